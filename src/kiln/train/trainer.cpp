// Training loop and checkpoints (the file format is checkpoint.h).
#include "kiln/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "kiln/core/allocator.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/file_io.h"
#include "kiln/core/thread_pool.h"
#include "kiln/core/trace.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/sharded_checkpoint.h"

namespace kiln {

double learning_rate(const TrainOptions& o, int64_t step, int64_t total) {
  if (step <= o.warmup_steps) return o.lr * static_cast<double>(step) / std::max<int64_t>(o.warmup_steps, 1);
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) /
                                            std::max<int64_t>(total - o.warmup_steps, 1));
  const double min_lr = o.lr * o.min_lr_fraction;
  return min_lr + 0.5 * (o.lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

double evaluate(Transformer& model, const TokenShard& data, int64_t batch, int64_t seq_len, int64_t batches,
                int64_t first_row, int64_t rows, ParallelPlan* plan) {
  SingleProcessPlan single;
  if (plan == nullptr) plan = &single;  // its forward_loss is the model's
  if (rows < 0) rows = batch;
  BatchLoader loader(&data, batch, seq_len, 0);
  std::vector<int32_t> x, y;
  double sum = 0;
  int64_t n = 0;
  const int64_t first = first_row * seq_len;
  for (int64_t i = 0; i < batches && loader.eval_batch(i, x, y); ++i) {
    sum += plan->forward_loss(model, x.data() + first, y.data() + first, rows, seq_len);
    ++n;
  }
  return n ? sum / n : -1;
}

Trainer::Trainer(Transformer& model, const TokenShard& train_data, const TokenShard* val_data, const TrainOptions& o,
                 ParallelPlan* plan)
    : model_(model), val_(val_data), o_(o), own_plan_(plan ? nullptr : std::make_unique<SingleProcessPlan>()),
      plan_(plan ? plan : own_plan_.get()), loader_(&train_data, o.batch, o.seq_len, o.seed),
      scaler_(o.loss_scale, o.dynamic_loss_scale, o.loss_scale_window), total_steps_(o.max_steps) {
  KILN_CHECK_MSG(o.batch % plan_->data_size() == 0, "batch {} does not divide over {} data-parallel ranks", o.batch,
                 plan_->data_size());
  rows_ = o.batch / plan_->data_size();
  x_.resize(static_cast<size_t>(o.batch * o.seq_len));  // filled in place by each step's loads
  y_.resize(x_.size());
  model_.set_checkpointing(o.checkpoint);
  model_.set_split_epilogues(o.split_epilogues);
  auto ctx = install_precision(model_, o.precision, o.amax_history, plan_->amax_group());
  KILN_CHECK_MSG(ctx.ok(), "{}", ctx.status().message());
  precision_ = *ctx;
  plan_->attach(model_);
  model_.set_hooks(plan_);
  m_ = Tensor::zeros({plan_->state_size()});
  v_ = Tensor::zeros({plan_->state_size()});
}

Trainer::~Trainer() { model_.set_hooks(nullptr); }

double Trainer::validation_loss() {
  const double mine =
      evaluate(model_, *val_, o_.batch, o_.seq_len, o_.eval_batches, plan_->data_rank() * rows_, rows_, plan_);
  model_.take_moe_stats();  // the evaluation's routing is not a training step's
  return mine < 0 ? mine : plan_->mean_over_data(mine);  // -1 (no batch) on every rank alike
}

graph::GraphKey Trainer::graph_key(float loss_scale) const {
  graph::GraphKey k;
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &loss_scale, sizeof(scale_bits));
  k.add("threads", num_threads())
      .add("simd target", static_cast<int64_t>(active_simd_target()))
      .add("model buffers epoch", static_cast<int64_t>(model_.buffer_epoch()))
      .add("tokens address", static_cast<int64_t>(reinterpret_cast<uintptr_t>(x_.data())))
      .add("targets address", static_cast<int64_t>(reinterpret_cast<uintptr_t>(y_.data())))
      .add("loss scale bits", scale_bits);
  return k;
}

// --graph capture: the step is captured once and replayed while its guards hold (MoE routing
// runs eagerly between its segments); a graph with breaks that are not eager regions (a layout
// that communicates, low-precision backends) is not kept and the step runs eagerly.
void Trainer::run_step(float loss_scale) {
  const auto eager = [&] {
    step_body(loss_scale);
    return true;
  };
  if (!o_.graph_capture) {
    eager();
    return;
  }
  graph::StepGraph::Step step;
  step.key = [&] { return graph_key(loss_scale); };
  step.eager = eager;
  step.keep = [&](graph::Graph& g) {  // what the host reads after a step, and the gradients
    for (auto [p, bytes] : model_.graph_outputs()) g.keep(p, bytes);
    g.keep(&state_, sizeof(state_));
    g.keep(x_.data(), static_cast<int64_t>(x_.size() * sizeof(int32_t)));
    g.keep(y_.data(), static_cast<int64_t>(y_.size() * sizeof(int32_t)));
    for (const OptimizerPiece& p : plan_->pieces()) g.keep(p.grads, p.n * static_cast<int64_t>(sizeof(float)));
  };
  step.pass = o_.graph_pass;
  graph_.run(step, graph_stats_);
}

// One step's work, host code between kernels as graph::op nodes: eagerly each runs at once;
// captured, it is a node of the joint graph whose closure reads this step's values (the step
// number, the learning rate, the scaler's verdict) when it runs. The update is predicated on
// the verdict inside its nodes (a CUDA graph's conditional node), not a branch around them.
void Trainer::step_body(float loss_scale) {
  plan_->begin_step();
  const int64_t n = o_.batch * o_.seq_len;
  const int64_t first = plan_->data_rank() * rows_ * o_.seq_len;  // this rank's rows of the global batch
  for (int64_t micro = 0; micro < o_.grad_accum; ++micro) {
    {
      KILN_TRACE_SCOPE(kTrain, "data");
      graph::op("load_batch", {graph::writes(x_.data(), n), graph::writes(y_.data(), n)},
                [this, micro](const graph::Access* io) {
                  loader_.batch_at((step_ - 1) * o_.grad_accum + micro, io[0].mut<int32_t>(), io[1].mut<int32_t>());
                });
    }
    plan_->begin_micro_batch(micro + 1 == o_.grad_accum);
    KILN_TRACE_SCOPE(kTrain, "forward_backward");
    const double loss = plan_->forward_backward(model_, x_.data() + first, y_.data() + first, rows_, o_.seq_len, loss_scale);
    if (graph::recording() && plan_->captured()) {  // the plan's loss is the model's (one part)
      graph::op("sum_loss", {graph::reads(model_.last_loss_ptr(), 1), graph::writes(&state_, 1)},
                [](const graph::Access* io) { io[1].mut<StepState>()->loss_sum += *io[0].as<float>(); });
    } else {
      state_.loss_sum += loss;
    }
  }
  {
    KILN_TRACE_SCOPE(kTrain, "reduction_wait");  // the gradient reductions still in flight
    plan_->finish_gradients();
  }
  // Unscale (1/S) and average over micro-batches in one multiply; S is a power of two in the
  // dynamic scaler, so unscaling is exact.
  const double parts = static_cast<double>(o_.grad_accum * plan_->loss_parts());
  const float inv = static_cast<float>(1.0 / (parts * loss_scale));
  std::vector<graph::Access> io = {graph::writes(&state_, 1)};
  for (const OptimizerPiece& p : plan_->pieces()) io.push_back(graph::writes(p.grads, p.n));
  graph::op("unscale_grad_norm", io, [this, inv](const graph::Access* io) {
    KILN_TRACE_SCOPE(kTrain, "grad_norm");
    StepState& st = *io[0].mut<StepState>();
    double sq = 0;
    const std::span<const OptimizerPiece> pieces = plan_->pieces();
    for (size_t k = 0; k < pieces.size(); ++k) {
      float* g = io[k + 1].mut<float>();
      for (int64_t i = 0; i < pieces[k].n; ++i) {
        g[i] *= inv;
        sq += static_cast<double>(g[i]) * g[i];
      }
    }
    st.sq = plan_->sum_over_shards(sq);
    st.norm = std::sqrt(st.sq);
    st.applied = scaler_.update(!std::isfinite(st.sq));  // an inf or NaN anywhere makes sq non-finite
    st.clip = o_.clip_norm > 0 && st.norm > o_.clip_norm ? static_cast<float>(o_.clip_norm / (st.norm + 1e-6)) : 1.0f;
  });
  optimizer_update();
  // Low-precision copies (and any other backend's state) follow the master: host work the graph
  // does not record.
  if (graph::recording()) {
    const std::vector<Linear*> linears = model_.linears();
    if (std::any_of(linears.begin(), linears.end(), [](const Linear* l) { return l->backend != nullptr; }))
      graph::graph_break("Linear backends re-sync their weights after the optimizer step");
  }
  if (state_.applied) {
    plan_->after_optimizer_step();
    sync_backends(model_);
  }
}

namespace {
// Piece k's moments sit at [at[k], at[k] + n) of the concatenation.
std::vector<int64_t> piece_starts(const std::vector<OptimizerPiece>& pieces) {
  std::vector<int64_t> at(pieces.size());
  for (size_t k = 1; k < pieces.size(); ++k) at[k] = at[k - 1] + pieces[k - 1].n;
  return at;
}

AdamWConfig piece_adamw(const TrainOptions& o, double lr, bool decay) {
  AdamWConfig cfg;
  cfg.lr = lr;
  cfg.beta1 = o.beta1;
  cfg.beta2 = o.beta2;
  cfg.weight_decay = decay ? o.weight_decay : 0.0;
  return cfg;
}

}  // namespace

// fn(k, i, len, m, v) for every part of the pieces' moments, where they live: in memory each
// piece whole (i = 0, len = n); offloaded, the part of piece k that each chunk holds, as the
// file streams past in order (elements [i, i + len) of the piece). m and v point at the part's
// moments; with write_back the chunks go back to the file after fn.
template <class Fn>
Status Trainer::visit_moments(std::span<const OptimizerPiece> pieces, bool write_back, const Fn& fn) const {
  if (!offload_) {
    for (size_t k = 0; k < pieces.size(); ++k)
      fn(k, 0, pieces[k].n, m_.data<float>() + pieces[k].state_offset, v_.data<float>() + pieces[k].state_offset);
    return {};
  }
  return offload_->stream(
      [&](int64_t begin, int64_t count, float* m, float* v) {
        for (size_t k = 0; k < pieces.size(); ++k) {
          const OptimizerPiece& p = pieces[k];
          const int64_t lo = std::max(begin, p.state_offset), hi = std::min(begin + count, p.state_offset + p.n);
          if (lo < hi) fn(k, lo - p.state_offset, hi - lo, m + (lo - begin), v + (lo - begin));
        }
      },
      write_back);
}

// AdamW over this rank's pieces, after the clip factor. In memory each piece is one node of
// the step (captured with it); offloaded, the moments stream past chunk by chunk and each
// chunk updates the parts of the pieces it holds (the same elementwise update, so the same
// values as in memory).
void Trainer::optimizer_update() {
  KILN_TRACE_SCOPE(kTrain, "optimizer");
  if (offload_) {
    KILN_CHECK_MSG(!graph::recording(), "offloaded optimizer state does not run in a captured step");
    if (!state_.applied) return;
    const std::span<const OptimizerPiece> pieces = plan_->pieces();
    if (state_.clip != 1.0f)
      for (const OptimizerPiece& p : pieces)
        for (int64_t i = 0; i < p.n; ++i) p.grads[i] *= state_.clip;
    offload_->take_stats();  // what a checkpoint read or wrote is not the step's
    const Status st = visit_moments(pieces, /*write_back=*/true,
                                    [&](size_t k, int64_t i, int64_t len, float* m, float* v) {
                                      const OptimizerPiece& p = pieces[k];
                                      cpu::adamw_step(p.params + i, p.grads + i, m, v, len,
                                                      piece_adamw(o_, state_.lr, p.decay), step_);
                                    });
    KILN_CHECK_MSG(st.ok(), "{}", st.message());  // the moments on the disk are no longer the run's
    offload_stats_ = offload_->take_stats();
    return;
  }
  for (const OptimizerPiece& p : plan_->pieces()) {
    graph::op("adamw_update",
              {graph::reads(&state_, 1), graph::writes(p.params, p.n),
               graph::writes(p.grads, p.n), graph::writes(m_.data<float>() + p.state_offset, p.n),
               graph::writes(v_.data<float>() + p.state_offset, p.n)},
              [this, n = p.n, decay = p.decay](const graph::Access* io) {
                const StepState& st = *io[0].as<StepState>();
                if (!st.applied) return;
                float* g = io[2].mut<float>();
                if (st.clip != 1.0f)
                  for (int64_t i = 0; i < n; ++i) g[i] *= st.clip;
                cpu::adamw_step(io[1].mut<float>(), g, io[3].mut<float>(), io[4].mut<float>(), n,
                                piece_adamw(o_, st.lr, decay), step_);
              });
  }
}

Status Trainer::offload_optimizer_state(const std::string& dir, int64_t chunk_floats) {
  if (o_.graph_capture) return invalid_argument("offloaded optimizer state does not combine with graph capture");
  if (offload_) return failed_precondition("the optimizer state is already offloaded to {}", offload_->dir());
  KILN_ASSIGN_OR_RETURN(offload_, OffloadedMoments::create(dir, plan_->state_size(), chunk_floats));
  const float* m = m_.data<float>();
  const float* v = v_.data<float>();
  if (Status st = offload_->stream([&](int64_t begin, int64_t count, float* mc, float* vc) {
        std::copy(m + begin, m + begin + count, mc);
        std::copy(v + begin, v + begin + count, vc);
      });
      !st.ok()) {
    offload_.reset();
    return st;
  }
  offload_->take_stats();  // the copy-in is not a step's traffic
  m_ = Tensor();
  v_ = Tensor();
  default_allocator().empty_cache();  // their blocks go back to the OS, not to the cache
  return {};
}

Status Trainer::read_moments(const std::vector<OptimizerPiece>& pieces, std::span<float> m, std::span<float> v) const {
  const std::vector<int64_t> at = piece_starts(pieces);
  return visit_moments(pieces, /*write_back=*/false, [&](size_t k, int64_t i, int64_t len, float* pm, float* pv) {
    std::copy(pm, pm + len, m.begin() + at[k] + i);
    std::copy(pv, pv + len, v.begin() + at[k] + i);
  });
}

Status Trainer::write_moments(const std::vector<OptimizerPiece>& pieces, std::span<const float> m,
                              std::span<const float> v) {
  const std::vector<int64_t> at = piece_starts(pieces);
  return visit_moments(pieces, /*write_back=*/true, [&](size_t k, int64_t i, int64_t len, float* pm, float* pv) {
    std::copy(m.begin() + at[k] + i, m.begin() + at[k] + i + len, pm);
    std::copy(v.begin() + at[k] + i, v.begin() + at[k] + i + len, pv);
  });
}

StepStats Trainer::step() {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  ++step_;
  trace::Scope step_scope(trace::Category::kTrain, "step", [&](trace::Event& e) { e.add_arg("step", step_); });
  const int64_t flushed0 = precision_->grads_flushed, rounded0 = precision_->values_rounded;
  const double loss_scale = scaler_.scale();
  state_.lr = learning_rate(o_, step_, total_steps_);
  state_.loss_sum = 0;
  run_step(static_cast<float>(loss_scale));
  const double parts = static_cast<double>(o_.grad_accum * plan_->loss_parts());
  const double loss = plan_->mean_over_data(state_.loss_sum / parts);
  StepStats s;
  s.step = step_;
  s.loss = static_cast<float>(loss);
  s.lr = state_.lr;
  s.grad_norm = state_.norm;
  s.loss_scale = loss_scale;
  s.skipped = !state_.applied;
  s.grads_flushed = precision_->grads_flushed - flushed0;
  s.grads_rounded = precision_->values_rounded - rounded0;
  s.comm = plan_->take_comm_times();
  s.moe = model_.take_moe_stats();
  s.offload = std::exchange(offload_stats_, {});
  s.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  elapsed_ += s.seconds;
  s.elapsed = elapsed_;
  s.tokens_per_second = static_cast<double>(o_.batch * o_.seq_len * o_.grad_accum) / s.seconds;
  // A time budget fixes the step count once the step time is known (after 5 steps), so the
  // cosine schedule still ends at its floor. Ranks agree on it (rank 0's clock decides).
  if (o_.max_seconds > 0) {
    const double agreed = plan_->mean_over_data(elapsed_);  // bitwise the same on every rank
    if (step_ == 5)
      total_steps_ = std::min(total_steps_, step_ + static_cast<int64_t>((o_.max_seconds - agreed) / (agreed / 5)));
    if (agreed >= o_.max_seconds) stop_ = true;
  }
  if (val_ && o_.eval_every > 0 && (step_ % o_.eval_every == 0 || done())) {
    KILN_TRACE_SCOPE(kTrain, "eval");
    s.val_loss = validation_loss();
  }
  return s;
}

namespace {

nlohmann::json options_json(const TrainOptions& o) {
  return {{"batch", o.batch}, {"seq_len", o.seq_len}, {"grad_accum", o.grad_accum}, {"lr", o.lr},
          {"min_lr_fraction", o.min_lr_fraction}, {"warmup_steps", o.warmup_steps},
          {"weight_decay", o.weight_decay}, {"beta1", o.beta1}, {"beta2", o.beta2}, {"clip_norm", o.clip_norm},
          {"seed", o.seed}};
}

// Only non-default precisions are recorded, so checkpoints from before mixed precision load.
nlohmann::json options_json_with_precision(const TrainOptions& o) {
  nlohmann::json j = options_json(o);
  if (o.precision != Precision::kF32) j["precision"] = std::string(precision_name(o.precision));
  return j;
}
}  // namespace

CheckpointHeader Trainer::checkpoint_meta() const {
  CheckpointHeader h;
  h.step = step_;
  h.num_params = plan_->checkpoint_num_params();
  h.model = model_.config().describe();
  h.options = options_json_with_precision(o_);
  h.loss_scale = scaler_.scale();
  h.loss_scale_good_steps = scaler_.good_steps();
  // A step count derived from a time budget is part of the schedule; --steps comes from the flags.
  if (o_.max_seconds > 0) h.time_budget_steps = total_steps_;
  return h;
}

namespace {
// The pieces' values gathered into one view (ranges in piece order).
struct PieceBuffers {
  std::vector<float> params, m, v;
  ShardView view;
};
PieceBuffers piece_buffers(const std::vector<OptimizerPiece>& pieces, int64_t num_params) {
  PieceBuffers b;
  int64_t n = 0;
  for (const OptimizerPiece& p : pieces) {
    b.view.ranges.push_back({p.flat_begin, p.flat_begin + p.n});
    n += p.n;
  }
  b.params.resize(static_cast<size_t>(n));
  b.m.resize(static_cast<size_t>(n));
  b.v.resize(static_cast<size_t>(n));
  b.view.num_params = num_params;
  b.view.params = b.params;
  b.view.m = b.m;
  b.view.v = b.v;
  return b;
}
}  // namespace

Status Trainer::save_checkpoint(const std::string& path) const {
  if (comm::Communicator* c = plan_->communicator()) {  // every rank its pieces, then a manifest
    const std::vector<OptimizerPiece> pieces = plan_->checkpoint_pieces();
    PieceBuffers b = piece_buffers(pieces, plan_->checkpoint_num_params());
    size_t at = 0;
    for (const OptimizerPiece& p : pieces) {
      std::copy(p.params, p.params + p.n, b.params.begin() + static_cast<std::ptrdiff_t>(at));
      at += static_cast<size_t>(p.n);
    }
    // A failed read stops this rank before the others wait for it in the manifest's gather:
    // the job ends with the message rather than hanging.
    const Status st = read_moments(pieces, b.m, b.v);
    KILN_CHECK_MSG(st.ok(), "{}", st.message());
    return save_sharded_checkpoint(*c, path, checkpoint_meta(), b.view);
  }
  if (offload_) {  // the moments (in the model's order, as m_ holds them) out of the file for the writer
    std::vector<float> m(static_cast<size_t>(model_.num_params())), v(m.size());
    KILN_RETURN_IF_ERROR(offload_->stream(
        [&](int64_t begin, int64_t count, float* mc, float* vc) {
          std::copy(mc, mc + count, m.begin() + begin);
          std::copy(vc, vc + count, v.begin() + begin);
        },
        /*write_back=*/false));
    const ShardView all{model_.num_params(), {{0, model_.num_params()}}, model_.params(), m, v};
    return save_checkpoint_file(path, checkpoint_meta(), all);
  }
  const ShardView all{model_.num_params(), {{0, model_.num_params()}}, model_.params(),
                      {m_.data<float>(), static_cast<size_t>(m_.numel())}, {v_.data<float>(), static_cast<size_t>(v_.numel())}};
  return save_checkpoint_file(path, checkpoint_meta(), all);
}


Status Trainer::restore(const CheckpointHeader& h, const std::string& path, const std::vector<OptimizerPiece>& pieces,
                        const PieceBuffersRef& from) {
  if (h.num_params != plan_->checkpoint_num_params())
    return invalid_argument("{} holds {} parameters; this model has {} ({})", path, h.num_params,
                            plan_->checkpoint_num_params(), h.model);
  if (h.options != options_json_with_precision(o_))
    return invalid_argument("{} was written with options {}; resume with the same ones (now {})", path,
                            h.options.dump(), options_json_with_precision(o_).dump());
  KILN_RETURN_IF_ERROR(write_moments(pieces, from.m, from.v));
  size_t at = 0;
  for (const OptimizerPiece& p : pieces) {
    const auto a = static_cast<std::ptrdiff_t>(at);
    std::copy(from.params.begin() + a, from.params.begin() + a + p.n, p.params);
    at += static_cast<size_t>(p.n);
  }
  step_ = h.step;
  scaler_.restore(h.loss_scale, h.loss_scale_good_steps);
  plan_->after_optimizer_step();  // the layout makes its parameters whole again
  sync_backends(model_);
  if (o_.max_seconds > 0 && h.time_budget_steps) total_steps_ = *h.time_budget_steps;
  return {};
}

Status Trainer::load_checkpoint(const std::string& path) {
  const std::vector<OptimizerPiece> pieces = plan_->restore_pieces();
  if (comm::Communicator* c = plan_->communicator()) {  // a sharded directory or a single file, at any P
    PieceBuffers b = piece_buffers(pieces, plan_->checkpoint_num_params());
    KILN_ASSIGN_OR_RETURN(const CheckpointHeader h, load_sharded_checkpoint(*c, path, b.view));
    return restore(h, path, pieces, {b.params, b.m, b.v});
  }
  // One process: a single file or a sharded directory, read whole and verified before anything
  // is overwritten (staged: params, m and v are held twice meanwhile).
  KILN_ASSIGN_OR_RETURN(const FullCheckpoint full, load_checkpoint_whole(path));
  return restore(full.meta, path, pieces, {full.params, full.m, full.v});
}

std::vector<StepStats> train(Transformer& model, const TokenShard& train_data, const TokenShard* val_data,
                             const TrainOptions& o, const std::function<void(const StepStats&)>& on_step) {
  Trainer trainer(model, train_data, val_data, o);
  std::vector<StepStats> history;
  while (!trainer.done()) {
    history.push_back(trainer.step());
    if (on_step) on_step(history.back());
  }
  return history;
}

}  // namespace kiln
