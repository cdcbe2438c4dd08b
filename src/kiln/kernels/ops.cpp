// The tensor-level ops (ops.h): shape, dtype and device checks once, then the host kernels or the
// CUDA side (ops_backends.h) on the inputs' device.
#include "kiln/kernels/ops.h"

#include <string>

#include "kiln/kernels/activation.h"
#include "kiln/kernels/ops_backends.h"
#include "kiln/kernels/softmax.h"

namespace kiln::ops {

Expected<Device> common_device(const char* op, std::initializer_list<Input> inputs) {
  bool mixed = false;
  std::string where;
  const Device first = inputs.size() > 0 ? inputs.begin()->tensor->device() : Device::kHost;
  for (const Input& in : inputs) {
    if (!in.tensor->defined()) return invalid_argument("[{}] {} is undefined", op, in.name);
    mixed |= in.tensor->device() != first;
    where += fmt::format("{}{} on {}", where.empty() ? "" : ", ", in.name, device_name(in.tensor->device()));
  }
  if (mixed)
    return invalid_argument("[{}] inputs on different devices ({}): move them with to(Device) first", op, where);
  return first;
}

namespace {

Status f32_contiguous(const char* op, const char* name, const Tensor& t) {
  if (t.dtype() != DType::kF32)
    return invalid_argument("[{}] {} has dtype {}; f32 expected", op, name, dtype_name(t.dtype()));
  if (!t.is_contiguous()) return invalid_argument("[{}] {} {} is not contiguous", op, name, t.to_string());
  return {};
}

// x (.., C) as rows x cols, with the checks every row op makes.
struct Rows {
  int64_t rows = 0, cols = 0;
};
Expected<Rows> rows_of(const char* op, const Tensor& x) {
  KILN_RETURN_IF_ERROR(f32_contiguous(op, "x", x));
  if (x.rank() < 1) return invalid_argument("[{}] x {} needs at least 1 dim", op, x.shape().to_string());
  const int64_t cols = x.dim(-1);
  return Rows{cols > 0 ? x.numel() / cols : 0, cols};
}

Status vector_of(const char* op, const char* name, const Tensor& v, int64_t cols) {
  KILN_RETURN_IF_ERROR(f32_contiguous(op, name, v));
  if (v.rank() != 1 || v.dim(0) != cols)
    return invalid_argument("[{}] {} {} must be ({},), the last dim of x", op, name, v.shape().to_string(), cols);
  return {};
}

float* f32(const Tensor& t) {
  return static_cast<float*>(t.raw_data());
}

// An elementwise op of one input: the host kernel or the CUDA side.
template <class Host, class Cuda>
Expected<Tensor> elementwise(const char* op, const Tensor& x, Host host, Cuda cuda) {
  KILN_ASSIGN_OR_RETURN(Device d, common_device(op, {{"x", &x}}));
  KILN_RETURN_IF_ERROR(f32_contiguous(op, "x", x));
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(x.shape(), DType::kF32, d));
  if (d == Device::kHost) {
    host(f32(out), f32(x), x.numel());
  } else {
    KILN_RETURN_IF_ERROR(cuda(f32(out), f32(x), x.numel()));
  }
  return out;
}

}  // namespace

Expected<Tensor> rmsnorm(const Tensor& x, const Tensor& weight, float eps) {
  KILN_ASSIGN_OR_RETURN(Device d, common_device("rmsnorm", {{"x", &x}, {"weight", &weight}}));
  KILN_ASSIGN_OR_RETURN(Rows r, rows_of("rmsnorm", x));
  KILN_RETURN_IF_ERROR(vector_of("rmsnorm", "weight", weight, r.cols));
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(x.shape(), DType::kF32, d));
  KILN_ASSIGN_OR_RETURN(Tensor rstd, Tensor::empty({r.rows}, DType::kF32, d));
  if (d == Device::kHost) {
    cpu::rmsnorm_forward(f32(out), f32(rstd), f32(x), f32(weight), r.rows, r.cols, eps);
  } else {
    KILN_RETURN_IF_ERROR(cuda_backend::rmsnorm(f32(out), f32(rstd), f32(x), f32(weight), r.rows, r.cols, eps));
  }
  return out;
}

Expected<Tensor> layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  KILN_ASSIGN_OR_RETURN(Device d,
                        common_device("layernorm", {{"x", &x}, {"weight", &weight}, {"bias", &bias}}));
  KILN_ASSIGN_OR_RETURN(Rows r, rows_of("layernorm", x));
  KILN_RETURN_IF_ERROR(vector_of("layernorm", "weight", weight, r.cols));
  KILN_RETURN_IF_ERROR(vector_of("layernorm", "bias", bias, r.cols));
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(x.shape(), DType::kF32, d));
  KILN_ASSIGN_OR_RETURN(Tensor stats, Tensor::empty({2, r.rows}, DType::kF32, d));
  float* mean = f32(stats);
  float* rstd = mean + r.rows;
  if (d == Device::kHost) {
    cpu::layernorm_forward(f32(out), mean, rstd, f32(x), f32(weight), f32(bias), r.rows, r.cols, eps);
  } else {
    KILN_RETURN_IF_ERROR(
        cuda_backend::layernorm(f32(out), mean, rstd, f32(x), f32(weight), f32(bias), r.rows, r.cols, eps));
  }
  return out;
}

Expected<Tensor> softmax(const Tensor& x) {
  KILN_ASSIGN_OR_RETURN(Device d, common_device("softmax", {{"x", &x}}));
  KILN_ASSIGN_OR_RETURN(Rows r, rows_of("softmax", x));
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(x.shape(), DType::kF32, d));
  if (d == Device::kHost) {
    cpu::softmax_forward(f32(out), f32(x), r.rows, r.cols);
  } else {
    KILN_RETURN_IF_ERROR(cuda_backend::softmax(f32(out), f32(x), r.rows, r.cols));
  }
  return out;
}

Expected<Tensor> gelu(const Tensor& x) {
  return elementwise("gelu", x, cpu::gelu_forward, cuda_backend::gelu);
}

Expected<Tensor> silu(const Tensor& x) {
  return elementwise("silu", x, cpu::silu_forward, cuda_backend::silu);
}

Expected<Tensor> swiglu(const Tensor& gate, const Tensor& up) {
  KILN_ASSIGN_OR_RETURN(Device d, common_device("swiglu", {{"gate", &gate}, {"up", &up}}));
  KILN_RETURN_IF_ERROR(f32_contiguous("swiglu", "gate", gate));
  KILN_RETURN_IF_ERROR(f32_contiguous("swiglu", "up", up));
  if (!(gate.shape() == up.shape()))
    return invalid_argument("[swiglu] gate {} and up {} must have one shape", gate.shape().to_string(),
                            up.shape().to_string());
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(gate.shape(), DType::kF32, d));
  if (d == Device::kHost) {
    cpu::swiglu_forward(f32(out), f32(gate), f32(up), gate.numel());
  } else {
    KILN_RETURN_IF_ERROR(cuda_backend::swiglu(f32(out), f32(gate), f32(up), gate.numel()));
  }
  return out;
}

}  // namespace kiln::ops
