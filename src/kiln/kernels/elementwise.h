// Small elementwise helpers a model needs — residual add, scale, accumulate, a row-broadcast
// bias add and its backward (the bias gradient: column sums) — and the vectorized exp / tanh as
// array ops, as kiln::ref and kiln::cpu (SIMD, threaded), identical signatures. Buffers (n,)
// unless said; outputs may alias inputs.
#pragma once

#include <cstdint>

#include "kiln/kernels/op_cost.h"

namespace kiln {

constexpr OpCost add_cost(int64_t n) {
  return {1.0 * n, 12.0 * n};
}
constexpr OpCost scale_cost(int64_t n) {
  return {1.0 * n, 8.0 * n};
}
constexpr OpCost accumulate_cost(int64_t n) {
  return {1.0 * n, 12.0 * n};
}
constexpr OpCost add_bias_cost(int64_t rows, int64_t cols) {
  return {1.0 * rows * cols, 8.0 * rows * cols + 4.0 * cols};
}
constexpr OpCost bias_backward_cost(int64_t rows, int64_t cols) {
  return {1.0 * rows * cols, 4.0 * rows * cols + 8.0 * cols};
}
constexpr OpCost exp_array_cost(int64_t n) {
  return {1.0 * n, 8.0 * n};
}

namespace ref {
void add(float* out, const float* a, const float* b, int64_t n);  // out = a + b (residual)
void scale(float* out, const float* inp, float s, int64_t n);     // out = s·inp
void accumulate(float* y, const float* x, int64_t n);             // y += x
// out (rows, cols) = x + bias (cols,) on every row: a GEMM's bias when it is not in its epilogue.
void add_bias(float* out, const float* x, const float* bias, int64_t rows, int64_t cols);
// dbias (cols,) += the column sums of dy (rows, cols), each column summed in row order: a
// Linear's bias gradient (add_bias's backward).
void bias_backward(float* dbias, const float* dy, int64_t rows, int64_t cols);
void exp_array(float* out, const float* inp, int64_t n);          // out = e^inp
void exp2_array(float* out, const float* inp, int64_t n);         // out = 2^inp
void tanh_array(float* out, const float* inp, int64_t n);         // out = tanh(inp)
}  // namespace ref

namespace cpu {  // same contracts; exp, exp2 and tanh within 2 ulp (see cpu/vec.h)
void add(float* out, const float* a, const float* b, int64_t n);
void scale(float* out, const float* inp, float s, int64_t n);
void accumulate(float* y, const float* x, int64_t n);
void add_bias(float* out, const float* x, const float* bias, int64_t rows, int64_t cols);
void bias_backward(float* dbias, const float* dy, int64_t rows, int64_t cols);  // bitwise as ref
void exp_array(float* out, const float* inp, int64_t n);
void exp2_array(float* out, const float* inp, int64_t n);
void tanh_array(float* out, const float* inp, int64_t n);
}  // namespace cpu

KILN_SAME_SIGNATURE(add);
KILN_SAME_SIGNATURE(scale);
KILN_SAME_SIGNATURE(accumulate);
KILN_SAME_SIGNATURE(add_bias);
KILN_SAME_SIGNATURE(bias_backward);
KILN_SAME_SIGNATURE(exp_array);
KILN_SAME_SIGNATURE(exp2_array);
KILN_SAME_SIGNATURE(tanh_array);

}  // namespace kiln
