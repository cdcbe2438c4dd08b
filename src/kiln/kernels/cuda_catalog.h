// What the CUDA backend built and how it launches each kernel, readable on any machine (no GPU,
// no CUDA runtime needed): the ptxas resource-usage log captured at build time and the host-side
// launch configuration (grid, block, dynamic shared memory) of every CUDA kernel for a problem
// shape. `kiln info --cuda` feeds both to the GPU execution model (perf/gpu_model.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::cuda {

// A representative problem: each kernel family reads the fields it needs.
struct ProblemShape {
  int64_t m = 4096, n = 4096, k = 4096;                                      // GEMM (m, k) x (k, n)
  int64_t batch = 1, heads = 32, kv_heads = 8, seq = 4096, head_dim = 128;   // attention
  int64_t rows = 4096, cols = 4096;                                          // row-wise ops (norms, softmax, ...)
};

// One kernel launch as the host code would issue it for a ProblemShape.
struct KernelLaunch {
  // The __global__ function as perf::ptxas_kernel_name() writes a ptxas/cuobjdump entry's mangled
  // name: demangled, without return type and parameters, e.g. "kiln::cuda::gemm_naive" or
  // "kiln::cuda::gemm_tiled<128, 128, 32>" (template arguments: integers only).
  std::string kernel;
  std::string family;             // "gemm", "attention", "norm", ...
  std::string variant;            // e.g. "tiled 128x128x32, mma.sync bf16"
  int64_t grid_blocks = 0;        // total blocks of the grid
  int threads_per_block = 0;
  int64_t dynamic_smem_bytes = 0;
};

// True when this binary was built with the CUDA backend (KILN_CUDA).
bool built();
// The archs the CUDA backend was compiled for, e.g. "sm_80;sm_90" (empty when not built).
std::string_view archs();
// The raw `ptxas -v` (--resource-usage) output of the CUDA build (empty when not built).
std::string_view ptxas_log();
// Every CUDA kernel's launch for `shape` (host logic only: available even when not built).
std::vector<KernelLaunch> kernel_launches(const ProblemShape& shape);

}  // namespace kiln::cuda
