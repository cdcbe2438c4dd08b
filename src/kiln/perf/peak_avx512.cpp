// AVX-512 ceiling loops for perf/peak.h: FMA and vdpbf16ps throughput (24 independent
// accumulators: 3x the 4-cycle latency on two pipes, room for 5-6 cycle dot latencies) and DRAM read bandwidth (8 streams).
#include <immintrin.h>

#include "kiln/perf/peak.h"

// GCC 12's AVX-512 reductions seed with _mm512_undefined_*(): a -Wextra false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kiln::perf::detail {

double fma_loop_avx512(int64_t iters) {
  constexpr int kAcc = 24;
  __m512 acc[kAcc];
  for (int j = 0; j < kAcc; ++j) acc[j] = _mm512_set1_ps(static_cast<float>(j));
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(0.001f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int j = 0; j < kAcc; ++j) acc[j] = _mm512_fmadd_ps(acc[j], x, y);
  }
  __m512 s = acc[0];
  for (int j = 1; j < kAcc; ++j) s = _mm512_add_ps(s, acc[j]);
  sink_value(_mm512_reduce_add_ps(s));
  return static_cast<double>(iters) * kAcc * 16 * 2;
}

double bf16_dot_loop_avx512(int64_t iters) {
  constexpr int kAcc = 24;
  __m512 acc[kAcc];
  for (int j = 0; j < kAcc; ++j) acc[j] = _mm512_set1_ps(static_cast<float>(j));
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f7f3f7f), y = (__m512bh)_mm512_set1_epi32(0x3a833a83);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int j = 0; j < kAcc; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
  }
  __m512 s = acc[0];
  for (int j = 1; j < kAcc; ++j) s = _mm512_add_ps(s, acc[j]);
  sink_value(_mm512_reduce_add_ps(s));
  return static_cast<double>(iters) * kAcc * 32 * 2;
}

double read_loop_avx512(const float* p, int64_t n) {
  // Eight streams advance together over 8 neighbouring 16 KiB rows, then the next 8 rows (the
  // access pattern of a GEMV over (out, in) weights with in = 4096), the next 8 rows prefetched
  // into L2 meanwhile: enough misses in flight, and neighbouring rows so DRAM pages are reused. Streams spread far apart
  // over the buffer measured ~15% less than such a GEMV reads on Zen 4.
  constexpr int kStreams = 8;
  constexpr int64_t kRow = 4096;  // floats
  __m512 acc[kStreams];
  for (int s = 0; s < kStreams; ++s) acc[s] = _mm512_setzero_ps();
  int64_t base = 0;
  for (; base + kStreams * kRow <= n; base += kStreams * kRow) {
    const float* q = p + base;
    const float* next = base + 2 * kStreams * kRow <= n ? q + kStreams * kRow : q;
    for (int64_t i = 0; i < kRow; i += 16) {
      if (i % 16 == 0) {  // the next 8 rows, one line per row per line read, into L2
#pragma GCC unroll 8
        for (int s = 0; s < kStreams; ++s) __builtin_prefetch(next + s * kRow + i, 0, 2);
      }
#pragma GCC unroll 8
      for (int s = 0; s < kStreams; ++s) acc[s] = _mm512_add_ps(acc[s], _mm512_loadu_ps(q + s * kRow + i));
    }
  }
  __m512 t = acc[0];
  for (int s = 1; s < kStreams; ++s) t = _mm512_add_ps(t, acc[s]);
  sink_value(_mm512_reduce_add_ps(t));
  return static_cast<double>(base) * 4;
}

// A buffer already in cache (L1, L2, L3), read whole with 8 independent sums: two loads a cycle
// need that many adds in flight. n: a multiple of 128 floats.
double cache_read_loop_avx512(const float* p, int64_t n) {
  __m512 acc[8];
  for (int s = 0; s < 8; ++s) acc[s] = _mm512_setzero_ps();
  for (int64_t i = 0; i + 128 <= n; i += 128) {
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) acc[s] = _mm512_add_ps(acc[s], _mm512_load_ps(p + i + 16 * s));
  }
  __m512 t = acc[0];
  for (int s = 1; s < 8; ++s) t = _mm512_add_ps(t, acc[s]);
  sink_value(_mm512_reduce_add_ps(t));
  return static_cast<double>(n / 128 * 128) * 4;
}

}  // namespace kiln::perf::detail
