// LayerNorm (GPT-2) and RMSNorm (Llama) over the last dimension of (rows, cols) activations:
// forward and backward, as a scalar reference (kiln::ref) and a fast SIMD, threaded version
// (kiln::cpu) with identical signatures.
//
// Gradient convention (llm.c): d-inputs (dinp) are overwritten; parameter gradients (dweight,
// dbias) ACCUMULATE with +=, so micro-batches sum into them; zero them once per optimizer step.
// Forward outputs may alias the input (in place); backward buffers must not alias each other.
// The saved statistics (mean, rstd) may be null in the forward when no backward follows.
// The cpu backward is deterministic: the same bits for any thread count.
#pragma once

#include <cstdint>

#include "kiln/kernels/op_cost.h"

namespace kiln {

inline constexpr float kLayerNormEps = 1e-5f;  // GPT-2 / torch.nn.LayerNorm default
inline constexpr float kRmsNormEps = 1e-6f;    // Llama 2 / 3 default (HF rms_norm_eps)

// LayerNorm: y = (x - mean)·rstd·w + b, rstd = 1/sqrt(var + eps), var biased (÷ cols).
constexpr OpCost layernorm_forward_cost(int64_t rows, int64_t cols) {
  const double n = static_cast<double>(rows) * cols;
  return {8.0 * n, 4.0 * (2.0 * n + 2.0 * cols + 2.0 * rows)};
}
// Reads dout, inp, weight, mean, rstd; writes dinp; reads and writes dweight, dbias. With
// accumulate_dx, dinp is read too and one add per element made.
constexpr OpCost layernorm_backward_cost(int64_t rows, int64_t cols, bool accumulate_dx = false) {
  const double n = static_cast<double>(rows) * cols, acc = accumulate_dx ? 1.0 : 0.0;
  return {(17.0 + acc) * n, 4.0 * ((3.0 + acc) * n + 5.0 * cols + 2.0 * rows)};
}
// RMSNorm: y = x·rstd·w, rstd = 1/sqrt(mean(x²) + eps).
constexpr OpCost rmsnorm_forward_cost(int64_t rows, int64_t cols) {
  const double n = static_cast<double>(rows) * cols;
  return {4.0 * n, 4.0 * (2.0 * n + cols + rows)};
}
constexpr OpCost rmsnorm_backward_cost(int64_t rows, int64_t cols, bool accumulate_dx = false) {
  const double n = static_cast<double>(rows) * cols, acc = accumulate_dx ? 1.0 : 0.0;
  return {(11.0 + acc) * n, 4.0 * ((3.0 + acc) * n + 3.0 * cols + rows)};
}

namespace ref {
// out (rows, cols); mean, rstd (rows,) saved for the backward (may be null);
// inp (rows, cols); weight, bias (cols,).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t rows, int64_t cols, float eps = kLayerNormEps);
// dinp (rows, cols) overwritten, or += with accumulate_dx (the residual stream's gradient, which
// the norm's input gradient joins); dweight, dbias (cols,) +=; dout, inp (rows, cols);
// weight (cols,); mean, rstd (rows,) from the forward.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int64_t rows, int64_t cols, bool accumulate_dx = false);
// out (rows, cols); rstd (rows,) saved for the backward (may be null); inp (rows, cols);
// weight (cols,).
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t rows,
                     int64_t cols, float eps = kRmsNormEps);
// dinp (rows, cols) overwritten, or += with accumulate_dx; dweight (cols,) +=.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t rows, int64_t cols,
                      bool accumulate_dx = false);
}  // namespace ref

namespace cpu {  // same contracts as ref::
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t rows, int64_t cols, float eps = kLayerNormEps);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int64_t rows, int64_t cols, bool accumulate_dx = false);
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t rows,
                     int64_t cols, float eps = kRmsNormEps);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t rows, int64_t cols,
                      bool accumulate_dx = false);
}  // namespace cpu

KILN_SAME_SIGNATURE(layernorm_forward);
KILN_SAME_SIGNATURE(layernorm_backward);
KILN_SAME_SIGNATURE(rmsnorm_forward);
KILN_SAME_SIGNATURE(rmsnorm_backward);

}  // namespace kiln
