// Speculative decoding: the rejection rule over probability rows (the serving engine's model
// executor runs the draft and the target; tests/serve/batch1_reference.h has a batch-1 loop).
#include "kiln/serve/speculative.h"

#include <algorithm>
#include <cmath>

namespace kiln {

namespace {

int32_t argmax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

}  // namespace

SpeculativeVerdict verify_draft(std::span<const int32_t> draft, const float* q, const float* p, int64_t vocab,
                                bool greedy, Rng& rng) {
  const int64_t gamma = static_cast<int64_t>(draft.size());
  SpeculativeVerdict v;
  for (int64_t i = 0; i < gamma; ++i) {
    const int32_t x = draft[static_cast<size_t>(i)];
    KILN_CHECK(x >= 0 && x < vocab);
    const float* pi = p + i * vocab;  // (V,) target at position i
    if (greedy) {
      const int32_t best = argmax(pi, vocab);
      if (best != x) {
        v.next_token = best;
        return v;
      }
      ++v.num_accepted;
      continue;
    }
    const float* qi = q + i * vocab;  // (V,) draft at position i
    KILN_CHECK_MSG(qi[x] > 0.0f, "draft token {} has probability 0 under its own distribution", x);
    const double ratio = static_cast<double>(pi[x]) / qi[x];
    if (ratio >= 1.0 || rng.uniform() < ratio) {
      ++v.num_accepted;
      continue;
    }
    // Rejected: draw from the residual norm(max(0, p − q)). It has mass here since p(x) < q(x)
    // and both rows sum to 1; guard against rounding anyway by falling back to p.
    std::vector<float> residual(static_cast<size_t>(vocab));
    double mass = 0;
    for (int64_t t = 0; t < vocab; ++t) mass += residual[t] = std::max(0.0f, pi[t] - qi[t]);
    v.next_token = mass > 0 ? sample_from_probs(residual.data(), vocab, rng) : sample_from_probs(pi, vocab, rng);
    return v;
  }
  const float* bonus = p + gamma * vocab;  // (V,) target after x_γ
  v.next_token = greedy ? argmax(bonus, vocab) : sample_from_probs(bonus, vocab, rng);
  return v;
}

double expected_tokens_per_pass(double alpha, int64_t gamma) {
  if (alpha >= 1.0) return static_cast<double>(gamma + 1);
  return (1.0 - std::pow(alpha, static_cast<double>(gamma + 1))) / (1.0 - alpha);
}

double SpeculativeStats::acceptance_rate() const {
  const int64_t tested = num_accepted + num_rejected;
  return tested > 0 ? static_cast<double>(num_accepted) / static_cast<double>(tested) : 0.0;
}

double SpeculativeStats::accepted_fraction() const {
  return num_proposed > 0 ? static_cast<double>(num_accepted) / static_cast<double>(num_proposed) : 0.0;
}

double SpeculativeStats::tokens_per_pass() const {
  return num_target_passes > 0 ? static_cast<double>(num_generated) / static_cast<double>(num_target_passes) : 0.0;
}

}  // namespace kiln
