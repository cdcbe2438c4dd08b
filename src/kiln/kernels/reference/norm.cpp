// Reference LayerNorm and RMSNorm (norm.h): plain loops, statistics and reductions in double.
#include "kiln/kernels/norm.h"

#include <cmath>
#include <vector>

#include "kiln/core/status.h"

namespace kiln::ref {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t rows, int64_t cols, float eps) {
  KILN_CHECK(rows >= 0 && cols > 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = inp + r * cols;  // (cols,)
    float* y = out + r * cols;        // (cols,)
    double m = 0;
    for (int64_t c = 0; c < cols; ++c) m += x[c];
    m /= static_cast<double>(cols);
    double var = 0;
    for (int64_t c = 0; c < cols; ++c) var += (x[c] - m) * (x[c] - m);
    var /= static_cast<double>(cols);
    const double s = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < cols; ++c) {
      y[c] = static_cast<float>((x[c] - m) * s * weight[c] + bias[c]);
    }
    if (mean) mean[r] = static_cast<float>(m);
    if (rstd) rstd[r] = static_cast<float>(s);
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int64_t rows, int64_t cols, bool accumulate_dx) {
  KILN_CHECK(rows >= 0 && cols > 0);
  std::vector<double> dw(cols, 0.0), db(cols, 0.0);  // (cols,)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = inp + r * cols;
    const float* dy = dout + r * cols;
    float* dx = dinp + r * cols;
    const double m = mean[r], s = rstd[r];
    double a = 0, b = 0;  // mean(dy·w), mean(dy·w·xhat)
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[c] - m) * s;
      const double g = static_cast<double>(dy[c]) * weight[c];
      a += g;
      b += g * xhat;
      dw[c] += dy[c] * xhat;
      db[c] += dy[c];
    }
    a /= static_cast<double>(cols);
    b /= static_cast<double>(cols);
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[c] - m) * s;
      const double g = static_cast<double>(dy[c]) * weight[c];
      const double v = s * (g - a - xhat * b);
      dx[c] = accumulate_dx ? dx[c] + static_cast<float>(v) : static_cast<float>(v);
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    dweight[c] = static_cast<float>(dweight[c] + dw[c]);
    dbias[c] = static_cast<float>(dbias[c] + db[c]);
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t rows,
                     int64_t cols, float eps) {
  KILN_CHECK(rows >= 0 && cols > 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = inp + r * cols;
    float* y = out + r * cols;
    double ss = 0;
    for (int64_t c = 0; c < cols; ++c) ss += static_cast<double>(x[c]) * x[c];
    const double s = 1.0 / std::sqrt(ss / static_cast<double>(cols) + eps);
    for (int64_t c = 0; c < cols; ++c) y[c] = static_cast<float>(x[c] * s * weight[c]);
    if (rstd) rstd[r] = static_cast<float>(s);
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t rows, int64_t cols,
                      bool accumulate_dx) {
  KILN_CHECK(rows >= 0 && cols > 0);
  std::vector<double> dw(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = inp + r * cols;
    const float* dy = dout + r * cols;
    float* dx = dinp + r * cols;
    const double s = rstd[r];
    double b = 0;  // mean(dy·w·xhat)
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = x[c] * s;
      b += static_cast<double>(dy[c]) * weight[c] * xhat;
      dw[c] += dy[c] * xhat;
    }
    b /= static_cast<double>(cols);
    for (int64_t c = 0; c < cols; ++c) {
      const double g = static_cast<double>(dy[c]) * weight[c];
      const double v = s * (g - x[c] * s * b);
      dx[c] = accumulate_dx ? dx[c] + static_cast<float>(v) : static_cast<float>(v);
    }
  }
  for (int64_t c = 0; c < cols; ++c) dweight[c] = static_cast<float>(dweight[c] + dw[c]);
}

}  // namespace kiln::ref
