// The list behind `kiln info`: one line per kernel family, asking each for its picked path.
#include "kiln/kernels/registry.h"

#include "kiln/core/cpu_features.h"

namespace kiln {

std::vector<KernelPath> kernel_paths() {
  std::vector<KernelPath> out;
  out.push_back({"active SIMD target", std::string(simd_target_name(active_simd_target()))});
  return out;
}

}  // namespace kiln
