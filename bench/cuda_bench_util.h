// What the CUDA benchmarks (*_cuda.cpp in bench/) share: a kernel's time by CUDA events, a
// device tensor's values on the host, and the normalized error of a device result against a
// reference. Included only by CUDA-built files.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/tensor.h"

namespace kiln::bench {

// Milliseconds of one fn() on the default stream, by CUDA events around it.
template <class F>
float cuda_event_ms(F&& fn) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  fn();
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

// A device tensor's values as f32 on the host, after the device's queued work.
inline std::vector<float> host_floats(const Tensor& t) {
  cudaDeviceSynchronize();
  return t.to(Device::kHost).value().to_floats();
}

// Σ(actual − expected)² / Σ expected²; +inf when the result holds a non-finite value.
inline double nmse(const std::vector<float>& expected, const std::vector<float>& actual) {
  double num = 0, den = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double d = static_cast<double>(actual[i]) - expected[i];
    num += d * d;
    den += static_cast<double>(expected[i]) * expected[i];
  }
  return std::isfinite(num) ? num / std::max(den, 1e-300) : INFINITY;
}

}  // namespace kiln::bench
