// ModelExecutor: SchedulerOutput -> PagedBatch -> Transformer::forward_paged -> logits rows;
// in a speculating step, γ draft forwards first (the first one also catches the draft's K/V up
// with the sequence), then the target verifies all draft tokens at once.
#include "kiln/serve/model_executor.h"

#include <algorithm>
#include <numeric>

namespace kiln {

ModelExecutor::ModelExecutor(Transformer& model, Transformer* draft, int64_t num_blocks, int64_t block_size,
                             bool packed_weights, bool graph_capture, graph::GraphPass graph_pass)
    : model_(model), draft_(draft), cache_(model.make_paged_kv_cache(num_blocks, block_size)) {
  if (draft_) draft_cache_ = draft_->make_paged_kv_cache(num_blocks, block_size);
  const TensorShard& shard = model.tensor_shard();
  KILN_CHECK_MSG(shard.size == 1 || shard.rank == 0, "tensor-parallel serving runs the engine on tp rank 0");
  KILN_CHECK_MSG(draft_ == nullptr || draft_->tensor_shard().size == 1, "a draft model runs whole, on rank 0");
  if (shard.size > 1) {
    tp_leader_ = std::make_unique<TensorParallelLeader>(*shard.comm);
    tp_leader_->cache(num_blocks, block_size, packed_weights);
  }
  if (graph_capture) graphs_ = std::make_unique<DecodeGraphs>(model_, cache_, true, std::move(graph_pass));
}

Expected<std::vector<const float*>> ModelExecutor::forward(Transformer& model, PagedKvCache& cache,
                                                           std::span<const ForwardSeq> seqs) {
  std::vector<const float*> first_row(seqs.size(), nullptr);
  if (seqs.empty()) return first_row;
  // Decodes first: consecutive one-token sequences become one paged attention call.
  order_.resize(seqs.size());
  std::iota(order_.begin(), order_.end(), size_t{0});
  std::stable_partition(order_.begin(), order_.end(), [&](size_t i) { return seqs[i].tokens.size() == 1; });
  int64_t max_blocks = 1;
  for (const ForwardSeq& s : seqs) max_blocks = std::max<int64_t>(max_blocks, s.block_ids.size());
  tokens_.clear();
  num_cached_.clear();
  num_new_.clear();
  logit_rows_.clear();
  table_.assign(seqs.size() * static_cast<size_t>(max_blocks), 0);
  std::vector<std::pair<size_t, int64_t>> row_of;  // (seq, its first row among the logits)
  for (size_t k = 0; k < order_.size(); ++k) {
    const ForwardSeq& s = seqs[order_[k]];
    tokens_.insert(tokens_.end(), s.tokens.begin(), s.tokens.end());
    num_cached_.push_back(static_cast<int32_t>(s.num_cached));
    num_new_.push_back(static_cast<int32_t>(s.tokens.size()));
    std::copy(s.block_ids.begin(), s.block_ids.end(), table_.begin() + static_cast<int64_t>(k) * max_blocks);
    if (s.num_rows > 0) row_of.emplace_back(order_[k], static_cast<int64_t>(logit_rows_.size()));
    for (int64_t r = s.num_rows; r >= 1; --r) logit_rows_.push_back(static_cast<int32_t>(tokens_.size()) - static_cast<int32_t>(r));
  }
  PagedBatch b;
  b.tokens = tokens_;
  b.num_cached = num_cached_;
  b.num_new = num_new_;
  b.block_table = table_;
  b.max_blocks_per_seq = max_blocks;
  b.logit_rows = logit_rows_;
  // The other tp ranks run the target's step on their shards (the draft is rank 0's alone).
  if (tp_leader_ && &model == &model_) tp_leader_->forward(b);
  const bool replay = graphs_ && &model == &model_ && !tp_leader_ && DecodeGraphs::eligible(b);
  KILN_ASSIGN_OR_RETURN(const float* rows, replay ? graphs_->run(b) : model.forward_paged(b, cache));
  const int64_t V = model.config().vocab_size;
  for (const auto& [seq, row] : row_of) first_row[seq] = rows + row * V;
  return first_row;
}

Expected<StepLogits> ModelExecutor::execute(const SchedulerOutput& out, const DraftSampler& draft_sampler,
                                            std::span<const uint8_t> all_rows) {
  StepLogits step;
  const size_t S = out.seqs.size();
  KILN_CHECK_MSG(all_rows.empty() || all_rows.size() == S, "execute(): {} all_rows flags for {} sequences",
                 all_rows.size(), S);
  step.rows.assign(S, nullptr);
  step.all_rows.assign(S, nullptr);
  for (const BlockCopy& c : out.block_copies) {
    cache_.copy_block(c.src, c.dst, c.num_tokens);
    if (tp_leader_) tp_leader_->copy_block(c.src, c.dst, c.num_tokens);
    if (draft_) draft_cache_.copy_block(c.src, c.dst, c.num_tokens);
  }
  if (S == 0) return step;

  int64_t max_lookahead = 0;
  for (const ScheduledSeq& e : out.seqs) max_lookahead = std::max(max_lookahead, e.num_lookahead);
  KILN_CHECK_MSG(max_lookahead == 0 || (draft_ && draft_sampler), "a speculative step needs a draft model and sampler");
  step.proposals.resize(S);
  step.draft_probs.resize(S);
  if (max_lookahead > 0) {
    // Round 0 feeds each speculative decode's pending token, after the tokens its draft K/V
    // lags by; round r feeds draft token x_r. Each round's last rows give the next draft token.
    const int64_t V = draft_->config().vocab_size;
    for (size_t k = 0; k < S; ++k) step.proposals[k].reserve(static_cast<size_t>(out.seqs[k].num_lookahead));
    for (int64_t round = 0; round < max_lookahead; ++round) {
      seqs_.clear();
      for (size_t k = 0; k < S; ++k) {
        const ScheduledSeq& e = out.seqs[k];
        if (e.num_lookahead <= round) continue;
        if (round == 0) {
          const int64_t first = e.num_computed_tokens - e.draft_lag;
          seqs_.push_back({e.tokens.subspan(static_cast<size_t>(first), static_cast<size_t>(e.draft_lag + 1)), first,
                           e.block_ids, 1});
        } else {
          seqs_.push_back({std::span<const int32_t>(&step.proposals[k][static_cast<size_t>(round - 1)], 1),
                           e.num_computed_tokens + round, e.block_ids, 1});
        }
      }
      KILN_ASSIGN_OR_RETURN(const auto rows, forward(*draft_, draft_cache_, seqs_));
      ++step.num_draft_forwards;
      // Sample in sequence order (each sequence owns its generator).
      size_t j = 0;
      for (size_t k = 0; k < S; ++k) {
        const ScheduledSeq& e = out.seqs[k];
        if (e.num_lookahead <= round) continue;  // not in this round's batch
        const float* row = rows[j++];
        auto& q = step.draft_probs[k];
        q.resize(static_cast<size_t>(e.num_lookahead * V));
        step.proposals[k].push_back(draft_sampler(k, round, row, q.data() + round * V));
      }
    }
  }

  // The target: new tokens, and for a speculative decode its pending token + draft tokens,
  // with a logits row after each.
  verify_tokens_.resize(S);
  seqs_.clear();
  for (size_t k = 0; k < S; ++k) {
    const ScheduledSeq& e = out.seqs[k];
    std::span<const int32_t> toks = e.tokens.subspan(static_cast<size_t>(e.num_computed_tokens),
                                                     static_cast<size_t>(e.num_new_tokens));
    int64_t rows = e.num_samples > 0 ? 1 : 0;
    if (!all_rows.empty() && all_rows[k] && e.num_lookahead == 0) rows = e.num_new_tokens;
    if (e.num_lookahead > 0) {
      auto& v = verify_tokens_[k];
      v.assign(toks.begin(), toks.end());
      v.insert(v.end(), step.proposals[k].begin(), step.proposals[k].end());
      toks = v;
      rows = e.num_lookahead + 1;
    }
    seqs_.push_back({toks, e.num_computed_tokens, e.block_ids, rows});
  }
  KILN_ASSIGN_OR_RETURN(step.rows, forward(model_, cache_, seqs_));
  if (!all_rows.empty()) {
    const int64_t V = model_.config().vocab_size;
    for (size_t k = 0; k < S; ++k) {
      const ScheduledSeq& e = out.seqs[k];
      if (!all_rows[k] || e.num_lookahead > 0) continue;
      step.all_rows[k] = step.rows[k];
      step.rows[k] = e.num_samples > 0 ? step.rows[k] + (e.num_new_tokens - 1) * V : nullptr;
    }
  }
  return step;
}

}  // namespace kiln
