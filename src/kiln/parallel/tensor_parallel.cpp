// Tensor parallelism's plan (tensor_parallel.h).
#include "kiln/parallel/tensor_parallel.h"

#include <algorithm>
#include <map>

#include "kiln/comm/collectives.h"

namespace kiln::parallel {

Status check_tensor_parallel(const TensorParallelOptions& o, const ModelConfig& c, int world,
                             const DataParallelOptions& dp, const TrainOptions& train) {
  if (o.tp < 1) return invalid_argument("--tp {} must be >= 1", o.tp);
  if (world % o.tp != 0)
    return invalid_argument("--tp {} does not divide the {} ranks of this job: dp × tp must be the world", o.tp, world);
  if (Status s = check_tensor_split(c, o.tp); !s.ok()) return invalid_argument("--tp {}: {}", o.tp, s.message());
  if (o.sequence_parallel && o.tp > 1 && train.seq_len % o.tp != 0)
    return invalid_argument("--sp splits the sequence over --tp {} ranks: --seq {} must be a multiple of it", o.tp,
                            train.seq_len);
  if (o.tp > 1 && dp.zero != 0)
    return invalid_argument("--tp {} composes with DDP (--zero 0) only; ZeRO/FSDP over tensor-parallel shards is not "
                            "implemented (got --zero {})", o.tp, dp.zero);
  return {};
}

Expected<std::unique_ptr<TensorParallelPlan>> TensorParallelPlan::create(comm::Communicator& world,
                                                                         const TensorParallelOptions& o,
                                                                         const DataParallelOptions& dp,
                                                                         const ModelConfig& config,
                                                                         const TrainOptions& train) {
  KILN_RETURN_IF_ERROR(check_tensor_parallel(o, config, world.size(), dp, train));
  KILN_RETURN_IF_ERROR(check_data_parallel(dp, world.size() / o.tp, train));
  std::unique_ptr<TensorParallelPlan> p(new TensorParallelPlan());
  p->o_ = o;
  KILN_ASSIGN_OR_RETURN(p->mesh_, comm::DeviceMesh::create(world, {{"dp", world.size() / o.tp}, {"tp", o.tp}}));
  p->mesh_->comm("tp").set_auto_probe(false);  // the same algorithm at every size: reproducible sums
  KILN_ASSIGN_OR_RETURN(p->data_, DataParallelPlan::create(p->mesh_->comm("dp"), dp, train));
  return p;
}

TensorParallelPlan::~TensorParallelPlan() = default;

TensorShard TensorParallelPlan::shard() {
  TensorShard s;
  s.rank = mesh_->coord("tp");
  s.size = mesh_->size("tp");
  s.comm = s.size > 1 ? &mesh_->comm("tp") : nullptr;
  s.sequence_parallel = o_.sequence_parallel && s.size > 1;
  return s;
}

void TensorParallelPlan::attach(Transformer& model) {
  KILN_CHECK_MSG(model.tensor_shard().size == mesh_->size("tp") && model.tensor_shard().rank == mesh_->coord("tp"),
                 "the model is built for tp shard {} of {}, the mesh says {} of {}", model.tensor_shard().rank,
                 model.tensor_shard().size, mesh_->coord("tp"), mesh_->size("tp"));
  model_ = &model;
  data_->attach(model);
  // One all-reduce per replica-group size, over the ranks that hold the same values.
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> by_replicas;
  for (const ParamEntry& e : model.param_entries())
    if (e.split.partial_grad && e.split.replicas > 1) by_replicas[e.split.replicas].emplace_back(e.offset, e.shape.numel());
  const int rank = mesh_->coord("tp");
  for (auto& [replicas, ranges] : by_replicas) {
    PartialGroup g;
    g.ranges = std::move(ranges);
    int64_t n = 0;
    for (auto [off, len] : g.ranges) n += len;
    g.buf = Tensor::empty({std::max<int64_t>(n, 1)});
    auto split = mesh_->comm("tp").split(rank / replicas, rank);
    KILN_CHECK_MSG(split.ok(), "{}", split.status().to_string());
    g.comm = std::move(split).value();
    g.comm->set_auto_probe(false);
    partial_.push_back(std::move(g));
  }
}

void TensorParallelPlan::finish_gradients() {
  data_->finish_gradients();
  const double t0 = comm::now_seconds();
  float* grads = model_->grads().data();
  for (PartialGroup& g : partial_) {  // pack, sum over the replicas, unpack
    float* buf = g.buf.data<float>();
    int64_t at = 0;
    for (auto [off, n] : g.ranges) {
      std::copy_n(grads + off, n, buf + at);
      at += n;
    }
    const Status s = comm::all_reduce(*g.comm, buf, buf, at, DType::kF32, comm::ReduceOp::kSum);
    KILN_CHECK_MSG(s.ok(), "{}", s.to_string());
    at = 0;
    for (auto [off, n] : g.ranges) {
      std::copy_n(buf + at, n, grads + off);
      at += n;
    }
  }
  tp_seconds_ += comm::now_seconds() - t0;
}

double TensorParallelPlan::sum_over_shards(double x) {
  x = data_->sum_over_shards(x);
  if (mesh_->size("tp") == 1) return x;
  // Replicated values are in every holder's x: keep them on the first holder only.
  const int rank = mesh_->coord("tp");
  const float* grads = model_->grads().data();
  for (const ParamEntry& e : model_->param_entries()) {
    if (e.split.replicas == 1 || rank % e.split.replicas == 0) continue;
    for (int64_t i = 0; i < e.shape.numel(); ++i) x -= static_cast<double>(grads[e.offset + i]) * grads[e.offset + i];
  }
  return comm::all_reduce_scalar(mesh_->comm("tp"), x, MPI_SUM, "the gradient norm over the tp ranks");
}

// What the model counted is kept for take_tp_traffic(): the Trainer takes the comm times
// every step, and the bytes must not go with them.
void TensorParallelPlan::collect_tp_traffic() {
  const TensorParallelTraffic m = model_->take_tp_traffic();
  traffic_.all_reduce_bytes += m.all_reduce_bytes;
  traffic_.all_gather_bytes += m.all_gather_bytes;
  traffic_.reduce_scatter_bytes += m.reduce_scatter_bytes;
  traffic_.cross_entropy_bytes += m.cross_entropy_bytes;
  traffic_.logits_bytes += m.logits_bytes;
  traffic_.seconds += m.seconds;
  untimed_seconds_ += m.seconds;
}

TensorParallelTraffic TensorParallelPlan::take_tp_traffic() {
  collect_tp_traffic();
  const TensorParallelTraffic t = traffic_;
  traffic_ = {};
  return t;
}


double TensorParallelPlan::mean_over_data(double x) {
  x = data_->mean_over_data(x);
  comm::Communicator& tp = mesh_->comm("tp");
  return tp.size() == 1 ? x : comm::all_reduce_scalar(tp, x, MPI_SUM, "a mean over the tp ranks") / tp.size();
}

CommTimes TensorParallelPlan::take_comm_times() {
  CommTimes t = data_->take_comm_times();
  // The layers' collectives block the layer that calls them: all of their time is exposed.
  collect_tp_traffic();
  const double tp = untimed_seconds_ + tp_seconds_;
  untimed_seconds_ = tp_seconds_ = 0;
  t.comm_seconds += tp;
  t.exposed_seconds += tp;
  // The data plan's waits include handing calls to its thread; exposed time is at most the
  // communication itself.
  t.exposed_seconds = std::min(t.exposed_seconds, t.comm_seconds);
  return t;
}

std::string TensorParallelPlan::describe() const {
  std::string s = fmt::format("tp {}", mesh_->size("tp"));
  if (o_.sequence_parallel && mesh_->size("tp") > 1) s += " + sequence parallel";
  return fmt::format("{} × {}", data_->describe(), s);
}

std::vector<OptimizerPiece> TensorParallelPlan::mapped_pieces(const std::vector<OptimizerPiece>& local,
                                                             bool every_entry) const {
  // Each piece lies inside one entry (the data plan's pieces never cross one); its values are
  // that entry's runs, each a piece at its whole-model offset with the piece's state beside it.
  std::vector<OptimizerPiece> out;
  const int rank = mesh_->coord("tp");
  const std::vector<ParamEntry>& entries = model_->param_entries();
  for (const OptimizerPiece& p : local) {
    const auto e = std::find_if(entries.begin(), entries.end(), [&](const ParamEntry& x) {
      return p.flat_begin >= x.offset && p.flat_begin < x.offset + x.shape.numel();
    });
    KILN_CHECK(e != entries.end());
    if (!every_entry && rank % e->split.replicas != 0) continue;  // a replica is written by its first holder
    for_each_entry_run(*e, [&](int64_t run, int64_t full, int64_t n) {
      const int64_t lo = std::max(run, p.flat_begin), hi = std::min(run + n, p.flat_begin + p.n);
      if (lo >= hi) return;
      const int64_t d = lo - p.flat_begin;
      out.push_back({p.params + d, p.grads + d, hi - lo, p.state_offset + d, full + (lo - run), p.decay});
    });
  }
  return out;
}

std::vector<OptimizerPiece> TensorParallelPlan::checkpoint_pieces() const {
  return mapped_pieces(data_->checkpoint_pieces(), false);  // the data plan tiles its ranks' state once
}

std::vector<OptimizerPiece> TensorParallelPlan::restore_pieces() const {
  const std::span<const OptimizerPiece> mine = data_->pieces();
  return mapped_pieces({mine.begin(), mine.end()}, true);
}

std::vector<float> TensorParallelPlan::gather_full(std::span<const float> local) const {
  std::vector<float> full(static_cast<size_t>(model_->full_num_params()), 0.0f);
  const int rank = mesh_->coord("tp");
  for (const ParamEntry& e : model_->param_entries()) {
    if (rank % e.split.replicas != 0) continue;  // each value once: the sum below assembles them
    for_each_entry_run(e, [&](int64_t l, int64_t f, int64_t n) { std::copy_n(local.data() + l, n, full.data() + f); });
  }
  const Status s = comm::all_reduce(mesh_->comm("tp"), full.data(), full.data(), static_cast<int64_t>(full.size()),
                                    DType::kF32, comm::ReduceOp::kSum);
  KILN_CHECK_MSG(s.ok(), "{}", s.to_string());
  return full;
}

}  // namespace kiln::parallel
