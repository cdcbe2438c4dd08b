// `kiln bench launch --device cuda` in a build without the CUDA backend (launch_bench.h).
#include "bench/launch_bench.h"

namespace kiln::bench {

Expected<std::vector<LaunchRow>> run_launch_bench_cuda(const LaunchBenchOptions&) {
  return failed_precondition(
      "the GPU rows need a CUDA build: kiln was built without CUDA (-DKILN_CUDA=OFF or no nvcc "
      "found)");
}

}  // namespace kiln::bench
