// Tensor parallelism (Megatron-LM) as a plan (train/plan.h) over a dp × tp mesh (comm/mesh.h):
// the model is built for its tp shard (TensorShard, model/transformer.h: heads, KV heads, FFN
// columns and the vocabulary split; the layers run the column/row-parallel collectives
// themselves), and this plan does what is left between backward and the optimizer:
//
//   * gradients the model leaves partial (sequence parallelism's norms and GPT-2 positions,
//     which saw N / tp token rows; a KV head replicated over tp > n_kv_heads ranks, which saw
//     some of its query heads) are all-reduced over the ranks holding the same values;
//   * the data-parallel axis is a DataParallelPlan over the mesh's dp communicator (DDP:
//     gradient buckets overlapped with backward), unchanged;
//   * the gradient norm sums every shard once (replicated values counted on one holder);
//   * checkpoints hold the single-process model: each rank writes its shard's runs at their
//     offsets in the whole flat vector (train/sharded_checkpoint.h), so `kiln generate`, one
//     process, or any other dp × tp layout reads them back.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/comm/mesh.h"
#include "kiln/parallel/data_parallel.h"
#include "kiln/train/plan.h"
#include "kiln/train/trainer.h"

namespace kiln::parallel {

struct TensorParallelOptions {
  int tp = 1;                      // ranks of a tensor-parallel group (consecutive world ranks)
  bool sequence_parallel = false;  // --sp
};

// The same verdict on every rank, with no communication: tp divides the world, the model splits
// over tp (check_tensor_split), sequence parallelism has seq_len divisible by tp, and the data
// parallel axis is DDP (ZeRO and FSDP over tensor-parallel shards are not implemented).
Status check_tensor_parallel(const TensorParallelOptions& o, const ModelConfig& c, int world,
                             const DataParallelOptions& dp, const TrainOptions& train);

class TensorParallelPlan final : public ParallelPlan {
 public:
  // Collective over `world`: the mesh dp × tp (world / tp data-parallel groups) and the data
  // plan over dp. Errors are check_tensor_parallel's and check_data_parallel's, on every rank.
  static Expected<std::unique_ptr<TensorParallelPlan>> create(comm::Communicator& world,
                                                              const TensorParallelOptions& o,
                                                              const DataParallelOptions& dp,
                                                              const ModelConfig& config,
                                                              const TrainOptions& train);
  ~TensorParallelPlan() override;

  // The shard to build the model for (Transformer::create).
  TensorShard shard();

  void attach(Transformer& model) override;
  int data_rank() const override { return data_->data_rank(); }
  int data_size() const override { return data_->data_size(); }
  void begin_step() override { data_->begin_step(); }
  void begin_micro_batch(bool last) override { data_->begin_micro_batch(last); }
  void finish_gradients() override;
  std::span<const OptimizerPiece> pieces() const override { return data_->pieces(); }
  int64_t state_size() const override { return data_->state_size(); }
  double sum_over_shards(double x) override;
  // Over the data-parallel ranks, then over the tp group, so every rank of the world holds the
  // same value: the tp ranks' losses are already equal (each computes all of its rows), but a
  // clock is not (the time budget's step count must be agreed by all).
  double mean_over_data(double x) override;
  void after_optimizer_step() override { data_->after_optimizer_step(); }
  CommTimes take_comm_times() override;
  std::string describe() const override;
  comm::Communicator* communicator() override { return &mesh_->world(); }
  std::vector<OptimizerPiece> checkpoint_pieces() const override;
  std::vector<OptimizerPiece> restore_pieces() const override;
  int64_t checkpoint_num_params() const override { return model_->full_num_params(); }
  // Every rank: a shard holds part of each tensor, a data-parallel rank part of the batch. The
  // world has no communication thread, so the layers' amax reductions do not queue behind
  // gradient buckets.
  comm::Communicator* amax_group() override { return &mesh_->world(); }

  // The model's hooks pass through to the data-parallel plan (its buckets).
  void before_model(Pass pass) override { data_->before_model(pass); }
  void before_block(int64_t block, Pass pass) override { data_->before_block(block, pass); }
  void after_block(int64_t block, Pass pass) override { data_->after_block(block, pass); }
  void grads_ready(ParamRange range) override { data_->grads_ready(range); }

  // Collective over the tp group: the single-process flat vector of `local` (this shard's
  // values in the model's flat layout: its parameters or gradients), on every rank.
  std::vector<float> gather_full(std::span<const float> local) const;
  comm::DeviceMesh& mesh() { return *mesh_; }
  // The layers' tensor-parallel collectives since the last call (Transformer::take_tp_traffic,
  // which take_comm_times() drains every step for the seconds: read the bytes here).
  TensorParallelTraffic take_tp_traffic();

 private:
  TensorParallelPlan() = default;
  // `local` (pieces in this shard's flat layout) at their whole-model offsets; without
  // every_entry, a tensor replicated over tp ranks only on its first holder.
  std::vector<OptimizerPiece> mapped_pieces(const std::vector<OptimizerPiece>& local, bool every_entry) const;

  TensorParallelOptions o_;
  std::unique_ptr<comm::DeviceMesh> mesh_;
  std::unique_ptr<DataParallelPlan> data_;
  Transformer* model_ = nullptr;
  // Partial gradients: per replica group size, its communicator (ranks rank / replicas) and the
  // entries (offset, n) packed into one all-reduce.
  struct PartialGroup {
    std::unique_ptr<comm::Communicator> comm;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    Tensor buf;  // (Σ n,) from the caching allocator, so memory reports (perf/memory_model.h) see it
  };
  std::vector<PartialGroup> partial_;
  double tp_seconds_ = 0;  // the partial gradients' all-reduces since take_comm_times()
  void collect_tp_traffic();
  TensorParallelTraffic traffic_;  // the model's, since take_tp_traffic()
  double untimed_seconds_ = 0;     // of it, since take_comm_times()
};

}  // namespace kiln::parallel
