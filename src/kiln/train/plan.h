// The trainer's parallel plan interface: everything a layout changes about a training step.
// The model reports through ModelHooks (transformer.h) where parameters are needed and when a
// gradient range is final; the plan answers with gathers, reductions and releases. The
// optimizer then steps over the pieces this rank owns only. SingleProcessPlan is the trivial
// plan (one process, the whole model); the layouts (DDP, ZeRO, FSDP, HSDP) are in
// src/kiln/parallel.
#pragma once

#include <span>
#include <vector>

#include "kiln/comm/communicator.h"
#include "kiln/model/transformer.h"

namespace kiln {

// n values of the optimizer's state this rank updates: the fp32 master weights and their
// (reduced) gradients wherever the layout keeps them, and the AdamW moments at state_offset
// of the trainer's m and v. flat_begin: where the values sit in the model's flat layout.
struct OptimizerPiece {
  float* params = nullptr;
  float* grads = nullptr;
  int64_t n = 0;
  int64_t state_offset = 0;
  int64_t flat_begin = 0;
  bool decay = false;  // AdamW weight decay applies
};

// Communication of one step, from timestamps: `comm` is the time the communication threads
// ran calls, `exposed` the time the compute thread waited for them (not hidden by compute).
struct CommTimes {
  double comm_seconds = 0, exposed_seconds = 0;
};

class ParallelPlan : public ModelHooks {
 public:
  ~ParallelPlan() override = default;
  // Once, before the first step: takes the model (installs itself as its hooks). The model's
  // parameters are the initial values on every rank after this.
  virtual void attach(Transformer& model) = 0;
  // This rank's part of each global batch: rows [data_rank · B / data_size, ...) of B.
  virtual int data_rank() const { return 0; }
  virtual int data_size() const { return 1; }
  // Gradients start from zero.
  virtual void begin_step() = 0;
  // Before each micro-batch's forward; `last`: the step's last micro-batch (layouts that
  // reduce once per step skip the reduction on the others, PyTorch's no_sync).
  virtual void begin_micro_batch(bool /*last*/) {}
  // One micro-batch's forward and backward (rows × seq_len of this rank): the model's, or a
  // layout that runs them itself (a pipeline schedule over its stages). Returns the loss the
  // gradients are of, summed over loss_parts() parts (each a mean over its rows) on every rank;
  // the trainer divides both by loss_parts().
  virtual double forward_backward(Transformer& model, const int32_t* tokens, const int32_t* targets, int64_t rows,
                                  int64_t seq_len, float loss_scale);
  // The mean loss of a forward without backward (validation), on every rank.
  virtual double forward_loss(Transformer& model, const int32_t* tokens, const int32_t* targets, int64_t rows,
                              int64_t seq_len);
  virtual int64_t loss_parts() const { return 1; }
  // After the last backward: every reduction is done; pieces() hold the gradient summed over
  // micro-batches and averaged over the data-parallel ranks.
  virtual void finish_gradients() {}
  virtual std::span<const OptimizerPiece> pieces() const = 0;
  // Floats of AdamW m (and v) this rank holds.
  virtual int64_t state_size() const = 0;
  // x summed over the ranks that hold different pieces (the gradient norm's squares).
  virtual double sum_over_shards(double x) { return x; }
  // x averaged over the data-parallel ranks (the loss).
  virtual double mean_over_data(double x) { return x; }
  // After the pieces' parameters changed (an optimizer step, a checkpoint load): parameters
  // made whole again where the layout needs them (ZeRO-1/2 all-gather; ZeRO-3 drops its stale
  // gathered units).
  virtual void after_optimizer_step() {}
  // The communication since the last call.
  virtual CommTimes take_comm_times() { return {}; }
  // A short name for reports ("single", "ddp", "zero1", "fsdp", "hsdp").
  virtual std::string describe() const = 0;
  // The ranks of the run, for sharded checkpoints (train/sharded_checkpoint.h); null: one
  // process, which writes the single-file checkpoint (train/checkpoint.h).
  virtual comm::Communicator* communicator() { return nullptr; }
  // The pieces this rank writes to a sharded checkpoint: over all ranks they tile the
  // parameters once (replicated state is written by one of its holders).
  virtual std::vector<OptimizerPiece> checkpoint_pieces() const {
    return {pieces().begin(), pieces().end()};
  }
  // The pieces this rank reads back from a checkpoint (its own state, wherever it sits in the
  // checkpoint's flat vector: flat_begin), and the size of that vector. A tensor-parallel shard
  // maps its runs into the single-process model's layout.
  virtual std::vector<OptimizerPiece> restore_pieces() const { return {pieces().begin(), pieces().end()}; }
  virtual int64_t checkpoint_num_params() const = 0;
  // fp8: the ranks that reduce each tensor's amax (PrecisionContext::amax_group); null: every
  // rank scales by its own (a data-parallel rank by its rows' amax).
  virtual comm::Communicator* amax_group() { return nullptr; }
};

// One process: the whole model's buffers, no communication.
class SingleProcessPlan final : public ParallelPlan {
 public:
  void attach(Transformer& model) override;
  void begin_step() override { model_->zero_grad(); }
  std::span<const OptimizerPiece> pieces() const override { return pieces_; }
  int64_t state_size() const override { return model_->num_params(); }
  int64_t checkpoint_num_params() const override { return model_->num_params(); }
  std::string describe() const override { return "single"; }
  bool captured() const override { return true; }  // its hooks are the defaults: nothing runs

 private:
  Transformer* model_ = nullptr;
  std::vector<OptimizerPiece> pieces_;
};

// One piece per parameter of the model's flat buffers, the moments at the same offsets (the
// single-process layout, and DDP's).
std::vector<OptimizerPiece> whole_model_pieces(Transformer& model);

}  // namespace kiln
