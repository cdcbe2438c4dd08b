// The topology model of `kiln plan comm` against hand-computed values: ring and hierarchical
// all-reduce on H100 nodes, Rabenseifner across nodes, dimension rings on a torus, the
// bisection bound of all-to-all, torus shapes and size parsing.
#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>

#include "kiln/comm/cost_model.h"
#include "kiln/comm/types.h"
#include "kiln/perf/comm_model.h"

namespace kiln::perf {
namespace {

double time_of(const std::vector<CommPrediction>& v, const std::string& algo) {
  for (const CommPrediction& c : v)
    if (c.algo == algo) return c.seconds;
  ADD_FAILURE() << "no prediction for " << algo;
  return 0;
}

constexpr double kGiB = 1073741824.0;

TEST(CommModel, RingOnOneH100Node) {
  const auto t = find_topology("h100-node");
  ASSERT_TRUE(t.has_value());
  const auto v = predict_comm(*t, ModelOp::kAllReduce, 8, kGiB);
  ASSERT_TRUE(v.ok());
  // 2(p-1) = 14 steps of 2 us, 2 (7/8) GiB over 450 GB/s.
  const double want = 14 * 2e-6 + 1.75 * kGiB / 450e9;
  EXPECT_NEAR(time_of(*v, "ring") / want, 1.0, 1e-12);
  const CommPrediction& ring = (*v)[0];
  EXPECT_NEAR(ring.algbw, kGiB / want, 1e-3);
  EXPECT_NEAR(ring.busbw, ring.algbw * 1.75, 1e-3);
  // Tree: 2 lg 8 = 6 levels of 2 us, 2 GiB over 450 GB/s: it wins at small sizes only.
  EXPECT_NEAR(time_of(*v, "double_binary_tree"), 6 * 2e-6 + 2 * kGiB / 450e9, 1e-12);
  const auto small = predict_comm(*t, ModelOp::kAllReduce, 8, 65536);
  EXPECT_LT(time_of(*small, "double_binary_tree"), time_of(*small, "ring"));
}

TEST(CommModel, HierarchicalAndRabenseifnerAcrossNodes) {
  const auto t = find_topology("h100-ib");
  ASSERT_TRUE(t.has_value());
  const double n = kGiB;
  const auto v = predict_comm(*t, ModelOp::kAllReduce, 16, n);
  ASSERT_TRUE(v.ok());
  // 2 nodes of 8: 2*7 NVLink steps (2 us) + 2*1 IB steps (5 us); bandwidth: the slower of
  // in-node RS+AG (2 (7/8) n / 450 GB/s) and the shard's ring across (n/8 over 50 GB/s).
  EXPECT_NEAR(time_of(*v, "hierarchical"), 14 * 2e-6 + 2 * 5e-6 + 1.75 * n / 450e9, 1e-12);
  // Rabenseifner: the first halving (distance 8) crosses nodes on one NIC with n/2 bytes,
  // the other three stay on NVLink with n/4, n/8, n/16; the all-gather mirrors it.
  const double half = 5e-6 + (n / 2) / 50e9 + 3 * 2e-6 + (n / 4 + n / 8 + n / 16) / 450e9;
  EXPECT_NEAR(time_of(*v, "rabenseifner"), 2 * half, 1e-12);
  // Ring across nodes: 30 IB-latency steps, 8 rails x 50 GB/s = 400 GB/s.
  EXPECT_NEAR(time_of(*v, "ring"), 30 * 5e-6 + 2 * (15.0 / 16) * n / 400e9, 1e-12);
  // At scale the flat ring's 2(p-1) steps dominate small messages; hierarchy and trees fix it.
  const auto big = predict_comm(*t, ModelOp::kAllReduce, 65536, 1 << 20);
  ASSERT_TRUE(big.ok());
  EXPECT_GT(time_of(*big, "ring"), 100 * time_of(*big, "hierarchical"));
}

TEST(CommModel, TorusRingsAndShapes) {
  EXPECT_EQ(torus_shape(4096, 3), (std::vector<int>{16, 16, 16}));
  EXPECT_EQ(torus_shape(12, 2), (std::vector<int>{4, 3}));
  EXPECT_EQ(torus_shape(7, 2), (std::vector<int>{7, 1}));
  EXPECT_EQ(torus_shape(65536, 2), (std::vector<int>{256, 256}));
  const auto t = find_topology("tpu-torus-2d");
  ASSERT_TRUE(t.has_value());
  const double n = 1 << 20;
  const auto v = predict_comm(*t, ModelOp::kAllReduce, 16, n);
  ASSERT_TRUE(v.ok());
  // 4 x 4: reduce-scatter along x (3 steps, 3/4 n) then y (3 steps, 3/4 of n/4), bidirectional
  // rings at 2 x 50 GB/s, then the all-gather mirrors it.
  const double one_way = 3 * 1e-6 + 0.75 * n / 100e9 + 3 * 1e-6 + 0.75 * (n / 4) / 100e9;
  EXPECT_NEAR(time_of(*v, "torus_rings"), 2 * one_way, 1e-15);
}

TEST(CommModel, AllToAllBisectionBound) {
  const auto t = find_topology("tpu-torus-2d");
  ASSERT_TRUE(t.has_value());
  // 4 x 4 torus: a cut across x crosses 2 * 4 links (wrap-around doubles): 400 GB/s.
  EXPECT_DOUBLE_EQ(bisection_bandwidth(*t, 16), 8 * 50e9);
  // 64 x 64: 128 links; p n / 4 bytes must cross.
  const auto v = predict_comm(*t, ModelOp::kAllToAll, 4096, kGiB);
  ASSERT_TRUE(v.ok());
  EXPECT_NEAR(time_of(*v, "pairwise"), 4096 * kGiB / 4 / (128 * 50e9), 1e-9);
  EXPECT_NE((*v)[0].note.find("bisection"), std::string::npos);
  const auto ib = find_topology("h100-ib");
  EXPECT_DOUBLE_EQ(bisection_bandwidth(*ib, 64), 32 * 50e9);
}

// One model: every algorithm of the collectives layer that implements a modelled op has a
// prediction on every topology (a new algorithm without one fails here), and on one switched
// node (every step on NVLink) its time is the collectives layer's own terms on that link.
TEST(CommModel, EveryCollectiveAlgorithmIsModelledAndOneNodeUsesTheLayersTerms) {
  const std::pair<ModelOp, comm::CollOp> ops[] = {{ModelOp::kAllReduce, comm::CollOp::kAllReduce},
                                                  {ModelOp::kAllGather, comm::CollOp::kAllGather},
                                                  {ModelOp::kReduceScatter, comm::CollOp::kReduceScatter},
                                                  {ModelOp::kAllToAll, comm::CollOp::kAllToAll}};
  for (const Topology& t : topologies()) {
    for (const int p : {2, 3, 6, 8, 64}) {
      if (p > t.max_ranks) continue;
      for (const auto& [op, coll] : ops) {
        const auto v = predict_comm(t, op, p, 3.0 * (1 << 20));
        ASSERT_TRUE(v.ok()) << v.status().message();
        for (const comm::AlgoInfo& info : comm::kAlgoInfos) {
          if (info.algo == comm::Algo::kAuto || info.algo == comm::Algo::kMpi || !comm::algo_implements(info.algo, coll))
            continue;
          // The hierarchical algorithm exists only across several nodes.
          if (info.algo == comm::Algo::kHierarchical && (t.kind != TopologyKind::kSwitched || p <= t.ranks_per_node))
            continue;
          const bool found = std::any_of(v->begin(), v->end(), [&](const CommPrediction& c) { return c.algo == info.name; });
          EXPECT_TRUE(found) << t.name << " p " << p << " " << model_op_name(op) << ": no prediction for " << info.name;
        }
      }
    }
  }
  const Topology node = *find_topology("h100-node");
  for (const int p : {3, 6, 8})
    for (const auto& [op, coll] : ops) {
      const double n = 5.0 * (1 << 20);
      const auto v = predict_comm(node, op, p, n);
      ASSERT_TRUE(v.ok());
      for (const CommPrediction& c : *v) {
        if (c.algo == "double_binary_tree") continue;  // NCCL-style trees, not kiln's chunked ones
        const auto a = comm::parse_algo(c.algo);
        ASSERT_TRUE(a.has_value()) << c.algo;
        const comm::AlgoCost terms = comm::algo_cost(coll, *a, p, n);
        EXPECT_NEAR(c.seconds, terms.steps * node.intra.latency_s + terms.bw_bytes / node.intra.bw_bytes_per_s,
                    1e-15) << c.algo << " p " << p;
      }
    }
}

TEST(CommModel, ErrorsAndSizes) {
  const auto t = find_topology("h100-node");
  const auto bad = predict_comm(*t, ModelOp::kAllReduce, 9, 1024);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("h100-node"), std::string::npos);
  EXPECT_FALSE(find_topology("nope").has_value());
  EXPECT_DOUBLE_EQ(*parse_bytes("4K"), 4096);
  EXPECT_DOUBLE_EQ(*parse_bytes("1GiB"), kGiB);
  EXPECT_DOUBLE_EQ(*parse_bytes("1.5MB"), 1.5e6);
  EXPECT_DOUBLE_EQ(*parse_bytes("4096"), 4096);
  EXPECT_FALSE(parse_bytes("abc").ok());
  EXPECT_FALSE(parse_bytes("5XB").ok());
  EXPECT_FALSE(parse_bytes("0").ok());
}

}  // namespace
}  // namespace kiln::perf
