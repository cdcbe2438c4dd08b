// Tensor-level ops that pick their backend from their tensors' device (MLX's eval_cpu / eval_gpu
// split): kernels/cpu for host tensors, kernels/cuda for CUDA tensors, so a caller holding
// tensors never names a backend and never #ifdefs. Every input must live on one device
// (InvalidArgument naming each input's device otherwise) and the result is allocated there.
// Inputs are f32 and contiguous, rows = the product of the leading dims, cols = the last dim. A
// device without a kernel for an op is Unimplemented, naming the op and the device. On CUDA the
// kernels are queued on this thread's current stream (core/device.h's StreamScope); the result's
// to(Device::kHost) copies in that stream's order.
// matmul (gemm.h) dispatches the same way.
#pragma once

#include "kiln/core/status.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/norm.h"

namespace kiln::ops {

// x (.., C) normalized over C, times weight (C,).
Expected<Tensor> rmsnorm(const Tensor& x, const Tensor& weight, float eps = kRmsNormEps);
// x (.., C) standardized over C, times weight (C,) plus bias (C,).
Expected<Tensor> layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                           float eps = kLayerNormEps);
// Softmax over the last dim.
Expected<Tensor> softmax(const Tensor& x);
// Elementwise: GELU (tanh approximation), SiLU, and SwiGLU silu(gate) * up (same shapes).
Expected<Tensor> gelu(const Tensor& x);
Expected<Tensor> silu(const Tensor& x);
Expected<Tensor> swiglu(const Tensor& gate, const Tensor& up);

// The device all of `inputs` live on, or InvalidArgument naming each input's device ("[op] x on
// cuda, weight on host: ..."); undefined inputs are InvalidArgument too.
struct Input {
  const char* name;
  const Tensor* tensor;
};
Expected<Device> common_device(const char* op, std::initializer_list<Input> inputs);

}  // namespace kiln::ops
