// Fast LayerNorm and RMSNorm (norm.h): the SIMD row kernels of ops_impl.inc picked for this CPU,
// rows spread over threads; parameter gradients reduced per column range (deterministic).
#include "kiln/kernels/norm.h"

#include "kiln/core/status.h"
#include "kiln/kernels/cpu/ops_targets.h"
#include "kiln/kernels/cpu/parallel.h"

namespace kiln::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int64_t rows, int64_t cols,
                       float eps) {
  KILN_CHECK(rows >= 0 && cols > 0);
  const auto fn = KILN_OPS_DISPATCH(layernorm_forward_rows).pick();
  parallel_for(rows, grain_for(cols), [&](int64_t r0, int64_t r1) {
    fn(out, mean, rstd, inp, weight, bias, r0, r1, cols, eps);
  });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int64_t rows, int64_t cols) {
  KILN_CHECK(rows >= 0 && cols > 0);
  const auto params = KILN_OPS_DISPATCH(layernorm_backward_params_cols).pick();
  parallel_cols(rows, cols, [&](int64_t c0, int64_t c1) {
    params(dweight, dbias, dout, inp, mean, rstd, rows, cols, c0, c1);
  });
  const auto dx = KILN_OPS_DISPATCH(layernorm_backward_dinp_rows).pick();
  parallel_for(rows, grain_for(cols), [&](int64_t r0, int64_t r1) {
    dx(dinp, dout, inp, weight, mean, rstd, r0, r1, cols);
  });
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                     int64_t rows, int64_t cols, float eps) {
  KILN_CHECK(rows >= 0 && cols > 0);
  const auto fn = KILN_OPS_DISPATCH(rmsnorm_forward_rows).pick();
  parallel_for(rows, grain_for(cols), [&](int64_t r0, int64_t r1) {
    fn(out, rstd, inp, weight, r0, r1, cols, eps);
  });
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t rows, int64_t cols) {
  KILN_CHECK(rows >= 0 && cols > 0);
  const auto params = KILN_OPS_DISPATCH(rmsnorm_backward_dweight_cols).pick();
  parallel_cols(rows, cols, [&](int64_t c0, int64_t c1) {
    params(dweight, dout, inp, rstd, rows, cols, c0, c1);
  });
  const auto dx = KILN_OPS_DISPATCH(rmsnorm_backward_dinp_rows).pick();
  parallel_for(rows, grain_for(cols), [&](int64_t r0, int64_t r1) {
    dx(dinp, dout, inp, weight, rstd, r0, r1, cols);
  });
}

}  // namespace kiln::cpu
