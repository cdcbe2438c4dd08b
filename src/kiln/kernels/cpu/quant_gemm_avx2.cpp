// AVX2 quantized GEMM kernels: 8-lane decoders (int8, int4 nibbles, fp8 through F16C) for the
// shared weight-only tiles, the W8A8 int8 tile (int8 widened to int16, vpmaddwd into int32:
// no pmaddubsw saturation), and per-token int8 activation quantization.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kiln/kernels/cpu/quant_gemm_simd.h"

namespace kiln::cpu {
namespace {

struct V256 {
  using T = __m256;
  static constexpr int kLanes = 8;
  static constexpr float kE4M3Factor = 256.0f;  // see quant_gemm_avx512.cpp
  static constexpr bool kPairs = true;           // 16 codes per step (decode2)
  static constexpr float kInt4Bias = 8.0f;
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, T x) { _mm256_storeu_ps(p, x); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static float reduce_add(T a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  template <QuantFormat F>
  static T decode(const uint8_t* row, int64_t k) {
    if constexpr (F == QuantFormat::kInt8) {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k));
      return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    } else if constexpr (F == QuantFormat::kInt4) {
      uint32_t bits;
      std::memcpy(&bits, row + k / 2, 4);
      const __m128i b = _mm_cvtsi32_si128(static_cast<int>(bits));
      const __m128i m = _mm_set1_epi8(0x0f);
      const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
      __m128i v = _mm_unpacklo_epi8(lo, hi);
      v = _mm_sub_epi8(_mm_xor_si128(v, _mm_set1_epi8(8)), _mm_set1_epi8(8));
      return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    } else if constexpr (F == QuantFormat::kF16) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
    } else {
      const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k)));
      __m128i h;
      if constexpr (F == QuantFormat::kFp8E5M2) {
        h = _mm_slli_epi16(b, 8);
      } else {
        h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k))), 7),
                          _mm_set1_epi16(static_cast<short>(0xbfff)));  // see quant_gemm_avx512.cpp
      }
      return _mm256_cvtph_ps(h);
    }
  }
  template <QuantFormat F>
  static void decode2(const uint8_t* row, int64_t k, T& lo, T& hi) {
    if constexpr (F == QuantFormat::kInt4) {  // 8 bytes = 16 codes: (even, odd) halves of q + 8
      const __m128i b = _mm_xor_si128(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k / 2)),
                                      _mm_set1_epi8(static_cast<char>(0x88)));
      const __m128i m = _mm_set1_epi8(0x0f);
      lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(b, m)));
      hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), m)));
    } else {
      lo = decode<F>(row, k);
      hi = decode<F>(row, k + kLanes);
    }
  }
};

int32_t reduce_add_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// ---- W8A8: R x C tile, 16 bytes per step widened to s16, vpmaddwd into s32 ----------------------
template <int R, int C>
void w8a8_tile(const W8A8Params& p, int64_t i0, int rows, int64_t j0, int cols) {
  const QuantWeight& w = *p.w;
  const int64_t in = w.in, in16 = in & ~int64_t{15};
  const int8_t* wr[C];
  const int8_t* ar[R];
  int64_t jc[C];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    jc[c] = j0 + std::min(c, cols - 1);
    wr[c] = reinterpret_cast<const int8_t*>(w.data) + jc[c] * in;
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) ar[r] = p.a + (i0 + std::min(r, rows - 1)) * p.lda;
  __m256i acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_si256();
  for (int64_t k = 0; k < in16; k += 16) {
    if ((k & 63) == 0) {
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) __builtin_prefetch(wr[c] + C * in + k, 0, 2);  // next tile, into L2
    }
    __m256i wv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) wv[c] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wr[c] + k)));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i av = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ar[r] + k)));
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(av, wv[c]));
    }
  }
  for (int r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    for (int c = 0; c < cols; ++c) {
      const int64_t j = jc[c];
      int32_t sum = reduce_add_epi32(acc[r][c]);
      for (int64_t k = in16; k < in; ++k) sum += static_cast<int32_t>(ar[r][k]) * wr[c][k];
      const float sw = w.per_tensor_scale ? w.scales[0] : w.scales[j];
      float v = (p.a_scales[i] * sw) * static_cast<float>(sum);
      if (p.bias) v += p.bias[j];
      if (p.residual) v += p.residual[i * p.ldr + j];
      p.y[i * p.ldy + j] = v;
    }
  }
}

void w8a8_rows(const W8A8Params& p, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; j += 4) {
    const int cols = static_cast<int>(std::min<int64_t>(4, j1 - j));
    for (int64_t i0 = 0; i0 < p.n; i0 += 2) {
      if (p.n - i0 >= 2) w8a8_tile<2, 4>(p, i0, 2, j, cols);
      else w8a8_tile<1, 4>(p, i0, 1, j, cols);
    }
  }
}

const char* w8a8_name() { return "avx2 vpmaddwd 2x4 tile (int8 widened to int16)"; }

// ---- per-token int8 quantization --------------------------------------------------------------
void quantize_rows(const float* x, int64_t n, int64_t in, int64_t ldx, int8_t* q, int64_t ldq, float* scales) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const int64_t in8 = in & ~int64_t{7};
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * ldx;
    int8_t* qr = q + i * ldq;
    __m256 vmax = _mm256_setzero_ps();
    for (int64_t k = 0; k < in8; k += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(xr + k), abs_mask));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    float amax = 0.0f;
    for (float v : lanes) amax = std::max(amax, v);
    for (int64_t k = in8; k < in; ++k) amax = std::max(amax, std::fabs(xr[k]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scales[i] = amax / 127.0f;
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    for (int64_t k = 0; k < in8; k += 8) {
      __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xr + k), vinv));  // nearest even
      v = _mm256_min_epi32(_mm256_max_epi32(v, lo), hi);
      const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(qr + k), _mm_packs_epi16(p16, p16));
    }
    for (int64_t k = in8; k < in; ++k) {
      const float r = std::nearbyint(xr[k] * inv);
      qr[k] = static_cast<int8_t>(std::fmin(127.0f, std::fmax(-127.0f, r)));
    }
  }
}

QuantTargetKernels make_kernels() {
  QuantTargetKernels k;
  k.name = "avx2 decode tile (2 rows x 4 channels, 16 codes per step)";
  k.lanes = 2 * V256::kLanes;  // codes per decode2 step
  k.wo_rows = &quant_detail::wo_rows<V256, quant_detail::FixedShapes<4, 2, 4>>;
  k.dequant_rows = &quant_detail::dequant_rows<V256>;
  k.w8a8_rows = &w8a8_rows;
  k.w8a8_name = &w8a8_name;
  k.quantize_rows = &quantize_rows;
  return k;
}

}  // namespace

const QuantTargetKernels& quant_kernels_avx2() {
  static const QuantTargetKernels k = make_kernels();
  return k;
}

}  // namespace kiln::cpu
