// Fast AdamW step (adamw.h): the per-step scalars in double, rounded to fp32 once, then the SIMD
// update of ops_impl.inc over aligned ranges spread over threads.
#include "kiln/kernels/adamw.h"

#include <cmath>

#include "kiln/core/trace.h"
#include "kiln/kernels/cpu/ops_targets.h"
#include "kiln/kernels/cpu/parallel.h"

namespace kiln::cpu {

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n,
                const AdamWConfig& c, int64_t step) {
  KILN_TRACE_KERNEL("adamw", adamw_cost(n), n);
  check_adamw_config(c).check_ok(__FILE__, __LINE__);
  KILN_CHECK(step >= 1);
  const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(step));
  AdamWScalars k;
  k.decay = static_cast<float>(1.0 - c.lr * c.weight_decay);
  k.one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  k.beta2 = static_cast<float>(c.beta2);
  k.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  k.neg_step_size = static_cast<float>(-(c.lr / bc1));
  k.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  k.eps = static_cast<float>(c.eps);
  const auto fn = KILN_OPS_DISPATCH(adamw_n).pick();
  parallel_elems(n, [&](int64_t b, int64_t e) { fn(param + b, grad + b, m + b, v + b, e - b, k); });
}

}  // namespace kiln::cpu
