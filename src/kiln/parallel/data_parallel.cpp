// DDP, ZeRO-1/2/3 (FSDP) and HSDP as one plan (data_parallel.h).
#include "kiln/parallel/data_parallel.h"

#include <algorithm>
#include <cstring>

#include "kiln/train/precision_kernels.h"

namespace kiln::parallel {

using comm::Work;

namespace {
// bf16 reduction: gradients to the wire dtype (round to nearest even, the mixed-precision
// kernel of this CPU, on the calling thread) and back.
void to_bf16(uint16_t* out, const float* in, int64_t n) { precision_kernels_picked().to_bf16(out, in, n); }
void from_bf16(float* out, const uint16_t* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
}
}  // namespace

struct DataParallelPlan::Gathered {
  Tensor params;  // (S · chunk,) the unit's whole parameters once `gather` completed
  Work gather;
  Tensor grads;        // (S · chunk,) zeroed; the unit's gradient during backward (stage >= 2)
};

Status check_data_parallel(const DataParallelOptions& o, int dp, const TrainOptions& t) {
  if (o.zero < 0 || o.zero > 3) return invalid_argument("--zero {}: the ZeRO stage is 0, 1, 2 or 3", o.zero);
  if (dp < 1) return invalid_argument("--dp {} must be >= 1", dp);
  if (t.batch % dp != 0)
    return invalid_argument("--batch {} (the global batch) does not divide over --dp {} ranks", t.batch, dp);
  if (o.shard_group < 0) return invalid_argument("--hsdp {} must be >= 1", o.shard_group);
  if (o.shard_group > 0) {
    if (o.zero == 0) return invalid_argument("--hsdp {} shards within groups: it needs --zero 1, 2 or 3", o.shard_group);
    if (dp % o.shard_group != 0)
      return invalid_argument("--hsdp {} does not divide --dp {}: groups of {} ranks must tile the data-parallel ranks",
                              o.shard_group, dp, o.shard_group);
  }
  if (!(o.bucket_mb > 0) || o.bucket_mb > 1 << 16) return invalid_argument("--bucket-mb {} must be in (0, 65536]", o.bucket_mb);
  if (o.fsdp_unit_blocks < 1) return invalid_argument("--fsdp-unit {} must be >= 1 block", o.fsdp_unit_blocks);
  if (o.prefetch < 0) return invalid_argument("--prefetch {} must be >= 0", o.prefetch);
  if (o.reduce_dtype != DType::kF32 && o.reduce_dtype != DType::kBF16)
    return invalid_argument("--reduce-dtype {}: gradients are reduced as f32 or bf16", dtype_name(o.reduce_dtype));
  if (o.zero == 3 && t.precision != Precision::kF32)
    return invalid_argument("--zero 3 / --fsdp runs fp32 only (got --precision {}): the precision backends keep a "
                            "converted copy of every whole weight, which a sharded model does not have; use --zero 2",
                            precision_name(t.precision));
  return {};
}

Expected<std::unique_ptr<DataParallelPlan>> DataParallelPlan::create(comm::Communicator& world,
                                                                     const DataParallelOptions& o,
                                                                     const TrainOptions& train) {
  KILN_RETURN_IF_ERROR(check_data_parallel(o, world.size(), train));
  std::unique_ptr<DataParallelPlan> p(new DataParallelPlan(o));
  const int dp = world.size();
  const int shard = o.zero == 0 ? 1 : (o.shard_group > 0 ? o.shard_group : dp);
  KILN_ASSIGN_OR_RETURN(p->mesh_, comm::DeviceMesh::create(world, {{"replicate", dp / shard}, {"shard", shard}}));
  KILN_ASSIGN_OR_RETURN(p->dp_, world.split(0, world.rank()));
  p->shard_ = &p->mesh_->comm("shard");
  p->replicate_ = &p->mesh_->comm("replicate");
  // `auto` without probing: the algorithm depends on the size only, so a resumed run sums in
  // the same order as an uninterrupted one.
  for (comm::Communicator* c : {p->dp_.get(), p->shard_, p->replicate_}) c->set_auto_probe(false);
  return p;
}

DataParallelPlan::DataParallelPlan(const DataParallelOptions& o) : o_(o) {}

DataParallelPlan::~DataParallelPlan() {
  for (Pending& q : pending_) (void)q.work.wait();
  for (auto& g : gathered_)
    if (g) (void)g->gather.wait();
}

ParamRange DataParallelPlan::Unit::mine() const {
  const int64_t b = std::min(range.end, range.begin + shard_rank * chunk);
  return {b, std::min(range.end, b + chunk)};
}

void DataParallelPlan::build_units() {
  const int S = shard_->size();
  auto add = [&](ParamRange r, int64_t first, int64_t last) {
    Unit u;
    u.range = r;
    u.chunk = (r.size() + S - 1) / S;
    u.shard_rank = shard_->rank();
    u.shard_offset = units_.empty() ? 0 : units_.back().shard_offset + units_.back().chunk;
    u.first_block = first;
    u.last_block = last;
    units_.push_back(u);
  };
  const int64_t L = model_->num_blocks(), K = o_.fsdp_unit_blocks;
  add(model_->head_range(), -1, -1);
  for (int64_t l = 0; l < L; l += K) {
    const int64_t last = std::min(l + K, L) - 1;
    add({model_->block_range(l).begin, model_->block_range(last).end}, l, last);
  }
  add(model_->tail_range(), -1, -1);
  gathered_.clear();
  for (size_t i = 0; i < units_.size(); ++i) gathered_.push_back(std::make_unique<Gathered>());
}

void DataParallelPlan::build_pieces() {
  pieces_.clear();
  if (o_.zero == 0) {
    pieces_ = whole_model_pieces(*model_);
    state_size_ = model_->num_params();
    return;
  }
  for (const Unit& u : units_) {
    const ParamRange mine = u.mine();
    for (const ParamEntry& e : model_->param_entries()) {
      const int64_t a = std::max(mine.begin, e.offset), b = std::min(mine.end, e.offset + e.shape.numel());
      if (a >= b) continue;
      OptimizerPiece p;
      p.n = b - a;
      p.flat_begin = a;
      p.state_offset = u.shard_offset + (a - mine.begin);
      p.params = o_.zero == 3 ? param_shard_.data<float>() + p.state_offset : model_->params().data() + a;
      p.grads = o_.zero >= 2 ? grad_shard_.data<float>() + p.state_offset : model_->grads().data() + a;
      p.decay = e.decay;
      pieces_.push_back(p);
    }
  }
  state_size_ = shard_floats();
}

void DataParallelPlan::attach(Transformer& model) {
  model_ = &model;
  build_units();
  // Every rank starts from rank 0's parameters.
  if (Status s = comm::broadcast(*dp_, model.params().data(), model.num_params(), DType::kF32, 0); !s.ok())
    comm::abort_job(fmt::format("data parallel: broadcasting the parameters failed: {}", s.message()));
  if (o_.zero == 3) {
    param_shard_ = Tensor::zeros({shard_floats()});
    for (const Unit& u : units_) {
      const ParamRange m = u.mine();
      std::memcpy(param_shard_.data<float>() + u.shard_offset, model.params().data() + m.begin,
                  static_cast<size_t>(m.size()) * sizeof(float));
    }
    model.release_params();
  }
  if (o_.zero >= 2) {
    grad_shard_ = Tensor::zeros({shard_floats()});
    model.release_grads();
  }
  build_pieces();
  // DDP / ZeRO-1 buckets: whole parameters, from the last one back, until a bucket holds
  // bucket_mb (a parameter larger than that is a bucket of its own).
  buckets_.clear();
  if (o_.zero <= 1 && o_.reduce_dtype == DType::kBF16) reduce_stage_ = Tensor::empty({model.num_params()}, DType::kBF16);
  if (o_.zero <= 1) {
    const auto cap = static_cast<int64_t>(o_.bucket_mb * (1 << 20) / sizeof(float));
    const auto& entries = model.param_entries();
    int64_t end = model.num_params();
    for (size_t i = entries.size(); i-- > 0;) {
      const int64_t begin = entries[i].offset;
      if (end - begin >= cap || i == 0) {
        buckets_.push_back({begin, end});
        end = begin;
      }
    }
  }
}

int64_t DataParallelPlan::shard_floats() const { return units_.back().shard_offset + units_.back().chunk; }

int DataParallelPlan::unit_of_block(int64_t block) const {
  return 1 + static_cast<int>(block / o_.fsdp_unit_blocks);
}

void DataParallelPlan::wait(const Work& w) {
  const double t0 = comm::now_seconds();
  Status s = w.wait();
  exposed_seconds_ += comm::now_seconds() - t0;
  if (!s.ok()) comm::abort_job(fmt::format("data parallel: a collective failed: {}", s.message()));
}

void DataParallelPlan::reap(bool all) {
  std::erase_if(pending_, [&](Pending& q) {
    if (all) wait(q.work);
    return q.work.test();
  });
}

void DataParallelPlan::wait_until_one_pending() {
  reap(false);
  while (pending_.size() > 1) {
    wait(pending_.front().work);
    pending_.erase(pending_.begin());
  }
}

void DataParallelPlan::begin_step() {
  if (o_.zero <= 1) model_->zero_grad();
  else std::memset(grad_shard_.raw_data(), 0, static_cast<size_t>(grad_shard_.nbytes()));
}

void DataParallelPlan::begin_micro_batch(bool last) {
  reduce_this_micro_ = last || o_.zero >= 2;
  buckets_launched_ = 0;
}

void DataParallelPlan::launch_buckets(int64_t frontier) {
  float* g = model_->grads().data();
  while (buckets_launched_ < buckets_.size() && buckets_[buckets_launched_].begin >= frontier) {
    const ParamRange b = buckets_[buckets_launched_++];
    if (o_.reduce_dtype == DType::kF32) {
      pending_.push_back({comm::all_reduce_async(*dp_, g + b.begin, g + b.begin, b.size(), DType::kF32, comm::ReduceOp::kAvg), {}});
      continue;
    }
    uint16_t* stage = static_cast<uint16_t*>(reduce_stage_.raw_data()) + b.begin;
    comm::Communicator* c = dp_.get();
    pending_.push_back({dp_->comm_thread().submit([=]() -> Status {
                          to_bf16(stage, g + b.begin, b.size());
                          KILN_RETURN_IF_ERROR(comm::all_reduce(*c, stage, stage, b.size(), DType::kBF16, comm::ReduceOp::kAvg));
                          from_bf16(g + b.begin, stage, b.size());
                          return {};
                        }),
                        {}});
  }
}

void DataParallelPlan::grads_ready(ParamRange range) {
  if (o_.zero <= 1) {
    if (reduce_this_micro_ && o_.overlap) launch_buckets(range.begin);
    return;
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = units_[u];
    const bool root = unit.first_block < 0;
    // A root unit is its range; a block unit is final with its first block's backward.
    if ((root && unit.range.begin == range.begin && unit.range.end == range.end) ||
        (!root && range.begin == model_->block_range(unit.first_block).begin)) {
      reduce_unit_grads(static_cast<int>(u));
      return;
    }
  }
}

void DataParallelPlan::reduce_unit_grads(int u) {
  const Unit& unit = units_[static_cast<size_t>(u)];
  Gathered& g = *gathered_[static_cast<size_t>(u)];
  wait_until_one_pending();
  const int64_t chunk = unit.chunk, padded = chunk * shard_->size();
  const DType wire = o_.reduce_dtype;
  // The reduced chunk (in the wire dtype) and, for bf16, the padded gradient rounded to bf16.
  Tensor part = Tensor::empty({std::max<int64_t>(chunk, 1)}, wire);
  Tensor wire_copy = wire == DType::kBF16 ? Tensor::empty({std::max<int64_t>(padded, 1)}, wire) : Tensor();
  const float* full = g.grads.data<float>();
  void* send = wire == DType::kBF16 ? wire_copy.raw_data() : g.grads.raw_data();
  void* recv = part.raw_data();
  float* shard = grad_shard_.data<float>() + unit.shard_offset;
  comm::Communicator* sc = shard_;
  comm::Communicator* rc = replicate_;
  // Reduce-scatter in the shard group, all-reduce the shard across groups (HSDP), then add
  // into this rank's gradient shard (micro-batches accumulate there).
  Work w = shard_->comm_thread().submit([=]() -> Status {
    if (wire == DType::kBF16) to_bf16(static_cast<uint16_t*>(send), full, padded);
    KILN_RETURN_IF_ERROR(comm::reduce_scatter(*sc, send, recv, chunk, wire, comm::ReduceOp::kAvg));
    if (rc->size() > 1) KILN_RETURN_IF_ERROR(comm::all_reduce(*rc, recv, recv, chunk, wire, comm::ReduceOp::kAvg));
    if (wire == DType::kBF16) {
      const auto* r = static_cast<const uint16_t*>(recv);
      for (int64_t i = 0; i < chunk; ++i) shard[i] += bf16_to_f32(r[i]);
    } else {
      const auto* r = static_cast<const float*>(recv);
      for (int64_t i = 0; i < chunk; ++i) shard[i] += r[i];
    }
    return {};
  });
  Pending q{w, {}};
  q.keep.push_back(std::move(g.grads));
  q.keep.push_back(std::move(part));
  if (wire_copy.defined()) q.keep.push_back(std::move(wire_copy));
  pending_.push_back(std::move(q));
  g.grads = Tensor();
  if (o_.zero == 3 && unit.first_block >= 0) release(u);
}

void DataParallelPlan::finish_gradients() {
  if (o_.zero <= 1) launch_buckets(0);  // the buckets not started during backward
  reap(true);
}

void DataParallelPlan::issue_gather(int u) {
  const Unit& unit = units_[static_cast<size_t>(u)];
  Gathered& g = *gathered_[static_cast<size_t>(u)];
  if (g.params.defined()) return;  // gathered or in flight
  const int S = shard_->size();
  g.params = Tensor::zeros({std::max<int64_t>(unit.chunk * S, 1)});
  float* full = g.params.data<float>();
  const ParamRange m = unit.mine();
  std::memcpy(full + unit.shard_rank * unit.chunk, param_shard_.data<float>() + unit.shard_offset,
              static_cast<size_t>(m.size()) * sizeof(float));
  g.gather = comm::all_gather_async(*shard_, full + unit.shard_rank * unit.chunk, full, unit.chunk, DType::kF32);
}

void DataParallelPlan::ensure_gathered(int u) {
  issue_gather(u);
  Gathered& g = *gathered_[static_cast<size_t>(u)];
  wait(g.gather);
  model_->bind(units_[static_cast<size_t>(u)].range, g.params.data<float>(), nullptr);
}

void DataParallelPlan::release(int u) {
  Gathered& g = *gathered_[static_cast<size_t>(u)];
  if (!g.params.defined()) return;
  wait(g.gather);
  g.params = Tensor();
  g.gather = Work();
}

void DataParallelPlan::bind_grad_buffer(int u) {
  // At most one reduction in flight when a new buffer is made: the older ones are waited for
  // (and their buffers freed), so the gradient memory is bounded whatever the timing.
  wait_until_one_pending();
  const Unit& unit = units_[static_cast<size_t>(u)];
  Gathered& g = *gathered_[static_cast<size_t>(u)];
  g.grads = Tensor::zeros({std::max<int64_t>(unit.chunk * shard_->size(), 1)});
  const float* params = o_.zero == 3 ? g.params.data<float>() : model_->params().data() + unit.range.begin;
  model_->bind(unit.range, params, g.grads.data<float>());
}

void DataParallelPlan::before_model(Pass pass) {
  const int tail = static_cast<int>(units_.size()) - 1;
  if (o_.zero == 3 && pass == Pass::kForward) {
    issue_gather(0);
    issue_gather(tail);
    ensure_gathered(0);
    ensure_gathered(tail);
  }
  if (o_.zero >= 2 && pass == Pass::kBackward) {
    bind_grad_buffer(0);
    bind_grad_buffer(tail);
  }
}

void DataParallelPlan::before_block(int64_t block, Pass pass) {
  if (o_.zero < 2) return;
  const int u = unit_of_block(block);
  const Unit& unit = units_[static_cast<size_t>(u)];
  const int first_unit = 1, last_unit = static_cast<int>(units_.size()) - 2;
  if (pass == Pass::kForward) {
    if (o_.zero < 3 || block != unit.first_block) return;
    ensure_gathered(u);
    for (int k = 1; k <= o_.prefetch && u + k <= last_unit; ++k) issue_gather(u + k);
    return;
  }
  if (block != unit.last_block) return;  // backward enters a unit at its last block
  if (o_.zero == 3) {
    ensure_gathered(u);
    for (int k = 1; k <= o_.prefetch && u - k >= first_unit; ++k) issue_gather(u - k);
  }
  bind_grad_buffer(u);
}

void DataParallelPlan::after_block(int64_t block, Pass pass) {
  if (o_.zero != 3 || pass != Pass::kForward || !o_.reshard_after_forward) return;
  const int u = unit_of_block(block);
  // The last unit's backward comes next: it stays.
  if (block == units_[static_cast<size_t>(u)].last_block && u != static_cast<int>(units_.size()) - 2) release(u);
}

namespace {
// Scalars in double through MPI's own all-reduce (one value: nothing to implement), run on
// the communicator's thread so it is ordered with the calls in flight there.
double all_reduce_double(comm::Communicator& c, double x, MPI_Op op) {
  if (c.size() == 1) return x;
  double out = 0;
  Status s = c.comm_thread()
                 .submit([&]() -> Status {
                   out = comm::all_reduce_scalar(c, x, op, "a double over the data-parallel ranks");
                   return {};
                 })
                 .wait();
  if (!s.ok()) comm::abort_job(s.message());
  return out;
}
}  // namespace

double DataParallelPlan::sum_over_shards(double x) {
  if (o_.zero == 0) return x;
  const double t0 = comm::now_seconds();
  const double r = all_reduce_double(*shard_, x, MPI_SUM);
  exposed_seconds_ += comm::now_seconds() - t0;
  return r;
}

double DataParallelPlan::mean_over_data(double x) {
  const double t0 = comm::now_seconds();
  const double r = all_reduce_double(*dp_, x, MPI_SUM) / dp_->size();
  exposed_seconds_ += comm::now_seconds() - t0;
  return r;
}

void DataParallelPlan::after_optimizer_step() {
  if (o_.zero == 3) {  // the gathered copies are stale now
    for (size_t u = 0; u < units_.size(); ++u) release(static_cast<int>(u));
    return;
  }
  if (o_.zero == 0 || shard_->size() == 1) return;
  // ZeRO-1/2: every rank updated its chunks; all-gather each unit through one padded buffer.
  int64_t most = 1;
  for (const Unit& u : units_) most = std::max(most, u.chunk * shard_->size());
  Tensor tmp = Tensor::empty({most});
  float* t = tmp.data<float>();
  float* params = model_->params().data();
  comm::Communicator* sc = shard_;
  const std::vector<Unit>& units = units_;
  wait(shard_->comm_thread().submit([=, &units]() -> Status {
    for (const Unit& u : units) {
      const ParamRange m = u.mine();
      std::memcpy(t + u.shard_rank * u.chunk, params + m.begin, static_cast<size_t>(m.size()) * sizeof(float));
      KILN_RETURN_IF_ERROR(comm::all_gather(*sc, t + u.shard_rank * u.chunk, t, u.chunk, DType::kF32));
      std::memcpy(params + u.range.begin, t, static_cast<size_t>(u.range.size()) * sizeof(float));
    }
    return {};
  }));
}

CommTimes DataParallelPlan::take_comm_times() {
  CommTimes t;
  for (comm::Communicator* c : {dp_.get(), shard_, replicate_})
    if (comm::CommThread* th = c->started_comm_thread()) t.comm_seconds += th->take_busy_seconds();
  t.exposed_seconds = exposed_seconds_;
  exposed_seconds_ = 0;
  return t;
}

std::string DataParallelPlan::describe() const {
  const char* stage[] = {"ddp", "zero1", "zero2", "fsdp"};
  std::string s = fmt::format("{} dp {}", stage[o_.zero], dp_->size());
  if (o_.reduce_dtype != DType::kF32) s += fmt::format(", gradients reduced as {}", dtype_name(o_.reduce_dtype));
  if (o_.shard_group > 0) s += fmt::format(" (hsdp: shard {} × replicate {})", shard_->size(), replicate_->size());
  return s;
}

std::vector<OptimizerPiece> DataParallelPlan::checkpoint_pieces() const {
  std::vector<OptimizerPiece> out;
  if (o_.zero == 0) {  // every rank holds everything: piece i is written by rank i mod P
    for (size_t i = 0; i < pieces_.size(); ++i)
      if (static_cast<int>(i % static_cast<size_t>(dp_->size())) == dp_->rank()) out.push_back(pieces_[i]);
  } else if (replicate_->rank() == 0) {  // HSDP: the first group writes the shards
    out = pieces_;
  }
  return out;
}

std::vector<float> DataParallelPlan::gather_full_params() {
  std::vector<float> out(static_cast<size_t>(model_->num_params()));
  if (o_.zero < 3) {
    std::copy(model_->params().begin(), model_->params().end(), out.begin());
    return out;
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    const bool had = gathered_[u]->params.defined();
    ensure_gathered(static_cast<int>(u));
    const Unit& unit = units_[u];
    std::memcpy(out.data() + unit.range.begin, gathered_[u]->params.data<float>(),
                static_cast<size_t>(unit.range.size()) * sizeof(float));
    if (!had) release(static_cast<int>(u));
  }
  return out;
}

}  // namespace kiln::parallel
