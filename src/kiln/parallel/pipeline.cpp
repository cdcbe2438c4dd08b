// Pipeline parallelism's plan and executor (pipeline.h).
#include "kiln/parallel/pipeline.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>

#include "kiln/comm/collectives.h"
#include "kiln/comm/work.h"

namespace kiln::parallel {

using pipeline::Action;
using pipeline::ActionKind;

namespace {
// A block's and the head's forward FLOPs per token, for the default split (the embedding is a
// lookup: no FLOPs).
pipeline::StageCosts stage_costs(const ModelConfig& c) {
  const double C = static_cast<double>(c.d_model), T = static_cast<double>(c.max_seq_len);
  const double kv = static_cast<double>(c.n_kv_heads * c.head_dim());
  const double mlp = (c.is_llama() ? 3.0 : 2.0) * C * static_cast<double>(c.d_ff);
  const double attn = 2.0 * C * C + 2.0 * C * kv;
  pipeline::StageCosts s;
  s.block_flops = 2.0 * (attn + mlp) + 2.0 * T * C;  // the matmuls, and causal attention's scores and values
  s.head_flops = 2.0 * C * static_cast<double>(c.vocab_size);
  return s;
}

// Floats of one activation (or its gradient) between stages for a micro-batch of n tokens: this
// tp rank's rows of the residual stream (n / tp under sequence parallelism).
int64_t message_floats(const Transformer& model, int64_t n) {
  const TensorShard& shard = model.tensor_shard();
  return (shard.sequence_parallel ? n / shard.size : n) * model.config().d_model;
}
}  // namespace

Expected<std::vector<BlockRange>> pipeline_stages(const PipelineOptions& o, const ModelConfig& c) {
  if (o.pp < 1) return invalid_argument("--pp {} must be >= 1", o.pp);
  const int stages = o.pp * std::max(o.virtual_stages, 1);
  Expected<std::vector<int>> split =
      pipeline::split_layers(static_cast<int>(c.n_layers), stages, o.layers, stage_costs(c));
  if (!split.ok()) return invalid_argument("--pp-layers: {}", split.status().message());
  std::vector<BlockRange> out;
  int64_t at = 0;
  for (int n : *split) {
    out.push_back({at, at + n});
    at += n;
  }
  return out;
}

Status check_pipeline_parallel(const PipelineOptions& o, const ModelConfig& c, int world,
                               const TensorParallelOptions& tp, const DataParallelOptions& dp,
                               const TrainOptions& train) {
  pipeline::ScheduleSpec spec{o.schedule, o.pp, o.micro_batches, o.virtual_stages};
  if (Status s = pipeline::check_schedule_spec(spec); !s.ok())
    return invalid_argument("--schedule {}: {}", pipeline::schedule_name(o.schedule), s.message());
  if (o.virtual_stages > 1 && o.pp < 2)
    return invalid_argument("--virtual-stages {} interleaves model chunks over pipeline ranks: it needs --pp 2 or more",
                            o.virtual_stages);
  KILN_RETURN_IF_ERROR(pipeline_stages(o, c).status());
  if (world % (o.pp * tp.tp) != 0)
    return invalid_argument("--pp {} × --tp {} does not divide the {} ranks of this job (mpirun -np): the world is "
                            "pp × dp × tp", o.pp, tp.tp, world);
  const int data = world / (o.pp * tp.tp);
  if (train.batch % (static_cast<int64_t>(data) * o.micro_batches) != 0)
    return invalid_argument("--batch {} must split into --micro-batches {} on each of the {} data-parallel ranks",
                            train.batch, o.micro_batches, data);
  if (dp.zero > 1)
    return invalid_argument("--pp {} composes with DDP and ZeRO-1 (--zero 0 or 1); ZeRO-2/3 and FSDP over pipeline "
                            "stages are not implemented (got --zero {})", o.pp, dp.zero);
  if (o.schedule == pipeline::ScheduleKind::kZeroBubbleH1) {
    if (train.precision != Precision::kF32)
      return invalid_argument("--schedule zb-h1 splits each Linear's backward into B and W in fp32; --precision {} "
                              "computes both halves at once", precision_name(train.precision));
    if (train.checkpoint != CheckpointMode::kNone)
      return invalid_argument("--schedule zb-h1 reads the saved activations in W; activation checkpointing "
                              "recomputes them into shared buffers (use --checkpoint none)");
    if (tp.sequence_parallel && tp.tp > 1)
      return invalid_argument("--schedule zb-h1 with --sp: W would read the gathered inputs, which are scratch");
  }
  return {};
}

// ---- the executor ----------------------------------------------------------------------------
// One step over the schedule's actions for this rank. Per micro-batch: the received input
// activation and output gradient, the sent output and input gradient (kept until every send is
// done at the end of the step), and the activation slot its forward used.
// Times are the machine's monotonic clock itself (steady_clock since boot: one clock for every
// process of a node; comm::now_seconds() counts from each process's first call, which differ by
// the ranks' start-up skew); gather_timeline() puts the step's first start at 0.
struct PipelineParallelPlan::Executor {
  Executor(PipelineParallelPlan& p, Transformer& m, int64_t width)
      : plan(p), model(m), report(p.report_), M(p.o_.micro_batches), V(p.o_.virtual_stages) {
    const size_t n = static_cast<size_t>(4 * M * V);
    if (bufs.size() != n || bufs[0].numel() != std::max<int64_t>(width, 1)) {
      bufs.clear();
      for (size_t i = 0; i < n; ++i) bufs.push_back(Tensor::empty({std::max<int64_t>(width, 1)}));
    }
    recv_act.assign(static_cast<size_t>(M * V), MPI_REQUEST_NULL);
    recv_grad.assign(static_cast<size_t>(M * V), MPI_REQUEST_NULL);
    slot_of.assign(static_cast<size_t>(M * V), -1);
    free_slots.resize(static_cast<size_t>(V));
    slots_made.assign(static_cast<size_t>(V), 0);
  }
  PipelineParallelPlan& plan;
  Transformer& model;
  PipelineStepReport& report;
  const int M, V;
  // (4, M, V): act in, grad in, act out, grad out per micro-batch and chunk; kept between steps.
  static inline thread_local std::vector<Tensor> bufs;
  std::vector<MPI_Request> recv_act, recv_grad, sends;  // (M, V) receives
  std::vector<int> slot_of;                             // (M, V): the activation slot in use, or -1
  std::vector<std::vector<int>> free_slots;             // per chunk
  std::vector<int> slots_made;                          // per chunk: slot ids chunk + V · k
  int slots_in_use = 0;

  size_t at(int mb, int chunk) const { return static_cast<size_t>(mb * V + chunk); }
  float* buf(int kind, int mb, int chunk) { return bufs[static_cast<size_t>(kind) * M * V + at(mb, chunk)].data<float>(); }
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  // Polls the receive (a dead neighbour ends the job after KILN_COMM_TIMEOUT, naming it).
  void wait(MPI_Request& r, const Action& a) {
    const double start = now();
    int done = 0;
    const double limit = comm::comm_timeout_seconds();
    for (int spins = 0;; ++spins) {
      MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      if (done) break;
      if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));  // leave the core to a busy rank
      if (now() - start > limit)
        comm::abort_job(fmt::format("pipeline stage {} waited {:.0f} s for the {} of micro-batch {} (KILN_COMM_TIMEOUT): "
                                    "a neighbouring stage's rank is gone",
                                    a.stage, limit, a.kind == ActionKind::kRecvActivation ? "activation" : "gradient",
                                    a.micro_batch));
    }
    report.wait_seconds += now() - start;
    report.timeline.push_back({a, plan.pp_rank(), start, now()});
  }

  // A chunk's slots are its own (a slot holds that chunk's layers only): ids chunk + V · k.
  void use_slot(int mb, int chunk) {
    int& s = slot_of[at(mb, chunk)];
    if (s < 0) {
      std::vector<int>& free = free_slots[static_cast<size_t>(chunk)];
      if (free.empty()) s = chunk + V * slots_made[static_cast<size_t>(chunk)]++;
      else { s = free.back(); free.pop_back(); }
      report.peak_micro_batches = std::max(report.peak_micro_batches, ++slots_in_use);
    }
    model.use_activation_slot(s);
  }
  void release_slot(int mb, int chunk) {
    int& s = slot_of[at(mb, chunk)];
    free_slots[static_cast<size_t>(chunk)].push_back(s);
    s = -1;
    --slots_in_use;
  }
};

Expected<std::unique_ptr<PipelineParallelPlan>> PipelineParallelPlan::create(comm::Communicator& world,
                                                                             const PipelineOptions& o,
                                                                             const TensorParallelOptions& tp,
                                                                             const DataParallelOptions& dp,
                                                                             const ModelConfig& config,
                                                                             const TrainOptions& train) {
  KILN_RETURN_IF_ERROR(check_pipeline_parallel(o, config, world.size(), tp, dp, train));
  std::unique_ptr<PipelineParallelPlan> p(new PipelineParallelPlan());
  p->o_ = o;
  KILN_ASSIGN_OR_RETURN(p->stages_, pipeline_stages(o, config));
  KILN_ASSIGN_OR_RETURN(p->schedule_, pipeline::make_schedule({o.schedule, o.pp, o.micro_batches, o.virtual_stages}));
  KILN_RETURN_IF_ERROR(pipeline::check_schedule(p->schedule_));  // the executor runs valid lists only
  const int per_stage = world.size() / o.pp;
  KILN_ASSIGN_OR_RETURN(p->mesh_, comm::DeviceMesh::create(world, {{"pp", o.pp}, {"dp", per_stage / tp.tp}, {"tp", tp.tp}}));
  const int stage = p->mesh_->coord("pp");
  KILN_ASSIGN_OR_RETURN(p->stage_world_, world.split(stage, world.rank()));
  // Each stage's ranks see the micro-batch as the whole model would: the trainer's rows for this
  // data-parallel rank (batch / dp), split into M micro-batches by the executor.
  KILN_ASSIGN_OR_RETURN(p->inner_, TensorParallelPlan::create(*p->stage_world_, tp, dp, config, train));
  // The tied embedding: the first stage and the last stage's copy, at each (dp, tp) coordinate.
  if (config.tied_embeddings && o.pp > 1) {
    const bool end = stage == 0 || stage == o.pp - 1;
    const int coord = p->mesh_->coord("dp") * tp.tp + p->mesh_->coord("tp");
    KILN_ASSIGN_OR_RETURN(p->embedding_group_, world.split(end ? coord : per_stage + world.rank(), world.rank()));
  }
  return p;
}

PipelineParallelPlan::~PipelineParallelPlan() = default;

PipelineStage PipelineParallelPlan::stage() const {
  PipelineStage s;
  for (size_t v = static_cast<size_t>(pp_rank()); v < stages_.size(); v += static_cast<size_t>(o_.pp))
    s.chunks.push_back(stages_[v]);
  return s;
}

void PipelineParallelPlan::attach(Transformer& model) {
  KILN_CHECK_MSG(model.stage() == stage(), "the model is not built for pipeline rank {}'s chunks", pp_rank());
  model_ = &model;
  inner_->attach(model);
  for (const ParamEntry& e : model.param_entries()) {
    const bool table = e.split.full_offset == 0 && e.shape.rank() == 2;  // the token embedding (or its copy)
    if (e.split.stage_copy) stage_copy_ = &e;
    if (table && embedding_group_ && (e.split.stage_copy || model.has_embedding())) {
      embedding_offset_ = e.offset;
      embedding_numel_ = e.shape.numel();
    }
  }
}

double PipelineParallelPlan::forward_backward(Transformer& model, const int32_t* tokens, const int32_t* targets,
                                              int64_t rows, int64_t seq_len, float loss_scale) {
  KILN_CHECK(&model == model_);
  const int M = o_.micro_batches;
  KILN_CHECK_MSG(rows % M == 0, "{} rows do not split into {} micro-batches", rows, M);
  comm::Communicator& pp = mesh_->comm("pp");
  const int64_t mb_rows = rows / M, n = mb_rows * seq_len, width = message_floats(model, n);
  report_ = {};
  Executor ex(*this, model, width);
  const double step_start = ex.now();
  const std::vector<Action>& actions = schedule_.ranks[static_cast<size_t>(pp_rank())];
  const int last_stage = schedule_.spec.stages() - 1;
  // The DDP buckets go out during the stage's last backward of the step (PyTorch's no_sync on
  // the others); zero-bubble's W comes later, so finish_gradients() sends them all.
  int last_backward = -1;
  for (int i = 0; i < static_cast<int>(actions.size()); ++i)
    if (actions[static_cast<size_t>(i)].kind == ActionKind::kBackward) last_backward = i;
  const size_t bytes = static_cast<size_t>(width) * sizeof(float);
  double loss = 0;
  enum { kActIn, kGradIn, kActOut, kGradOut };
  for (int i = 0; i < static_cast<int>(actions.size()); ++i) {
    const Action& a = actions[static_cast<size_t>(i)];
    const int mb = a.micro_batch, chunk = a.stage / o_.pp;
    const int tag = pipeline::is_compute(a.kind) ? 0 : pipeline::tag_for(a, schedule_.spec);
    const size_t m = ex.at(mb, chunk);
    const int64_t at = static_cast<int64_t>(mb) * n;
    const double start = ex.now();
    switch (a.kind) {
      case ActionKind::kRecvActivation:
        ex.recv_act[m] = pp.irecv(ex.buf(kActIn, mb, chunk), bytes, schedule_.rank_of(a.stage - 1), tag);
        continue;
      case ActionKind::kRecvGrad:
        ex.recv_grad[m] = pp.irecv(ex.buf(kGradIn, mb, chunk), bytes, schedule_.rank_of(a.stage + 1), tag);
        continue;
      case ActionKind::kSendActivation:
        ex.sends.push_back(pp.isend(ex.buf(kActOut, mb, chunk), bytes, schedule_.rank_of(a.stage + 1), tag));
        continue;
      case ActionKind::kSendGrad:
        ex.sends.push_back(pp.isend(ex.buf(kGradOut, mb, chunk), bytes, schedule_.rank_of(a.stage - 1), tag));
        continue;
      case ActionKind::kForward: {
        const float* input = nullptr;
        if (a.stage > 0) {
          ex.wait(ex.recv_act[m], {ActionKind::kRecvActivation, mb, a.stage});
          input = ex.buf(kActIn, mb, chunk);
        }
        ex.use_slot(mb, chunk);
        const double t = ex.now();
        const float l = model.forward_stage(tokens + at, targets + at, input, mb_rows, seq_len, chunk).value();
        if (a.stage == last_stage) loss += l;
        else std::memcpy(ex.buf(kActOut, mb, chunk), model.stage_output(chunk), bytes);
        report_.timeline.push_back({a, pp_rank(), t, ex.now()});
        break;
      }
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput: {
        const float* dout = nullptr;
        if (a.stage < last_stage) {
          ex.wait(ex.recv_grad[m], {ActionKind::kRecvGrad, mb, a.stage});
          dout = ex.buf(kGradIn, mb, chunk);
        }
        ex.use_slot(mb, chunk);
        const double t = ex.now();
        inner_->begin_micro_batch(last_micro_ && i == last_backward);
        const bool defer = a.kind == ActionKind::kBackwardInput;
        model.backward_stage(dout, loss_scale, defer, chunk);
        if (a.stage > 0) std::memcpy(ex.buf(kGradOut, mb, chunk), model.input_grad(), bytes);
        if (!defer) ex.release_slot(mb, chunk);
        report_.timeline.push_back({a, pp_rank(), t, ex.now()});
        break;
      }
      case ActionKind::kBackwardWeight: {
        ex.use_slot(mb, chunk);
        model.backward_weights();
        ex.release_slot(mb, chunk);
        report_.timeline.push_back({a, pp_rank(), start, ex.now()});
        break;
      }
    }
    report_.peak_activation_bytes =
        std::max(report_.peak_activation_bytes,
                 ex.slots_in_use * model.saved_activation_bytes() + model.deferred_weight_bytes());
  }
  const double ws = ex.now();
  comm::Communicator::wait_all(ex.sends);
  report_.wait_seconds += ex.now() - ws;
  report_.seconds = ex.now() - step_start;
  p2p_wait_seconds_ += report_.wait_seconds;
  // The loss is the last stage's: every rank gets it (the others add 0, exactly).
  const double t = comm::now_seconds();
  loss = o_.pp > 1 ? comm::all_reduce_scalar(pp, pp_rank() == o_.pp - 1 ? loss : 0.0, MPI_SUM, "the loss over the stages") : loss;
  cross_stage_seconds_ += comm::now_seconds() - t;
  return loss;
}

double PipelineParallelPlan::forward_loss(Transformer& model, const int32_t* tokens, const int32_t* targets,
                                          int64_t rows, int64_t seq_len) {
  // Validation: the micro-batches one after another through the stages (forward only).
  const int M = o_.micro_batches;
  comm::Communicator& pp = mesh_->comm("pp");
  const int64_t mb_rows = rows / M, n = mb_rows * seq_len;
  std::vector<float> act(static_cast<size_t>(message_floats(model, n)));
  const size_t bytes = act.size() * sizeof(float);
  const int rank = pp_rank(), V = o_.virtual_stages, last = o_.pp * V - 1;
  double loss = 0;
  for (int mb = 0; mb < M; ++mb) {
    for (int v = 0; v < V; ++v) {  // virtual stage v · pp + rank, in model order on every rank
      const int s = v * o_.pp + rank;
      if (s > 0) pp.recv(act.data(), bytes, (s - 1) % o_.pp, 0x7e00 + mb);
      model.use_activation_slot(v);  // chunk v's slot (the executor's ids: chunk + V · k)
      const float l =
          model.forward_stage(tokens + mb * n, targets + mb * n, act.data(), mb_rows, seq_len, v).value();
      if (s < last) pp.send(model.stage_output(v), bytes, (s + 1) % o_.pp, 0x7e00 + mb);
      else loss += l;
    }
  }
  loss /= M;
  return o_.pp > 1 ? comm::all_reduce_scalar(pp, rank == o_.pp - 1 ? loss : 0.0, MPI_SUM, "the validation loss over the stages") : loss;
}

void PipelineParallelPlan::finish_gradients() {
  inner_->finish_gradients();
  if (embedding_offset_ < 0) return;
  // The tied table's gradient: the embedding's part (first stage) plus the head's (last).
  const double t = comm::now_seconds();
  float* g = model_->grads().data() + embedding_offset_;
  const Status s = comm::all_reduce(*embedding_group_, g, g, embedding_numel_, DType::kF32, comm::ReduceOp::kSum);
  KILN_CHECK_MSG(s.ok(), "{}", s.to_string());
  cross_stage_seconds_ += comm::now_seconds() - t;
}

double PipelineParallelPlan::sum_over_shards(double x) {
  if (stage_copy_) {  // the copy's squares (in this rank's pieces) are the first stage's too: count them once
    const float* begin = model_->grads().data() + stage_copy_->offset;
    const float* end = begin + stage_copy_->shape.numel();
    for (const OptimizerPiece& p : inner_->pieces())
      if (p.grads >= begin && p.grads < end)
        for (int64_t i = 0; i < p.n; ++i) x -= static_cast<double>(p.grads[i]) * p.grads[i];
  }
  x = inner_->sum_over_shards(x);
  return o_.pp > 1 ? comm::all_reduce_scalar(mesh_->comm("pp"), x, MPI_SUM, "the gradient norm over the stages") : x;
}

double PipelineParallelPlan::mean_over_data(double x) {
  x = inner_->mean_over_data(x);
  // The stages' values agree for the loss; a clock does not: the first stage's decides.
  if (o_.pp > 1 && MPI_Bcast(&x, 1, MPI_DOUBLE, 0, mesh_->comm("pp").handle()) != MPI_SUCCESS)
    comm::abort_job("MPI_Bcast over the pipeline stages failed");
  return x;
}

CommTimes PipelineParallelPlan::take_comm_times() {
  CommTimes t = inner_->take_comm_times();
  // Waiting on a neighbour's activation or gradient is exposed by definition; the transfers
  // that finished while this rank computed are hidden and not counted.
  t.comm_seconds += p2p_wait_seconds_ + cross_stage_seconds_;
  t.exposed_seconds += p2p_wait_seconds_ + cross_stage_seconds_;
  p2p_wait_seconds_ = cross_stage_seconds_ = 0;
  return t;
}

std::string PipelineParallelPlan::describe() const {
  std::string split;
  for (const BlockRange& s : stages_) split += fmt::format("{}{}", split.empty() ? "" : ",", s.size());
  const std::string chunks = o_.virtual_stages > 1 ? fmt::format(", {} chunks per rank", o_.virtual_stages) : "";
  return fmt::format("pp {} ({}, {} micro-batches{}, blocks {}) × {}", o_.pp, pipeline::schedule_name(o_.schedule),
                     o_.micro_batches, chunks, split, inner_->describe());
}

std::vector<OptimizerPiece> PipelineParallelPlan::checkpoint_pieces() const {
  std::vector<OptimizerPiece> out = inner_->checkpoint_pieces();
  if (!stage_copy_) return out;
  const float* begin = model_->params().data() + stage_copy_->offset;  // ZeRO-1 keeps the parameters whole
  const float* end = begin + stage_copy_->shape.numel();
  std::erase_if(out, [&](const OptimizerPiece& p) { return p.params >= begin && p.params < end; });
  return out;
}

std::vector<OptimizerPiece> PipelineParallelPlan::restore_pieces() const {
  std::vector<OptimizerPiece> out = inner_->restore_pieces();
  std::stable_sort(out.begin(), out.end(),
                   [](const OptimizerPiece& a, const OptimizerPiece& b) { return a.flat_begin < b.flat_begin; });
  return out;
}

std::vector<float> PipelineParallelPlan::gather_full(std::span<const float> local) const {
  std::vector<float> full(static_cast<size_t>(model_->full_num_params()), 0.0f);
  const int tp_rank = model_->tensor_shard().rank;
  if (mesh_->coord("dp") == 0) {  // one data-parallel replica contributes
    for (const ParamEntry& e : model_->param_entries()) {
      if (e.split.stage_copy || tp_rank % e.split.replicas != 0) continue;  // each value once
      for_each_entry_run(e, [&](int64_t l, int64_t f, int64_t n) { std::copy_n(local.data() + l, n, full.data() + f); });
    }
  }
  comm::Communicator& world = mesh_->world();
  const Status s = comm::all_reduce(world, full.data(), full.data(), static_cast<int64_t>(full.size()), DType::kF32,
                                    comm::ReduceOp::kSum);
  KILN_CHECK_MSG(s.ok(), "{}", s.to_string());
  return full;
}

std::vector<StagePeak> PipelineParallelPlan::gather_peaks() const {
  comm::Communicator& world = mesh_->world();
  const int64_t mine[2] = {report_.peak_micro_batches, report_.peak_activation_bytes};
  std::vector<int64_t> all(static_cast<size_t>(2 * world.size()));
  MPI_Allgather(mine, 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, world.handle());
  std::vector<StagePeak> out;
  const int per_stage = world.size() / o_.pp;  // pp is the slowest axis: stage s starts at s · per_stage
  for (int s = 0; s < o_.pp; ++s)
    out.push_back({static_cast<int>(all[static_cast<size_t>(2 * s * per_stage)]), all[static_cast<size_t>(2 * s * per_stage + 1)]});
  return out;
}

std::vector<pipeline::TimedAction> PipelineParallelPlan::gather_timeline() const {
  // Fixed-size records (kind, micro-batch, stage, rank, start, end) through MPI's all-gather.
  struct Record {
    int32_t kind, micro_batch, stage, rank;
    double start, end;
  };
  std::vector<Record> mine;
  const bool speaks = mesh_->coord("dp") == 0 && mesh_->coord("tp") == 0;  // a stage's first rank
  if (speaks)
    for (const pipeline::TimedAction& t : report_.timeline)
      mine.push_back({static_cast<int32_t>(t.action.kind), t.action.micro_batch, t.action.stage, t.rank, t.start, t.end});
  comm::Communicator& world = mesh_->world();
  int count = static_cast<int>(mine.size() * sizeof(Record));
  std::vector<int> counts(static_cast<size_t>(world.size())), displs(static_cast<size_t>(world.size()));
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, world.handle());
  std::exclusive_scan(counts.begin(), counts.end(), displs.begin(), 0);
  std::vector<Record> all(static_cast<size_t>((displs.back() + counts.back()) / static_cast<int>(sizeof(Record))));
  MPI_Allgatherv(mine.data(), count, MPI_BYTE, all.data(), counts.data(), displs.data(), MPI_BYTE, world.handle());
  double first = all.empty() ? 0 : all[0].start;
  for (const Record& r : all) first = std::min(first, r.start);
  std::vector<pipeline::TimedAction> out;
  for (const Record& r : all)
    out.push_back({{static_cast<ActionKind>(r.kind), r.micro_batch, r.stage}, r.rank, r.start - first, r.end - first});
  return out;
}

PipelineBubble measure_bubble(const PipelineParallelPlan& plan) {
  const pipeline::Schedule& sched = plan.schedule();
  PipelineBubble b;
  b.measured = plan.gather_timeline();
  // Mean measured seconds of F, B (or BI) and W, over all stages (the ideal's costs) and per
  // stage (the staged ideal's).
  const int S = sched.spec.stages();
  std::vector<std::array<double, 3>> sum(static_cast<size_t>(S + 1), {0, 0, 0});  // entry S: every stage
  std::vector<std::array<int, 3>> count(static_cast<size_t>(S + 1), {0, 0, 0});
  for (const pipeline::TimedAction& a : b.measured) {
    int k = -1;
    switch (a.action.kind) {
      case ActionKind::kForward: k = 0; break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput: k = 1; break;
      case ActionKind::kBackwardWeight: k = 2; break;
      default: continue;  // sends, receives and their waits
    }
    for (size_t at : {static_cast<size_t>(a.action.stage), static_cast<size_t>(S)}) {
      sum[at][static_cast<size_t>(k)] += a.end - a.start;
      ++count[at][static_cast<size_t>(k)];
    }
  }
  b.split_backward = count[static_cast<size_t>(S)][2] > 0;
  auto costs_of = [&](size_t at) {
    auto mean = [&](size_t k) { return count[at][k] ? sum[at][k] / count[at][k] : 0.0; };
    pipeline::ActionCosts c;
    c.forward = mean(0);
    c.backward_input = b.split_backward ? mean(1) : mean(1) / 2;  // kBackward costs B + W
    c.backward_weight = b.split_backward ? mean(2) : mean(1) / 2;
    return c;
  };
  b.costs = costs_of(static_cast<size_t>(S));
  b.backward_seconds = b.split_backward ? b.costs.backward_input : 2 * b.costs.backward_input;
  std::vector<pipeline::ActionCosts> per_stage;
  for (int st = 0; st < S; ++st) per_stage.push_back(costs_of(static_cast<size_t>(st)));
  b.ideal = pipeline::simulate_schedule(sched, b.costs);
  b.staged = pipeline::simulate_schedule(sched, per_stage);
  b.staged_stats = pipeline::schedule_stats(sched, b.staged);
  b.measured_stats = pipeline::schedule_stats(sched, b.measured);
  b.ideal_stats = pipeline::schedule_stats(sched, b.ideal);
  b.formula = pipeline::bubble_formula(sched.spec, b.costs);
  return b;
}

}  // namespace kiln::parallel
