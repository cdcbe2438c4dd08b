// Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a small draft model proposes γ
// tokens, the target scores all of them in one forward pass, and a modified rejection rule keeps
// the output distributed exactly as the target's alone (greedy: the very same tokens).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kiln/core/rng.h"
#include "kiln/core/status.h"
#include "kiln/model/transformer.h"
#include "kiln/serve/sampler.h"

namespace kiln {

// What one verification keeps: a prefix of the proposal and the one token after it.
struct SpeculativeVerdict {
  int64_t num_accepted = 0;  // draft tokens kept, x_1..x_a
  int32_t next_token = -1;   // the correction at the first rejection, or the bonus token
};

// The rejection rule over probability rows, no model needed.
//   draft (γ): the proposed tokens x_1..x_γ;
//   q (γ, V):  the draft's distribution each x_i was drawn from (unused when greedy);
//   p (γ+1, V): the target's distribution at the same positions, plus the one after x_γ.
// Sampling: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection draw
// from norm(max(0, p_i − q_i)); when all γ are accepted draw a bonus token from p_{γ+1}.
// Greedy: accept while argmax p_i == x_i, then emit argmax p (rng untouched).
SpeculativeVerdict verify_draft(std::span<const int32_t> draft, const float* q, const float* p, int64_t vocab,
                                bool greedy, Rng& rng);

// (1 − α^(γ+1)) / (1 − α): expected tokens per target pass when each draft token is accepted
// independently with probability α (γ + 1 at α = 1).
double expected_tokens_per_pass(double alpha, int64_t gamma);

struct SpeculativeStats {
  int64_t num_generated = 0;      // tokens emitted
  int64_t num_target_passes = 0;  // verification forwards of the target (prefill not counted)
  int64_t num_draft_passes = 0;   // forwards of the draft (prefill not counted)
  int64_t num_proposed = 0;       // draft tokens proposed
  int64_t num_accepted = 0;       // draft tokens accepted
  int64_t num_rejected = 0;       // passes that stopped at a rejection (the rest accepted all)
  double seconds = 0;             // wall time of generation, prefill included
  double draft_seconds = 0;       // of which draft forwards (prefill included)
  double target_seconds = 0;      // of which target forwards (prefill included)
  // α: accepted / (accepted + rejected), the per-token acceptance probability that the formula
  // (1 − α^(γ+1))/(1 − α) assumes. Tokens after the first rejection are never tested, so
  // accepted / proposed (accepted_fraction) is smaller and does not fit that formula.
  double acceptance_rate() const;
  double accepted_fraction() const;  // accepted / proposed
  double tokens_per_pass() const;    // generated / target passes
};

}  // namespace kiln
