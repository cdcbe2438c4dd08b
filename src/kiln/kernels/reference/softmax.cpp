// Reference softmax (softmax.h): max-subtracted, exp and sums in double.
#include "kiln/kernels/softmax.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/core/status.h"

namespace kiln::ref {

void softmax_forward(float* out, const float* inp, int64_t rows, int64_t cols) {
  KILN_CHECK(rows >= 0 && cols > 0);
  std::vector<double> e(cols);  // (cols,): out may alias inp
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = inp + r * cols;
    float* y = out + r * cols;
    double m = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, static_cast<double>(x[c]));
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) {
      e[c] = std::exp(x[c] - m);
      sum += e[c];
    }
    for (int64_t c = 0; c < cols; ++c) y[c] = static_cast<float>(e[c] / sum);
  }
}

void softmax_backward(float* dinp, const float* dout, const float* out, int64_t rows,
                      int64_t cols) {
  KILN_CHECK(rows >= 0 && cols > 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* y = out + r * cols;
    const float* dy = dout + r * cols;
    float* dx = dinp + r * cols;
    double dot = 0;
    for (int64_t c = 0; c < cols; ++c) dot += static_cast<double>(dy[c]) * y[c];
    for (int64_t c = 0; c < cols; ++c) dx[c] = static_cast<float>(y[c] * (dy[c] - dot));
  }
}

}  // namespace kiln::ref
