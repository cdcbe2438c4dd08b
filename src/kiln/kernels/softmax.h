// Softmax over the last dimension of (rows, cols): forward (max-subtracted, so any finite
// logits are safe) and backward, as kiln::ref (scalar, double accumulation) and kiln::cpu
// (SIMD with a polynomial exp, rows spread over threads), identical signatures.
// out may alias inp; dinp (overwritten) may alias dout. A row of all -inf gives NaN.
#pragma once

#include <cstdint>

#include "kiln/kernels/op_cost.h"

namespace kiln {

// max, exp (counted as 1), subtract, sum, scale per element.
constexpr OpCost softmax_forward_cost(int64_t rows, int64_t cols) {
  const double n = static_cast<double>(rows) * cols;
  return {5.0 * n, 8.0 * n};
}
// dinp = y ⊙ (dy - <dy, y>): reads dout and out, writes dinp.
constexpr OpCost softmax_backward_cost(int64_t rows, int64_t cols) {
  const double n = static_cast<double>(rows) * cols;
  return {4.0 * n, 12.0 * n};
}

namespace ref {
// out, inp (rows, cols).
void softmax_forward(float* out, const float* inp, int64_t rows, int64_t cols);
// dinp, dout, out (rows, cols); out is the forward's output.
void softmax_backward(float* dinp, const float* dout, const float* out, int64_t rows, int64_t cols);
}  // namespace ref

namespace cpu {  // same contracts as ref::
void softmax_forward(float* out, const float* inp, int64_t rows, int64_t cols);
void softmax_backward(float* dinp, const float* dout, const float* out, int64_t rows, int64_t cols);
}  // namespace cpu

KILN_SAME_SIGNATURE(softmax_forward);
KILN_SAME_SIGNATURE(softmax_backward);

}  // namespace kiln
