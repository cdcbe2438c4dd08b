// Drivers for the ceiling loops (peak_avx512.cpp, peak_avx2.cpp): calibrate an iteration count,
// run the loop on every thread at once (plain std::threads released together), keep the best
// of three; plus the per-process cache behind fma_peak_gflops().
#include "kiln/perf/peak.h"


#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/core/cpu_features.h"
#include "kiln/core/huge_pages.h"
#include "kiln/kernels/cpu/gemm_cpu.h"

namespace kiln::perf {
namespace detail {
namespace {
std::atomic<float> g_sink{0.0f};
}  // namespace
void sink_value(float v) { g_sink.store(v, std::memory_order_relaxed); }
double peak_despite_stalls(double first, double one_thread, int cores, const std::function<double()>& again) {
  double best = first;
  for (int retry = 0; retry < 2 && best < 0.75 * cores * one_thread; ++retry) best = std::max(best, again());
  return best;
}
}  // namespace detail

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs fn(thread) on `threads` threads started together; returns the wall time from release to
// the last join.
template <class F>
double run_on_threads(int threads, F&& fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
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
  const double t0 = now_seconds();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  return now_seconds() - t0;
}

using LoopFn = double (*)(int64_t);

LoopFn fma_loop_for(DType dtype) {
  const SimdTarget t = active_simd_target();
  if (dtype == DType::kBF16 && cpu::bf16_gemm_kernel() == cpu::Bf16Kernel::kAmx) return &cpu::run_bf16_amx_peak_loop;
  if (dtype == DType::kBF16) return bf16_dot_available() ? &detail::bf16_dot_loop_avx512 : nullptr;
  if (dtype != DType::kF32) return nullptr;
  if (t == SimdTarget::kAvx512) return &detail::fma_loop_avx512;
  if (t == SimdTarget::kAvx2) return &detail::fma_loop_avx2;
  return nullptr;
}

// fn(count) -> FLOPs done, run on `threads` threads at once for about `seconds` (count
// calibrated on one thread); GFLOP/s of the run.
template <class F>
double timed_window(F&& fn, int threads, int64_t count) {
  std::vector<double> flops(static_cast<size_t>(threads));
  const double t = run_on_threads(threads, [&](int th) { flops[static_cast<size_t>(th)] = fn(count); });
  double total = 0;
  for (double f : flops) total += f;
  return total / std::max(t, 1e-9) * 1e-9;
}

template <class F>
int64_t calibrate(F&& fn, int64_t count, double seconds) {
  const double t = run_on_threads(1, [&](int) { fn(count); });
  return std::max<int64_t>(count, static_cast<int64_t>(static_cast<double>(count) * seconds / std::max(t, 1e-7)));
}

}  // namespace

FmaPeak measure_fma_peak(DType dtype, int threads, double seconds) {
  const LoopFn loop = fma_loop_for(dtype);
  if (!loop || threads < 1) return {};
  const cpu::GemmPath path = dtype == DType::kBF16 ? cpu::GemmPath::kBF16 : cpu::GemmPath::kF32;
  auto kernel = [path](int64_t reps) { return cpu::run_micro_kernel_in_l1(path, reps); };
  constexpr int kWindows = 8;
  const double window = seconds / (2 * kWindows);
  // Warm-up on every thread (clock, licences, upper lanes), then size the windows.
  const int64_t warm = calibrate(loop, 1 << 16, std::max(0.03, seconds / 4));
  timed_window(loop, threads, warm);
  const int64_t iters = calibrate(loop, 1 << 16, window);
  const int64_t reps = calibrate(kernel, 1024, window);
  FmaPeak p;
  for (int w = 0; w < kWindows; ++w) {
    p.loop_gflops = std::max(p.loop_gflops, timed_window(loop, threads, iters));
    p.kernel_gflops = std::max(p.kernel_gflops, timed_window(kernel, threads, reps));
  }
  return p;
}

double measure_fma_peak_gflops(DType dtype, int threads, double seconds) {
  return measure_fma_peak(dtype, threads, seconds).gflops();
}

void DramReadProbe::Free::operator()(float* p) const {
  std::free(p);
}

DramReadProbe::DramReadProbe(int64_t bytes) {
  if (active_simd_target() == SimdTarget::kScalar) return;
  if (bytes <= 0)
    bytes = std::max<int64_t>(int64_t{256} << 20, int64_t{8} * cpu_features().l3_bytes);
  const int64_t n = bytes / 4 & ~int64_t{1023};  // floats
  if (n <= 0) return;
  buf_.reset(static_cast<float*>(allocate_large(static_cast<size_t>(n) * 4).ptr));  // fewer page faults
  if (!buf_) return;
  // First touch on both cores (page faults are slow in VMs), with values that stay finite.
  const int touch =
      std::max(1, static_cast<int>(std::min<unsigned>(2, std::thread::hardware_concurrency())));
  run_on_threads(touch, [&](int th) {
    const int64_t b = n * th / touch, e = n * (th + 1) / touch;
    for (int64_t i = b; i < e; ++i) buf_.get()[i] = static_cast<float>(i & 255) * (1.0f / 256);
  });
  n_ = n;
}

double DramReadProbe::pass(int threads) const {
  const SimdTarget target = active_simd_target();
  if (!buf_ || threads < 1 || target == SimdTarget::kScalar) return 0.0;
  const auto loop =
      target == SimdTarget::kAvx512 ? &detail::read_loop_avx512 : &detail::read_loop_avx2;
  std::vector<double> read(static_cast<size_t>(threads));
  const double t = run_on_threads(threads, [&](int th) {
    const int64_t b = n_ * th / threads & ~int64_t{63}, e = n_ * (th + 1) / threads & ~int64_t{63};
    read[static_cast<size_t>(th)] = loop(buf_.get() + b, e - b);
  });
  double total = 0;
  for (double r : read) total += r;
  return total / t * 1e-9;
}

double measure_dram_read_gbps(int threads, int64_t bytes) {
  if (active_simd_target() == SimdTarget::kScalar || threads < 1) return 0.0;
  const DramReadProbe probe(bytes);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) best = std::max(best, probe.pass(threads));
  return best;
}

double measure_read_gbps(int threads, int64_t bytes_per_thread, double seconds) {
  const SimdTarget target = active_simd_target();
  if (target == SimdTarget::kScalar || threads < 1) return 0.0;
  const auto loop = target == SimdTarget::kAvx512 ? &detail::cache_read_loop_avx512 : &detail::cache_read_loop_avx2;
  const int64_t n = std::max<int64_t>(1024, bytes_per_thread / 4 & ~int64_t{127});  // floats, whole loop turns
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<float, Free>> bufs;
  for (int t = 0; t < threads; ++t) {
    bufs.emplace_back(static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n) * 4)));
    if (!bufs.back()) return 0.0;
    for (int64_t i = 0; i < n; ++i) bufs.back().get()[i] = static_cast<float>(i & 255) * (1.0f / 256);
  }
  // Each thread warms its buffer into its cache with one pass, then times `passes` more.
  auto run = [&](int64_t passes) {
    std::vector<double> read(static_cast<size_t>(threads));
    std::vector<double> secs(static_cast<size_t>(threads));
    run_on_threads(threads, [&](int th) {
      const float* b = bufs[static_cast<size_t>(th)].get();
      loop(b, n);
      const double t0 = now_seconds();
      double r = 0;
      for (int64_t p = 0; p < passes; ++p) r += loop(b, n);
      secs[static_cast<size_t>(th)] = now_seconds() - t0;
      read[static_cast<size_t>(th)] = r;
    });
    double total = 0, slowest = 0;
    for (int t = 0; t < threads; ++t) {
      total += read[static_cast<size_t>(t)];
      slowest = std::max(slowest, secs[static_cast<size_t>(t)]);
    }
    return std::make_pair(total, slowest);
  };
  int64_t passes = 8;
  const double t_cal = run(passes).second;
  passes = std::max<int64_t>(passes, static_cast<int64_t>(static_cast<double>(passes) * seconds / std::max(t_cal, 1e-7)));
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto [bytes, secs] = run(passes);
    best = std::max(best, bytes / std::max(secs, 1e-9) * 1e-9);
  }
  return best;
}

HierarchicalRoofline measure_hierarchical_roofline(int threads) {
  HierarchicalRoofline r;
  r.threads = threads;
  r.peak_gflops = measure_fma_peak_gflops(DType::kF32, threads, 0.05);
  const CpuFeatures& f = cpu_features();
  // Working sets of half of each level, so the loop's other data fits beside them. L1 and L2 are
  // per core (each thread its own; together they hold `threads` times one), L3 is shared (each
  // thread reads its share).
  struct Level {
    const char* name;
    int64_t bytes;
    bool shared;
  };
  const Level levels[] = {{"L1", f.l1d_bytes, false}, {"L2", f.l2_bytes, false}, {"L3", f.l3_bytes, true}};
  for (const Level& l : levels) {
    const int64_t per_thread = l.shared ? l.bytes / 2 / std::max(threads, 1) : l.bytes / 2;
    if (per_thread <= 0) continue;
    r.memory.push_back({l.name, measure_read_gbps(threads, per_thread), l.shared ? l.bytes : l.bytes * threads});
  }
  r.memory.push_back({"DRAM", measure_dram_read_gbps(threads), 0});
  return r;
}

double gemm_peak_gflops(int threads, DType dtype) {
  if (dtype == DType::kBF16 && cpu::bf16_gemm_on_bf16_products()) {
    if (const double p = fma_peak_gflops(threads, DType::kBF16); p > 0) return p;
  }
  return fma_peak_gflops(threads, DType::kF32);
}

double fma_peak_gflops(int threads, DType dtype) {
  const double one = threads > 1 ? fma_peak_gflops(1, dtype) : 0.0;  // before the lock: it takes it
  static std::mutex mu;
  static std::map<std::pair<int, int>, double> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(static_cast<int>(dtype), threads);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  // ~30 ms of warm-up, then eight ~5 ms windows of the loop and of the micro-kernel.
  double v = measure_fma_peak_gflops(dtype, threads, 0.08);
  // A VM whose vCPU stalls for the whole probe reads one thread's rate or less (seen once: 186
  // GFLOP/s at 2 threads against 1-thread peaks of 224, so an MFU of 137%). SMT siblings sharing
  // one core's FMA ports really stay below, and pay ~0.2 s once.
  if (threads > 1)
    v = detail::peak_despite_stalls(v, one, std::min<int>(threads, std::max(1u, std::thread::hardware_concurrency())),
                                    [&] { return measure_fma_peak_gflops(dtype, threads, 0.08); });
  cache.emplace(key, v);
  return v;
}

}  // namespace kiln::perf
