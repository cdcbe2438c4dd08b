// Which SIMD path each kernel family runs on this machine, for `kiln info` and the profiler.
#pragma once

#include <string>
#include <vector>

namespace kiln {

struct KernelPath {
  std::string family;  // e.g. "gemm f32"
  std::string path;    // e.g. "avx512 14x32 micro-kernel"
};

std::vector<KernelPath> kernel_paths();

}  // namespace kiln
