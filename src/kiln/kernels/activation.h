// Activations, elementwise over n values: GELU (tanh approximation, as GPT-2), SiLU and SwiGLU
// (Llama's MLP), forward and backward, as kiln::ref (double) and kiln::cpu (SIMD, polynomial
// exp, threaded), identical signatures. Outputs may alias inputs; d-inputs are overwritten.
//
// SwiGLU layout: two separate (N, H) buffers, gate = x·W_gate and up = x·W_up (HF Llama's
// gate_proj / up_proj), out = silu(gate) ⊙ up. A fused (N, 2H) GEMM output is not accepted
// as is; keep the two projections' outputs apart (or pass the halves of a (2, N, H) buffer).
#pragma once

#include <cstdint>

#include "kiln/kernels/op_cost.h"

namespace kiln {

// gelu(x) = 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))); exp and divide count as 1 each.
constexpr OpCost gelu_forward_cost(int64_t n) {
  return {9.0 * n, 8.0 * n};
}
constexpr OpCost gelu_backward_cost(int64_t n) {
  return {18.0 * n, 12.0 * n};
}
// silu(x) = x·sigmoid(x).
constexpr OpCost silu_forward_cost(int64_t n) {
  return {4.0 * n, 8.0 * n};
}
constexpr OpCost silu_backward_cost(int64_t n) {
  return {8.0 * n, 12.0 * n};
}
// n = N·H output elements.
constexpr OpCost swiglu_forward_cost(int64_t n) {
  return {5.0 * n, 12.0 * n};
}
constexpr OpCost swiglu_backward_cost(int64_t n) {
  return {10.0 * n, 20.0 * n};
}

namespace ref {
// out, inp (n,).
void gelu_forward(float* out, const float* inp, int64_t n);
// dinp = dout ⊙ gelu'(inp); dinp, dout, inp (n,).
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n);
void silu_forward(float* out, const float* inp, int64_t n);
void silu_backward(float* dinp, const float* dout, const float* inp, int64_t n);
// out, gate, up (N, H) with n = N·H: out = silu(gate) ⊙ up.
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
// dgate = dout ⊙ up ⊙ silu'(gate), dup = dout ⊙ silu(gate); all (N, H), n = N·H.
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n);
}  // namespace ref

namespace cpu {  // same contracts as ref::
void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n);
void silu_forward(float* out, const float* inp, int64_t n);
void silu_backward(float* dinp, const float* dout, const float* inp, int64_t n);
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n);
}  // namespace cpu

KILN_SAME_SIGNATURE(gelu_forward);
KILN_SAME_SIGNATURE(gelu_backward);
KILN_SAME_SIGNATURE(silu_forward);
KILN_SAME_SIGNATURE(silu_backward);
KILN_SAME_SIGNATURE(swiglu_forward);
KILN_SAME_SIGNATURE(swiglu_backward);

}  // namespace kiln
