// The GEMM op boundary: argument validation (check_gemm), FLOP/byte accounting, the scalar
// activations every path shares, and the tensor-level matmul op (cpu::gemm or, on CUDA tensors,
// the CUDA side of kernels/ops).
#include "kiln/kernels/gemm.h"

#include <cmath>

#include "kiln/core/graph.h"
#include "kiln/core/trace.h"
#include "kiln/kernels/activation.h"
#include "kiln/kernels/ops.h"
#include "kiln/kernels/ops_backends.h"

namespace kiln {

std::string_view activation_name(Activation act) {
  switch (act) {
    case Activation::kNone: return "none";
    case Activation::kGeluTanh: return "gelu_tanh";
    case Activation::kSilu: return "silu";
    case Activation::kRelu: return "relu";
  }
  return "?";
}

float apply_activation(Activation act, float v) {
  switch (act) {
    case Activation::kNone: return v;
    case Activation::kGeluTanh: {
      // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      const float kS = 0.7978845608028654f;
      return 0.5f * v * (1.0f + std::tanh(kS * (v + 0.044715f * v * v * v)));
    }
    case Activation::kSilu: return v / (1.0f + std::exp(-v));
    case Activation::kRelu: return v > 0.0f ? v : 0.0f;
  }
  return v;
}

float activation_grad(Activation act, float x) {
  const float one = 1.0f;
  float g = 1.0f;
  switch (act) {
    case Activation::kNone:
      break;
    case Activation::kGeluTanh:
      ref::gelu_backward(&g, &one, &x, 1);
      break;
    case Activation::kSilu:
      ref::silu_backward(&g, &one, &x, 1);
      break;
    case Activation::kRelu:
      g = x > 0.0f ? 1.0f : 0.0f;
      break;
  }
  return g;
}

void add_bias_grad_rows(const GemmParams& p, int64_t r0, int64_t rows, int64_t pc, int64_t kc) {
  for (int64_t i = r0; i < r0 + rows; ++i) {
    for (int64_t l = pc; l < pc + kc; ++l) {
      const int64_t at = p.trans_a ? l * p.lda + i : i * p.lda + l;
      p.bias_grad[i] += p.a_dtype == DType::kBF16
                            ? bf16_to_f32(static_cast<const uint16_t*>(p.a)[at])
                            : static_cast<const float*>(p.a)[at];
    }
  }
}

Status check_gemm(const GemmParams& p) {
  const auto desc = [&] {
    return fmt::format("A{} ({}, {}) {}, B{} ({}, {}) {}", p.trans_a ? "^T" : "", p.m, p.k,
                       dtype_name(p.a_dtype), p.trans_b ? "^T" : "", p.k, p.n,
                       dtype_name(p.b_dtype));
  };
  if (p.m < 0 || p.n < 0 || p.k < 0)
    return invalid_argument("[gemm] negative size m={} n={} k={}", p.m, p.n, p.k);
  for (auto [dt, name] : {std::pair{p.a_dtype, "A"}, std::pair{p.b_dtype, "B"}}) {
    if (dt != DType::kF32 && dt != DType::kBF16)
      return invalid_argument("[gemm] {} has dtype {}; f32 or bf16 expected ({})", name,
                              dtype_name(dt), desc());
  }
  // Stored row lengths: A is (m, k) or (k, m); B is (k, n) or (n, k).
  const int64_t a_row = p.trans_a ? p.m : p.k, b_row = p.trans_b ? p.k : p.n;
  if (p.lda < std::max<int64_t>(1, a_row))
    return invalid_argument("[gemm] lda {} must be >= {} (the stored row length of {})", p.lda,
                            std::max<int64_t>(1, a_row), desc());
  if (p.ldb < std::max<int64_t>(1, b_row))
    return invalid_argument("[gemm] ldb {} must be >= {} (the stored row length of {})", p.ldb,
                            std::max<int64_t>(1, b_row), desc());
  if (p.ldc < std::max<int64_t>(1, p.n))
    return invalid_argument("[gemm] ldc {} must be >= n {} ({})", p.ldc, p.n, desc());
  if (p.m > 0 && p.n > 0 && p.c == nullptr) return invalid_argument("[gemm] C is null ({})", desc());
  if (p.m > 0 && p.n > 0 && p.k > 0 && (p.a == nullptr || p.b == nullptr))
    return invalid_argument("[gemm] A or B is null ({})", desc());
  if (p.bias_grad != nullptr && p.m > 0 && p.k > 0 && p.a == nullptr)
    return invalid_argument("[gemm] bias_grad sums A's rows, but A is null ({})", desc());
  if (p.residual != nullptr && p.ldr < std::max<int64_t>(1, p.n))
    return invalid_argument("[gemm] ldr {} must be >= n {} for the residual ({})", p.ldr, p.n,
                            desc());
  for (Activation a : {p.act, p.act_grad}) {
    if (static_cast<int>(a) < 0 || static_cast<int>(a) > static_cast<int>(Activation::kRelu))
      return invalid_argument("[gemm] unknown activation {}", static_cast<int>(a));
  }
  const bool grad = p.act_grad != Activation::kNone;
  if (p.save_pre != nullptr && p.act == Activation::kNone)
    return invalid_argument("[gemm] save_pre keeps an activation's input, but act is none ({})",
                            desc());
  if (grad && p.pre == nullptr)
    return invalid_argument("[gemm] act_grad {} needs pre, the activation's input ({})",
                            activation_name(p.act_grad), desc());
  if (!grad && p.pre != nullptr)
    return invalid_argument("[gemm] pre is set but act_grad is none ({})", desc());
  if (grad && (p.act != Activation::kNone || p.bias || p.residual || p.save_pre))
    return invalid_argument("[gemm] act_grad {} takes no bias, act, residual or save_pre ({})",
                            activation_name(p.act_grad), desc());
  if ((p.save_pre != nullptr || grad) && p.ldpre < std::max<int64_t>(1, p.n))
    return invalid_argument("[gemm] ldpre {} must be >= n {} ({})", p.ldpre, p.n, desc());
  return Status::ok_status();
}

double gemm_bytes(const GemmParams& p) {
  const double a = static_cast<double>(dtype_nbytes(p.a_dtype, p.m * p.k));
  const double b = static_cast<double>(dtype_nbytes(p.b_dtype, p.k * p.n));
  const double c = 4.0 * p.m * p.n * (p.beta != 0.0f ? 2 : 1);
  const double extra = (p.bias ? 4.0 * p.n : 0.0) + (p.residual ? 4.0 * p.m * p.n : 0.0) +
                       (p.save_pre ? 4.0 * p.m * p.n : 0.0) + (p.pre ? 4.0 * p.m * p.n : 0.0) +
                       (p.bias_grad ? 8.0 * p.m : 0.0);
  return a + b + c + extra;
}

std::array<graph::Access, kGemmIoCount> gemm_io(const GemmParams& p) {
  // A (rows, cols) stored with leading dim ld, in elements of `dt`.
  auto bytes = [](int64_t rows, int64_t cols, int64_t ld, DType dt) {
    return rows > 0 && cols > 0 ? dtype_nbytes(dt, (rows - 1) * ld + cols) : 0;
  };
  const int64_t a = p.trans_a ? bytes(p.k, p.m, p.lda, p.a_dtype) : bytes(p.m, p.k, p.lda, p.a_dtype);
  const int64_t b = p.trans_b ? bytes(p.n, p.k, p.ldb, p.b_dtype) : bytes(p.k, p.n, p.ldb, p.b_dtype);
  const int64_t c = bytes(p.m, p.n, p.ldc, DType::kF32);
  const int64_t pre = bytes(p.m, p.n, p.ldpre, DType::kF32);
  return {graph::writes_bytes(p.c, c),
          graph::reads_bytes(p.a, a),
          graph::reads_bytes(p.b, b),
          graph::reads(p.bias, p.n),
          graph::reads_bytes(p.residual, bytes(p.m, p.n, p.ldr, DType::kF32)),
          p.beta != 0.0f ? graph::reads_bytes(p.c, c) : graph::Access{},
          graph::writes_bytes(p.save_pre, pre),
          graph::reads_bytes(p.pre, pre),
          graph::writes(p.bias_grad, p.m),
          graph::reads(p.bias_grad, p.m)};
}

void describe_gemm(trace::Event& e, const GemmParams& p) {
  e.flops = gemm_flops(p.m, p.n, p.k);
  e.bytes = gemm_bytes(p);
  e.set_dims({p.m, p.n, p.k});
  e.dtype = p.a_dtype == DType::kBF16 || p.b_dtype == DType::kBF16 ? "bf16" : "f32";
}

Expected<Tensor> matmul(const Tensor& a, const Tensor& b, bool trans_b) {
  KILN_ASSIGN_OR_RETURN(Device device, ops::common_device("matmul", {{"a", &a}, {"b", &b}}));
  for (const Tensor* t : {&a, &b}) {
    if (t->dtype() != DType::kF32 && t->dtype() != DType::kBF16)
      return invalid_argument("[matmul] {} has dtype {}; f32 or bf16 expected",
                              t == &a ? "a" : "b", dtype_name(t->dtype()));
  }
  if (a.rank() < 2)
    return invalid_argument("[matmul] a {} must have at least 2 dims", a.shape().to_string());
  if (b.rank() != 2)
    return invalid_argument("[matmul] b {} must have 2 dims", b.shape().to_string());
  const int64_t k = a.dim(-1);
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0), n = trans_b ? b.dim(0) : b.dim(1);
  if (k != kb)
    return invalid_argument("[matmul] last dim of a {} must match {} dim of b {}{}",
                            a.shape().to_string(), trans_b ? "last" : "first",
                            b.shape().to_string(), trans_b ? " (trans_b)" : "");
  if (device == Device::kCuda && (!a.is_contiguous() || !b.is_contiguous()))
    return invalid_argument("[matmul] cuda inputs must be contiguous (a {}, b {})", a.to_string(),
                            b.to_string());
  const Tensor ac = a.contiguous();
  const Tensor bc = b.strides()[1] == 1 ? b : b.contiguous();
  Shape out_shape = a.shape();
  out_shape[a.rank() - 1] = n;
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(out_shape, DType::kF32, device));
  GemmParams p;
  p.m = a.numel() / std::max<int64_t>(k, 1);
  if (k == 0) p.m = out.numel() / std::max<int64_t>(n, 1);
  p.n = n;
  p.k = k;
  p.a = ac.raw_data();
  p.lda = std::max<int64_t>(k, 1);
  p.a_dtype = ac.dtype();
  p.b = bc.raw_data();
  p.ldb = std::max<int64_t>(bc.strides()[0], std::max<int64_t>(1, bc.dim(1)));
  p.b_dtype = bc.dtype();
  p.trans_b = trans_b;
  p.c = static_cast<float*>(out.raw_data());
  p.ldc = std::max<int64_t>(n, 1);
  KILN_RETURN_IF_ERROR(check_gemm(p));
  if (device == Device::kCuda) {
    KILN_RETURN_IF_ERROR(ops::cuda_backend::gemm(p));
  } else {
    cpu::gemm(p);
  }
  return out;
}

}  // namespace kiln
