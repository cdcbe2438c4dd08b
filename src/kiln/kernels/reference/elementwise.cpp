// Reference elementwise helpers (elementwise.h); exp and tanh through double.
#include "kiln/kernels/elementwise.h"

#include <cmath>

namespace kiln::ref {

void add(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
void add_bias(float* out, const float* x, const float* bias, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = x[r * cols + c] + bias[c];
}
void bias_backward(float* dbias, const float* dy, int64_t rows, int64_t cols) {
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) dbias[c] += dy[r * cols + c];
}
void scale(float* out, const float* inp, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = inp[i] * s;
}
void accumulate(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}
void exp_array(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<float>(std::exp(static_cast<double>(inp[i])));
}
void exp2_array(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<float>(std::exp2(static_cast<double>(inp[i])));
}
void tanh_array(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(std::tanh(static_cast<double>(inp[i])));
  }
}

}  // namespace kiln::ref
