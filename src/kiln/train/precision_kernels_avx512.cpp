// AVX-512 versions of the mixed-precision rounding kernels; bitwise the scalar ones (NaN
// payloads aside). bf16 rounding is done with integer ops (AVX-512F only, no AVX512_BF16
// needed); f16 with vcvtps2ph/vcvtph2ps; fp8 with the bit-level RNE described in qdq_fp8.
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "kiln/core/dtype.h"
#include "kiln/core/fp8.h"
#include "kiln/train/precision_kernels.h"

namespace kiln::precision_detail::avx512 {
namespace {

void to_bf16(uint16_t* dst, const float* src, int64_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), qnan = _mm512_set1_epi32(0x40);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(src + i));
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, lsb)), 16);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), qnan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(r));
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

int64_t round_f16(float* dst, const float* src, int64_t n) {
  int64_t flushed = 0;
  const __m512 zero = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(src + i);
    const __m512 r = _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __mmask16 lost = _mm512_cmp_ps_mask(x, zero, _CMP_NEQ_UQ) & _mm512_cmp_ps_mask(r, zero, _CMP_EQ_OQ);
    flushed += __builtin_popcount(lost);
    _mm512_storeu_ps(dst + i, r);
  }
  for (; i < n; ++i) {
    const float r = f16_to_f32(f32_to_f16(src[i]));
    flushed += (src[i] != 0.0f && r == 0.0f) ? 1 : 0;
    dst[i] = r;
  }
  return flushed;
}

float amax(const float* x, int64_t n) {
  __m512 m = _mm512_setzero_ps();
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_abs_ps(_mm512_loadu_ps(x + i));
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, v);
  }
  float r = _mm512_reduce_max_ps(m);
  for (; i < n; ++i) {
    if (std::isnan(x[i])) return x[i];
    r = std::fmax(r, std::fabs(x[i]));
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : r;
}

// Round |s| to the format, saturating. Normal results: add half an ulp of the format (minus one,
// plus the kept lowest bit: ties to even) to the f32 bits and clear the dropped bits; carries
// into the exponent are the right next binade. Subnormal results: |s| + C - C with C =
// step · 2^23 rounds to the subnormal grid `step` in the FPU's round-to-nearest-even. Then clamp
// to the largest finite pattern (which also maps ±inf there).
template <int kExpBits, int kManBits, class Layout>
void qdq_layout(float* dst, const float* src, int64_t n, float scale) {
  constexpr int kBias = (1 << (kExpBits - 1)) - 1, kMinExp = 1 - kBias, kDrop = 23 - kManBits;
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i half_m1 = _mm512_set1_epi32((1 << (kDrop - 1)) - 1), one = _mm512_set1_epi32(1);
  const __m512i keep = _mm512_set1_epi32(~((1 << kDrop) - 1));
  const __m512i min_normal = _mm512_set1_epi32((127 + kMinExp) << 23);
  const __m512i max_bits = _mm512_set1_epi32(static_cast<int>(f32_bits(Layout::decode(static_cast<uint8_t>(Layout::kMaxFinite)))));
  const __m512 magic = _mm512_castsi512_ps(_mm512_set1_epi32((127 + kMinExp - kManBits + 23) << 23));
  const __m512 vscale = _mm512_set1_ps(scale), vinv = _mm512_set1_ps(1.0f / scale);
  const __m512 qnan = _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN());
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(src + i), vscale);
    const __m512i u = _mm512_castps_si512(s);
    const __m512i a = _mm512_and_si512(u, abs_mask);
    const __m512i sign = _mm512_andnot_si512(abs_mask, u);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, kDrop), one);
    __m512i r = _mm512_and_si512(_mm512_add_epi32(a, _mm512_add_epi32(half_m1, lsb)), keep);
    const __m512 sub = _mm512_sub_ps(_mm512_add_ps(_mm512_castsi512_ps(a), magic), magic);
    r = _mm512_mask_mov_epi32(r, _mm512_cmplt_epi32_mask(a, min_normal), _mm512_castps_si512(sub));
    r = _mm512_min_epi32(r, max_bits);
    __m512 q = _mm512_castsi512_ps(_mm512_or_si512(r, sign));
    q = _mm512_mask_mov_ps(q, _mm512_cmpgt_epi32_mask(a, inf), qnan);
    _mm512_storeu_ps(dst + i, _mm512_mul_ps(q, vinv));
  }
  const float inv = 1.0f / scale;
  for (; i < n; ++i) dst[i] = Layout::decode(Layout::encode(src[i] * scale, true)) * inv;
}

void qdq_fp8(float* dst, const float* src, int64_t n, float scale, Fp8Kind kind) {
  if (kind == Fp8Kind::kE4M3) qdq_layout<4, 3, Fp8E4M3>(dst, src, n, scale);
  else qdq_layout<5, 2, Fp8E5M2>(dst, src, n, scale);
}

}  // namespace
const Kernels kKernels = {&to_bf16, &round_f16, &amax, &qdq_fp8};
}  // namespace kiln::precision_detail::avx512
