// The fp16-arithmetic GEMM's micro-kernel on AVX512-FP16 (gemm_f16_kernel.h): vfmadd231ph into
// fp16 accumulators over a chunk of k steps, each chunk's partial widened (vcvtph2ps) and added
// into the f32 tile. Compiled with -mavx512fp16 (the file-name suffix) and nothing but this
// function in it: the driver, packing and threads stay in baseline code (gemm_f16.cpp), so no
// inline function compiled for AVX512-FP16 can be picked by the linker for other callers.
#include <immintrin.h>

#include "kiln/kernels/cpu/gemm_f16_kernel.h"

namespace kiln::cpu {

void gemm_f16_micro_kernel_avx512fp16(int64_t kc, int chunk, const uint32_t* a, const uint16_t* b,
                                      float* tile) {
  if (kc == 0) {
    for (int i = 0; i < kF16Mr * kF16Nr; ++i) tile[i] = 0.0f;
    return;
  }
  for (int64_t k0 = 0; k0 < kc; k0 += chunk) {
    __m512h acc[kF16Mr][2];
#pragma GCC unroll 12
    for (int i = 0; i < kF16Mr; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ph();
    const int64_t k1 = kc < k0 + chunk ? kc : k0 + chunk;
    for (int64_t k = k0; k < k1; ++k) {
      const __m512h b0 = _mm512_load_ph(b + k * kF16Nr);
      const __m512h b1 = _mm512_load_ph(b + k * kF16Nr + 32);
#pragma GCC unroll 12
      for (int i = 0; i < kF16Mr; ++i) {
        const __m512h ai =
            _mm512_castsi512_ph(_mm512_set1_epi32(static_cast<int>(a[k * kF16Mr + i])));
        acc[i][0] = _mm512_fmadd_ph(ai, b0, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ph(ai, b1, acc[i][1]);
      }
    }
    const bool first = k0 == 0;
#pragma GCC unroll 12
    for (int i = 0; i < kF16Mr; ++i) {
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        float* t = tile + i * kF16Nr + j * 32;
        const __m512i bits = _mm512_castph_si512(acc[i][j]);
        // The zero-masked extracts: the plain ones pass an undefined vector GCC 12 warns about.
        const __m512 lo =
            _mm512_cvtxph_ps(_mm256_castsi256_ph(_mm512_maskz_extracti64x4_epi64(0xff, bits, 0)));
        const __m512 hi =
            _mm512_cvtxph_ps(_mm256_castsi256_ph(_mm512_maskz_extracti64x4_epi64(0xff, bits, 1)));
        _mm512_storeu_ps(t, first ? lo : _mm512_add_ps(_mm512_loadu_ps(t), lo));
        _mm512_storeu_ps(t + 16, first ? hi : _mm512_add_ps(_mm512_loadu_ps(t + 16), hi));
      }
    }
  }
}

}  // namespace kiln::cpu
