// Scalar references of the block-quantized GEMM (block_quant_gemm.h): per-block activation
// quantization, exact int32 block dots read through the packed layout's accessors, block
// scales as the f32 product dw · da, the sum over blocks in double.
#include <cmath>
#include <cstdlib>
#include <vector>

#include "kiln/kernels/block_quant_gemm.h"

namespace kiln::ref {

void quantize_blocks_int8(const float* x, int64_t n, int64_t in, int64_t ldx, int8_t* q, int64_t ldq, float* scales,
                          int32_t* sums) {
  const int64_t nb = in / kQuantBlock;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + i * ldx + b * kQuantBlock;
      int8_t* qb = q + i * ldq + b * kQuantBlock;
      float amax = 0.0f;
      for (int64_t k = 0; k < kQuantBlock; ++k) amax = std::max(amax, std::fabs(xb[k]));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      int32_t s = 0;
      for (int64_t k = 0; k < kQuantBlock; ++k) {
        // nearbyint under the default rounding mode: half to even, as cvtps2dq.
        const int v = static_cast<int>(std::nearbyint(xb[k] * inv));
        qb[k] = static_cast<int8_t>(v);
        s += v;
      }
      scales[i * nb + b] = amax / 127.0f;
      sums[i * nb + b] = s;
    }
  }
}

void block_quant_gemm(const BlockQuantGemmParams& p) {
  const BlockQuantWeight& w = *p.w;
  const int64_t nb = w.blocks();
  std::vector<int8_t> q(static_cast<size_t>(p.n * w.in));
  std::vector<float> da(static_cast<size_t>(p.n * nb));
  std::vector<int32_t> sums(da.size());
  quantize_blocks_int8(p.x, p.n, w.in, p.ldx, q.data(), w.in, da.data(), sums.data());
  for (int64_t i = 0; i < p.n; ++i) {
    for (int64_t j = 0; j < w.out; ++j) {
      double acc = 0.0;
      for (int64_t b = 0; b < nb; ++b) {
        int32_t dot = 0;
        for (int64_t kk = 0; kk < kQuantBlock; ++kk) {
          const int64_t k = b * kQuantBlock + kk;
          dot += static_cast<int32_t>(q[i * w.in + k]) * block_quant_code(w, j, k);
        }
        const float s = block_quant_scale(w, j, b) * da[i * nb + b];
        acc += static_cast<double>(s) * dot;
      }
      float v = static_cast<float>(acc);
      if (p.bias) v += p.bias[j];
      if (p.residual) v += p.residual[i * p.ldr + j];
      p.y[i * p.ldy + j] = v;
    }
  }
}

}  // namespace kiln::ref
