// The tensor-level ops' CUDA side in a build without CUDA (ops_backends.h): no CUDA tensor can
// exist here, so reaching one of these is answered with the build's reason.
#include "kiln/kernels/ops_backends.h"

namespace kiln::ops::cuda_backend {
namespace {
Status not_built(const char* op) {
  return failed_precondition("[{}] on cuda: kiln was built without CUDA (-DKILN_CUDA=OFF or no nvcc found)",
                             op);
}
}  // namespace

Status gemm(const GemmParams&) {
  return not_built("matmul");
}
Status rmsnorm(float*, float*, const float*, const float*, int64_t, int64_t, float) {
  return not_built("rmsnorm");
}
Status layernorm(float*, float*, float*, const float*, const float*, const float*, int64_t, int64_t,
                 float) {
  return not_built("layernorm");
}
Status softmax(float*, const float*, int64_t, int64_t) {
  return not_built("softmax");
}
Status gelu(float*, const float*, int64_t) {
  return not_built("gelu");
}
Status silu(float*, const float*, int64_t) {
  return not_built("silu");
}
Status swiglu(float*, const float*, const float*, int64_t) {
  return not_built("swiglu");
}

}  // namespace kiln::ops::cuda_backend
