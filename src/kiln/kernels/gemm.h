// GEMM, the contract every backend implements: row-major C = act(alpha·op(A)·op(B) + beta·C +
// bias) + residual, f32 or bf16 inputs, f32 accumulate and output. check_gemm() validates at
// the op boundary; ref::gemm is the ground truth; cpu::gemm is the fast packed path.
#pragma once

#include <array>
#include <cstdint>

#include "kiln/core/dtype.h"
#include "kiln/core/status.h"
#include "kiln/core/tensor.h"

namespace kiln {
namespace trace {
struct Event;
}
namespace graph {
struct Access;
}

enum class Activation { kNone, kGeluTanh, kSilu, kRelu };
std::string_view activation_name(Activation act);

struct GemmParams {
  int64_t m = 0, n = 0, k = 0;
  // A: (m, k), or (k, m) stored when trans_a. Elements are f32 or bf16 (a_dtype).
  const void* a = nullptr;
  int64_t lda = 0;
  DType a_dtype = DType::kF32;
  bool trans_a = false;
  // B: (k, n), or (n, k) stored when trans_b (PyTorch weights (out, in): y = x W^T).
  const void* b = nullptr;
  int64_t ldb = 0;
  DType b_dtype = DType::kF32;
  bool trans_b = false;
  float* c = nullptr;  // (m, n), always f32
  int64_t ldc = 0;
  float alpha = 1.0f, beta = 0.0f;  // beta = 0 never reads C; beta = 1 accumulates
  const float* bias = nullptr;      // (n,) added before the activation
  Activation act = Activation::kNone;
  const float* residual = nullptr;  // (m, n) with leading dim ldr, added after the activation
  int64_t ldr = 0;
};

// Op-level validation: names the op, the shapes, leading dims and dtypes that are wrong.
Status check_gemm(const GemmParams& p);

// Work and traffic of one call (STYLE rule 10): 2mnk FLOPs; bytes = each operand read once
// plus C written (and read when beta != 0), bias and residual read.
inline double gemm_flops(int64_t m, int64_t n, int64_t k) { return 2.0 * m * n * k; }
double gemm_bytes(const GemmParams& p);
// The profiler's arguments of one call (core/trace.h): FLOPs, bytes, (m, n, k), dtype.
void describe_gemm(trace::Event& e, const GemmParams& p);

// The buffers of one call for graph capture (core/graph.h), in this order: C written, A, B,
// bias, residual, and C read when beta != 0 (a null or empty operand is an empty access).
std::array<graph::Access, 6> gemm_io(const GemmParams& p);

// The scalar epilogue, shared by the reference and edge paths: v is alpha·acc + beta·C.
float apply_activation(Activation act, float v);

namespace ref {
// Plain triple loop, fp32 accumulate in k order; the ground truth for every fast path.
void gemm(const GemmParams& p);
}  // namespace ref

namespace cpu {
// Fast packed GEMM: BLIS-style blocking, SIMD micro-kernels picked at run time, fused
// epilogue, the kiln thread pool. Assumes valid params (KILN_CHECK only).
void gemm(const GemmParams& p);
}  // namespace cpu

// Tensor-level op: (.., m, k) x (k, n) -> (.., m, n), or x (n, k)^T when trans_b; a is 2-D or
// more (leading dims folded into m, a must be contiguous in its last dim), b is 2-D.
// f32 or bf16 inputs, f32 output, on the inputs' device (kernels/ops.h: cpu::gemm on the host,
// cuda::gemm on a CUDA device, where both inputs must be contiguous).
Expected<Tensor> matmul(const Tensor& a, const Tensor& b, bool trans_b = false);

}  // namespace kiln
