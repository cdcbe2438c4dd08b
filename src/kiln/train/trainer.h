// The training loop: AdamW (fused kernel, decoupled weight decay on matrices only), cosine
// learning rate with linear warm-up, clipping by global gradient norm, gradient accumulation,
// periodic validation loss, deterministic given the seed. Mixed precision (precision.h): the
// precision's backends on every Linear, loss scaling, and sync() of every installed backend
// after each optimizer step; activation checkpointing (checkpoint_mode.h).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kiln/core/graph.h"
#include "kiln/kernels/adamw.h"
#include "kiln/model/transformer.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/data.h"
#include "kiln/train/offload.h"
#include "kiln/train/plan.h"
#include "kiln/train/precision.h"

namespace kiln {

struct TrainOptions {
  int64_t batch = 8, seq_len = 256;
  int64_t max_steps = 1000;
  double max_seconds = 0;   // > 0: stop after this much wall time
  int64_t grad_accum = 1;
  double lr = 3e-3, min_lr_fraction = 0.1;
  int64_t warmup_steps = 50;
  double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95;
  double clip_norm = 1.0;   // 0: no clipping
  int64_t eval_every = 100, eval_batches = 8;
  uint64_t seed = 1;
  // Mixed precision and memory.
  Precision precision = Precision::kF32;
  double loss_scale = 1.0;           // static S, or the initial S when dynamic
  bool dynamic_loss_scale = false;   // halve S and skip the step on inf/NaN; double after a window
  int64_t loss_scale_window = 1000;  // good steps before S doubles
  int amax_history = 16;             // fp8 delayed scaling: amaxes remembered per tensor
  CheckpointMode checkpoint = CheckpointMode::kNone;
  // Each step replays one captured graph (core/graph.h) of its data loads, forwards, backwards
  // and optimizer update. --graph capture
  bool graph_capture = false;
  graph::GraphPass graph_pass;  // run on the graph before it is planned (--graph fused)
  bool split_epilogues = false;  // Transformer::set_split_epilogues (--split-epilogues)
};

struct StepStats {
  int64_t step = 0;
  float loss = 0;
  double lr = 0, grad_norm = 0;
  double tokens_per_second = 0;
  double seconds = 0;          // wall time of this step
  double elapsed = 0;          // since the start
  double val_loss = -1;        // >= 0 on evaluation steps
  double loss_scale = 1;       // S used for this step's backward
  bool skipped = false;        // inf/NaN gradients: no optimizer step
  int64_t grads_flushed = 0;   // fp16: output-gradient values rounded to zero in this step
  int64_t grads_rounded = 0;   // fp16: output-gradient values rounded in this step
  CommTimes comm;              // data-parallel layouts: communication of this step
  MoeStats moe;                // MoE models: this step's routing (every micro-batch)
  OffloadStats offload;        // offloaded optimizer state: this step's transfers
};

// Learning rate at `step` (1-based): linear warm-up, then cosine decay to min_lr_fraction·lr.
double learning_rate(const TrainOptions& o, int64_t step, int64_t total_steps);

// One training run's state: the model, AdamW moments and the step count. The data order is a
// function of (seed, step), so a checkpoint of this state resumes to exactly the losses of
// an uninterrupted run. The step runs over a parallel plan (plan.h): `options.batch` is the
// global batch, of which each data-parallel rank computes its rows; null: one process.
class Trainer {
 public:
  Trainer(Transformer& model, const TokenShard& train_data, const TokenShard* val_data, const TrainOptions& options,
          ParallelPlan* plan = nullptr);
  ~Trainer();

  // One optimizer step (grad_accum micro-batches); evaluates when due.
  StepStats step();
  bool done() const { return step_ >= total_steps_ || stop_; }
  int64_t steps_done() const { return step_; }
  int64_t total_steps() const { return total_steps_; }
  const LossScaler& loss_scaler() const { return scaler_; }
  const PrecisionContext& precision_context() const { return *precision_; }
  ParallelPlan& plan() { return *plan_; }
  // Graph capture's counters (TrainOptions::graph_capture), else null.
  const graph::GraphStats* graph_stats() const { return o_.graph_capture ? &graph_stats_ : nullptr; }
  // Mean loss over the first eval_batches validation batches (each rank its rows).
  double validation_loss();

  // Moves AdamW's m and v (this rank's, with their current values) into a file in `dir`
  // (offload.h) and frees them from memory; every later optimizer step streams them through.
  // Errors (the directory, its space) leave the moments in memory. Not with graph capture (a
  // captured step writes the moments in place).
  Status offload_optimizer_state(const std::string& dir,
                                 int64_t chunk_floats = OffloadedMoments::kDefaultChunkFloats);
  // The store the moments live in, or null (in memory).
  const OffloadedMoments* offloaded_moments() const { return offload_.get(); }

  // params, AdamW m and v, the step and the options that decide the losses, each section with
  // its CRC-32C (checkpoint.h); written to a temporary file and renamed. Loading checks that the
  // model and those options match and refuses a checksum mismatch naming the section, before
  // overwriting anything.
  // Over several ranks (a plan with a communicator), `path` is a directory of shards and a
  // manifest (sharded_checkpoint.h); loading reads a sharded directory written at any P or a
  // single-process file, and one process reads a sharded directory too (resharding).
  Status save_checkpoint(const std::string& path) const;
  Status load_checkpoint(const std::string& path);

 private:
  Transformer& model_;
  const TokenShard* val_;
  TrainOptions o_;
  std::unique_ptr<ParallelPlan> own_plan_;
  ParallelPlan* plan_;
  BatchLoader loader_;
  Tensor m_, v_;  // AdamW moments (num_params,), from the caching allocator; empty when offloaded
  std::unique_ptr<OffloadedMoments> offload_;  // where the moments live when offloaded
  OffloadStats offload_stats_;                 // the last optimizer update's transfers
  std::shared_ptr<PrecisionContext> precision_;
  LossScaler scaler_;
  int64_t step_ = 0;
  int64_t total_steps_;
  bool stop_ = false;
  double elapsed_ = 0;  // seconds of steps run by this process
  std::vector<int32_t> x_, y_;
  int64_t rows_ = 0;  // rows of each batch this rank computes
  // What a step's nodes compute for the host and for each other (read at run time, so replayed
  // steps see this step's values): the learning rate in, the loss, norm and verdicts out.
  struct StepState {
    double lr = 0;        // set before the step
    double loss_sum = 0;  // the micro-batches' losses
    double sq = 0, norm = 0;  // the unscaled gradient's squared norm (over shards) and norm
    float clip = 1;       // the factor clipping scales the gradient by
    bool applied = false;  // the loss scaler let the update through (no inf or NaN)
  };
  StepState state_;
  // --graph capture: the whole step (data, forward, backward, unscale, norm, clip, AdamW; the
  // joint graph) captured once and replayed while its guards hold.
  graph::StepGraph graph_;
  graph::GraphStats graph_stats_;
  graph::GraphKey graph_key(float loss_scale) const;
  void run_step(float loss_scale);   // eagerly or replayed
  void step_body(float loss_scale);  // what run_step captures

  struct PieceBuffersRef {
    std::span<const float> params, m, v;  // the pieces' values, concatenated in piece order
  };
  CheckpointHeader checkpoint_meta() const;
  // The AdamW update of every piece; offloaded, chunk by chunk as the moments stream past.
  void optimizer_update();
  template <class Fn>
  Status visit_moments(std::span<const OptimizerPiece> pieces, bool write_back, const Fn& fn) const;
  // The moments of `pieces`, concatenated in piece order, out of memory or the file, and back.
  Status read_moments(const std::vector<OptimizerPiece>& pieces, std::span<float> m, std::span<float> v) const;
  Status write_moments(const std::vector<OptimizerPiece>& pieces, std::span<const float> m, std::span<const float> v);
  // Checks h against this run, then puts the values in place.
  Status restore(const CheckpointHeader& h, const std::string& path, const std::vector<OptimizerPiece>& pieces,
                 const PieceBuffersRef& from);
};

// Trains to completion; calls on_step after each step. Returns the stats of every step.
std::vector<StepStats> train(Transformer& model, const TokenShard& train_data, const TokenShard* val_data,
                             const TrainOptions& options, const std::function<void(const StepStats&)>& on_step);

// Mean loss over up to `batches` sequential validation batches; rows [first_row, first_row +
// rows) of each (rows < 0: all `batch`), a data-parallel rank's part; through `plan`'s
// forward_loss when given (a pipeline runs the stages).
double evaluate(Transformer& model, const TokenShard& data, int64_t batch, int64_t seq_len, int64_t batches,
                int64_t first_row = 0, int64_t rows = -1, ParallelPlan* plan = nullptr);

}  // namespace kiln
