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

}  // namespace kiln
