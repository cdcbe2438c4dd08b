// `kiln bench gemm --device cuda`: the CUDA GEMM ladder (kernels/cuda/launch.h's GemmKernel,
// naive -> ... -> mma.sync + cp.async) beside cuBLAS on square bf16 and f32 problems, C (m, n) =
// A (m, k) · B^T with B stored (n, k) like a weight. Each rung is checked against cuBLAS's
// result (normalized MSE) before it is timed; GFLOP/s and the ratio to cuBLAS are printed.
// A build or machine without CUDA says so and returns 1.
#pragma once

#include <string>
#include <vector>

namespace kiln::bench {

struct GemmCudaBenchOptions {
  std::vector<int> sizes = {1024, 2048, 4096, 8192};  // m = n = k
  std::string dtype = "all";                          // f32 | bf16 | all
  int reps = 5;                                       // timed runs after one warm-up; median
  double max_seconds_per_rung = 2.0;  // fewer reps for a slow rung (the naive ones at 8192)
  bool json = false;                  // one JSON object per line instead of the table
};

int run_gemm_cuda_bench(const GemmCudaBenchOptions& opt);

}  // namespace kiln::bench
