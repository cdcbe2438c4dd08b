// Next-token sampling from logits: greedy (temperature 0), temperature, top-k, top-p
// (nucleus), with a seeded RNG so a seed gives the same text.
#pragma once

#include <cstdint>

#include "kiln/core/rng.h"

namespace kiln {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  int64_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
};

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, Rng& rng);

// The distribution sample_token draws from, over the whole vocabulary: probs (vocab) gets the
// temperature softmax renormalized over the top-k / top-p candidates and 0 elsewhere;
// temperature 0 gives a one-hot row at the argmax. Speculative decoding compares these rows.
void sampling_distribution(const float* logits, int64_t vocab, const SamplingParams& params, float* probs);
// Draws an index from a row of non-negative weights (normalized or not; at least one > 0).
int32_t sample_from_probs(const float* probs, int64_t vocab, Rng& rng);

}  // namespace kiln
