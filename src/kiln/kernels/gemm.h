// GEMM, the contract every backend implements: row-major C = act(alpha·op(A)·op(B) + beta·C +
// bias) + residual, f32 or bf16 inputs, f32 accumulate and output; for training, the activation's
// input can be kept (save_pre) and the backward's multiply by act' fused (act_grad). check_gemm()
// validates at the op boundary; ref::gemm is the ground truth; cpu::gemm is the fast packed path.
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
  // Training's activation pair, as cuBLASLt's GELU_AUX and DGELU epilogues (both (m, n) with
  // leading dim ldpre; at most one of them per call):
  //  * save_pre, with act set: also receives the activation's input, alpha·op(A)·op(B) + beta·C +
  //    bias, which the backward needs (the forward of a Linear followed by its activation);
  //  * act_grad, with pre: C = (alpha·op(A)·op(B) + beta·C) ⊙ act_grad'(pre), the gradient through
  //    the activation that turned pre into this GEMM's input (no bias, act or residual then).
  float* save_pre = nullptr;
  Activation act_grad = Activation::kNone;
  const float* pre = nullptr;
  int64_t ldpre = 0;
  // The bias gradient of a weight-gradient GEMM, as cuBLASLt's BGRADA epilogue: bias_grad (m,)
  // += the sum over k of op(A)'s row i, added in k order (bitwise the column sums of dY that a
  // separate pass makes). For dW (out, in) = dYᵀ X, A = dY stored (tokens, out) with trans_a, and
  // the sum is over the tokens. Independent of B, C and the epilogue (also made when n is 0).
  float* bias_grad = nullptr;
};

// Op-level validation: names the op, the shapes, leading dims and dtypes that are wrong.
Status check_gemm(const GemmParams& p);

// Work and traffic of one call (STYLE rule 10): 2mnk FLOPs; bytes = each operand read once
// plus C written (and read when beta != 0), bias, residual and pre read, save_pre written,
// bias_grad read and written.
inline double gemm_flops(int64_t m, int64_t n, int64_t k) { return 2.0 * m * n * k; }
double gemm_bytes(const GemmParams& p);
// The profiler's arguments of one call (core/trace.h): FLOPs, bytes, (m, n, k), dtype.
void describe_gemm(trace::Event& e, const GemmParams& p);

// The buffers of one call for graph capture (core/graph.h), in this order: C written, A, B,
// bias, residual, C read when beta != 0, save_pre written, pre read, bias_grad written and read
// (a null or empty operand is an empty access).
inline constexpr int kGemmIoCount = 10;
std::array<graph::Access, kGemmIoCount> gemm_io(const GemmParams& p);

// The scalar epilogue, shared by the reference and edge paths: v is alpha·acc + beta·C.
float apply_activation(Activation act, float v);
// act'(x), what act_grad multiplies by: ref::gelu_backward's and ref::silu_backward's (in double).
float activation_grad(Activation act, float x);
// The bias-gradient epilogue element by element: bias_grad[i] += op(A)(i, l) for rows i in
// [r0, r0 + rows) and l in [pc, pc + kc), in k order. ref::gemm runs it whole; the fast paths run
// it for the layouts they have no vector loop for.
void add_bias_grad_rows(const GemmParams& p, int64_t r0, int64_t rows, int64_t pc, int64_t kc);

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
