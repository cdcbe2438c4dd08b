// Pipeline parallelism as a plan (train/plan.h) over a pp × dp × tp mesh (comm/mesh.h, pp
// slowest): each pp rank builds the model's stage (PipelineStage, model/transformer.h: a range
// of the same blocks, the embedding on the first, the head and loss on the last) and runs a
// step as a schedule (pipeline_schedule.h) of M micro-batches: one executor runs any valid
// action list, with nonblocking point-to-point activations and gradients between neighbouring
// stages (receives posted ahead, waited on by the compute that consumes them), each
// micro-batch's saved activations in their own slot until its backward, and zero-bubble's
// weight gradients deferred to their W action. Every compute action and every wait is
// timestamped: the measured timeline, its bubble and the peak activation memory come from them.
//
// Within a stage the ranks are a TensorParallelPlan (tp ≥ 1; DDP over dp, or ZeRO-1 at
// tp = 1): gradient buckets, tensor-parallel partial gradients, the norm over shards, and
// checkpoints in the single-process layout are its. This plan adds what crosses stages: the tied embedding's
// gradient summed between the first stage and the last stage's copy, the gradient norm and the
// loss over the stages, and the whole model for export.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/comm/mesh.h"
#include "kiln/parallel/pipeline_schedule.h"
#include "kiln/parallel/tensor_parallel.h"

namespace kiln::parallel {

struct PipelineOptions {
  int pp = 1;                  // --pp: stages (consecutive groups of dp × tp world ranks)
  std::vector<int> layers;     // --pp-layers: blocks per stage (empty: balanced by FLOPs)
  int micro_batches = 1;       // --micro-batches M per optimizer micro-step
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::k1F1B;  // --schedule
  int virtual_stages = 1;      // --virtual-stages V (interleaved)
};

// Blocks [begin, end) of each virtual stage (pp × virtual_stages of them, in model order): the
// explicit split checked, or the FLOP-balanced one. Rank r holds stages r, r + pp, ….
Expected<std::vector<BlockRange>> pipeline_stages(const PipelineOptions& o, const ModelConfig& c);

// The same verdict on every rank, with no communication: the schedule is valid for (pp, M, V),
// the stages split the model, pp × tp divides the world, every micro-batch has rows
// (batch divisible by dp × M), and what the executor does not support is named: interleaved
// stages on one rank, ZeRO-2/3 and FSDP over stages, and zero-bubble with a non-fp32 precision or
// activation checkpointing or sequence parallelism (W reads the saved activations B left).
Status check_pipeline_parallel(const PipelineOptions& o, const ModelConfig& c, int world,
                               const TensorParallelOptions& tp, const DataParallelOptions& dp,
                               const TrainOptions& train);

// One step's measurements: the timeline of this rank (compute actions and receive waits) and
// the activation memory its schedule held.
struct PipelineStepReport {
  std::vector<pipeline::TimedAction> timeline;  // this rank's, seconds from the step's start
  double seconds = 0;                           // the step's wall time on this rank
  int peak_micro_batches = 0;                   // activation slots in use at once
  int64_t peak_activation_bytes = 0;            // of them, plus zero-bubble's queued gradients
  double wait_seconds = 0;                      // compute waiting on receives
};

struct StagePeak {
  int micro_batches = 0;  // activation slots in use at once
  int64_t bytes = 0;      // of them, plus zero-bubble's queued output gradients
};

class PipelineParallelPlan final : public ParallelPlan {
 public:
  // Collective over `world`: the mesh, the stage's communicators and its TensorParallelPlan.
  static Expected<std::unique_ptr<PipelineParallelPlan>> create(comm::Communicator& world, const PipelineOptions& o,
                                                                const TensorParallelOptions& tp,
                                                                const DataParallelOptions& dp,
                                                                const ModelConfig& config, const TrainOptions& train);
  ~PipelineParallelPlan() override;

  // What to build the model for (Transformer::create(config, seed, shard(), stage())).
  TensorShard shard() { return inner_->shard(); }
  PipelineStage stage() const;  // this rank's chunks
  const std::vector<BlockRange>& stages() const { return stages_; }  // every virtual stage
  const pipeline::Schedule& schedule() const { return schedule_; }
  int pp_rank() const { return mesh_->coord("pp"); }

  void attach(Transformer& model) override;
  int data_rank() const override { return inner_->data_rank(); }
  int data_size() const override { return inner_->data_size(); }
  void begin_step() override { inner_->begin_step(); }
  void begin_micro_batch(bool last) override { last_micro_ = last; }
  // Runs the schedule over M micro-batches of rows / M rows each; the sum of their mean losses
  // on every rank (the last stage computes it).
  double forward_backward(Transformer& model, const int32_t* tokens, const int32_t* targets, int64_t rows,
                          int64_t seq_len, float loss_scale) override;
  double forward_loss(Transformer& model, const int32_t* tokens, const int32_t* targets, int64_t rows,
                      int64_t seq_len) override;
  int64_t loss_parts() const override { return o_.micro_batches; }
  void finish_gradients() override;
  std::span<const OptimizerPiece> pieces() const override { return inner_->pieces(); }
  int64_t state_size() const override { return inner_->state_size(); }
  double sum_over_shards(double x) override;
  double mean_over_data(double x) override;
  void after_optimizer_step() override { inner_->after_optimizer_step(); }
  CommTimes take_comm_times() override;
  std::string describe() const override;
  comm::Communicator* communicator() override { return &mesh_->world(); }
  std::vector<OptimizerPiece> checkpoint_pieces() const override;
  // The stage's pieces in whole-model order (the last stage's copy of the tied embedding, at
  // offset 0, first): a checkpoint is read range by range in that order.
  std::vector<OptimizerPiece> restore_pieces() const override;
  int64_t checkpoint_num_params() const override { return inner_->checkpoint_num_params(); }
  comm::Communicator* amax_group() override { return inner_->amax_group(); }

  void before_model(Pass pass) override { inner_->before_model(pass); }
  void before_block(int64_t block, Pass pass) override { inner_->before_block(block, pass); }
  void after_block(int64_t block, Pass pass) override { inner_->after_block(block, pass); }
  void grads_ready(ParamRange range) override { inner_->grads_ready(range); }

  // The last forward_backward's measurements on this rank.
  const PipelineStepReport& last_step() const { return report_; }
  // Collective over the world: every rank's timeline of the last step, on every rank
  // (TimedAction.rank is the pp rank; the dp × tp ranks of a stage keep the first's).
  std::vector<pipeline::TimedAction> gather_timeline() const;
  // Collective over the world: each stage's peak activation memory in the last step.
  std::vector<StagePeak> gather_peaks() const;
  // Collective over the world: the single-process flat parameters, on every rank.
  std::vector<float> gather_full(std::span<const float> local) const;

 private:
  PipelineParallelPlan() = default;
  struct Executor;  // one step's buffers and requests (pipeline.cpp)

  PipelineOptions o_;
  std::unique_ptr<comm::DeviceMesh> mesh_;
  std::unique_ptr<comm::Communicator> stage_world_;  // the dp × tp ranks of this stage
  std::unique_ptr<TensorParallelPlan> inner_;
  std::unique_ptr<comm::Communicator> embedding_group_;  // first and last stage (tied embeddings)
  std::vector<BlockRange> stages_;
  pipeline::Schedule schedule_;
  Transformer* model_ = nullptr;
  const ParamEntry* stage_copy_ = nullptr;  // the last stage's copy of the tied embedding
  int64_t embedding_offset_ = -1;           // the tied table's offset on this rank (first or last stage)
  int64_t embedding_numel_ = 0;
  bool last_micro_ = true;
  PipelineStepReport report_;
  double p2p_wait_seconds_ = 0, cross_stage_seconds_ = 0;  // since take_comm_times()
};

// The last step's bubble three ways (lesson 9): measured on the gathered timeline; ideal, the
// same action lists simulated with the measured mean cost of each compute action (no
// communication); and the textbook formula with those costs. Collective over the world: every
// rank calls it after a step (`kiln train --pp`'s report and `kiln bench pp` read it).
// The last step's bubble three ways: measured; `ideal`, the same lists simulated with the mean
// measured F / B / W over all stages (a balanced pipeline: its bubble is the formula's); and
// `staged`, simulated with each stage's own mean costs (what this split could reach without
// communication and overheads: the gap to `ideal` is the stages' imbalance).
struct PipelineBubble {
  std::vector<pipeline::TimedAction> measured, ideal, staged;  // every rank's actions, the step's start at 0
  pipeline::ScheduleStats measured_stats, ideal_stats, staged_stats;
  double formula = 0;           // bubble_formula() of the schedule with `costs`
  pipeline::ActionCosts costs;  // mean measured F, B (or BI), W seconds; an unsplit B halved into B + W
  double backward_seconds = 0;  // mean measured B (B and W together) or BI (zero-bubble)
  bool split_backward = false;  // W measured on its own (zero-bubble's lists)
};
PipelineBubble measure_bubble(const PipelineParallelPlan& plan);

}  // namespace kiln::parallel
