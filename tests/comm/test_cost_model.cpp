// The alpha-beta model's terms against hand-computed cases, `auto` selection, the fit, the
// calibration file round trip, and the double binary tree's shape.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/comm/communicator.h"
#include "kiln/comm/cost_model.h"
#include "kiln/comm/detail.h"

namespace kiln::comm {
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
  // Scattered all-to-all: one latency per window of 32 peers, the same bytes as pairwise.
  c = algo_cost(CollOp::kAllToAll, Algo::kScattered, 4, 4000);
  EXPECT_DOUBLE_EQ(c.steps, 1);
  EXPECT_DOUBLE_EQ(c.bw_bytes, 3000);
  c = algo_cost(CollOp::kAllToAll, Algo::kScattered, 40, 4000);
  EXPECT_DOUBLE_EQ(c.steps, 2);
  EXPECT_DOUBLE_EQ(c.bw_bytes, 3900);
  // Chain broadcast, p = 4: K chunks through p - 1 links take p - 2 + K steps of n / K bytes.
  // 32 KiB: 4032 B eager pieces, K = 9; 1 MiB: 256 KiB chunks, K = 4; 16 MiB: 1 MiB, K = 16.
  c = algo_cost(CollOp::kBroadcast, Algo::kChain, 4, 32768);
  EXPECT_DOUBLE_EQ(c.steps, 11);
  EXPECT_DOUBLE_EQ(c.bw_bytes, 11 * 32768.0 / 9);
  c = algo_cost(CollOp::kBroadcast, Algo::kChain, 4, 1 << 20);
  EXPECT_DOUBLE_EQ(c.steps, 6);
  EXPECT_DOUBLE_EQ(c.bw_bytes, 1.5 * (1 << 20));
  c = algo_cost(CollOp::kBroadcast, Algo::kChain, 4, 16 << 20);
  EXPECT_DOUBLE_EQ(c.steps, 18);
  EXPECT_DOUBLE_EQ(c.bw_bytes, 18.0 * (1 << 20));
  // One eager piece (4032 B or less): no pipelining, p - 1 steps of the whole message.
  c = algo_cost(CollOp::kBroadcast, Algo::kChain, 5, 4000);
  EXPECT_DOUBLE_EQ(c.steps, 4);
  EXPECT_DOUBLE_EQ(c.bw_bytes, 16000);
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

// Every algorithm has terms for every op it implements, at every p and size: one without them
// would be priced 0 and chosen by `auto` (algo_cost aborts naming it).
TEST(DistCostModel, EveryImplementedOpHasTerms) {
  for (const AlgoInfo& info : kAlgoInfos) {
    if (info.algo == Algo::kAuto || info.algo == Algo::kMpi) continue;
    for (int op = 0; op < kNumCollOps; ++op) {
      if (!algo_implements(info.algo, static_cast<CollOp>(op))) continue;
      for (int p : {2, 3, 4, 5, 8, 64})
        for (double n : {8.0, 4096.0, 1048576.0}) {
          const AlgoCost c = algo_cost(static_cast<CollOp>(op), info.algo, p, n, 2);
          EXPECT_GT(c.steps, 0) << info.name << " " << kCollOpNames[static_cast<size_t>(op)] << " p " << p;
          EXPECT_GT(c.bw_bytes, 0) << info.name << " " << kCollOpNames[static_cast<size_t>(op)] << " p " << p;
        }
    }
  }
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
  PiecewiseAlphaBeta& ring = t.fit_of(CollOp::kAllReduce, Algo::kRing);
  ring.knots[0] = {8, {0, 1e-12}};
  ring.num_knots = 1;
  EXPECT_NEAR(predict_seconds(t, CollOp::kAllReduce, Algo::kRing, 4, 1024), 1536e-12, 1e-18);
  EXPECT_EQ(select_algo(t, CollOp::kAllReduce, 4, 64 << 20), Algo::kRing);
  // ... but not for another p.
  EXPECT_EQ(select_algo(t, CollOp::kAllReduce, 8, 64 << 20), Algo::kRabenseifner);
  // Hierarchical is chosen only when ranks form several nodes of more than one rank.
  for (double n : {8.0, 1e3, 1e6, 1e9}) {
    EXPECT_NE(select_algo(t, CollOp::kAllReduce, 8, n, 0), Algo::kHierarchical);
    EXPECT_NE(select_algo(t, CollOp::kAllReduce, 8, n, 1), Algo::kHierarchical);
    EXPECT_NE(select_algo(t, CollOp::kAllReduce, 8, n, 8), Algo::kHierarchical);
  }
  // A hierarchical fit applies only to the node size it was measured with.
  t.hier_ranks_per_node = 2;
  PiecewiseAlphaBeta& hier = t.fit_of(CollOp::kAllReduce, Algo::kHierarchical);
  hier.knots[0] = {8, {0, 1e-13}};
  hier.num_knots = 1;
  EXPECT_EQ(select_algo(t, CollOp::kAllReduce, 4, 64 << 20, 2), Algo::kHierarchical);
  EXPECT_NEAR(predict_seconds(t, CollOp::kAllReduce, Algo::kHierarchical, 4, 1024, 2),
              algo_cost(CollOp::kAllReduce, Algo::kHierarchical, 4, 1024, 2).bw_bytes * 1e-13, 1e-20);
  t.hier_ranks_per_node = 3;  // measured with another split: the link model
  const AlgoCost hc = algo_cost(CollOp::kAllReduce, Algo::kHierarchical, 4, 1024, 2);
  EXPECT_DOUBLE_EQ(hc.steps, 4);  // 2 (L-1) + 2 (N-1) with L = N = 2
  EXPECT_NEAR(predict_seconds(t, CollOp::kAllReduce, Algo::kHierarchical, 4, 1024, 2),
              4e-6 + hc.bw_bytes * 1e-9, 1e-15);
}

// The piecewise model reproduces the measured times at its knots exactly and interpolates
// alpha and beta in log2(size) between them.
TEST(DistCostModel, PiecewiseFitReproducesKnots) {
  // A ring-like algorithm: 6 steps at every size, bandwidth term 1.5 n; a latency of 1 us per
  // step, then beta that doubles at 1 MiB (cache) and a noisy point below alpha * steps.
  const double sizes[] = {8, 32, 128, 512, 2048, 8192, 32768, 1 << 20, 4 << 20, 16 << 20};
  const int n = static_cast<int>(std::size(sizes));
  std::vector<double> steps(n, 6), bw(n), secs(n);
  for (int i = 0; i < n; ++i) {
    bw[i] = 1.5 * sizes[i];
    const double beta = sizes[i] >= (1 << 20) ? 2e-10 : 1e-10;
    secs[i] = 1e-6 * 6 + beta * bw[i];
  }
  const PiecewiseAlphaBeta f = fit_piecewise(sizes, steps.data(), bw.data(), secs.data(), n);
  ASSERT_EQ(f.num_knots, n);
  auto reproduces = [&](const PiecewiseAlphaBeta& pw) {
    for (int i = 0; i < n; ++i) {
      const AlphaBeta ab = pw.at(sizes[i]);
      EXPECT_TRUE(ab.valid());
      EXPECT_NEAR(ab.alpha_s * steps[i] + ab.beta_s_per_byte * bw[i], secs[i], 1e-9 * secs[i])
          << "knot " << i;
    }
  };
  reproduces(f);
  EXPECT_NEAR(f.at(8).alpha_s, 1e-6, 1e-12);
  EXPECT_NEAR(f.at(8192).beta_s_per_byte, 1e-10, 1e-16);
  EXPECT_NEAR(f.at(1 << 20).beta_s_per_byte, 2e-10, 1e-16);
  EXPECT_NEAR(f.at(16 << 20).alpha_s, 1e-6, 1e-9);
  // Halfway (in log2) between 1 MiB and 4 MiB: the mean of the two knots' betas (both 2e-10);
  // between 32 KiB and 1 MiB: a blend of 1e-10 and 2e-10.
  EXPECT_NEAR(f.at(2 << 20).beta_s_per_byte, 2e-10, 1e-16);
  const double mid = f.at(std::sqrt(32768.0 * (1 << 20))).beta_s_per_byte;
  EXPECT_NEAR(mid, 1.5e-10, 1e-16);
  // Outside the knots the end knots hold.
  EXPECT_EQ(f.at(1).beta_s_per_byte, f.knots[0].ab.beta_s_per_byte);
  EXPECT_EQ(f.at(1e12).beta_s_per_byte, f.knots[n - 1].ab.beta_s_per_byte);
  // A noisy knot below alpha * steps: its alpha is lowered so the measured time still holds.
  secs[2] = 5e-6;
  reproduces(fit_piecewise(sizes, steps.data(), bw.data(), secs.data(), n));
  // So selection between two calibrated algorithms follows the measurement at each knot.
  AlphaBetaTable t;
  t.fitted_p = 4;
  const double big[] = {1 << 20, 4 << 20, 16 << 20};
  double ring_s[] = {100e-6, 500e-6, 3000e-6}, rab_s[] = {110e-6, 450e-6, 3100e-6};
  double st[3], b[3], st2[3], b2[3];
  for (int i = 0; i < 3; ++i) {
    const AlgoCost cr = algo_cost(CollOp::kAllReduce, Algo::kRing, 4, big[i]);
    const AlgoCost ca = algo_cost(CollOp::kAllReduce, Algo::kRabenseifner, 4, big[i]);
    st[i] = cr.steps, b[i] = cr.bw_bytes, st2[i] = ca.steps, b2[i] = ca.bw_bytes;
  }
  t.fit_of(CollOp::kAllReduce, Algo::kRing) = fit_piecewise(big, st, b, ring_s, 3);
  t.fit_of(CollOp::kAllReduce, Algo::kRabenseifner) = fit_piecewise(big, st2, b2, rab_s, 3);
  for (Algo a : {Algo::kRecursiveDoubling, Algo::kDoubleBinaryTree}) {
    PiecewiseAlphaBeta& slow = t.fit_of(CollOp::kAllReduce, a);
    slow.knots[0] = {8, {1e-3, 1e-9}};
    slow.num_knots = 1;
  }
  EXPECT_EQ(select_algo(t, CollOp::kAllReduce, 4, 1 << 20), Algo::kRing);
  EXPECT_EQ(select_algo(t, CollOp::kAllReduce, 4, 4 << 20), Algo::kRabenseifner);
  EXPECT_EQ(select_algo(t, CollOp::kAllReduce, 4, 16 << 20), Algo::kRing);
}

TEST(DistCostModel, SingleNodeSplit) {
  EXPECT_EQ(single_node_split(1), 0);
  EXPECT_EQ(single_node_split(2), 0);
  EXPECT_EQ(single_node_split(3), 0);
  EXPECT_EQ(single_node_split(4), 2);
  EXPECT_EQ(single_node_split(5), 0);
  EXPECT_EQ(single_node_split(6), 2);
  EXPECT_EQ(single_node_split(8), 2);
  EXPECT_EQ(single_node_split(9), 3);
  EXPECT_EQ(single_node_split(16), 4);
  EXPECT_EQ(single_node_split(64), 8);
  // On one machine the automatic setting gives hierarchical virtual nodes where p allows.
  Communicator& c = Communicator::world();
  c.set_ranks_per_node(0);
  EXPECT_EQ(c.hierarchical_node_size(), single_node_split(c.size()));
  c.set_ranks_per_node(2);
  EXPECT_EQ(c.hierarchical_node_size(), c.size() > 2 && c.size() % 2 == 0 ? 2 : 0);
  c.set_ranks_per_node(0);
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
  const std::string path = std::string(KILN_BINARY_DIR) + "/test_comm_calibration_p" +
                           std::to_string(c.size()) + ".json";
  setenv("KILN_COMM_CALIBRATION", path.c_str(), 1);
  EXPECT_EQ(calibration_path(), path);
  AlphaBetaTable t;
  t.link = {3e-6, 2e-10};
  t.gamma_s_per_byte = 5e-11;
  t.fitted_p = c.size();
  t.hier_ranks_per_node = 2;
  t.placement = "0|1|0|1";
  PiecewiseAlphaBeta& ring = t.fit_of(CollOp::kAllReduce, Algo::kRing);
  ring.knots[0] = {8, {4e-6, 6e-10}};
  ring.knots[1] = {1 << 20, {5e-6, 7e-10}};
  ring.num_knots = 2;
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
  EXPECT_EQ(u.hier_ranks_per_node, 2);
  EXPECT_EQ(u.placement, "0|1|0|1");  // on every rank, not only the one that read the file
  EXPECT_EQ(u.fit_of(CollOp::kAllReduce, Algo::kRing).num_knots, 2);
  EXPECT_DOUBLE_EQ(u.fit_of(CollOp::kAllReduce, Algo::kRing).at(8).beta_s_per_byte, 6e-10);
  EXPECT_DOUBLE_EQ(u.fit_of(CollOp::kAllReduce, Algo::kRing).at(1e9).beta_s_per_byte, 7e-10);
  EXPECT_DOUBLE_EQ(u.fit_of(CollOp::kAllReduce, Algo::kRing).at(1e9).alpha_s, 5e-6);
  EXPECT_FALSE(u.fit_of(CollOp::kAllReduce, Algo::kRabenseifner).valid());
  c.barrier();
  if (c.rank() == 0) std::remove(path.c_str());
  unsetenv("KILN_COMM_CALIBRATION");
}

// Pooled calibration: a launch with `scale` times the base times (all-reduce, ring and
// recursive doubling at p = 2, 8 B .. 8 MiB), recursive doubling `rd_scale` times more.
CalibrationLaunch synthetic_launch(const std::string& placement, double scale, double rd_scale) {
  CalibrationLaunch l;
  l.placement = placement;
  for (double bytes = 8; bytes <= 8 << 20; bytes *= 4) {
    const double ring = 2e-6 + bytes * 3e-10, rd = 1e-6 + bytes * 3.2e-10;  // rd wins below ~5 MB
    l.times[static_cast<int>(CollOp::kAllReduce)][static_cast<int>(Algo::kRing)].emplace_back(bytes, scale * ring);
    l.times[static_cast<int>(CollOp::kAllReduce)][static_cast<int>(Algo::kRecursiveDoubling)].emplace_back(
        bytes, scale * rd_scale * rd);
  }
  return l;
}

// The fitted model's time at each size of `want` reproduces want's times.
void expect_fit_reproduces(const PiecewiseAlphaBeta& f, Algo a, const CalibrationLaunch& want) {
  ASSERT_TRUE(f.valid());
  for (const auto& [bytes, seconds] : want.times[static_cast<int>(CollOp::kAllReduce)][static_cast<int>(a)]) {
    const AlgoCost c = algo_cost(CollOp::kAllReduce, a, 2, bytes);
    const AlphaBeta ab = f.at(bytes);
    EXPECT_NEAR(ab.alpha_s * c.steps + ab.beta_s_per_byte * c.bw_bytes, seconds, 1e-9 * seconds)
        << algo_name(a) << " at " << bytes << " B";
  }
}

TEST(DistCostModel, PooledFitIgnoresSlowOutlierLaunch) {
  const CalibrationLaunch fast1 = synthetic_launch("0|1", 1.0, 1.0);
  const CalibrationLaunch fast2 = synthetic_launch("0|1", 1.02, 1.0);
  // The newest launch ran slow, recursive doubling 3x more: alone it would rank ring first.
  const CalibrationLaunch slow = synthetic_launch("0|1", 2.0, 3.0);
  const std::vector<CalibrationLaunch> pool = pool_launches({fast1, fast2}, slow);
  ASSERT_EQ(pool.size(), 3u);
  for (Algo a : {Algo::kRing, Algo::kRecursiveDoubling})
    expect_fit_reproduces(fit_pooled(pool, CollOp::kAllReduce, a, 2), a, fast2);  // the median
  AlphaBetaTable t;
  t.fitted_p = 2;
  for (Algo a : {Algo::kRing, Algo::kRecursiveDoubling})
    t.fit_of(CollOp::kAllReduce, a) = fit_pooled(pool, CollOp::kAllReduce, a, 2);
  EXPECT_LT(predict_seconds(t, CollOp::kAllReduce, Algo::kRecursiveDoubling, 2, 32768),
            predict_seconds(t, CollOp::kAllReduce, Algo::kRing, 2, 32768));
  // The slow launch alone ranks the other way: the test can tell the two apart.
  for (Algo a : {Algo::kRing, Algo::kRecursiveDoubling})
    t.fit_of(CollOp::kAllReduce, a) = fit_pooled({slow}, CollOp::kAllReduce, a, 2);
  EXPECT_GT(predict_seconds(t, CollOp::kAllReduce, Algo::kRecursiveDoubling, 2, 32768),
            predict_seconds(t, CollOp::kAllReduce, Algo::kRing, 2, 32768));
  // No times for an algorithm: no fit.
  EXPECT_FALSE(fit_pooled(pool, CollOp::kAllReduce, Algo::kRabenseifner, 2).valid());
  EXPECT_FALSE(fit_pooled({}, CollOp::kAllReduce, Algo::kRing, 2).valid());
}

TEST(DistCostModel, PoolKeepsLastLaunchesOfThePlacement) {
  const CalibrationLaunch other = synthetic_launch("unbound", 50.0, 50.0);
  CalibrationLaunch other_node = synthetic_launch("0|1", 40.0, 1.0);
  other_node.hier_ranks_per_node = 1;
  const CalibrationLaunch oldest = synthetic_launch("0|1", 30.0, 1.0);
  const CalibrationLaunch a = synthetic_launch("0|1", 1.0, 1.0);
  const CalibrationLaunch b = synthetic_launch("0|1", 1.1, 1.0);
  const CalibrationLaunch now = synthetic_launch("0|1", 5.0, 1.0);
  const std::vector<CalibrationLaunch> pool = pool_launches({oldest, other, a, other_node, b}, now);
  ASSERT_EQ(pool.size(), 3u);  // a, b, now: the oldest dropped, the others never mixed
  EXPECT_DOUBLE_EQ(pool[0].times[0][static_cast<int>(Algo::kRing)][0].second,
                   a.times[0][static_cast<int>(Algo::kRing)][0].second);
  EXPECT_DOUBLE_EQ(pool[2].times[0][static_cast<int>(Algo::kRing)][0].second,
                   now.times[0][static_cast<int>(Algo::kRing)][0].second);
  expect_fit_reproduces(fit_pooled(pool, CollOp::kAllReduce, Algo::kRing, 2), Algo::kRing, b);
  // A launch of another placement starts a pool of its own.
  EXPECT_EQ(pool_launches({a, b}, other).size(), 1u);
}

TEST(DistCostModel, CalibrationLaunchesRoundTrip) {
  Communicator& c = Communicator::world();
  const std::string path = std::string(KILN_BINARY_DIR) + "/test_comm_launches_p" +
                           std::to_string(c.size()) + ".json";
  const std::vector<CalibrationLaunch> pool = {synthetic_launch("0|1", 1.0, 1.0),
                                               synthetic_launch("0|1", 2.0, 1.5)};
  AlphaBetaTable t;
  t.fitted_p = c.size();  // the key of the fits; the times are synthetic p = 2 ones
  t.placement = "0|1";
  t.fit_of(CollOp::kAllReduce, Algo::kRing) = fit_pooled(pool, CollOp::kAllReduce, Algo::kRing, 2);
  if (c.rank() == 0) {
    std::remove(path.c_str());
    EXPECT_TRUE(read_calibration_launches(path, c.size()).empty());  // no file
    ASSERT_TRUE(save_cost_table(t, path, pool).ok());
    const std::vector<CalibrationLaunch> back = read_calibration_launches(path, c.size());
    ASSERT_EQ(back.size(), 2u);
    EXPECT_TRUE(read_calibration_launches(path, c.size() + 1).empty());
    for (size_t i = 0; i < back.size(); ++i) {
      EXPECT_EQ(back[i].placement, "0|1");
      for (int a : {static_cast<int>(Algo::kRing), static_cast<int>(Algo::kRecursiveDoubling)})
        EXPECT_EQ(back[i].times[0][a], pool[i].times[0][a]);
    }
    // Saving a table without launches drops them (fits[p] is rewritten whole).
    ASSERT_TRUE(save_cost_table(t, path).ok());
    EXPECT_TRUE(read_calibration_launches(path, c.size()).empty());
    ASSERT_TRUE(save_cost_table(t, path, pool).ok());
  }
  c.barrier();
  // The fits' reader skips the "launches" key (as the reader before it did).
  setenv("KILN_COMM_CALIBRATION", path.c_str(), 1);
  const AlphaBetaTable u = load_cost_table(c);
  EXPECT_EQ(u.placement, "0|1");
  EXPECT_EQ(u.fit_of(CollOp::kAllReduce, Algo::kRing).num_knots,
            t.fit_of(CollOp::kAllReduce, Algo::kRing).num_knots);
  EXPECT_FALSE(u.fit_of(CollOp::kAllReduce, Algo::kRecursiveDoubling).valid());
  c.barrier();
  if (c.rank() == 0) std::remove(path.c_str());
  unsetenv("KILN_COMM_CALIBRATION");
}

// The placement string: one field per rank, "unbound" only when all ranks share the same
// several CPUs; and the live one agrees on every rank.
TEST(DistCostModel, DescribePlacement) {
  EXPECT_EQ(describe_placement({}), "");
  EXPECT_EQ(describe_placement({{0}, {1}, {0}, {1}}), "0|1|0|1");
  EXPECT_EQ(describe_placement({{0}, {0}, {1}, {1}}), "0|0|1|1");
  EXPECT_EQ(describe_placement({{0, 1}, {0, 1}, {0, 1}}), "unbound");
  EXPECT_EQ(describe_placement({{0, 1}, {2, 3}}), "0,1|2,3");
  EXPECT_EQ(describe_placement({{3}}), "3");
  EXPECT_EQ(describe_placement({{0, 1}, {0}}), "0,1|0");
  Communicator& c = Communicator::world();
  const std::string mine = rank_placement(c);
  EXPECT_FALSE(mine.empty());
  // Every rank got the same string: compare its length and first character with rank 0's.
  int v[2] = {static_cast<int>(mine.size()), mine[0]}, lo[2] = {0, 0}, hi[2] = {0, 0};
  MPI_Allreduce(v, lo, 2, MPI_INT, MPI_MIN, c.handle());
  MPI_Allreduce(v, hi, 2, MPI_INT, MPI_MAX, c.handle());
  EXPECT_EQ(lo[0], hi[0]);
  EXPECT_EQ(lo[1], hi[1]);
  if (mine != "unbound") {
    EXPECT_EQ(std::count(mine.begin(), mine.end(), '|'), c.size() - 1);
  }
}

// Paired times: a machine state that scales a whole round cancels, so the ratio between two
// algorithms comes out exact however the rounds vary, and a minority of outlier rounds does
// not move it.
TEST(DistCostModel, PairedTimesCancelRoundStates) {
  const std::vector<double> state = {1.0, 3.0, 1.0, 2.5, 1.0, 3.0, 1.2};  // bimodal machine
  std::vector<std::vector<double>> rounds(3);
  for (double f : state) {
    rounds[0].push_back(2e-6 * f);  // 1.25x the reference
    rounds[1].push_back(1.6e-6 * f);  // the reference: least median
    rounds[2].push_back(4.8e-6 * f);  // 3x
  }
  rounds[2][4] *= 10;  // one round where the third algorithm was descheduled
  std::vector<double> t = paired_times(rounds);
  ASSERT_EQ(t.size(), 3u);
  const double ref_median = 1.6e-6 * 1.2;  // sorted states: 1, 1, 1, 1.2, 2.5, 3, 3
  EXPECT_NEAR(t[1], ref_median, 1e-18);
  EXPECT_NEAR(t[0] / t[1], 1.25, 1e-12);
  EXPECT_NEAR(t[2] / t[1], 3.0, 1e-12);
  // The paired ratio as the bench reports it (vs_best: the best's time / this time).
  EXPECT_NEAR(median_ratio(rounds[1], rounds[0]), 0.8, 1e-12);
  // Even number of rounds: the mean of the two middle ratios.
  EXPECT_NEAR(median_ratio({1, 2, 3, 4}, {1, 1, 1, 1}), 2.5, 1e-12);
  // The fit through paired times recovers the alpha and beta the rounds were made from.
  const double alpha = 1.5e-6, beta = 2e-10;
  const double sizes[] = {1024, 4096, 16384, 65536};
  std::vector<double> steps(4, 4), bw(4), secs(4);
  for (int i = 0; i < 4; ++i) {
    bw[i] = 2 * sizes[i];
    std::vector<std::vector<double>> r(2);
    for (double f : state) {
      r[0].push_back((alpha * steps[i] + beta * bw[i]) * f);
      r[1].push_back(0.5e-6 * f);  // a faster reference algorithm
    }
    const std::vector<double> pt = paired_times(r);
    secs[i] = pt[0] / pt[1] * 0.5e-6;  // in the state of the reference's median round
  }
  const AlphaBeta ab = fit_alpha_beta(steps.data(), bw.data(), secs.data(), 4);
  EXPECT_NEAR(ab.alpha_s / alpha, 1.0, 1e-9);
  EXPECT_NEAR(ab.beta_s_per_byte / beta, 1.0, 1e-9);
}

// A corrupt calibration file gives the defaults with a message; a bad fit inside a good
// file drops that fit only.
TEST(DistCostModel, CorruptCalibrationFileFallsBack) {
  Communicator& c = Communicator::world();
  const std::string path = std::string(KILN_BINARY_DIR) + "/test_comm_corrupt_p" +
                           std::to_string(c.size()) + ".json";
  setenv("KILN_COMM_CALIBRATION", path.c_str(), 1);
  const AlphaBetaTable defaults;
  if (c.rank() == 0) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("{\"version\": 2, \"link\": {\"alpha_s\": 1e-6,", f);  // cut short
    std::fclose(f);
  }
  c.barrier();
  AlphaBetaTable u = load_cost_table(c);
  EXPECT_EQ(u.fitted_p, 0);
  EXPECT_DOUBLE_EQ(u.link.alpha_s, defaults.link.alpha_s);
  EXPECT_DOUBLE_EQ(u.gamma_s_per_byte, defaults.gamma_s_per_byte);
  c.barrier();
  if (c.rank() == 0) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f,
                 "{\"version\": 2, \"fits\": {\"%d\": {\"allreduce\": {"
                 "\"ring\": {\"knots\": [[8, 1e-6, 2e-10], [1024, 1e-6, 1e-10]]},"
                 "\"rabenseifner\": {\"knots\": [[8, 1e-6, -2e-10]]},"
                 "\"recursive_doubling\": {\"knots\": \"oops\"}}}}}\n",
                 c.size());
    std::fclose(f);
  }
  c.barrier();
  u = load_cost_table(c);
  EXPECT_EQ(u.fitted_p, c.size());
  EXPECT_EQ(u.fit_of(CollOp::kAllReduce, Algo::kRing).num_knots, 2);
  EXPECT_FALSE(u.fit_of(CollOp::kAllReduce, Algo::kRabenseifner).valid());
  EXPECT_FALSE(u.fit_of(CollOp::kAllReduce, Algo::kRecursiveDoubling).valid());
  // Missing file: the defaults, silently.
  c.barrier();
  if (c.rank() == 0) std::remove(path.c_str());
  c.barrier();
  u = load_cost_table(c);
  EXPECT_EQ(u.fitted_p, 0);
  EXPECT_DOUBLE_EQ(u.link.beta_s_per_byte, defaults.link.beta_s_per_byte);
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
}  // namespace kiln::comm
