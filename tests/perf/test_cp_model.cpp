// `kiln plan cp`'s arithmetic (perf/cp_model.h): the causal imbalance of the two layouts from
// the block counts, the ring's exposed communication at the two extremes of the link, Ulysses'
// all-to-all volume by hand, its head rule, and memory per rank against C.
#include <gtest/gtest.h>

#include "kiln/perf/cp_model.h"

namespace kiln::perf {
namespace {

using parallel::LayoutKind;

CpPlanOptions ring(LayoutKind layout, int c) {
  CpPlanOptions o;
  o.method = CpMethod::kRing, o.layout = layout, o.cp = c;
  o.forward_flops_per_s = 100e12;
  return o;
}

// A switched "node" whose one link is `bw` bytes/s and `alpha` s.
Topology node_with(double bw, double alpha) {
  Topology t = *find_topology("h100-node");
  t.intra = t.inter = {bw, alpha};
  return t;
}

TEST(CpModel, ZigzagIsBalancedAndContiguousFollowsTheBlockCount) {
  const Topology t = *find_topology("h100-node");
  const CpAttentionShape s{8, 8, 64, 1, 1, true};
  const int64_t seq = 8192;
  for (const int c : {2, 4}) {
    const CpPrediction z = predict_cp_layer(t, s, seq, ring(LayoutKind::kZigzag, c)).value();
    EXPECT_DOUBLE_EQ(z.imbalance, 1.0) << c;
    EXPECT_DOUBLE_EQ(z.min_compute_s * c, z.mean_compute_s * c) << c;
    // Contiguous: rank r computes r full blocks of n = T/C rows and one diagonal one, whose
    // n(n+1)/2 visible pairs are d = (n+1)/(2n) of a full block: busiest C−1+d over mean (C−1)/2+d.
    const double n = static_cast<double>(seq / c), d = (n + 1) / (2 * n);
    const CpPrediction k = predict_cp_layer(t, s, seq, ring(LayoutKind::kContiguous, c)).value();
    EXPECT_NEAR(k.imbalance, (c - 1 + d) / ((c - 1) / 2.0 + d), 1e-12) << c;
    EXPECT_NEAR(k.imbalance, (2.0 * c - 1) / c, 1e-3) << c;  // d → 1/2
    // Both layouts do the same work in all.
    EXPECT_NEAR(k.mean_compute_s, z.mean_compute_s, 1e-12 * z.mean_compute_s) << c;
  }
}

TEST(CpModel, RingHidesEverythingOnAHugeLinkAndNothingWhenComputeIsFree) {
  const CpAttentionShape s{8, 2, 64, 1, 1, true};
  const int64_t seq = 16384;
  for (const int c : {2, 4, 8}) {
    const Topology fast = node_with(1e30, 0);
    const CpPrediction p = predict_cp_layer(fast, s, seq, ring(LayoutKind::kZigzag, c)).value();
    EXPECT_NEAR(p.exposed_s, 0, 1e-15) << c;
    EXPECT_NEAR(p.wait_s, 0, 1e-15) << c;

    // Compute ~0: every hop is exposed. Forward C−1 K/V hops; backward K/V at steps 0..C−2,
    // dK/dV at steps 1..C−1 (one exchange a step), then dK/dV home.
    const double bw = 10e9, alpha = 3e-6;
    const Topology slow = node_with(bw, alpha);
    CpPlanOptions o = ring(LayoutKind::kZigzag, c);
    o.forward_flops_per_s = 1e30;
    const CpPrediction q = predict_cp_layer(slow, s, seq, o).value();
    const double kv = 2.0 * (seq / c) * s.kv_heads * s.head_dim * o.bytes_per_element;
    EXPECT_DOUBLE_EQ(q.ring_hop_bytes_fwd, kv);
    auto hop = [&](double bytes) { return alpha + bytes / bw; };
    const double bwd_steps = c == 2 ? 2 * hop(kv) : 2 * hop(kv) + (c - 2) * hop(2 * kv);
    const double expected = (c - 1) * hop(kv) + bwd_steps + hop(kv);
    EXPECT_NEAR(q.exposed_s, expected, 1e-9 * expected) << c;
    EXPECT_NEAR(q.comm_s, expected, 1e-9 * expected) << c;
    EXPECT_NEAR(q.wait_s, expected, 1e-6 * expected) << c;
    EXPECT_DOUBLE_EQ(q.bytes_sent, kv * (3 * c - 2)) << c;
  }
}

TEST(CpModel, UlyssesVolumeIsTheHandCount) {
  // T = 16, C = 2, 4 heads, 2 KV heads, D = 8, 2 bytes: 8 local rows. Forward sends q (4 heads)
  // k, v (2 each) = 8·8·8·2 = 1024 B, then out (4·8·2) + lse (4·4) = 8·80 = 640 B back; backward
  // dout, q, out (12 heads) + k, v (4) = 16·8·2 per row + lse 16 B = 8·272 = 2176 B in, dq, dk, dv
  // 8·8·8·2 = 1024 B back. Half of each buffer goes to the one peer.
  const Topology t = *find_topology("h100-node");
  const CpAttentionShape s{4, 2, 8, 1, 1, true};
  CpPlanOptions o;
  o.method = CpMethod::kUlysses, o.cp = 2, o.forward_flops_per_s = 1e12;
  const CpPrediction p = predict_cp_layer(t, s, 16, o).value();
  EXPECT_DOUBLE_EQ(p.a2a_bytes_fwd, 1024 + 640);
  EXPECT_DOUBLE_EQ(p.a2a_bytes_bwd, 2176 + 1024);
  EXPECT_DOUBLE_EQ(p.bytes_sent, (1664 + 3200) / 2.0);
  EXPECT_EQ(p.ring_hop_bytes_fwd, 0);
  EXPECT_DOUBLE_EQ(p.imbalance, 1);
  EXPECT_GT(p.exposed_s, 0);
  EXPECT_DOUBLE_EQ(p.exposed_s, p.comm_s);  // the all-to-alls block
}

TEST(CpModel, UlyssesIsRefusedWhenHeadsDoNotDivide) {
  const Topology t = *find_topology("h100-node");
  CpPlanOptions o;
  o.method = CpMethod::kUlysses, o.cp = 4, o.forward_flops_per_s = 1e12;
  const CpAttentionShape six_heads{6, 6, 64, 1, 1, true}, two_kv{8, 2, 64, 1, 1, true};
  for (const CpAttentionShape& s : {six_heads, two_kv}) {
    const auto p = predict_cp_layer(t, s, 8192, o);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("ring"), std::string::npos) << p.status().message();
    EXPECT_FALSE(check_cp_heads(s, o).ok());
    EXPECT_TRUE(predict_cp_layer(t, s, 8192, ring(LayoutKind::kZigzag, 4)).ok());
  }
  o.method = CpMethod::kHybrid, o.ulysses = 2;  // 2 × 2 divides both
  EXPECT_TRUE(predict_cp_layer(t, two_kv, 8192, o).ok());
}

TEST(CpModel, MemoryPerRankScalesAsOneOverC) {
  const Topology t = *find_topology("h100-ib");
  const CpAttentionShape s{32, 32, 128, 32, 1, true};
  const int64_t seq = 65536;
  for (const CpMethod m : {CpMethod::kRing, CpMethod::kUlysses, CpMethod::kHybrid}) {
    CpPlanOptions o = ring(LayoutKind::kZigzag, 4);
    o.method = m, o.ulysses = 2;
    const double at4 = predict_cp_layer(t, s, seq, o).value().memory_bytes;
    o.cp = 8;
    if (m == CpMethod::kHybrid) o.ulysses = 4;  // the same ring of 2 across
    const double at8 = predict_cp_layer(t, s, seq, o).value().memory_bytes;
    EXPECT_NEAR(at4 / at8, 2.0, 1e-9) << cp_method_name(m);
  }
  // And the hand count of ring's: 4 q-sized + 4 kv-sized local tensors + lse, plus backward's
  // five K/V blocks, its lse slabs and one segment's dq, dk, dv partials.
  const int c = 4;
  const double tl = seq / c, seg = tl / 2, b = 2, D = 128, H = 32;
  const double expected = tl * (8 * H * D * b + H * 4) + 5 * 2 * tl * H * D * b + tl * H * 4 + seg * 3 * H * D * b;
  EXPECT_DOUBLE_EQ(predict_cp_layer(t, s, seq, ring(LayoutKind::kZigzag, c)).value().memory_bytes, expected);
}

TEST(CpModel, ArgumentsAreChecked) {
  const Topology t = *find_topology("h100-node");
  const CpAttentionShape s{8, 8, 64, 1, 1, true};
  EXPECT_FALSE(predict_cp_layer(t, s, 8190, ring(LayoutKind::kZigzag, 4)).ok());   // 2C ∤ T
  EXPECT_FALSE(predict_cp_layer(t, s, 8192, ring(LayoutKind::kZigzag, 16)).ok());  // 8 GPUs
  CpPlanOptions none = ring(LayoutKind::kZigzag, 2);
  none.forward_flops_per_s = 0;
  EXPECT_FALSE(predict_cp_layer(t, s, 8192, none).ok());
}

}  // namespace
}  // namespace kiln::perf
