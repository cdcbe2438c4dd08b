// Machine ceilings the GEMM benchmark reports against: FMA peak (f32 and bf16 dot products,
// register-only loops on 1..N threads) and DRAM read bandwidth (streaming over >> L3).
#pragma once

#include <cstdint>

namespace kiln::bench {

// Keeps a result alive so the loops are not optimized away.
void sink_value(float v);

// Each returns the FLOPs (or bytes) the loop performed.
double fma_loop_avx512(int64_t iters);
double bf16_dot_loop_avx512(int64_t iters);
double read_loop_avx512(const float* p, int64_t n);

struct Ceilings {
  double f32_gflops = 0, bf16_gflops = 0;  // FMA peak, all threads of the run
  double dram_gbs = 0;                     // streaming read bandwidth
};

// Measured on `threads` std::threads at once (each thread its own loop / slice of the buffer).
double measure_fma_peak_gflops(int threads, bool bf16);
double measure_read_bandwidth_gbs(int threads, const float* buffer, int64_t n);

}  // namespace kiln::bench
