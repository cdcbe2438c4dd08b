// The alpha-beta model's terms against hand-computed cases, `auto` selection, the fit, the
// calibration file round trip, and the double binary tree's shape.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include <gtest/gtest.h>

#include "kiln/dist/communicator.h"
#include "kiln/dist/cost_model.h"
#include "kiln/dist/detail.h"

namespace kiln::dist {
namespace {

TEST(DistCostModel, HandComputedTerms) {
  // Ring all-reduce, p = 4, n = 1024 B: 2(p-1) = 6 steps, 2(p-1)/p n = 1536 B, (p-1)/p n = 768.
  AlgoCost c = algo_cost(CollOp::kAllReduce, Algo::kRing, 4, 1024);
  EXPECT_DOUBLE_EQ(c.steps, 6);
  EXPECT_DOUBLE_EQ(c.bw_bytes, 1536);
  EXPECT_DOUBLE_EQ(c.reduce_bytes, 768);
  // Recursive doubling, p = 4: lg p = 2 steps of the whole vector; p = 5 adds fold + unfold.
  c = algo_cost(CollOp::kAllReduce, Algo::kRecursiveDoubling, 4, 1000);
  EXPECT_DOUBLE_EQ(c.steps, 2);
  EXPECT_DOUBLE_EQ(c.bw_bytes, 2000);
  c = algo_cost(CollOp::kAllReduce, Algo::kRecursiveDoubling, 5, 1000);
  EXPECT_DOUBLE_EQ(c.steps, 4);
  EXPECT_DOUBLE_EQ(c.bw_bytes, 4000);
  // Rabenseifner, p = 8, n = 800: 2 lg p = 6 steps, 2 (7/8) 800 = 1400 B.
  c = algo_cost(CollOp::kAllReduce, Algo::kRabenseifner, 8, 800);
  EXPECT_DOUBLE_EQ(c.steps, 6);
  EXPECT_DOUBLE_EQ(c.bw_bytes, 1400);
  // Double binary tree, p = 8 (height 3), n = 2 MiB: K = 1 MiB / 256 KiB = 4 chunks per tree,
  // 2 (3 + 4 - 1) = 12 steps, fanout 2: 2 n (6 / 4) = 3 n bytes.
  c = algo_cost(CollOp::kAllReduce, Algo::kDoubleBinaryTree, 8, 2 << 20);
  EXPECT_DOUBLE_EQ(c.steps, 12);
  EXPECT_DOUBLE_EQ(c.bw_bytes, 3.0 * (2 << 20));
  // Hierarchical, 8 ranks as 2 nodes of 4, n = 4096: 2*3 + 2*1 = 8 steps;
  // 2 (3/4) 4096 + 2 (1/2) 4096/4 = 6144 + 1024.
  c = algo_cost(CollOp::kAllReduce, Algo::kHierarchical, 8, 4096, 4);
  EXPECT_DOUBLE_EQ(c.steps, 8);
  EXPECT_DOUBLE_EQ(c.bw_bytes, 7168);
  // All-gather ring, p = 4, output 4000 B: 3 steps, 3000 B. All-to-all the same.
  c = algo_cost(CollOp::kAllGather, Algo::kRing, 4, 4000);
  EXPECT_DOUBLE_EQ(c.steps, 3);
  EXPECT_DOUBLE_EQ(c.bw_bytes, 3000);
  c = algo_cost(CollOp::kAllToAll, Algo::kPairwise, 4, 4000);
  EXPECT_DOUBLE_EQ(c.bw_bytes, 3000);
  // Reduce-scatter recursive halving, p = 4, input 4000: 2 steps, (3/4) 4000 = 3000 B.
  c = algo_cost(CollOp::kReduceScatter, Algo::kRecursiveHalving, 4, 4000);
  EXPECT_DOUBLE_EQ(c.steps, 2);
  EXPECT_DOUBLE_EQ(c.bw_bytes, 3000);
  // Broadcast binomial, p = 5: ceil(lg 5) = 3 rounds of the message.
  c = algo_cost(CollOp::kBroadcast, Algo::kBinomialTree, 5, 100);
  EXPECT_DOUBLE_EQ(c.steps, 3);
  EXPECT_DOUBLE_EQ(c.bw_bytes, 300);
  // One rank: nothing moves.
  c = algo_cost(CollOp::kAllReduce, Algo::kRing, 1, 1000);
  EXPECT_DOUBLE_EQ(c.steps + c.bw_bytes, 0);
}

TEST(DistCostModel, PredictAndSelect) {
  AlphaBetaTable t;
  t.link = {1e-6, 1e-9};
  t.gamma_s_per_byte = 0;
  // Ring p = 4, 1024 B: 6 alpha + 1536 beta.
  EXPECT_NEAR(predict_seconds(t, CollOp::kAllReduce, Algo::kRing, 4, 1024), 6e-6 + 1536e-9, 1e-15);
  // Small: recursive doubling (2 steps); large: Rabenseifner (same bandwidth term as the ring,
  // fewer steps); the double binary tree moves 2n against 1.5n.
  EXPECT_EQ(select_algo(t, CollOp::kAllReduce, 4, 8), Algo::kRecursiveDoubling);
  EXPECT_EQ(select_algo(t, CollOp::kAllReduce, 4, 64 << 20), Algo::kRabenseifner);
  // At p = 6 Rabenseifner pays 2n for fold + unfold; the ring wins at large sizes.
  EXPECT_EQ(select_algo(t, CollOp::kAllReduce, 6, 64 << 20), Algo::kRing);
  EXPECT_EQ(select_algo(t, CollOp::kBroadcast, 8, 8), Algo::kBinomialTree);
  EXPECT_EQ(select_algo(t, CollOp::kBroadcast, 8, 256 << 20), Algo::kChain);
  // A per-algorithm fit for this p overrides the link model.
  t.fitted_p = 4;
  t.fit[static_cast<int>(CollOp::kAllReduce)][static_cast<int>(Algo::kRing)] = {0, 1e-12};
  EXPECT_NEAR(predict_seconds(t, CollOp::kAllReduce, Algo::kRing, 4, 1024), 1536e-12, 1e-18);
  // Calls from kLargeCallBytes up use the large-regime fit (none yet: the link model).
  EXPECT_EQ(select_algo(t, CollOp::kAllReduce, 4, 64 << 20), Algo::kRabenseifner);
  t.fit_large[static_cast<int>(CollOp::kAllReduce)][static_cast<int>(Algo::kRing)] = {1e-6, 1e-12};
  EXPECT_EQ(select_algo(t, CollOp::kAllReduce, 4, 64 << 20), Algo::kRing);
  EXPECT_NEAR(predict_seconds(t, CollOp::kAllReduce, Algo::kRing, 4, 4 << 20),
              6e-6 + 1.5 * (4 << 20) * 1e-12, 1e-15);
  // Hierarchical is chosen only when ranks form several nodes.
  for (double n : {8.0, 1e3, 1e6, 1e9})
    EXPECT_NE(select_algo(t, CollOp::kAllReduce, 8, n, 0), Algo::kHierarchical);
}

TEST(DistCostModel, FitRecoversAlphaBeta) {
  const double alpha = 2e-6, beta = 3e-10;
  double steps[6], bytes[6], secs[6];
  for (int i = 0; i < 6; ++i) {
    steps[i] = 6;
    bytes[i] = std::pow(4.0, 2 + 2 * i);
    secs[i] = alpha * steps[i] + beta * bytes[i];
  }
  const AlphaBeta f = fit_alpha_beta(steps, bytes, secs, 6);
  EXPECT_NEAR(f.alpha_s / alpha, 1.0, 1e-9);
  EXPECT_NEAR(f.beta_s_per_byte / beta, 1.0, 1e-9);
  // Pure latency data: beta would go negative, so it is clamped and alpha refit.
  for (int i = 0; i < 6; ++i) secs[i] = 1e-5 * (1 + (i % 2 ? 0.01 : -0.01)) - 1e-20 * bytes[i];
  const AlphaBeta g = fit_alpha_beta(steps, bytes, secs, 6);
  EXPECT_GE(g.beta_s_per_byte, 0);
  EXPECT_GE(g.alpha_s, 0);
}

TEST(DistCostModel, CalibrationFileRoundTrip) {
  Communicator& c = Communicator::world();
  const std::string path = std::string(KILN_BINARY_DIR) + "/test_dist_calibration_p" +
                           std::to_string(c.size()) + ".json";
  setenv("KILN_COMM_CALIBRATION", path.c_str(), 1);
  EXPECT_EQ(calibration_path(), path);
  AlphaBetaTable t;
  t.link = {3e-6, 2e-10};
  t.gamma_s_per_byte = 5e-11;
  t.fitted_p = c.size();
  t.fit[static_cast<int>(CollOp::kAllReduce)][static_cast<int>(Algo::kRing)] = {4e-6, 6e-10};
  t.fit_large[static_cast<int>(CollOp::kAllReduce)][static_cast<int>(Algo::kRing)] = {5e-6, 7e-10};
  if (c.rank() == 0) {
    std::remove(path.c_str());
    EXPECT_TRUE(save_cost_table(t, path).ok());
  }
  c.barrier();
  const AlphaBetaTable u = load_cost_table(c);
  EXPECT_DOUBLE_EQ(u.link.alpha_s, 3e-6);
  EXPECT_DOUBLE_EQ(u.link.beta_s_per_byte, 2e-10);
  EXPECT_DOUBLE_EQ(u.gamma_s_per_byte, 5e-11);
  EXPECT_EQ(u.fitted_p, c.size());
  EXPECT_DOUBLE_EQ(u.fit_of(CollOp::kAllReduce, Algo::kRing).beta_s_per_byte, 6e-10);
  EXPECT_DOUBLE_EQ(u.fit_of(CollOp::kAllReduce, Algo::kRing, 1e9).beta_s_per_byte, 7e-10);
  EXPECT_FALSE(u.fit_of(CollOp::kAllReduce, Algo::kRabenseifner).valid());
  c.barrier();
  if (c.rank() == 0) std::remove(path.c_str());
  unsetenv("KILN_COMM_CALIBRATION");
}

// Both trees span every rank with consistent parent/child links, and no rank is an inner
// node in both (so every rank's links carry about the same load).
TEST(DistTree, TwoTreesSpanAndNoRankInnerInBoth) {
  for (int p = 1; p <= 70; ++p) {
    for (int w = 0; w < 2; ++w) {
      int roots = 0;
      std::set<int> seen;
      for (int r = 0; r < p; ++r) {
        const detail::TreeLinks t = detail::tree_links(p, r, w);
        if (t.parent < 0) ++roots;
        else {
          const detail::TreeLinks pt = detail::tree_links(p, t.parent, w);
          EXPECT_TRUE(pt.children[0] == r || pt.children[1] == r) << "p=" << p << " r=" << r;
        }
        for (int ch : t.children)
          if (ch >= 0) {
            EXPECT_EQ(detail::tree_links(p, ch, w).parent, r);
            EXPECT_TRUE(seen.insert(ch).second);
          }
      }
      EXPECT_EQ(roots, 1) << "p=" << p;
      EXPECT_EQ(static_cast<int>(seen.size()), p - 1) << "p=" << p;
    }
    for (int r = 0; r < p; ++r) {
      const bool inner0 = detail::tree_links(p, r, 0).num_children() > 0;
      const bool inner1 = detail::tree_links(p, r, 1).num_children() > 0;
      EXPECT_FALSE(inner0 && inner1) << "p=" << p << " rank " << r << " is inner in both trees";
    }
  }
  EXPECT_EQ(detail::tree_height(8), 3);
  EXPECT_EQ(detail::tree_height(5), 2);
}

}  // namespace
}  // namespace kiln::dist
