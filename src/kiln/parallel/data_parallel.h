// Data parallelism as one plan (train/plan.h) with a ZeRO stage, over a mesh of
// replicate × shard ranks (comm/mesh.h):
//
//   stage 0, DDP     every rank holds everything; gradients all-reduced (avg) in buckets of
//                    --bucket-mb, cut in reverse layer order, each started on the
//                    communication thread as soon as its last gradient is final (overlap);
//                    on all but the last micro-batch nothing is reduced (no_sync).
//   stage 1          as DDP, but AdamW's m and v are sharded: each rank updates its shard of
//                    the parameters, which are then all-gathered.
//   stage 2          gradients too: each unit's gradient is reduce-scattered into its shards
//                    as soon as the unit's backward is done, and the unit's full gradient
//                    freed.
//   stage 3, FSDP    parameters too: each unit (--fsdp-unit blocks; the embeddings, final
//                    norm and head are the root, gathered for the whole step) is all-gathered
//                    before its forward and again before its backward, and freed after
//                    (reshard_after_forward off keeps it from forward to backward: stage 2's
//                    memory, no second gather); the next `prefetch` units' gathers are issued
//                    ahead, forward and backward, so they overlap compute.
//   Gradient buffers of stages 2 and 3: the head's lives through the backward (the tied
//   embedding's gradient is final last); besides it, at most two units' buffers, each with its
//   chunk-sized reduce temporary once it reduces: before a new buffer or temporary is made,
//   older reductions are waited for until one is in flight, so memory per rank is bounded
//   whatever the communication's lag.
//   HSDP             stages 1–3 shard within groups of `shard_group` ranks and replicate
//                    across the groups: reduce-scatter in the group, all-reduce (avg) of the
//                    shard across groups, all-gather in the group.
//
// Shards: the flat parameter vector is cut into units (the head range, groups of blocks, the
// tail range; transformer.h); unit u of n floats is split over the S shard ranks in chunks of
// ceil(n / S) (the last ones shorter or empty), padded to S chunks for the collectives.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/comm/mesh.h"
#include "kiln/comm/work.h"
#include "kiln/train/plan.h"
#include "kiln/train/trainer.h"

namespace kiln::parallel {

struct DataParallelOptions {
  int zero = 0;                    // ZeRO stage 0 (DDP), 1, 2, 3 (FSDP)
  int shard_group = 0;             // HSDP: shard within groups of this many ranks; 0: all of dp
  double bucket_mb = 25;           // DDP / ZeRO-1 gradient bucket size (PyTorch's default)
  bool overlap = true;             // start reductions during backward (off: all after it)
  int fsdp_unit_blocks = 1;        // blocks per FSDP unit
  bool reshard_after_forward = true;
  int prefetch = 1;                // units gathered ahead (0: on demand)
  // The gradients' dtype on the wire: f32, or bf16 (half the bytes; each reduction step adds
  // in f32 and rounds once, comm/collectives.h). The master weights and the optimizer stay fp32.
  DType reduce_dtype = DType::kF32;
};

// The same verdict on every rank, with no communication: dp divides the batch, shard_group
// divides dp, the stage is 0..3, ZeRO-3 has an fp32 model (the precision backends keep
// converted copies of whole weights), sizes are positive.
Status check_data_parallel(const DataParallelOptions& o, int dp, const TrainOptions& train);

class DataParallelPlan final : public ParallelPlan {
 public:
  // Collective over `world` (every rank is a data-parallel rank): builds the mesh
  // (replicate × shard). Errors are check_data_parallel's, on every rank.
  static Expected<std::unique_ptr<DataParallelPlan>> create(comm::Communicator& world, const DataParallelOptions& o,
                                                            const TrainOptions& train);
  ~DataParallelPlan() override;

  void attach(Transformer& model) override;
  int data_rank() const override { return dp_->rank(); }
  int data_size() const override { return dp_->size(); }
  void begin_step() override;
  void begin_micro_batch(bool last) override;
  void finish_gradients() override;
  std::span<const OptimizerPiece> pieces() const override { return pieces_; }
  int64_t state_size() const override { return state_size_; }
  double sum_over_shards(double x) override;
  double mean_over_data(double x) override;
  void after_optimizer_step() override;
  CommTimes take_comm_times() override;
  std::string describe() const override;
  comm::Communicator* communicator() override { return dp_.get(); }
  std::vector<OptimizerPiece> checkpoint_pieces() const override;
  int64_t checkpoint_num_params() const override { return model_->num_params(); }

  // ModelHooks
  void before_model(Pass pass) override;
  void before_block(int64_t block, Pass pass) override;
  void after_block(int64_t block, Pass pass) override;
  void grads_ready(ParamRange range) override;

  // The whole fp32 parameter vector on every rank (ZeRO-3 gathers it; the others copy), e.g.
  // to export or sample after training. Collective.
  std::vector<float> gather_full_params();
  // This rank's ranges of the flat vector, and the padded shard layout (for checkpoints).
  struct Unit {
    ParamRange range;
    int64_t chunk = 0;         // ceil(n / S)
    int64_t shard_offset = 0;  // where this rank's chunk sits in the shard buffers
    int64_t first_block = -1, last_block = -1;  // -1: a root unit (head or tail)
    ParamRange mine() const;   // this rank's part (may be empty)
    int shard_rank = 0;
  };
  const std::vector<Unit>& units() const { return units_; }

 private:
  explicit DataParallelPlan(const DataParallelOptions& o);
  struct Gathered;  // a unit's gathered parameters and gradient buffer
  void build_units();
  void build_pieces();
  int unit_of_block(int64_t block) const;
  // Floats of one rank's shard: Σ over units of the chunk (padded).
  int64_t shard_floats() const;
  // ZeRO-3: starts the all-gather of unit u (if neither gathered nor in flight); ensure waits.
  void issue_gather(int u);
  void ensure_gathered(int u);
  void release(int u);
  // ZeRO-2/3: a fresh zeroed gradient buffer for unit u, bound to the model.
  void bind_grad_buffer(int u);
  void reduce_unit_grads(int u);
  void launch_buckets(int64_t frontier);
  void wait(const comm::Work& w);
  void reap(bool all);
  // Waits for the oldest reductions until at most one is in flight (ZeRO-2/3, before a new
  // gradient buffer or reduce temporary is allocated).
  void wait_until_one_pending();

  DataParallelOptions o_;
  std::unique_ptr<comm::DeviceMesh> mesh_;
  std::unique_ptr<comm::Communicator> dp_;  // every data-parallel rank (a dup of the world)
  comm::Communicator* shard_ = nullptr;     // the mesh's shard axis
  comm::Communicator* replicate_ = nullptr; // the mesh's replicate axis
  Transformer* model_ = nullptr;
  std::vector<Unit> units_;
  std::vector<std::unique_ptr<Gathered>> gathered_;  // per unit
  std::vector<ParamRange> buckets_;                  // DDP / ZeRO-1, from the end
  size_t buckets_launched_ = 0;
  bool reduce_this_micro_ = true;
  Tensor param_shard_, grad_shard_;  // ZeRO-3 / ZeRO-2+
  std::vector<OptimizerPiece> pieces_;
  int64_t state_size_ = 0;
  // Reductions in flight and the buffers they read, freed when done.
  struct Pending {
    comm::Work work;
    std::vector<Tensor> keep;
  };
  Tensor reduce_stage_;  // bf16 reduction: the DDP buckets' staging copy (num_params bf16)
  std::vector<Pending> pending_;
  double exposed_seconds_ = 0;
};

}  // namespace kiln::parallel
