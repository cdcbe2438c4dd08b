// Tensor-parallel serving (`mpirun -np T kiln serve --tp T`, `kiln generate --tp T`): rank 0
// runs the HTTP server, the scheduler, the sampler and the engine's loop; every model step it
// takes (a ragged PagedBatch: the scheduler output packed for the model, or a copy-on-write
// block copy) is first broadcast to the other tp ranks, and all ranks then run the same
// sharded paged forward (model/transformer.h, TensorShard): each over its share of the heads,
// holding only its share of the KV cache (Hkv / T heads per token row, or the one KV head its
// queries read when T > n_kv_heads). The whole logits come back on every rank; rank 0 samples.
// Speculative decoding: the draft model runs whole on rank 0; only the target's verification
// forwards are broadcast.
// The broadcast is a flat tree of point-to-point sends (T is small: a node's GPUs), so a
// follower waits for the next step politely (test and sleep) for as long as the server is idle.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/comm/communicator.h"
#include "kiln/core/status.h"
#include "kiln/model/transformer.h"
#include "kiln/quant/qmodel.h"

namespace kiln {

// `--tp T` of kiln serve and kiln generate, on every rank of `world` (mpirun -np T): the same
// verdict everywhere with no communication (T is the world's size, the model splits over T, a
// quantized model's scales split with it: quant::shard_quantized_state), then `full` (the
// single-process model, loaded from disk; `quantized`: its quantized weights, when it is a
// kiln-quantized model) sliced for this rank's shard, quantized backends installed.
Expected<std::unique_ptr<Transformer>> shard_for_serving(Transformer& full, comm::Communicator& world, int tp,
                                                         const quant::QuantizedState* quantized = nullptr);

// Rank 0's side, owned by the ModelExecutor of a model with a tp shard of size > 1: announces
// each model step to the followers just before rank 0 runs it.
class TensorParallelLeader {
 public:
  explicit TensorParallelLeader(comm::Communicator& tp) : tp_(tp) {}
  ~TensorParallelLeader();  // tells the followers to stop
  // The paged cache's shape, and whether rank 0 packed its weights (model/packed_linear.h).
  void cache(int64_t num_blocks, int64_t block_size, bool packed_weights);
  void forward(const PagedBatch& b);
  void copy_block(int32_t src, int32_t dst, int64_t num_tokens);

 private:
  void send(const int64_t (&header)[6], const std::vector<int32_t>& payload);
  comm::Communicator& tp_;
  std::vector<int32_t> payload_;
};

// Ranks 1..T-1: runs rank 0's announced steps on `model` (its shard) over its own paged cache
// until rank 0's engine stops. Errors of a step are rank 0's too (the same checks on the same
// batch), so a follower goes on after one.
Status follow_tensor_parallel_steps(Transformer& model);

}  // namespace kiln
