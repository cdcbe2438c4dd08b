// Reference GELU (tanh form), SiLU and SwiGLU (activation.h), each value computed in double.
#include "kiln/kernels/activation.h"

#include <cmath>

namespace kiln::ref {
namespace {

constexpr double kGeluC = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kGeluA = 0.044715;

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = inp[i];
    out[i] = static_cast<float>(0.5 * x * (1.0 + std::tanh(kGeluC * (x + kGeluA * x * x * x))));
  }
}

void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = inp[i];
    const double t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
    const double du = kGeluC * (1.0 + 3.0 * kGeluA * x * x);
    const double g = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
    dinp[i] = static_cast<float>(dout[i] * g);
  }
}

void silu_forward(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = inp[i];
    out[i] = static_cast<float>(x * sigmoid(x));
  }
}

void silu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = inp[i], s = sigmoid(x);
    dinp[i] = static_cast<float>(dout[i] * s * (1.0 + x * (1.0 - s)));
  }
}

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g * sigmoid(g) * up[i]);
  }
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i], u = up[i], dy = dout[i], s = sigmoid(g);
    dgate[i] = static_cast<float>(dy * u * s * (1.0 + g * (1.0 - s)));
    dup[i] = static_cast<float>(dy * g * s);
  }
}

}  // namespace kiln::ref
