// Drivers for the ceiling loops in peak_avx512.cpp: calibrate an iteration count, run the loop
// on every thread at once, keep the best of three.
#include "bench/peak.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "kiln/core/cpu_features.h"

namespace kiln::bench {

namespace {
std::atomic<float> g_sink{0.0f};
}  // namespace

void sink_value(float v) { g_sink.store(v, std::memory_order_relaxed); }

namespace {

// Runs fn(thread) on `threads` threads started together; returns the wall time.
template <class F>
double run_on_threads(int threads, F&& fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  double t0 = 0;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      fn(t);
    });
  }
  while (ready.load() != threads) {
  }
  t0 = now_seconds();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  return now_seconds() - t0;
}

}  // namespace

double measure_fma_peak_gflops(int threads, bool bf16) {
  if (!cpu_features().avx512f || (bf16 && !cpu_features().avx512_bf16)) return 0.0;
  auto loop = [bf16](int64_t iters) { return bf16 ? bf16_dot_loop_avx512(iters) : fma_loop_avx512(iters); };
  // Calibrate to ~0.15 s per run.
  int64_t iters = 1 << 20;
  const double t_cal = run_on_threads(1, [&](int) { loop(iters); });
  iters = std::max<int64_t>(iters, static_cast<int64_t>(iters * 0.15 / std::max(t_cal, 1e-6)));
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<double> flops(threads);
    const double t = run_on_threads(threads, [&](int th) { flops[th] = loop(iters); });
    double total = 0;
    for (double f : flops) total += f;
    best = std::max(best, total / t * 1e-9);
  }
  return best;
}

double measure_read_bandwidth_gbs(int threads, const float* buffer, int64_t n) {
  if (!cpu_features().avx512f) return 0.0;
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<double> bytes(threads);
    const double t = run_on_threads(threads, [&](int th) {
      const int64_t begin = n * th / threads & ~int64_t{63}, end = n * (th + 1) / threads & ~int64_t{63};
      bytes[th] = read_loop_avx512(buffer + begin, end - begin);
    });
    double total = 0;
    for (double b : bytes) total += b;
    best = std::max(best, total / t * 1e-9);
  }
  return best;
}

}  // namespace kiln::bench
