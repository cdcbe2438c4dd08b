// Expert parallelism (GShard / DeepSpeed-MoE) as a plan (train/plan.h) over an edp × ep mesh
// (comm/mesh.h). Every rank is a data-parallel rank (its rows of the global batch); the ep
// ranks of a group (consecutive world ranks) each hold E / ep of every MoE block's experts
// (ExpertShard, model/transformer.h) and exchange their tokens' rows by all-to-all inside the
// MoE layer (model/moe.h), in chunks overlapped with the experts' compute. This plan does what
// is left:
//
//   * the MoE layers' routing statistics (the load-balancing loss's f and P, the capacity's
//     token order) span every data rank, on a communicator of their own, so the layout computes
//     the single-process objective and drops;
//   * gradients: the replicated parameters (attention, norms, embeddings, routers, shared
//     experts) are averaged over every rank, as DDP; an expert's gradient already holds the
//     contributions of every token of its ep group routed to it, so it is summed over the edp
//     ranks that hold the same expert and divided by the world size;
//   * the gradient norm counts each expert once per ep group, the replicated values once;
//   * checkpoints hold the single-process model: rank 0 writes the replicated values, the first
//     edp replica of each expert its expert, all at their single-process offsets.
//
// With ep = 1 it is data parallelism of a MoE model with the single-process routing statistics.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/comm/mesh.h"
#include "kiln/parallel/data_parallel.h"
#include "kiln/train/plan.h"
#include "kiln/train/trainer.h"

namespace kiln::parallel {

struct ExpertParallelOptions {
  int ep = 1;      // --ep: ranks of an expert-parallel group
  int chunks = 2;  // --ep-chunks: dispatch chunks whose all-to-alls overlap the experts (1: no overlap)
};

// The same verdict on every rank, with no communication: the model is MoE, ep divides the world
// and num_experts, the batch splits over the world's data ranks, chunks >= 1, and the data
// layout is DDP (ZeRO and FSDP over expert shards are not implemented).
Status check_expert_parallel(const ExpertParallelOptions& o, const ModelConfig& c, int world,
                             const DataParallelOptions& dp, const TrainOptions& train);

class ExpertParallelPlan final : public ParallelPlan {
 public:
  // Collective over `world`: the mesh edp × ep and the routing statistics' communicator.
  static Expected<std::unique_ptr<ExpertParallelPlan>> create(comm::Communicator& world,
                                                              const ExpertParallelOptions& o,
                                                              const DataParallelOptions& dp,
                                                              const ModelConfig& config,
                                                              const TrainOptions& train);
  ~ExpertParallelPlan() override;

  // The shard to build the model for (Transformer::create).
  ExpertShard shard();

  void attach(Transformer& model) override;
  int data_rank() const override { return mesh_->world().rank(); }
  int data_size() const override { return mesh_->world().size(); }
  void begin_step() override { model_->zero_grad(); }
  void finish_gradients() override;
  std::span<const OptimizerPiece> pieces() const override { return pieces_; }
  int64_t state_size() const override { return model_->num_params(); }
  double sum_over_shards(double x) override;
  double mean_over_data(double x) override;
  CommTimes take_comm_times() override;
  std::string describe() const override;
  comm::Communicator* communicator() override { return &mesh_->world(); }
  std::vector<OptimizerPiece> checkpoint_pieces() const override;
  std::vector<OptimizerPiece> restore_pieces() const override;
  int64_t checkpoint_num_params() const override { return model_->full_num_params(); }

  // Collective over the world: the single-process flat vector of `local` (this rank's values in
  // the model's flat layout), on every rank.
  std::vector<float> gather_full(std::span<const float> local) const;
  comm::DeviceMesh& mesh() { return *mesh_; }

 private:
  ExpertParallelPlan() = default;
  // The pieces at their single-process offsets (flat_begin), every entry or (for checkpoints)
  // those this rank writes.
  std::vector<OptimizerPiece> mapped_pieces(bool every_entry) const;

  ExpertParallelOptions o_;
  std::unique_ptr<comm::DeviceMesh> mesh_;
  std::unique_ptr<comm::Communicator> batch_, dense_;  // routing statistics; replicated gradients
  Transformer* model_ = nullptr;
  std::vector<OptimizerPiece> pieces_;
  // (offset, n) of the replicated and of the expert entries, packed for one all-reduce each.
  std::vector<std::pair<int64_t, int64_t>> dense_ranges_, expert_ranges_;
  Tensor dense_buf_, expert_buf_;
  double comm_seconds_ = 0;
};

}  // namespace kiln::parallel
