// Batch-1 reference loops for the serving engine's decoding (the engine runs every request of
// `kiln generate` and `kiln serve`): plain autoregressive generation, and speculative decoding
// with a draft and a target over their own KV caches, rolling rejected tokens back by
// cache.len. Tests compare the engine with these, and check the rejection rule through them.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <span>
#include <vector>

#include "kiln/core/rng.h"
#include "kiln/core/status.h"
#include "kiln/model/transformer.h"
#include "kiln/serve/sampler.h"
#include "kiln/serve/speculative.h"

namespace kiln::test {

struct GenerationResult {
  std::vector<int32_t> tokens;  // the generated tokens (prompt excluded)
  SpeculativeStats stats;
};

// Called with each generated token in order; return false to stop (end-of-text, a stop string).
using TokenCallback = std::function<bool(int32_t)>;

namespace batch1_detail {
inline int32_t argmax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline Status check_prompt(const char* op, std::span<const int32_t> prompt, int64_t ctx) {
  if (prompt.empty()) return invalid_argument("[{}] the prompt is empty", op);
  if (static_cast<int64_t>(prompt.size()) >= ctx)
    return invalid_argument("[{}] the prompt has {} tokens; the context is {}", op, prompt.size(), ctx);
  return {};
}

}  // namespace batch1_detail

// Up to max_new_tokens after `prompt` (and no further than the smaller context), batch 1, over
// each model's own KV cache; a rejected suffix is rolled back by resetting cache.len. gamma >= 1.
// Errors: vocabularies differ, empty or too long prompt, bad token ids.
inline Expected<GenerationResult> speculative_generate(Transformer& target, Transformer& draft,
                                                std::span<const int32_t> prompt, int64_t max_new_tokens,
                                                int64_t gamma, const SamplingParams& sampling, uint64_t seed,
                                                const TokenCallback& on_token = {}) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t V = target.config().vocab_size;
  if (draft.config().vocab_size != V)
    return invalid_argument("[speculative_generate] the draft's vocabulary ({}) differs from the target's ({})",
                            draft.config().vocab_size, V);
  if (gamma < 1) return invalid_argument("[speculative_generate] num_speculative must be >= 1, got {}", gamma);
  if (max_new_tokens < 0) return invalid_argument("[speculative_generate] max_new_tokens {} < 0", max_new_tokens);
  const int64_t ctx = std::min(target.config().max_seq_len, draft.config().max_seq_len);
  KILN_RETURN_IF_ERROR(batch1_detail::check_prompt("speculative_generate", prompt, ctx));
  const bool greedy = sampling.temperature <= 0.0f;
  const int64_t P = static_cast<int64_t>(prompt.size());
  const int64_t limit = std::min(max_new_tokens, ctx - P);  // the sequence stays within the context

  GenerationResult out;
  SpeculativeStats& st = out.stats;
  Rng rng(seed);
  KVCache tcache = target.make_kv_cache(ctx), dcache = draft.make_kv_cache(ctx);
  // Both caches hold everything before the pending token (the last one known, not yet scored).
  if (P > 1) {
    auto t = std::chrono::steady_clock::now();
    KILN_RETURN_IF_ERROR(target.forward_cached(prompt.data(), P - 1, tcache).status());
    st.target_seconds += batch1_detail::seconds_since(t);
    t = std::chrono::steady_clock::now();
    KILN_RETURN_IF_ERROR(draft.forward_cached(prompt.data(), P - 1, dcache).status());
    st.draft_seconds += batch1_detail::seconds_since(t);
  }
  int32_t pending = prompt[static_cast<size_t>(P - 1)];
  // Tokens the draft has not seen yet, ending with `pending`: one, or two after a full accept
  // (x_γ was proposed from the draft's last forward but never fed back), fed in one forward.
  std::vector<int32_t> draft_feed = {pending};
  std::vector<int32_t> proposal, verify_tokens;
  std::vector<float> q, p;  // (γ, V) draft rows, (γ+1, V) target rows
  bool stopped = false;
  while (!stopped && static_cast<int64_t>(out.tokens.size()) < limit) {
    const int64_t remaining = limit - static_cast<int64_t>(out.tokens.size());
    const int64_t g = std::min(gamma, remaining - 1);  // a pass emits up to g + 1 tokens
    const int64_t base = tcache.len;                   // position of `pending`
    // Draft: propose x_1..x_g one token at a time.
    proposal.clear();
    q.assign(static_cast<size_t>(g * V), 0.0f);
    for (int64_t i = 0; i < g; ++i) {
      // One forward over the unseen tokens (two after a full accept: reading the weights once
      // costs about what one token does), using the last row.
      const int64_t n = static_cast<int64_t>(draft_feed.size());
      const auto td = std::chrono::steady_clock::now();
      KILN_ASSIGN_OR_RETURN(const float* logits, draft.forward_cached(draft_feed.data(), n, dcache));
      st.draft_seconds += batch1_detail::seconds_since(td);
      ++st.num_draft_passes;
      float* qi = q.data() + i * V;
      sampling_distribution(logits + (n - 1) * V, V, sampling, qi);
      const int32_t x = greedy ? batch1_detail::argmax(qi, V) : sample_from_probs(qi, V, rng);
      proposal.push_back(x);
      draft_feed = {x};
    }
    // Target: score pending, x_1..x_g in one forward: rows for positions base+1 .. base+g+1.
    verify_tokens.assign(1, pending);
    verify_tokens.insert(verify_tokens.end(), proposal.begin(), proposal.end());
    const auto tt = std::chrono::steady_clock::now();
    KILN_ASSIGN_OR_RETURN(const float* logits, target.forward_cached(verify_tokens.data(), g + 1, tcache));
    st.target_seconds += batch1_detail::seconds_since(tt);
    ++st.num_target_passes;
    p.resize(static_cast<size_t>((g + 1) * V));
    for (int64_t i = 0; i <= g; ++i) sampling_distribution(logits + i * V, V, sampling, p.data() + i * V);
    const SpeculativeVerdict v = verify_draft(proposal, q.data(), p.data(), V, greedy, rng);
    st.num_proposed += g;
    st.num_accepted += v.num_accepted;
    st.num_rejected += v.num_accepted < g ? 1 : 0;
    // Roll back: the target keeps pending + the accepted tokens; so does the draft, which holds
    // pending, x_1..x_{g-1} after proposing.
    tcache.len = base + 1 + v.num_accepted;
    if (g == 0) {
      draft_feed.push_back(v.next_token);
    } else if (v.num_accepted == g) {
      draft_feed = {proposal.back(), v.next_token};
    } else {
      dcache.len = base + 1 + v.num_accepted;
      draft_feed = {v.next_token};
    }
    pending = v.next_token;
    for (int64_t i = 0; i <= v.num_accepted && !stopped; ++i) {
      const int32_t t = i < v.num_accepted ? proposal[static_cast<size_t>(i)] : v.next_token;
      out.tokens.push_back(t);
      if (on_token && !on_token(t)) stopped = true;
    }
  }
  st.num_generated = static_cast<int64_t>(out.tokens.size());
  st.seconds = batch1_detail::seconds_since(t0);
  return out;
}

// Plain autoregressive generation with the same conventions (prefill, then one token per
// forward_cached step).
inline Expected<GenerationResult> autoregressive_generate(Transformer& model, std::span<const int32_t> prompt,
                                                   int64_t max_new_tokens, const SamplingParams& sampling,
                                                   uint64_t seed, const TokenCallback& on_token = {}) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t ctx = model.config().max_seq_len, V = model.config().vocab_size;
  KILN_RETURN_IF_ERROR(batch1_detail::check_prompt("autoregressive_generate", prompt, ctx));
  if (max_new_tokens < 0) return invalid_argument("[autoregressive_generate] max_new_tokens {} < 0", max_new_tokens);
  const int64_t P = static_cast<int64_t>(prompt.size());
  const int64_t limit = std::min(max_new_tokens, ctx - P);
  GenerationResult out;
  if (limit == 0) return out;
  Rng rng(seed);
  KVCache cache = model.make_kv_cache(ctx);
  KILN_ASSIGN_OR_RETURN(const float* last, model.forward_cached(prompt.data(), P, cache));
  last += (P - 1) * V;
  while (true) {
    const int32_t next = sample_token(last, V, sampling, rng);
    out.tokens.push_back(next);
    ++out.stats.num_target_passes;
    if ((on_token && !on_token(next)) || static_cast<int64_t>(out.tokens.size()) == limit) break;
    KILN_ASSIGN_OR_RETURN(last, model.forward_cached(&next, 1, cache));
  }
  out.stats.num_generated = static_cast<int64_t>(out.tokens.size());
  out.stats.seconds = batch1_detail::seconds_since(t0);
  return out;
}

}  // namespace kiln::test
