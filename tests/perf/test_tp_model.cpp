// `kiln plan tp`'s arithmetic (perf/tp_model.h): the block FLOP count against Megatron's
// 24·B·T·h² + 4·B·T²·h, the GEMM time at the peak, the TP collectives priced with
// comm_model's fastest algorithm at the counts the layers run, and the traffic formula by
// hand. (tests/parallel/test_tp_traffic.cpp holds the formula against real tp > 1 steps.)
#include <gtest/gtest.h>

#include <algorithm>

#include "kiln/perf/tp_model.h"

namespace kiln::perf {
namespace {

double fastest(const Topology& t, ModelOp op, int p, double bytes) {
  const auto v = predict_comm(t, op, p, bytes).value();
  double best = v.front().seconds;
  for (const CommPrediction& c : v) best = std::min(best, c.seconds);
  return best;
}

TEST(TpModel, BlockFlopsAreMegatronsCount) {
  const TpLayerShape s{3072, 32, 4 * 3072, 1024, 8};
  const double B = 8, T = 1024, h = 3072;
  EXPECT_DOUBLE_EQ(block_forward_flops(s), 24 * B * T * h * h + 4 * B * T * T * h);
}

TEST(TpModel, OneRankHasNoCommunicationAndRunsAtThePeak) {
  const Topology t = *find_topology("h100-node");
  const TpLayerShape s;
  TpPlanOptions o;
  o.flops_per_s = t.peak_flops;
  const TpLayerPrediction p = predict_tp_layer(t, s, 1, o).value();
  EXPECT_EQ(p.comm_s, 0);
  EXPECT_EQ(p.efficiency, 1);
  EXPECT_DOUBLE_EQ(p.gemm_s, 3 * block_forward_flops(s) / t.peak_flops);
}

TEST(TpModel, CollectivesAreTheLayersCountsAtTheFastestAlgorithm) {
  const Topology t = *find_topology("h100-node");
  const TpLayerShape s;
  const double bytes = 2.0 * s.batch * s.seq * s.d_model;
  TpPlanOptions o;
  o.flops_per_s = t.peak_flops;
  for (int tp : {2, 4, 8}) {
    const TpLayerPrediction plain = predict_tp_layer(t, s, tp, o).value();
    EXPECT_NEAR(plain.comm_s, 4 * fastest(t, ModelOp::kAllReduce, tp, bytes), 1e-15) << tp;
    EXPECT_DOUBLE_EQ(plain.gemm_s, 3 * block_forward_flops(s) / tp / t.peak_flops);
    EXPECT_DOUBLE_EQ(plain.efficiency, plain.gemm_s / (plain.gemm_s + plain.comm_s));
    TpPlanOptions sp = o;
    sp.sp = true;
    EXPECT_NEAR(predict_tp_layer(t, s, tp, sp).value().comm_s,
                6 * fastest(t, ModelOp::kAllGather, tp, bytes) + 4 * fastest(t, ModelOp::kReduceScatter, tp, bytes),
                1e-15) << tp;
    TpPlanOptions re = o;
    re.recompute = true;
    const TpLayerPrediction r = predict_tp_layer(t, s, tp, re).value();
    EXPECT_NEAR(r.comm_s, 6 * fastest(t, ModelOp::kAllReduce, tp, bytes), 1e-15) << tp;
    EXPECT_DOUBLE_EQ(r.gemm_s, 4 * block_forward_flops(s) / tp / t.peak_flops);
  }
}

TEST(TpModel, BadSplitsAndMissingPeaksAreNamed) {
  const Topology node = *find_topology("h100-node");
  TpPlanOptions o;
  o.flops_per_s = node.peak_flops;
  const auto three = predict_tp_layer(node, TpLayerShape{}, 3, o);
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.status().message().find("heads (32)"), std::string::npos);
  EXPECT_FALSE(predict_tp_layer(node, TpLayerShape{}, 16, o).ok());  // 8 GPUs in the node
  const Topology torus = *find_topology("tpu-torus-2d");
  EXPECT_EQ(torus.peak_flops, 0);
  const auto no_peak = predict_tp_layer(torus, TpLayerShape{}, 2, TpPlanOptions{});
  ASSERT_FALSE(no_peak.ok());
  EXPECT_NE(no_peak.status().message().find("--tflops"), std::string::npos);
}

TEST(TpModel, TrafficFormulaByHand) {
  ModelConfig c;
  c.n_layers = 2;
  c.d_model = 4;
  const int64_t rows = 10, buffer = rows * 4 * 4;  // rows × d_model fp32
  EXPECT_EQ(tp_traffic_formula(c, 1, false, rows).all_reduce_bytes, 0);
  const TensorParallelTraffic plain = tp_traffic_formula(c, 2, false, rows);
  EXPECT_EQ(plain.all_reduce_bytes, (2 * 2 + 2 * 2 + 2) * buffer);  // blocks fwd, bwd; embedding, head
  EXPECT_EQ(plain.all_gather_bytes + plain.reduce_scatter_bytes, 0);
  EXPECT_EQ(plain.cross_entropy_bytes, 3 * rows * 4);
  const TensorParallelTraffic sp = tp_traffic_formula(c, 2, true, rows);
  EXPECT_EQ(sp.all_reduce_bytes, 0);
  EXPECT_EQ(sp.all_gather_bytes, (2 * 2 + 4 * 2 + 2) * buffer);
  EXPECT_EQ(sp.reduce_scatter_bytes, (2 * 2 + 2 * 2 + 2) * buffer);
  // Full checkpointing re-runs block 0's forward (the last block's is still in its buffers).
  EXPECT_EQ(tp_traffic_formula(c, 2, false, rows, CheckpointMode::kFull).all_reduce_bytes,
            plain.all_reduce_bytes + 2 * buffer);
}

}  // namespace
}  // namespace kiln::perf
