// Context parallelism's plan (context_parallel_plan.h).
#include "kiln/parallel/context_parallel_plan.h"

#include <algorithm>
#include <cstring>
#include <optional>

namespace kiln::parallel {

std::string_view cp_method_name(CpMethod m) {
  return m == CpMethod::kRing ? "ring" : m == CpMethod::kUlysses ? "ulysses" : "hybrid";
}

Expected<CpMethod> parse_cp_method(std::string_view name) {
  if (name == "ring") return CpMethod::kRing;
  if (name == "ulysses") return CpMethod::kUlysses;
  if (name == "hybrid") return CpMethod::kHybrid;
  return invalid_argument("context-parallel method '{}' (ring, ulysses or hybrid)", name);
}

Status check_context_parallel(const ContextParallelOptions& o, const TensorParallelOptions& tensor, const ModelConfig& c,
                              int world, const DataParallelOptions& dp, const TrainOptions& train) {
  if (o.cp < 1) return invalid_argument("--cp {} must be >= 1", o.cp);
  const int tp = std::max(1, tensor.tp);
  if (world % (o.cp * tp) != 0)
    return invalid_argument("--cp {} × --tp {} does not divide the {} ranks of this job: dp × cp × tp must be the world",
                            o.cp, tp, world);
  if (!c.is_llama() || c.is_mla() || c.is_moe())
    return invalid_argument("--cp runs a dense Llama-family model with multi-head attention (not MLA or MoE: {})",
                            c.describe());
  // Ulysses moves whole heads of this tensor shard: n_heads / tp of them, split again over cp.
  if (o.method == CpMethod::kUlysses && (c.n_heads % (tp * o.cp) != 0 || c.n_kv_heads % (tp * o.cp) != 0))
    return invalid_argument("--cp-method ulysses shards the heads: --cp {} × --tp {} must divide n_heads ({}) and "
                            "n_kv_heads ({}); use --cp-method ring", o.cp, tp, c.n_heads, c.n_kv_heads);
  if (o.method == CpMethod::kHybrid &&
      (o.ulysses < 2 || o.cp % o.ulysses != 0 || c.n_heads % (tp * o.ulysses) != 0 || c.n_kv_heads % (tp * o.ulysses) != 0))
    return invalid_argument("--cp-method hybrid runs Ulysses over --cp-ulysses {} ranks inside a ring over the rest: it "
                            "must be >= 2 and divide --cp {}, and × --tp {} divide n_heads ({}) and n_kv_heads ({})",
                            o.ulysses, o.cp, tp, c.n_heads, c.n_kv_heads);
  const int64_t chunks = o.layout == LayoutKind::kZigzag ? 2 * o.cp : o.cp;
  if (train.seq_len % chunks != 0)
    return invalid_argument("--cp {} with the {} layout cuts --seq {} into {} chunks: it must be a multiple of {}", o.cp,
                            layout_kind_name(o.layout), train.seq_len, chunks, chunks);
  if (tp > 1) {  // the tensor split of the rows a rank holds: T / cp of each sequence
    TrainOptions local = train;
    local.seq_len = train.seq_len / o.cp;
    KILN_RETURN_IF_ERROR(check_tensor_parallel(tensor, c, world / o.cp, dp, local));
  }
  const int dp_size = world / (o.cp * tp);
  if (train.batch % dp_size != 0)
    return invalid_argument("--batch {} does not split over the {} data-parallel ranks", train.batch, dp_size);
  if (dp.zero != 0 || dp.shard_group != 0)
    return invalid_argument("--cp composes with DDP (--zero 0) only; ZeRO/FSDP with context parallelism is not "
                            "implemented (got --zero {})", dp.zero);
  if (train.checkpoint != CheckpointMode::kNone)
    return invalid_argument("--cp with activation checkpointing is not implemented (the recomputed attention is a "
                            "collective); use --checkpoint none");
  return {};
}

// The model's sequence attention: ring (contiguous or zig-zag) or Ulysses over the cp group. A
// failure is a broken invariant here (the plan checked every shape before the first step).
class ContextParallelPlan::Attention final : public SequenceAttention {
 public:
  // comm: the cp group (ring, Ulysses); the hybrid's two groups in `hybrid`.
  Attention(comm::Communicator* comm, std::optional<HybridGroups> hybrid, const SequenceLayout& layout,
            CpMethod method)
      : comm_(comm), hybrid_(hybrid), layout_(layout), method_(method) {}
  void forward(float* out, float* lse, const float* q, const float* k, const float* v,
               const AttentionParams& local) const override {
    CpStats s;
    const Status st =
        method_ == CpMethod::kRing      ? ring_attention_forward(*comm_, layout_, out, lse, q, k, v, local, &s)
        : method_ == CpMethod::kUlysses ? ulysses_attention_forward(*comm_, layout_, out, lse, q, k, v, local, &s)
                                        : hybrid_attention_forward(*hybrid_, layout_, out, lse, q, k, v, local, &s);
    KILN_CHECK_MSG(st.ok(), "context-parallel attention: {}", st.to_string());
    stats_.add(s);
  }
  void backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                const float* out, const float* lse, const AttentionParams& local) const override {
    CpStats s;
    const Status st =
        method_ == CpMethod::kRing
            ? ring_attention_backward(*comm_, layout_, dq, dk, dv, dout, q, k, v, out, lse, local, &s)
        : method_ == CpMethod::kUlysses
            ? ulysses_attention_backward(*comm_, layout_, dq, dk, dv, dout, q, k, v, out, lse, local, &s)
            : hybrid_attention_backward(*hybrid_, layout_, dq, dk, dv, dout, q, k, v, out, lse, local, &s);
    KILN_CHECK_MSG(st.ok(), "context-parallel attention backward: {}", st.to_string());
    stats_.add(s);
  }
  CpStats take() const { return std::exchange(stats_, CpStats{}); }

 private:
  comm::Communicator* comm_;
  std::optional<HybridGroups> hybrid_;
  const SequenceLayout& layout_;
  CpMethod method_;
  mutable CpStats stats_;
};

Expected<std::unique_ptr<ContextParallelPlan>> ContextParallelPlan::create(comm::Communicator& world,
                                                                           const ContextParallelOptions& o,
                                                                           const TensorParallelOptions& tensor,
                                                                           const DataParallelOptions& dp,
                                                                           const ModelConfig& config,
                                                                           const TrainOptions& train) {
  KILN_RETURN_IF_ERROR(check_context_parallel(o, tensor, config, world.size(), dp, train));
  std::unique_ptr<ContextParallelPlan> p(new ContextParallelPlan());
  p->o_ = o;
  const int tp = std::max(1, tensor.tp);
  const bool hybrid = o.method == CpMethod::kHybrid;
  const int ring = hybrid ? o.cp / o.ulysses : o.cp;
  KILN_ASSIGN_OR_RETURN(p->layout_, SequenceLayout::create(o.layout, train.seq_len, ring));
  if (hybrid) {
    KILN_ASSIGN_OR_RETURN(p->layout_, SequenceLayout::hybrid(p->layout_, o.ulysses));
  }
  // The hybrid's cp axis is (cp_ring, cp_ulysses): layout rank g·U + m is ring shard g, part m.
  std::vector<comm::MeshAxis> axes = {{"dp", world.size() / (o.cp * tp)}};
  if (hybrid) {
    axes.push_back({"cp_ring", ring});
    axes.push_back({"cp_ulysses", o.ulysses});
  } else {
    axes.push_back({"cp", o.cp});
  }
  axes.push_back({"tp", tp});
  KILN_ASSIGN_OR_RETURN(p->mesh_, comm::DeviceMesh::create(world, std::move(axes)));
  // The gradients: each rank's loss is its tokens' mean, so DDP over the dp × cp ranks averages
  // them. Its check wants the batch split over those ranks; the rows are split over dp only (the
  // cp ranks of a group share them), so it is shown the batch it would split the same way. The
  // tensor plan's mesh (dp × cp, tp) has the same tp groups as this one: tp is fastest in both.
  TrainOptions every_rank = train;
  every_rank.batch = train.batch * o.cp;
  if (tp > 1) {
    KILN_ASSIGN_OR_RETURN(auto t, TensorParallelPlan::create(world, tensor, dp, config, every_rank));
    p->tensor_ = t.get();
    p->inner_ = std::move(t);
  } else {
    KILN_ASSIGN_OR_RETURN(p->inner_, DataParallelPlan::create(world, dp, every_rank));
  }
  p->attention_ =
      hybrid ? std::make_unique<Attention>(nullptr, HybridGroups{p->mesh_->comm("cp_ring"), p->mesh_->comm("cp_ulysses")},
                                           p->layout_, o.method)
             : std::make_unique<Attention>(&p->mesh_->comm("cp"), std::nullopt, p->layout_, o.method);
  return p;
}

ContextParallelPlan::~ContextParallelPlan() = default;

int ContextParallelPlan::cp_rank() const {
  return o_.method == CpMethod::kHybrid ? mesh_->coord("cp_ring") * o_.ulysses + mesh_->coord("cp_ulysses")
                                        : mesh_->coord("cp");
}

ContextShard ContextParallelPlan::shard() const {
  ContextShard s;
  if (o_.cp == 1) return s;  // the whole sequence: one process's code
  for (const SequenceSegment& g : layout_.segments(cp_rank())) s.segments.emplace_back(g.start, g.len);
  s.attention = attention_.get();
  return s;
}

void ContextParallelPlan::attach(Transformer& model) {
  inner_->attach(model);
  model.set_hooks(this);
}

void ContextParallelPlan::local_rows(std::vector<int32_t>& out, const int32_t* in, int64_t rows, int64_t seq_len) const {
  KILN_CHECK_MSG(seq_len == layout_.seq_len(), "context parallelism is laid out for seq_len {}, got {}",
                 layout_.seq_len(), seq_len);
  out.clear();
  for (int64_t r = 0; r < rows; ++r)
    for (const SequenceSegment& g : layout_.segments(cp_rank()))
      out.insert(out.end(), in + r * seq_len + g.start, in + r * seq_len + g.start + g.len);
}

double ContextParallelPlan::forward_backward(Transformer& model, const int32_t* tokens, const int32_t* targets,
                                             int64_t rows, int64_t seq_len, float loss_scale) {
  if (o_.cp == 1) return ParallelPlan::forward_backward(model, tokens, targets, rows, seq_len, loss_scale);
  local_rows(x_, tokens, rows, seq_len);
  local_rows(y_, targets, rows, seq_len);
  return ParallelPlan::forward_backward(model, x_.data(), y_.data(), rows, layout_.local_len(), loss_scale);
}

double ContextParallelPlan::forward_loss(Transformer& model, const int32_t* tokens, const int32_t* targets, int64_t rows,
                                         int64_t seq_len) {
  if (o_.cp == 1) return ParallelPlan::forward_loss(model, tokens, targets, rows, seq_len);
  local_rows(x_, tokens, rows, seq_len);
  local_rows(y_, targets, rows, seq_len);
  return ParallelPlan::forward_loss(model, x_.data(), y_.data(), rows, layout_.local_len());
}

CommTimes ContextParallelPlan::take_comm_times() {
  CommTimes t = inner_->take_comm_times();
  const CpStats s = attention_->take();
  t.comm_seconds += s.comm_seconds;
  t.exposed_seconds += s.exposed_seconds;
  return t;
}

CpStats ContextParallelPlan::take_cp_stats() { return attention_->take(); }

std::string ContextParallelPlan::describe() const {
  return fmt::format("dp {} × cp {}{} ({}, {}; gradients: {})", mesh_->size("dp"), o_.cp,
                     tensor_ ? fmt::format(" × tp {}", mesh_->size("tp")) : std::string(), cp_method_name(o_.method),
                     layout_.describe(), inner_->describe());
}

}  // namespace kiln::parallel
