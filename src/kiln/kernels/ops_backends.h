// Internal to kernels/ops.cpp: the CUDA side of the tensor-level ops, on checked device pointers.
// ops_cuda.cpp implements it with kernels/cuda (CUDA builds); ops_nocuda.cpp answers with a named
// error (a build without CUDA has no CUDA tensors to reach it with).
#pragma once

#include <cstdint>

#include "kiln/core/status.h"

namespace kiln {
struct GemmParams;
}

namespace kiln::ops::cuda_backend {

Status gemm(const GemmParams& p);  // kernels/cuda's automatic rung

Status rmsnorm(float* out, float* rstd, const float* x, const float* w, int64_t rows, int64_t cols,
               float eps);
Status layernorm(float* out, float* mean, float* rstd, const float* x, const float* w,
                 const float* b, int64_t rows, int64_t cols, float eps);
Status softmax(float* out, const float* x, int64_t rows, int64_t cols);
Status gelu(float* out, const float* x, int64_t n);
Status silu(float* out, const float* x, int64_t n);
Status swiglu(float* out, const float* gate, const float* up, int64_t n);

}  // namespace kiln::ops::cuda_backend
