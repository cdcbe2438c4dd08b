// The per-target entry points of the fast non-GEMM kernels (scalar, AVX2, AVX-512 copies of
// ops_impl.inc) and KILN_OPS_DISPATCH(fn), the Dispatch table over the three copies of `fn`.
// Internal to kiln::cpu: callers use the family headers (norm.h, softmax.h, ...).
#pragma once

#include <cstdint>

#include "kiln/kernels/dispatch.h"

namespace kiln::cpu {

// AdamW's per-step scalars, rounded to fp32 as PyTorch applies them (see adamw.h).
struct AdamWScalars {
  float decay;            // 1 - lr·weight_decay
  float one_minus_beta1;  // 1 - beta1
  float beta2;
  float one_minus_beta2;  // 1 - beta2
  float neg_step_size;    // -lr / (1 - beta1^t)
  float bc2_sqrt;         // sqrt(1 - beta2^t)
  float eps;
};

namespace scalar {
#include "kiln/kernels/cpu/ops_decl.inc"
}  // namespace scalar
namespace avx2 {
#include "kiln/kernels/cpu/ops_decl.inc"
}  // namespace avx2
namespace avx512 {
#include "kiln/kernels/cpu/ops_decl.inc"
}  // namespace avx512

}  // namespace kiln::cpu

#define KILN_OPS_DISPATCH(fn)                            \
  (::kiln::Dispatch<decltype(&::kiln::cpu::scalar::fn)>{ \
      &::kiln::cpu::scalar::fn, &::kiln::cpu::avx2::fn, &::kiln::cpu::avx512::fn})
