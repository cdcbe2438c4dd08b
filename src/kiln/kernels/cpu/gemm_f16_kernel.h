// Internal interface between the fp16-arithmetic GEMM's driver (kernels/gemm_f16.cpp) and its
// AVX512-FP16 micro-kernel (gemm_f16_avx512fp16.cpp, compiled for that target alone).
#pragma once

#include <cstdint>

namespace kiln::cpu {

// 12 rows x 64 columns: 24 fp16 accumulators (two vectors of 32 lanes per row), two B vectors
// and one broadcast A value in the 32 vector registers. Per k step 24 FMAs against 2 + 12 loads:
// the broadcasts are vpbroadcastd from a 32-bit word holding the half twice (a pure load on
// Intel cores; a 16-bit broadcast would also take a shuffle port, which the FMAs share).
inline constexpr int kF16Mr = 12, kF16Nr = 64;

// tile (12 x 64 f32, row-major) = A strip (kc x 12 words, each half twice) x B micro-panel
// (kc x 64 halves, 64-byte aligned), summed in fp16 over `chunk` k steps at a time, each partial
// widened and added in f32. Only where the CPU has AVX512-FP16.
void gemm_f16_micro_kernel_avx512fp16(int64_t kc, int chunk, const uint32_t* a, const uint16_t* b,
                                      float* tile);

}  // namespace kiln::cpu
