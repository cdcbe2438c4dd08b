// Context parallelism as a plan (train/plan.h) over a dp × cp × tp mesh (comm/mesh.h): each sequence
// of the batch is split over the cp ranks of a group by a SequenceLayout (contiguous or zig-zag,
// sequence_layout.h); a rank's forward sees its T / cp token rows of every sequence of its data
// rank's rows (ContextShard, model/transformer.h: RoPE at their global positions), attention runs
// over the whole sequence through ring attention or Ulysses (context_parallel.h), and everything
// else is local. Each rank's loss is the mean over its tokens, so with the same number of valid
// targets on every rank the mean over all dp × cp ranks is the global mean: the gradients are
// DDP's over every rank (a DataParallelPlan over the world), and the losses, gradients and
// weights are the single-process run's. With tp > 1 the model is also built for its tensor
// shard (the cp group's ranks share a tp coordinate, so attention sees this shard's heads) and a
// TensorParallelPlan over the world does the gradients instead: DDP over the dp × cp ranks of the
// same tp coordinate, the tp group's partial sums and checkpoint mapping as without --cp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/comm/mesh.h"
#include "kiln/parallel/context_parallel.h"
#include "kiln/parallel/data_parallel.h"
#include "kiln/parallel/tensor_parallel.h"
#include "kiln/train/plan.h"
#include "kiln/train/trainer.h"

namespace kiln::parallel {

enum class CpMethod { kRing, kUlysses, kHybrid };
std::string_view cp_method_name(CpMethod m);
Expected<CpMethod> parse_cp_method(std::string_view name);  // "ring" | "ulysses" | "hybrid"

struct ContextParallelOptions {
  int cp = 1;                            // --cp: ranks of a context-parallel group (consecutive)
  LayoutKind layout = LayoutKind::kZigzag;  // --cp-layout (of the ring, also inside the hybrid)
  CpMethod method = CpMethod::kRing;     // --cp-method
  int ulysses = 2;                       // --cp-ulysses: the hybrid's Ulysses group (ring over cp / ulysses)
};

// The same verdict on every rank, with no communication: cp × tp divides the world, the model is
// a Llama with multi-head attention (heads and KV heads divide by tp · cp for Ulysses, by
// tp · ulysses for the hybrid, whose Ulysses group divides cp), seq_len splits into the layout's
// chunks (2·cp for zig-zag), the batch over the dp ranks, the tensor
// split as check_tensor_parallel says (sequence parallelism over the T / cp local rows), DDP only
// (ZeRO/FSDP with --cp are not implemented), no activation checkpointing.
Status check_context_parallel(const ContextParallelOptions& o, const TensorParallelOptions& tensor, const ModelConfig& c,
                              int world, const DataParallelOptions& dp, const TrainOptions& train);

class ContextParallelPlan final : public ParallelPlan {
 public:
  static Expected<std::unique_ptr<ContextParallelPlan>> create(comm::Communicator& world,
                                                               const ContextParallelOptions& o,
                                                               const TensorParallelOptions& tensor,
                                                               const DataParallelOptions& dp,
                                                               const ModelConfig& config, const TrainOptions& train);
  ~ContextParallelPlan() override;

  // The shards to build the model for (Transformer::create); valid while the plan lives.
  ContextShard shard() const;
  TensorShard tensor_shard() { return tensor_ ? tensor_->shard() : TensorShard{}; }

  void attach(Transformer& model) override;
  int data_rank() const override { return mesh_->coord("dp"); }
  int data_size() const override { return mesh_->size("dp"); }
  void begin_step() override { inner_->begin_step(); }
  void begin_micro_batch(bool last) override { inner_->begin_micro_batch(last); }
  // This rank's rows of the layout (rows × T / cp tokens), then the model's forward and backward.
  double forward_backward(Transformer& model, const int32_t* tokens, const int32_t* targets, int64_t rows,
                          int64_t seq_len, float loss_scale) override;
  double forward_loss(Transformer& model, const int32_t* tokens, const int32_t* targets, int64_t rows,
                      int64_t seq_len) override;
  void finish_gradients() override { inner_->finish_gradients(); }
  std::span<const OptimizerPiece> pieces() const override { return inner_->pieces(); }
  int64_t state_size() const override { return inner_->state_size(); }
  double sum_over_shards(double x) override { return inner_->sum_over_shards(x); }
  double mean_over_data(double x) override { return inner_->mean_over_data(x); }
  void after_optimizer_step() override { inner_->after_optimizer_step(); }
  CommTimes take_comm_times() override;
  std::string describe() const override;
  comm::Communicator* communicator() override { return inner_->communicator(); }
  comm::Communicator* amax_group() override { return inner_->amax_group(); }
  std::vector<OptimizerPiece> checkpoint_pieces() const override { return inner_->checkpoint_pieces(); }
  std::vector<OptimizerPiece> restore_pieces() const override { return inner_->restore_pieces(); }
  int64_t checkpoint_num_params() const override { return inner_->checkpoint_num_params(); }

  void before_model(Pass pass) override { inner_->before_model(pass); }
  void before_block(int64_t block, Pass pass) override { inner_->before_block(block, pass); }
  void after_block(int64_t block, Pass pass) override { inner_->after_block(block, pass); }
  void grads_ready(ParamRange range) override { inner_->grads_ready(range); }

  const SequenceLayout& layout() const { return layout_; }
  // Collective over the tp group: the single-process flat vector of `local` (this shard's
  // parameters or gradients); a copy at tp 1.
  std::vector<float> gather_full(std::span<const float> local) const {
    return tensor_ ? tensor_->gather_full(local) : std::vector<float>(local.begin(), local.end());
  }
  // The attention calls' work and communication since the last call.
  CpStats take_cp_stats();

 private:
  ContextParallelPlan() = default;
  class Attention;  // the SequenceAttention over the cp group
  int cp_rank() const;  // this rank's place in the layout
  // tokens (rows, T) -> this rank's (rows, T / cp) in the layout's order.
  void local_rows(std::vector<int32_t>& out, const int32_t* in, int64_t rows, int64_t seq_len) const;

  ContextParallelOptions o_;
  std::unique_ptr<comm::DeviceMesh> mesh_;
  std::unique_ptr<ParallelPlan> inner_;  // the gradients' plan: DataParallelPlan (tp 1) or TensorParallelPlan
  TensorParallelPlan* tensor_ = nullptr;  // inner_ when tp > 1
  SequenceLayout layout_;
  std::unique_ptr<Attention> attention_;
  std::vector<int32_t> x_, y_;
};

}  // namespace kiln::parallel
