// AVX2+FMA ceiling loops for perf/peak.h, used on CPUs (or KILN_SIMD settings) without AVX-512:
// 256-bit FMA throughput with 12 accumulators and an 8-stream read loop.
#include <immintrin.h>

#include "kiln/perf/peak.h"

namespace kiln::perf::detail {
namespace {
float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
}  // namespace

double fma_loop_avx2(int64_t iters) {
  // 12 accumulators and the two operands: 14 of the 16 ymm registers (16 accumulators spilled
  // one chain to the stack); 12 covers a 4-5 cycle latency on two ports.
  constexpr int kAcc = 12;
  __m256 acc[kAcc];
  for (int j = 0; j < kAcc; ++j) acc[j] = _mm256_set1_ps(static_cast<float>(j));
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(0.001f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int j = 0; j < kAcc; ++j) acc[j] = _mm256_fmadd_ps(acc[j], x, y);
  }
  __m256 s = acc[0];
  for (int j = 1; j < kAcc; ++j) s = _mm256_add_ps(s, acc[j]);
  sink_value(hsum(s));
  return static_cast<double>(iters) * kAcc * 8 * 2;
}

double read_loop_avx2(const float* p, int64_t n) {
  // Same pattern as read_loop_avx512: 8 neighbouring 16 KiB rows read together.
  constexpr int kStreams = 8;
  constexpr int64_t kRow = 4096;  // floats
  __m256 acc[kStreams];
  for (int s = 0; s < kStreams; ++s) acc[s] = _mm256_setzero_ps();
  int64_t base = 0;
  for (; base + kStreams * kRow <= n; base += kStreams * kRow) {
    const float* q = p + base;
    const float* next = base + 2 * kStreams * kRow <= n ? q + kStreams * kRow : q;
    for (int64_t i = 0; i < kRow; i += 8) {
      if (i % 16 == 0) {  // the next 8 rows, one line per row per line read, into L2
#pragma GCC unroll 8
        for (int s = 0; s < kStreams; ++s) __builtin_prefetch(next + s * kRow + i, 0, 2);
      }
#pragma GCC unroll 8
      for (int s = 0; s < kStreams; ++s) acc[s] = _mm256_add_ps(acc[s], _mm256_loadu_ps(q + s * kRow + i));
    }
  }
  __m256 t = acc[0];
  for (int s = 1; s < kStreams; ++s) t = _mm256_add_ps(t, acc[s]);
  sink_value(hsum(t));
  return static_cast<double>(base) * 4;
}

// As cache_read_loop_avx512, 8 sums of 8 lanes; n: a multiple of 64 floats.
double cache_read_loop_avx2(const float* p, int64_t n) {
  __m256 acc[8];
  for (int s = 0; s < 8; ++s) acc[s] = _mm256_setzero_ps();
  for (int64_t i = 0; i + 64 <= n; i += 64) {
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) acc[s] = _mm256_add_ps(acc[s], _mm256_load_ps(p + i + 8 * s));
  }
  __m256 t = acc[0];
  for (int s = 1; s < 8; ++s) t = _mm256_add_ps(t, acc[s]);
  sink_value(hsum(t));
  return static_cast<double>(n / 64 * 64) * 4;
}

}  // namespace kiln::perf::detail
