// The tensor-level ops' CUDA side (ops_backends.h): the checked kernels of kernels/cuda.
#include "kiln/kernels/cuda/kernels.h"
#include "kiln/kernels/ops_backends.h"

namespace kiln::ops::cuda_backend {

Status gemm(const GemmParams& p) {
  return cuda::gemm(p);
}

Status rmsnorm(float* out, float* rstd, const float* x, const float* w, int64_t rows, int64_t cols,
               float eps) {
  return cuda::rmsnorm_forward(out, rstd, x, w, rows, cols, eps);
}
Status layernorm(float* out, float* mean, float* rstd, const float* x, const float* w,
                 const float* b, int64_t rows, int64_t cols, float eps) {
  return cuda::layernorm_forward(out, mean, rstd, x, w, b, rows, cols, eps);
}
Status softmax(float* out, const float* x, int64_t rows, int64_t cols) {
  return cuda::softmax_forward(out, x, rows, cols);
}
Status gelu(float* out, const float* x, int64_t n) {
  return cuda::gelu_forward(out, x, n);
}
Status silu(float* out, const float* x, int64_t n) {
  return cuda::silu_forward(out, x, n);
}
Status swiglu(float* out, const float* gate, const float* up, int64_t n) {
  return cuda::swiglu_forward(out, gate, up, n);
}

}  // namespace kiln::ops::cuda_backend
