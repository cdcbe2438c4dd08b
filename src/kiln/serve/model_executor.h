// The model executor of the serving engine: runs one SchedulerOutput on the real model (the
// same layers as training and generation) over the paged KV cache, and hands back the logits
// of every sequence that samples in this step. With a draft model (speculative decoding) it
// first lets the draft propose each decode's draft tokens, then verifies them all in the
// target's one forward.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/model/transformer.h"
#include "kiln/serve/decode_graph.h"
#include "kiln/serve/scheduler.h"
#include "kiln/serve/tensor_parallel.h"

namespace kiln {

// What one step computed, per entry of SchedulerOutput::seqs.
struct StepLogits {
  // The target's logits: num_lookahead + 1 consecutive (V,) rows for a speculative decode
  // (after the pending token, then after each draft token), one row for a sequence that
  // samples, null for a prefill chunk that does not reach the end. Valid until the next step.
  std::vector<const float*> rows;
  // Entries execute() was asked for all rows of: num_new_tokens consecutive (V,) rows, one
  // after each new token (rows[k] is then the last of them, or null before the end); else null.
  std::vector<const float*> all_rows;
  std::vector<std::vector<int32_t>> proposals;  // speculative decodes: the draft tokens x_1..x_γ
  std::vector<std::vector<float>> draft_probs;  // speculative decodes: (γ, V) q rows they were drawn from
  int64_t num_draft_forwards = 0;
};

class ModelExecutor {
 public:
  // Draws draft token i (0-based) of out.seqs[seq]: fills q (V,) with the draft's sampling
  // distribution for `logits` (V,) and returns the token drawn from it.
  using DraftSampler = std::function<int32_t(size_t seq, int64_t i, const float* logits, float* q)>;

  // The K/V pools (num_blocks blocks of block_size tokens per layer) are allocated here, for
  // the draft too (same block ids: one block table addresses both caches). A model with a tp
  // shard of size > 1 (on tp rank 0) announces every target step to the other tp ranks first
  // (serve/tensor_parallel.h); a draft runs whole on rank 0.
  // packed_weights: the engine packed the model's weights (EngineConfig); the other tp ranks do too.
  // graph_capture: the target's decode steps replay captured graphs (serve/decode_graph.h).
  ModelExecutor(Transformer& model, Transformer* draft, int64_t num_blocks, int64_t block_size,
                bool packed_weights = false, bool graph_capture = false, graph::GraphPass graph_pass = {});

  // Copies the step's copy-on-write blocks (in both caches), runs the draft's proposals when a
  // sequence has num_lookahead > 0 (draft_sampler required then), then every scheduled
  // sequence's new tokens, and the draft tokens after them, in one ragged target forward
  // (decodes first, so they share one paged split-KV call). all_rows (empty, or one per
  // out.seqs entry): 1 = the logits after every new token of that entry (echo's prompt
  // logprobs), not only after its last; ignored for a speculative decode.
  Expected<StepLogits> execute(const SchedulerOutput& out, const DraftSampler& draft_sampler = {},
                               std::span<const uint8_t> all_rows = {});

  Transformer& model() { return model_; }
  Transformer* draft() { return draft_; }
  const PagedKvCache& cache() const { return cache_; }
  PagedKvCache& cache() { return cache_; }  // disaggregated serving writes received K/V here
  int64_t cache_bytes() const { return cache_.bytes() + (draft_ ? draft_cache_.bytes() : 0); }
  // Graph capture's counters (null when the engine runs eagerly).
  const GraphStats* graph_stats() const { return graphs_ ? &graphs_->stats() : nullptr; }

 private:
  // One sequence's share of a forward: tokens at positions [num_cached, num_cached + size),
  // logits for the last num_rows of them.
  struct ForwardSeq {
    std::span<const int32_t> tokens;
    int64_t num_cached = 0;
    std::span<const BlockId> block_ids;
    int64_t num_rows = 0;
  };
  // Per seq, its first logits row (rows are consecutive), or null without rows.
  Expected<std::vector<const float*>> forward(Transformer& model, PagedKvCache& cache,
                                              std::span<const ForwardSeq> seqs);

  Transformer& model_;
  Transformer* draft_;
  PagedKvCache cache_, draft_cache_;
  // Reused per forward: the packed batch.
  std::vector<int32_t> tokens_, num_cached_, num_new_, table_, logit_rows_;
  std::vector<size_t> order_;
  std::vector<ForwardSeq> seqs_;
  std::vector<std::vector<int32_t>> verify_tokens_;  // per entry: pending token + draft tokens
  std::unique_ptr<TensorParallelLeader> tp_leader_;  // tensor-parallel serving: rank 0's broadcast
  std::unique_ptr<DecodeGraphs> graphs_;             // the target's captured decode steps
};

}  // namespace kiln
