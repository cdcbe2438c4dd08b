// `kiln bench gemm --device cuda` in a build without the CUDA backend: a named error.
#include <cstdio>

#include "bench/gemm_cuda_bench.h"

namespace kiln::bench {

int run_gemm_cuda_bench(const GemmCudaBenchOptions&) {
  std::fprintf(stderr,
               "kiln bench gemm --device cuda: kiln was built without CUDA "
               "(-DKILN_CUDA=OFF or no nvcc found)\n");
  return 1;
}

}  // namespace kiln::bench
