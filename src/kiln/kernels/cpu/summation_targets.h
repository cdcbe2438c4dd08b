// Per-target entry points of the fast summation (summation_impl.inc compiled as scalar, AVX2
// and AVX-512) and KILN_SUM_DISPATCH, the Dispatch table over them. Internal to kiln::cpu:
// callers use summation.h.
#pragma once

#include <cstdint>

#include "kiln/kernels/dispatch.h"
#include "kiln/kernels/summation.h"

namespace kiln::cpu {

// The f32-accumulator sum of one block x[0, n) by `method`, lanes combined. Naive and pairwise
// return the block's f32 result (widened); Kahan and Neumaier return the lanes' s ∓ c summed by
// Neumaier in double, so the block's compensation is not lost between blocks.
namespace scalar { double sum_block_f32(const float* x, int64_t n, SumMethod method); }
namespace avx2 { double sum_block_f32(const float* x, int64_t n, SumMethod method); }
namespace avx512 { double sum_block_f32(const float* x, int64_t n, SumMethod method); }

}  // namespace kiln::cpu

#define KILN_SUM_DISPATCH                                                          \
  (::kiln::Dispatch<decltype(&::kiln::cpu::scalar::sum_block_f32)>{                \
      &::kiln::cpu::scalar::sum_block_f32, &::kiln::cpu::avx2::sum_block_f32,      \
      &::kiln::cpu::avx512::sum_block_f32})
