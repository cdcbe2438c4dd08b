// Expert parallelism's plan (expert_parallel.h).
#include "kiln/parallel/expert_parallel.h"

#include <algorithm>

#include "kiln/comm/collectives.h"
#include "kiln/comm/work.h"

namespace kiln::parallel {

Status check_expert_parallel(const ExpertParallelOptions& o, const ModelConfig& c, int world,
                             const DataParallelOptions& dp, const TrainOptions& train) {
  if (!c.is_moe()) return invalid_argument("--ep shards the experts of a MoE model; this model has none (num_experts 0)");
  if (o.ep < 1) return invalid_argument("--ep {} must be >= 1", o.ep);
  if (world % o.ep != 0)
    return invalid_argument("--ep {} does not divide the {} ranks of this job: edp × ep must be the world", o.ep, world);
  if (Status s = check_expert_split(c, o.ep); !s.ok()) return invalid_argument("--ep {}: {}", o.ep, s.message());
  if (o.chunks < 1) return invalid_argument("--ep-chunks {} must be >= 1", o.chunks);
  if (train.batch % world != 0)
    return invalid_argument("--batch {} does not split over the {} data-parallel ranks", train.batch, world);
  if (dp.zero != 0 || dp.shard_group != 0)
    return invalid_argument("--ep composes with DDP (--zero 0) only; ZeRO/FSDP over expert shards is not implemented "
                            "(got --zero {})", dp.zero);
  if (dp.reduce_dtype != DType::kF32)
    return invalid_argument("--ep reduces gradients in f32; --reduce-dtype bf16 is not implemented with it");
  return {};
}

Expected<std::unique_ptr<ExpertParallelPlan>> ExpertParallelPlan::create(comm::Communicator& world,
                                                                         const ExpertParallelOptions& o,
                                                                         const DataParallelOptions& dp,
                                                                         const ModelConfig& config,
                                                                         const TrainOptions& train) {
  KILN_RETURN_IF_ERROR(check_expert_parallel(o, config, world.size(), dp, train));
  std::unique_ptr<ExpertParallelPlan> p(new ExpertParallelPlan());
  p->o_ = o;
  KILN_ASSIGN_OR_RETURN(p->mesh_, comm::DeviceMesh::create(world, {{"edp", world.size() / o.ep}, {"ep", o.ep}}));
  // Communicators of their own: the routing statistics are MPI calls of the compute thread, the
  // gradient all-reduces the plan's; neither queues behind the ep group's all-to-alls.
  KILN_ASSIGN_OR_RETURN(p->batch_, world.split(0, world.rank()));
  KILN_ASSIGN_OR_RETURN(p->dense_, world.split(0, world.rank()));
  for (comm::Communicator* c : {p->dense_.get(), &p->mesh_->comm("edp")}) c->set_auto_probe(false);
  return p;
}

ExpertParallelPlan::~ExpertParallelPlan() = default;

ExpertShard ExpertParallelPlan::shard() {
  ExpertShard s;
  s.rank = mesh_->coord("ep");
  s.size = mesh_->size("ep");
  s.comm = s.size > 1 ? &mesh_->comm("ep") : nullptr;
  s.batch = batch_.get();
  s.chunks = s.size > 1 ? o_.chunks : 1;
  return s;
}

void ExpertParallelPlan::attach(Transformer& model) {
  const ExpertShard& s = model.expert_shard();
  KILN_CHECK_MSG(s.size == mesh_->size("ep") && s.rank == mesh_->coord("ep") && s.batch == batch_.get(),
                 "the model is built for expert shard {} of {}, the mesh says {} of {}", s.rank, s.size,
                 mesh_->coord("ep"), mesh_->size("ep"));
  model_ = &model;
  model.set_hooks(this);
  pieces_ = whole_model_pieces(model);
  int64_t nd = 0, ne = 0;
  for (const ParamEntry& e : model.param_entries()) {
    auto& ranges = e.split.expert ? expert_ranges_ : dense_ranges_;
    ranges.emplace_back(e.offset, e.shape.numel());
    (e.split.expert ? ne : nd) += e.shape.numel();
  }
  dense_buf_ = Tensor::empty({std::max<int64_t>(nd, 1)});
  expert_buf_ = Tensor::empty({std::max<int64_t>(ne, 1)});
}

void ExpertParallelPlan::finish_gradients() {
  const double t0 = comm::now_seconds();
  float* grads = model_->grads().data();
  // Pack the ranges, reduce, unpack (scaled by `scale`).
  auto reduce = [&](const std::vector<std::pair<int64_t, int64_t>>& ranges, Tensor& buf, comm::Communicator& c,
                    comm::ReduceOp op, float scale) {
    float* b = buf.data<float>();
    int64_t at = 0;
    for (auto [off, n] : ranges) {
      std::copy_n(grads + off, n, b + at);
      at += n;
    }
    if (at == 0) return;
    if (c.size() > 1) {
      const Status s = comm::all_reduce(c, b, b, at, DType::kF32, op);
      KILN_CHECK_MSG(s.ok(), "{}", s.to_string());
    }
    at = 0;
    for (auto [off, n] : ranges) {
      for (int64_t i = 0; i < n; ++i) grads[off + i] = b[at + i] * scale;
      at += n;
    }
  };
  reduce(dense_ranges_, dense_buf_, *dense_, comm::ReduceOp::kAvg, 1.0f);
  // An expert's gradient is its ep group's tokens' (each source rank's share): summed over the
  // replicas, over every data rank's share of the mean.
  reduce(expert_ranges_, expert_buf_, mesh_->comm("edp"), comm::ReduceOp::kSum,
         1.0f / static_cast<float>(mesh_->world().size()));
  comm_seconds_ += comm::now_seconds() - t0;
}

double ExpertParallelPlan::sum_over_shards(double x) {
  comm::Communicator& ep = mesh_->comm("ep");
  if (ep.size() == 1) return x;
  // Experts differ over the ep group: their squares summed over it, the replicated ones once.
  const float* grads = model_->grads().data();
  double experts = 0;
  for (auto [off, n] : expert_ranges_)
    for (int64_t i = 0; i < n; ++i) experts += static_cast<double>(grads[off + i]) * grads[off + i];
  return x - experts + comm::all_reduce_scalar(ep, experts, MPI_SUM, "the experts' gradient norm over the ep ranks");
}

double ExpertParallelPlan::mean_over_data(double x) {
  return comm::all_reduce_scalar(*dense_, x, MPI_SUM, "a mean over the data-parallel ranks") / dense_->size();
}

CommTimes ExpertParallelPlan::take_comm_times() {
  CommTimes t;
  t.comm_seconds = t.exposed_seconds = comm_seconds_;  // after the backward: all exposed
  comm_seconds_ = 0;
  return t;
}

std::string ExpertParallelPlan::describe() const {
  return fmt::format("ep {} × edp {} (DDP over {} ranks, {} dispatch chunks)", mesh_->size("ep"), mesh_->size("edp"),
                     mesh_->world().size(), mesh_->size("ep") > 1 ? o_.chunks : 1);
}

std::vector<OptimizerPiece> ExpertParallelPlan::mapped_pieces(bool every_entry) const {
  std::vector<OptimizerPiece> out;
  const bool first_replica = mesh_->coord("edp") == 0, first_rank = mesh_->world().rank() == 0;
  const std::vector<ParamEntry>& entries = model_->param_entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    const ParamEntry& e = entries[i];
    if (!every_entry && !(e.split.expert ? first_replica : first_rank)) continue;
    OptimizerPiece p = pieces_[i];
    p.flat_begin = e.split.full_offset;
    out.push_back(p);
  }
  return out;
}

std::vector<OptimizerPiece> ExpertParallelPlan::checkpoint_pieces() const { return mapped_pieces(false); }
std::vector<OptimizerPiece> ExpertParallelPlan::restore_pieces() const { return mapped_pieces(true); }

std::vector<float> ExpertParallelPlan::gather_full(std::span<const float> local) const {
  std::vector<float> full(static_cast<size_t>(model_->full_num_params()), 0.0f);
  for (const OptimizerPiece& p : mapped_pieces(false))
    std::copy_n(local.data() + p.state_offset, p.n, full.data() + p.flat_begin);
  const Status s = comm::all_reduce(*dense_, full.data(), full.data(), static_cast<int64_t>(full.size()), DType::kF32,
                                    comm::ReduceOp::kSum);
  KILN_CHECK_MSG(s.ok(), "{}", s.to_string());
  return full;
}

}  // namespace kiln::parallel
