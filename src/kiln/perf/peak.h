// Machine ceilings measured on the CPU at hand: the FMA peak (f32 FMA or bf16 dot products in a
// register-only loop on 1..N threads) and the DRAM read bandwidth (streaming over >> L3). MFU
// during training and % of peak in the benchmarks are both quoted against these.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "kiln/core/dtype.h"
#include "kiln/perf/roofline.h"

namespace kiln::perf {

// The FMA peak of `threads` threads, two ways:
//  * loop: each thread runs an independent register-only loop (f32: vfmadd on the widest vector
//    of the active SIMD target; bf16: AVX512_BF16 vdpbf16ps, 2 FLOPs per product, or where the
//    bf16 GEMM runs on AMX, four independent TDPBF16PS on tiles in registers) with enough
//    independent accumulators for the longest FMA latency times FMA ports of current x86 cores
//    (24 zmm for 4-5 cycles x 2 ports on AVX-512, 12 ymm on AVX2: all that fit beside the two
//    operands without spilling), so both ports stay busy;
//  * kernel (the self-check): the GEMM micro-kernel of the same dtype on one tile whose panels
//    stay in L1 (cpu::run_micro_kernel_in_l1), the rate a GEMM's inner loop reaches.
// The vector units and the clock are warmed first (~1/4 of `seconds`, at least 30 ms: AVX-512
// frequency licences and the power-gated upper lanes of Intel cores change the rate in the first
// milliseconds), then eight windows of each alternate over `seconds` and the best window of
// each counts: a window that a VM's neighbour or an interrupt slowed is discarded.
struct FmaPeak {
  double loop_gflops = 0;
  double kernel_gflops = 0;
  // The peak quoted (MFU, % of peak): the larger, so no GEMM can run above 100% of it.
  double gflops() const { return loop_gflops > kernel_gflops ? loop_gflops : kernel_gflops; }
  // The self-check: kernel / loop (a loop that reads low shows up as > 1).
  double kernel_share() const { return loop_gflops > 0 ? kernel_gflops / loop_gflops : 0.0; }
};
// Zeros when the CPU has no such instruction (bf16 without AVX512_BF16, f32 on the scalar
// target) or the dtype is neither.
FmaPeak measure_fma_peak(DType dtype, int threads, double seconds = 0.15);
// measure_fma_peak(...).gflops().
double measure_fma_peak_gflops(DType dtype, int threads, double seconds = 0.15);

// GB/s read by `threads` threads streaming disjoint slices of a buffer of `bytes` (0: the larger
// of 256 MiB and 8x the L3 cache) with wide loads; best of three passes. Allocates and frees the
// buffer (first touch included, not timed). 0 when the active target is scalar.
double measure_dram_read_gbps(int threads, int64_t bytes = 0);

// The same probe with its buffer kept, for repeated single passes: a benchmark can time one pass
// in each of its rounds, beside the kernels it rates, and so see the DRAM rate of the same
// moments (on shared VMs the 2-thread rate was seen to move between ~35 and ~60 GB/s from one
// minute to the next). pass() returns 0 when the active target is scalar or allocation failed.
class DramReadProbe {
 public:
  explicit DramReadProbe(int64_t bytes = 0);
  double pass(int threads) const;  // GB/s of one pass over the whole buffer

 private:
  struct Free {
    void operator()(float* p) const;
  };
  std::unique_ptr<float, Free> buf_;
  int64_t n_ = 0;  // floats
};

// GB/s read by `threads` threads, each streaming its own buffer of `bytes_per_thread` over and
// over for about `seconds` (best of three): with a buffer that fits in L1 or L2 (per core) or a
// share of L3 this is that level's read bandwidth. 0 when the active target is scalar.
double measure_read_gbps(int threads, int64_t bytes_per_thread, double seconds = 0.02);

// The ceilings of the hierarchical roofline on `threads` threads: the f32 FMA peak, and read
// bandwidth at L1, L2, L3 (working sets of half of each level, from cpu_features(); a level
// the CPU does not report is left out) and DRAM (measure_dram_read_gbps). About a second.
HierarchicalRoofline measure_hierarchical_roofline(int threads);

// The FMA peak for `threads` threads, measured once per process per (dtype, threads) with a
// short (~100 ms) measure_fma_peak and cached; thread-safe. For MFU = achieved FLOP/s / this.
double fma_peak_gflops(int threads, DType dtype = DType::kF32);
// The peak of the products a GEMM of `dtype` inputs issues on this CPU: the bf16 dot-product
// peak while cpu::gemm runs bf16 on vdpbf16ps, the TDPBF16PS peak while it runs on AMX tiles,
// else (bf16 widened to f32, or any other dtype) the f32 FMA peak. What MFU of a bf16 run is
// quoted against.
double gemm_peak_gflops(int threads, DType dtype);

namespace detail {
// Per-target loops (peak_avx512.cpp, peak_avx2.cpp). Each returns the FLOPs (or bytes) done.
double fma_loop_avx512(int64_t iters);
double bf16_dot_loop_avx512(int64_t iters);
double read_loop_avx512(const float* p, int64_t n);
double fma_loop_avx2(int64_t iters);
double read_loop_avx2(const float* p, int64_t n);
// Cache-resident reads (measure_read_gbps): p 64-byte aligned.
double cache_read_loop_avx512(const float* p, int64_t n);
double cache_read_loop_avx2(const float* p, int64_t n);
// Keeps a loop's result alive so it is not optimized away.
void sink_value(float v);
// fma_peak_gflops' guard against a stalled vCPU: `first`, or the best of up to two calls of
// `again` while the best stays below 0.75 x cores x `one_thread` (cores = N threads, at most
// the CPUs).
double peak_despite_stalls(double first, double one_thread, int cores, const std::function<double()>& again);
}  // namespace detail

}  // namespace kiln::perf
