// Fused softmax + cross-entropy over logits (N, V) and int32 targets (N,), as kiln::ref
// (double) and kiln::cpu (SIMD, rows over threads), identical signatures. Probabilities are
// never stored: the forward makes one streaming pass per row (running max and rescaled
// sum of exp), the backward one such pass and one that writes the gradient.
//   loss[n]     = logsumexp(logits[n]) - logits[n, t_n]
//   dlogits[n]  = (softmax(logits[n]) - onehot(t_n)) · dlosses[n]
// A target of -1 means "ignore": its loss is 0 and its gradient row is 0 (the caller's
// dlosses typically hold 1/(number of non-ignored targets) for a mean loss).
// dlogits may alias logits (in place, saving an (N, V) buffer at vocab 50257).
#pragma once

#include <cstdint>
#include <span>

#include "kiln/core/status.h"
#include "kiln/kernels/op_cost.h"

namespace kiln {

inline constexpr int32_t kIgnoreTarget = -1;

// InvalidArgument naming the first target outside {-1} ∪ [0, vocab_size) and its row.
Status check_targets(std::span<const int32_t> targets, int64_t vocab_size);

// max, subtract, exp, sum per logit.
constexpr OpCost cross_entropy_forward_cost(int64_t rows, int64_t vocab) {
  const double n = static_cast<double>(rows) * vocab;
  return {4.0 * n, 4.0 * n + 8.0 * rows};
}
// the forward's pass plus subtract, exp, scale per logit; reads logits, writes dlogits.
constexpr OpCost cross_entropy_backward_cost(int64_t rows, int64_t vocab) {
  const double n = static_cast<double>(rows) * vocab;
  return {7.0 * n, 8.0 * n + 12.0 * rows};
}

namespace ref {
// losses (N,); logits (N, V); targets (N,) in {-1} ∪ [0, V) (checked).
void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t rows,
                           int64_t vocab);
// dlogits (N, V) overwritten; dlosses (N,) = dL/dloss[n].
void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            const float* dlosses, int64_t rows, int64_t vocab);
}  // namespace ref

namespace cpu {  // same contracts as ref::
void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t rows,
                           int64_t vocab);
void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            const float* dlosses, int64_t rows, int64_t vocab);
}  // namespace cpu

KILN_SAME_SIGNATURE(cross_entropy_forward);
KILN_SAME_SIGNATURE(cross_entropy_backward);

}  // namespace kiln
