// Reference GEMM: the plain scalar triple loop every fast path is checked against. fp32
// accumulation in k order (no doubles, so its error is that of a plain fp32 implementation).
#include "kiln/kernels/gemm.h"

namespace kiln::ref {
namespace {

float load(const void* base, DType dt, int64_t i) {
  return dt == DType::kBF16 ? bf16_to_f32(static_cast<const uint16_t*>(base)[i])
                            : static_cast<const float*>(base)[i];
}

}  // namespace

void gemm(const GemmParams& p) {
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      float acc = 0.0f;
      for (int64_t l = 0; l < p.k; ++l) {
        const float av = load(p.a, p.a_dtype, p.trans_a ? l * p.lda + i : i * p.lda + l);
        const float bv = load(p.b, p.b_dtype, p.trans_b ? j * p.ldb + l : l * p.ldb + j);
        acc += av * bv;
      }
      float* c = p.c + i * p.ldc + j;
      float v = p.alpha * acc;
      if (p.beta != 0.0f) v += p.beta * *c;  // beta = 0 never reads C (it may hold NaN)
      if (p.bias) v += p.bias[j];
      if (p.save_pre) p.save_pre[i * p.ldpre + j] = v;
      if (p.act_grad != Activation::kNone) v *= activation_grad(p.act_grad, p.pre[i * p.ldpre + j]);
      v = apply_activation(p.act, v);
      if (p.residual) v += p.residual[i * p.ldr + j];
      *c = v;
    }
  }
  if (p.bias_grad) add_bias_grad_rows(p, 0, p.m, 0, p.k);
}

}  // namespace kiln::ref
