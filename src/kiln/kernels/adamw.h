// One fused AdamW step over fp32 parameters with fp32 moments, as kiln::ref (double per
// element) and kiln::cpu (SIMD, threaded), identical signatures. The formula is PyTorch's
// torch.optim.AdamW (amsgrad=False, maximize=False), in its order; with t the 1-based step:
//   p  ← p·(1 - lr·λ)                         decoupled weight decay, before the moments
//   m  ← m + (1 - β1)·(g - m)                 (= β1·m + (1 - β1)·g, torch's lerp_)
//   v  ← β2·v + (1 - β2)·g²
//   p  ← p - (lr / (1 - β1^t)) · m / (sqrt(v) / sqrt(1 - β2^t) + ε)
// The per-step scalars are computed in double and applied in fp32, as torch does.
#pragma once

#include <cstdint>

#include "kiln/core/status.h"
#include "kiln/kernels/op_cost.h"

namespace kiln {

struct AdamWConfig {  // torch.optim.AdamW defaults
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

// InvalidArgument unless lr >= 0, eps >= 0, 0 <= beta1, beta2 < 1, weight_decay >= 0
// (torch's checks).
Status check_adamw_config(const AdamWConfig& config);

// Reads p, g, m, v; writes p, m, v.
constexpr OpCost adamw_cost(int64_t n) {
  return {14.0 * n, 28.0 * n};
}

namespace ref {
// param, grad, m, v (n,); step >= 1 is the number of this update (1 for the first).
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n,
                const AdamWConfig& config, int64_t step);
}  // namespace ref

namespace cpu {  // same contract as ref::
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n,
                const AdamWConfig& config, int64_t step);
}  // namespace cpu

KILN_SAME_SIGNATURE(adamw_step);

}  // namespace kiln
