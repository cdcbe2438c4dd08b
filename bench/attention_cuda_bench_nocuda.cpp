// `kiln bench attention --device cuda` in a build without the CUDA backend: a named error.
#include <cstdio>

#include "bench/attention_cuda_bench.h"

namespace kiln::bench {

int run_attention_cuda_bench(const AttentionCudaBenchOptions&) {
  std::fprintf(stderr,
               "kiln bench attention --device cuda: kiln was built without CUDA "
               "(-DKILN_CUDA=OFF or no nvcc found)\n");
  return 1;
}

}  // namespace kiln::bench
