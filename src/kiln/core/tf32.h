// TF32: the GEMM input format of NVIDIA tensor cores (Ampere+): f32's 8 exponent bits with only
// 10 fraction bits (11 significant bits), stored in an f32 whose low 13 bits are zero. Used as
// a GEMM input mode (round A and B, accumulate in f32); rounding is to nearest, ties to even.
// Included from dtype.h; tests in tests/core/test_fp8.cpp (TF32 section).
#pragma once

#include <cstdint>

#include "kiln/core/dtype.h"

namespace kiln {

inline constexpr int kTf32FractionBits = 10;

// x rounded to the nearest TF32 value (ties to even). Infinities stay, NaN stays NaN (quiet),
// values that round past the largest TF32 (≈ 3.4025e38) become ±inf like any IEEE rounding.
inline float round_to_tf32(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return f32_from_bits((u | 0x400000u) & ~0x1fffu);
  u += 0xfffu + ((u >> 13) & 1u);  // 13 dropped bits: add half minus one plus the kept lsb
  return f32_from_bits(u & ~0x1fffu);
}

// out[i] = round_to_tf32(in[i]) over n values (in may equal out): what a TF32 GEMM does to its
// A and B operands before an f32-accumulating product.
inline void round_to_tf32_array(float* out, const float* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = round_to_tf32(in[i]);
}

}  // namespace kiln
