// The model executor of the serving engine: runs one SchedulerOutput on the real model (the
// same layers as training and generation) over the paged KV cache, and hands back the logits
// of every sequence that samples in this step.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/model/transformer.h"
#include "kiln/serve/scheduler.h"

namespace kiln {

class ModelExecutor {
 public:
  // The K/V pools (num_blocks blocks of block_size tokens per layer) are allocated here.
  ModelExecutor(Transformer& model, int64_t num_blocks, int64_t block_size);

  // Copies the step's copy-on-write blocks, then runs every scheduled sequence's new tokens in
  // one ragged forward (decodes first, so they share one paged split-KV call). Returns, per
  // entry of out.seqs, its last new token's logits (V,) when it samples, else null; valid
  // until the next execute().
  Expected<std::vector<const float*>> execute(const SchedulerOutput& out);

  Transformer& model() { return model_; }
  const PagedKvCache& cache() const { return cache_; }

 private:
  Transformer& model_;
  PagedKvCache cache_;
  // Reused per step: the packed batch.
  std::vector<int32_t> tokens_, num_cached_, num_new_, table_, logit_rows_;
  std::vector<size_t> order_;
};

}  // namespace kiln
