// Scalar references of the quantized GEMMs (quant_gemm.h): every weight element decoded
// exactly, weight-only products summed in double, W8A8 sums exact in int32. The ground truth
// the fast paths are compared with.
#include <cmath>

#include "kiln/kernels/quant_gemm.h"

namespace kiln::ref {

void quant_gemm(const QuantGemmParams& p) {
  const QuantWeight& w = *p.w;
  for (int64_t i = 0; i < p.n; ++i) {
    const float* x = p.x + i * p.ldx;  // (in,)
    for (int64_t j = 0; j < w.out; ++j) {
      double acc = 0.0;
      for (int64_t k = 0; k < w.in; ++k) acc += static_cast<double>(x[k]) * quant_weight_element(w, j, k);
      float v = static_cast<float>(acc);
      if (p.bias) v += p.bias[j];
      if (p.residual) v += p.residual[i * p.ldr + j];
      p.y[i * p.ldy + j] = v;
    }
  }
}

void w8a8_gemm(const W8A8Params& p) {
  const QuantWeight& w = *p.w;
  const auto* wq = reinterpret_cast<const int8_t*>(w.data);
  for (int64_t i = 0; i < p.n; ++i) {
    const int8_t* a = p.a + i * p.lda;  // (in,)
    for (int64_t j = 0; j < w.out; ++j) {
      int32_t acc = 0;
      for (int64_t k = 0; k < w.in; ++k) acc += static_cast<int32_t>(a[k]) * wq[j * w.in + k];
      const float sw = w.per_tensor_scale ? w.scales[0] : w.scales[j];
      float v = (p.a_scales[i] * sw) * static_cast<float>(acc);
      if (p.bias) v += p.bias[j];
      if (p.residual) v += p.residual[i * p.ldr + j];
      p.y[i * p.ldy + j] = v;
    }
  }
}

void quantize_rows_int8(const float* x, int64_t n, int64_t in, int64_t ldx, int8_t* q, int64_t ldq,
                        float* scales) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * ldx;
    float amax = 0.0f;
    for (int64_t k = 0; k < in; ++k) amax = std::fmax(amax, std::fabs(xr[k]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scales[i] = amax / 127.0f;
    for (int64_t k = 0; k < in; ++k) {
      float r = std::nearbyint(xr[k] * inv);  // ties to even in the default rounding mode
      r = std::fmin(127.0f, std::fmax(-127.0f, r));
      q[i * ldq + k] = static_cast<int8_t>(r);
    }
  }
}

}  // namespace kiln::ref
