// The empty kernel: one warp that returns at once. Timing it alone measures a launch's fixed cost
// (the host's submit time and the GPU's launch-to-launch gap), the floor under every small kernel
// and what a CUDA graph's replay removes (kiln bench launch, bench/launch_bench.h).
#include "kiln/kernels/cuda/common.cuh"

namespace kiln::cuda {

__global__ void empty_kernel() {}

cudaError_t launch_empty_kernel() {
  const LaunchConfig c = empty_kernel_launch();
  empty_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>();
  return cudaGetLastError();
}

}  // namespace kiln::cuda
