// Next-token sampling from logits: greedy (temperature 0), temperature, top-k, top-p
// (nucleus), with a seeded RNG so a seed gives the same text; OpenAI's logit adjustments
// (logit_bias, frequency and presence penalties) and the log-probabilities a reply reports.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kiln/core/rng.h"

namespace kiln {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  int64_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
};

// OpenAI's adjustments of the logits before sampling, over the tokens this sample generated so
// far (its history; the prompt does not count, as in OpenAI's and vLLM's definition):
//   l[j] + bias[j] - c[j] * frequency_penalty - (c[j] > 0) * presence_penalty
// where c[j] counts j in the history. Applied before temperature, top-k and top-p.
struct LogitAdjust {
  float frequency_penalty = 0.0f;  // [-2, 2]
  float presence_penalty = 0.0f;   // [-2, 2]
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id < vocab, bias in [-100, 100]), ids unique
  bool active() const { return frequency_penalty != 0.0f || presence_penalty != 0.0f || !logit_bias.empty(); }
};

// out (vocab) = logits (vocab) adjusted as above; out may alias logits.
void adjust_logits(const float* logits, int64_t vocab, const LogitAdjust& adjust, std::span<const int32_t> history,
                   float* out);

// One entry of a logprobs reply: a token and its log-probability.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// The log-softmax of logits (vocab), computed in double over the whole vocabulary: returns
// token's log-probability and, when top is given, fills it with the num_top (<= vocab) most
// likely tokens, most likely first (ties: the lower id first).
float token_logprobs(const float* logits, int64_t vocab, int32_t token, int64_t num_top,
                     std::vector<TokenLogprob>* top);

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, Rng& rng);

// The distribution sample_token draws from, over the whole vocabulary: probs (vocab) gets the
// temperature softmax renormalized over the top-k / top-p candidates and 0 elsewhere;
// temperature 0 gives a one-hot row at the argmax. Speculative decoding compares these rows.
void sampling_distribution(const float* logits, int64_t vocab, const SamplingParams& params, float* probs);
// Draws an index from a row of non-negative weights (normalized or not; at least one > 0).
int32_t sample_from_probs(const float* probs, int64_t vocab, Rng& rng);

}  // namespace kiln
