// Tensor parallelism's collective counts and per-layer prediction (tp_model.h).
#include "kiln/perf/tp_model.h"

namespace kiln::perf {

TpCollectives tp_block_collectives(Pass pass, bool sp) {
  if (!sp) return {2, 0, 0};
  return pass == Pass::kForward ? TpCollectives{0, 2, 2} : TpCollectives{0, 4, 2};
}

TpCollectives tp_edge_collectives(Pass /*pass*/, bool sp) {
  // Forward: embedding (AR | RS) + final norm (SP: AG). Backward: head (AR | RS) + embedding
  // gradient (SP: AG). The same shape both ways.
  return sp ? TpCollectives{0, 1, 1} : TpCollectives{1, 0, 0};
}

TensorParallelTraffic tp_traffic_formula(const ModelConfig& c, int tp, bool sp, int64_t rows,
                                         CheckpointMode ckpt) {
  TensorParallelTraffic t;
  if (tp <= 1) return t;
  const int64_t buffer_bytes = rows * c.d_model * static_cast<int64_t>(sizeof(float));
  const int64_t recomputed = ckpt == CheckpointMode::kFull ? c.n_layers - 1 : 0;
  auto add = [&](const TpCollectives& k, int64_t times) {
    t.all_reduce_bytes += times * k.all_reduce * buffer_bytes;
    t.all_gather_bytes += times * k.all_gather * buffer_bytes;
    t.reduce_scatter_bytes += times * k.reduce_scatter * buffer_bytes;
  };
  add(tp_block_collectives(Pass::kForward, sp), c.n_layers + recomputed);
  add(tp_block_collectives(Pass::kBackward, sp), c.n_layers);
  add(tp_edge_collectives(Pass::kForward, sp), 1);
  add(tp_edge_collectives(Pass::kBackward, sp), 1);
  t.cross_entropy_bytes = 3 * rows * static_cast<int64_t>(sizeof(float));
  return t;
}

double block_forward_flops(const TpLayerShape& s) {
  const double B = static_cast<double>(s.batch), T = static_cast<double>(s.seq);
  const double h = static_cast<double>(s.d_model), f = static_cast<double>(s.ffn);
  return 2 * B * T * (3 * h * h + h * h + 2 * h * f) + 4 * B * T * T * h;
}

Expected<TpLayerPrediction> predict_tp_layer(const Topology& t, const TpLayerShape& s, int tp,
                                             const TpPlanOptions& o) {
  if (tp < 1 || s.n_heads % tp != 0 || s.ffn % tp != 0)
    return invalid_argument("[plan tp] tp {} must be >= 1 and divide the heads ({}) and the FFN width ({})",
                            tp, s.n_heads, s.ffn);
  if (tp > t.max_ranks)
    return invalid_argument("[plan tp] topology {} has at most {} ranks, tp is {}", t.name, t.max_ranks, tp);
  if (!(o.flops_per_s > 0) || !(o.gemm_efficiency > 0))
    return invalid_argument("[plan tp] topology {} names no device peak: give --tflops", t.name);
  TpLayerPrediction p;
  p.tp = tp;
  const double passes = o.recompute ? 4 : 3;  // backward is 2 forwards of matmuls
  p.gemm_s = passes * block_forward_flops(s) / tp / (o.flops_per_s * o.gemm_efficiency);
  if (tp == 1) return p;
  TpCollectives k = tp_block_collectives(Pass::kForward, o.sp);
  const TpCollectives bwd = tp_block_collectives(Pass::kBackward, o.sp);
  const int64_t forwards = o.recompute ? 2 : 1;
  k = {forwards * k.all_reduce + bwd.all_reduce, forwards * k.all_gather + bwd.all_gather,
       forwards * k.reduce_scatter + bwd.reduce_scatter};
  const double bytes = static_cast<double>(s.batch * s.seq * s.d_model) * o.bytes_per_element;
  const std::pair<ModelOp, int64_t> ops[] = {{ModelOp::kAllReduce, k.all_reduce},
                                             {ModelOp::kAllGather, k.all_gather},
                                             {ModelOp::kReduceScatter, k.reduce_scatter}};
  for (const auto& [op, count] : ops) {
    if (count == 0) continue;
    KILN_ASSIGN_OR_RETURN(const std::vector<CommPrediction> preds, predict_comm(t, op, tp, bytes));
    const CommPrediction* best = &preds.front();
    for (const CommPrediction& c : preds)
      if (c.seconds < best->seconds) best = &c;
    p.comm_s += static_cast<double>(count) * best->seconds;
    p.algos += (p.algos.empty() ? "" : ",") + std::string(model_op_name(op)) + ":" + best->algo;
  }
  p.efficiency = p.gemm_s / (p.gemm_s + p.comm_s);
  return p;
}

}  // namespace kiln::perf
