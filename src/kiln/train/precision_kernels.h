// Bulk rounding kernels for mixed-precision training: f32 -> bf16 (RNE), f32 rounded through
// f16 (RNE, counting values flushed to zero), amax, and fp8 quantize-dequantize with a per-tensor
// scale (saturating, RNE). Scalar references and AVX-512 versions, picked with Dispatch.
#pragma once

#include <cstdint>

#include "kiln/kernels/dispatch.h"

namespace kiln {

enum class Fp8Kind { kE4M3, kE5M2 };

namespace precision_detail {
// One target's kernels over x[0, n). Each must give bitwise the scalar results.
struct Kernels {
  void (*to_bf16)(uint16_t* dst, const float* src, int64_t n);
  // dst = f16(src) as f32; returns how many non-zero src became zero (underflow).
  int64_t (*round_f16)(float* dst, const float* src, int64_t n);
  // max |x| (NaN if any element is NaN).
  float (*amax)(const float* x, int64_t n);
  // dst = decode(encode_saturating(src · scale)) / scale.
  void (*qdq_fp8)(float* dst, const float* src, int64_t n, float scale, Fp8Kind kind);
};
namespace scalar { extern const Kernels kKernels; }
namespace avx512 { extern const Kernels kKernels; }
}  // namespace precision_detail

// Threaded entry points (parallel_for over chunks, the picked target per chunk).
void convert_to_bf16(uint16_t* dst, const float* src, int64_t n);
int64_t round_through_f16(float* dst, const float* src, int64_t n);
float abs_max(const float* x, int64_t n);
void fp8_quantize_dequantize(float* dst, const float* src, int64_t n, float scale, Fp8Kind kind);
// Largest finite value of the format (448, 57344).
float fp8_max(Fp8Kind kind);
// The scalar kernels, for tests comparing targets.
const precision_detail::Kernels& precision_kernels_scalar();
const precision_detail::Kernels& precision_kernels_picked();

}  // namespace kiln
