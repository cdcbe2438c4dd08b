// ModelExecutor: SchedulerOutput -> PagedBatch -> Transformer::forward_paged -> logits rows.
#include "kiln/serve/model_executor.h"

#include <algorithm>
#include <numeric>

namespace kiln {

ModelExecutor::ModelExecutor(Transformer& model, int64_t num_blocks, int64_t block_size)
    : model_(model), cache_(model.make_paged_kv_cache(num_blocks, block_size)) {}

Expected<std::vector<const float*>> ModelExecutor::execute(const SchedulerOutput& out) {
  std::vector<const float*> logits(out.seqs.size(), nullptr);
  for (const BlockCopy& c : out.block_copies) cache_.copy_block(c.src, c.dst, c.num_tokens);
  if (out.seqs.empty()) return logits;
  // Decodes first: consecutive one-token sequences become one paged attention call.
  order_.resize(out.seqs.size());
  std::iota(order_.begin(), order_.end(), size_t{0});
  std::stable_partition(order_.begin(), order_.end(), [&](size_t i) { return out.seqs[i].num_new_tokens == 1; });
  int64_t max_blocks = 1;
  for (const ScheduledSeq& e : out.seqs) max_blocks = std::max<int64_t>(max_blocks, e.block_ids.size());
  tokens_.clear();
  num_cached_.clear();
  num_new_.clear();
  logit_rows_.clear();
  table_.assign(out.seqs.size() * static_cast<size_t>(max_blocks), 0);
  std::vector<size_t> sampled;  // indices into out.seqs, in logit-row order
  for (size_t k = 0; k < order_.size(); ++k) {
    const ScheduledSeq& e = out.seqs[order_[k]];
    const auto first = e.tokens.begin() + e.num_computed_tokens;
    tokens_.insert(tokens_.end(), first, first + e.num_new_tokens);
    num_cached_.push_back(static_cast<int32_t>(e.num_computed_tokens));
    num_new_.push_back(static_cast<int32_t>(e.num_new_tokens));
    std::copy(e.block_ids.begin(), e.block_ids.end(), table_.begin() + static_cast<int64_t>(k) * max_blocks);
    if (e.num_samples > 0) {
      logit_rows_.push_back(static_cast<int32_t>(tokens_.size()) - 1);
      sampled.push_back(order_[k]);
    }
  }
  PagedBatch b;
  b.tokens = tokens_;
  b.num_cached = num_cached_;
  b.num_new = num_new_;
  b.block_table = table_;
  b.max_blocks_per_seq = max_blocks;
  b.logit_rows = logit_rows_;
  KILN_ASSIGN_OR_RETURN(const float* rows, model_.forward_paged(b, cache_));
  const int64_t V = model_.config().vocab_size;
  for (size_t r = 0; r < sampled.size(); ++r) logits[sampled[r]] = rows + static_cast<int64_t>(r) * V;
  return logits;
}

}  // namespace kiln
