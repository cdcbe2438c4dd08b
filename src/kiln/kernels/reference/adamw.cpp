// Reference AdamW step (adamw.h): PyTorch's formula with every element computed in double.
#include "kiln/kernels/adamw.h"

#include <cmath>

namespace kiln::ref {

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n,
                const AdamWConfig& c, int64_t step) {
  check_adamw_config(c).check_ok(__FILE__, __LINE__);
  KILN_CHECK(step >= 1);
  const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(step));
  for (int64_t i = 0; i < n; ++i) {
    const double g = grad[i];
    double p = param[i] * (1.0 - c.lr * c.weight_decay);
    const double mi = c.beta1 * m[i] + (1.0 - c.beta1) * g;
    const double vi = c.beta2 * v[i] + (1.0 - c.beta2) * g * g;
    p -= (c.lr / bc1) * mi / (std::sqrt(vi) / std::sqrt(bc2) + c.eps);
    param[i] = static_cast<float>(p);
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
  }
}

}  // namespace kiln::ref
