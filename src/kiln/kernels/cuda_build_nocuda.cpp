// What a build without the CUDA backend says about it (cuda_catalog.h); a CUDA build generates
// these three from its ptxas log instead (cmake/kiln_embed_ptxas_log.cmake).
#include "kiln/kernels/cuda_catalog.h"

namespace kiln::cuda {

bool built() {
  return false;
}
std::string_view archs() {
  return {};
}
std::string_view ptxas_log() {
  return {};
}

}  // namespace kiln::cuda
