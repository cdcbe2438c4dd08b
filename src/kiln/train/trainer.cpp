// Training loop and checkpoints (the file format is checkpoint.h).
#include "kiln/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

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
  model_.set_checkpointing(o.checkpoint);
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

graph::GraphKey Trainer::graph_key(const int32_t* tokens, const int32_t* targets, float loss_scale) const {
  graph::GraphKey k;
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &loss_scale, sizeof(scale_bits));
  k.add("threads", num_threads())
      .add("simd target", static_cast<int64_t>(active_simd_target()))
      .add("model buffers epoch", static_cast<int64_t>(model_.buffer_epoch()))
      .add("tokens address", static_cast<int64_t>(reinterpret_cast<uintptr_t>(tokens)))
      .add("targets address", static_cast<int64_t>(reinterpret_cast<uintptr_t>(targets)))
      .add("loss scale bits", scale_bits);
  return k;
}

// One micro-batch through the plan: eagerly, or (--graph capture) replayed from the graph
// captured from the first one (again when a guard fails).
double Trainer::forward_backward(const int32_t* tokens, const int32_t* targets, float loss_scale) {
  double loss = 0;
  const auto eager = [&] {
    loss = plan_->forward_backward(model_, tokens, targets, rows_, o_.seq_len, loss_scale);
    return true;
  };
  if (!o_.graph_capture) {
    eager();
    return loss;
  }
  graph::StepGraph::Step step;
  step.key = [&] { return graph_key(tokens, targets, loss_scale); };
  step.eager = eager;
  step.keep = [&](graph::Graph& g) {
    for (auto [p, bytes] : model_.graph_outputs()) g.keep(p, bytes);
  };
  step.pass = o_.graph_pass;
  const graph::StepGraph::Ran ran = graph_.run(step, graph_stats_);
  return ran == graph::StepGraph::Ran::kReplayed ? model_.last_loss() : loss;
}

StepStats Trainer::step() {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  ++step_;
  trace::Scope step_scope(trace::Category::kTrain, "step", [&](trace::Event& e) { e.add_arg("step", step_); });
  plan_->begin_step();
  const int64_t flushed0 = precision_->grads_flushed, rounded0 = precision_->values_rounded;
  const double loss_scale = scaler_.scale();
  const int64_t first = plan_->data_rank() * rows_ * o_.seq_len;  // this rank's rows of the global batch
  double loss = 0;
  for (int64_t micro = 0; micro < o_.grad_accum; ++micro) {
    {
      KILN_TRACE_SCOPE(kTrain, "data");
      loader_.batch_at((step_ - 1) * o_.grad_accum + micro, x_, y_);
    }
    plan_->begin_micro_batch(micro + 1 == o_.grad_accum);
    KILN_TRACE_SCOPE(kTrain, "forward_backward");
    loss += forward_backward(x_.data() + first, y_.data() + first, static_cast<float>(loss_scale));
  }
  {
    KILN_TRACE_SCOPE(kTrain, "reduction_wait");  // the gradient reductions still in flight
    plan_->finish_gradients();
  }
  const double parts = static_cast<double>(o_.grad_accum * plan_->loss_parts());
  loss = plan_->mean_over_data(loss / parts);
  // Unscale (1/S) and average over micro-batches in one multiply; S is a power of two in the
  // dynamic scaler, so unscaling is exact.
  const float inv = static_cast<float>(1.0 / (parts * loss_scale));
  double sq = 0;
  {
    KILN_TRACE_SCOPE(kTrain, "grad_norm");
    for (const OptimizerPiece& p : plan_->pieces()) {
      for (int64_t i = 0; i < p.n; ++i) {
        p.grads[i] *= inv;
        sq += static_cast<double>(p.grads[i]) * p.grads[i];
      }
    }
    sq = plan_->sum_over_shards(sq);
  }
  const double norm = std::sqrt(sq);
  const bool apply = scaler_.update(!std::isfinite(sq));  // an inf or NaN anywhere makes sq non-finite
  AdamWConfig cfg;
  cfg.lr = learning_rate(o_, step_, total_steps_);
  cfg.beta1 = o_.beta1;
  cfg.beta2 = o_.beta2;
  if (apply) {
    KILN_TRACE_SCOPE(kTrain, "optimizer");
    const float clip = o_.clip_norm > 0 && norm > o_.clip_norm ? static_cast<float>(o_.clip_norm / (norm + 1e-6)) : 1.0f;
    for (const OptimizerPiece& p : plan_->pieces()) {
      if (clip != 1.0f)
        for (int64_t i = 0; i < p.n; ++i) p.grads[i] *= clip;
      cfg.weight_decay = p.decay ? o_.weight_decay : 0.0;
      cpu::adamw_step(p.params, p.grads, m_.data<float>() + p.state_offset, v_.data<float>() + p.state_offset, p.n,
                      cfg, step_);
    }
    plan_->after_optimizer_step();
    sync_backends(model_);  // low-precision copies (and any other backend's state) follow the master
  }
  StepStats s;
  s.step = step_;
  s.loss = static_cast<float>(loss);
  s.lr = cfg.lr;
  s.grad_norm = norm;
  s.loss_scale = loss_scale;
  s.skipped = !apply;
  s.grads_flushed = precision_->grads_flushed - flushed0;
  s.grads_rounded = precision_->values_rounded - rounded0;
  s.comm = plan_->take_comm_times();
  s.moe = model_.take_moe_stats();
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
      std::copy(m_.data<float>() + p.state_offset, m_.data<float>() + p.state_offset + p.n, b.m.begin() + static_cast<std::ptrdiff_t>(at));
      std::copy(v_.data<float>() + p.state_offset, v_.data<float>() + p.state_offset + p.n, b.v.begin() + static_cast<std::ptrdiff_t>(at));
      at += static_cast<size_t>(p.n);
    }
    return save_sharded_checkpoint(*c, path, checkpoint_meta(), b.view);
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
  size_t at = 0;
  for (const OptimizerPiece& p : pieces) {
    const auto a = static_cast<std::ptrdiff_t>(at);
    std::copy(from.params.begin() + a, from.params.begin() + a + p.n, p.params);
    std::copy(from.m.begin() + a, from.m.begin() + a + p.n, m_.data<float>() + p.state_offset);
    std::copy(from.v.begin() + a, from.v.begin() + a + p.n, v_.data<float>() + p.state_offset);
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
