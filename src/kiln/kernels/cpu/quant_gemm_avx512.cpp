// AVX-512 quantized GEMM kernels: 16-lane decoders (int8, int4 nibbles, fp8 through the F16C
// half-precision converter) for the shared weight-only tiles, the W8A8 int8 tile with
// AVX512-VNNI vpdpbusd (u8 x s8, activations shifted by +128) or a 16-bit multiply-add fallback,
// and per-token int8 activation quantization.
#include <immintrin.h>

#include <cstring>
#include <iterator>

#include "kiln/core/cpu_features.h"
#include "kiln/kernels/cpu/quant_gemm_simd.h"

// GCC 12's AVX-512 reductions start from _mm512_undefined_*(), which -Wextra reports as
// uninitialized once inlined (a false positive; the values are fully overwritten).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kiln::cpu {
namespace {

struct V512 {
  using T = __m512;
  static constexpr int kLanes = 16;
  // E4M3 decodes as a half with the same bits shifted (value · 2^-8): fold 2^8 into the scale.
  static constexpr float kE4M3Factor = 256.0f;
  // decode2: 32 codes per step; int4 as (even, odd) halves of unsigned q + 8 (see
  // quant_gemm_simd.h), which costs 13 instead of 22 instructions per 32 codes.
  static constexpr bool kPairs = true;
  static constexpr float kInt4Bias = 8.0f;
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, T x) { _mm512_storeu_ps(p, x); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static float reduce_add(T a) { return _mm512_reduce_add_ps(a); }
  template <QuantFormat F>
  static T decode(const uint8_t* row, int64_t k) {
    if constexpr (F == QuantFormat::kInt8) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k));
      return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    } else if constexpr (F == QuantFormat::kInt4) {
      // 8 bytes -> 16 nibbles in element order (low nibble first), sign-extended via (v ^ 8) - 8.
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k / 2));
      const __m128i m = _mm_set1_epi8(0x0f);
      const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
      __m128i v = _mm_unpacklo_epi8(lo, hi);
      v = _mm_sub_epi8(_mm_xor_si128(v, _mm_set1_epi8(8)), _mm_set1_epi8(8));
      return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
    } else if constexpr (F == QuantFormat::kF16) {
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k)));
    } else {
      const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)));
      __m256i h;
      if constexpr (F == QuantFormat::kFp8E5M2) {
        h = _mm256_slli_epi16(b, 8);  // E5M2 is the top byte of an IEEE half
      } else {                        // sign to bit 15, exponent+mantissa to bits 13..7
        // Sign-extended byte << 7 puts the sign in bit 15 and exponent+mantissa in bits 13..7;
        // bit 14 (a copy of the sign) is cleared.
        h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k))), 7),
                             _mm256_set1_epi16(static_cast<short>(0xbfff)));
      }
      return _mm512_cvtph_ps(h);
    }
  }
  template <QuantFormat F>
  static void decode2(const uint8_t* row, int64_t k, T& lo, T& hi) {
    if constexpr (F == QuantFormat::kInt4) {
      // 16 bytes = 32 codes; u ^ 8 turns a two's-complement nibble into q + 8 in [0, 15].
      const __m128i b = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2)),
                                      _mm_set1_epi8(static_cast<char>(0x88)));
      const __m128i m = _mm_set1_epi8(0x0f);
      lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, m)));                     // even k
      hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), m)));  // odd k
    } else {
      lo = decode<F>(row, k);
      hi = decode<F>(row, k + kLanes);
    }
  }
};

// ---- W8A8 -----------------------------------------------------------------------------------
// One R x C tile of int32 dot products over all of in; missing rows/channels repeat the last
// valid one and are not stored. kVnni: 64 bytes per step with vpdpbusd on (a ^ 0x80) = a + 128
// as u8; the 128·Σw bias is removed with the precomputed row sums. Otherwise: 32 bytes per step
// widened to s16 and multiplied with vpmaddwd (s16 x s16 pairs into s32: no saturation).
template <int R, int C, bool kVnni>
void w8a8_tile(const W8A8Params& p, int64_t i0, int rows, int64_t j0, int cols) {
  const QuantWeight& w = *p.w;
  const int64_t in = w.in;
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
  __m512i acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_si512();
  if constexpr (kVnni) {
    const __m512i shift = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int64_t k = 0; k < in; k += 64) {
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) __builtin_prefetch(wr[c] + C * in + k, 0, 2);  // next tile, into L2
      const int64_t rem = in - k;
      const __mmask64 mask = rem >= 64 ? ~__mmask64{0} : ((__mmask64{1} << rem) - 1);
      __m512i wv[C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) wv[c] = _mm512_maskz_loadu_epi8(mask, wr[c] + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        // Masked-off bytes become 0x80 (= 128 as u8) but meet zero weights: no contribution.
        const __m512i av = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, ar[r] + k), shift);
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], av, wv[c]);
      }
    }
  } else {
    for (int64_t k = 0; k < in; k += 32) {
      if ((k & 63) == 0) {
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) __builtin_prefetch(wr[c] + C * in + k, 0, 2);
      }
      const int64_t rem = in - k;
      const __mmask32 mask = rem >= 32 ? ~__mmask32{0} : ((__mmask32{1} << rem) - 1);
      __m512i wv[C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) wv[c] = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mask, wr[c] + k));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i av = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mask, ar[r] + k));
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_add_epi32(acc[r][c], _mm512_madd_epi16(av, wv[c]));
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    for (int c = 0; c < cols; ++c) {
      const int64_t j = jc[c];
      int32_t sum = _mm512_reduce_add_epi32(acc[r][c]);
      if constexpr (kVnni) sum -= 128 * p.w_row_sums[j];
      const float sw = w.per_tensor_scale ? w.scales[0] : w.scales[j];
      float v = (p.a_scales[i] * sw) * static_cast<float>(sum);
      if (p.bias) v += p.bias[j];
      if (p.residual) v += p.residual[i * p.ldr + j];
      p.y[i * p.ldy + j] = v;
    }
  }
}

template <bool kVnni>
void w8a8_rows_impl(const W8A8Params& p, int64_t j0, int64_t j1) {
  if (p.n == 1) {
    for (int64_t j = j0; j < j1; j += 8)
      w8a8_tile<1, 8, kVnni>(p, 0, 1, j, static_cast<int>(std::min<int64_t>(8, j1 - j)));
    return;
  }
  for (int64_t j = j0; j < j1; j += 4) {
    const int cols = static_cast<int>(std::min<int64_t>(4, j1 - j));
    for (int64_t i0 = 0; i0 < p.n; i0 += 4) {
      const int rows = static_cast<int>(std::min<int64_t>(4, p.n - i0));
      switch (rows) {
        case 1: w8a8_tile<1, 4, kVnni>(p, i0, 1, j, cols); break;
        case 2: w8a8_tile<2, 4, kVnni>(p, i0, 2, j, cols); break;
        case 3: w8a8_tile<3, 4, kVnni>(p, i0, 3, j, cols); break;
        default: w8a8_tile<4, 4, kVnni>(p, i0, 4, j, cols); break;
      }
    }
  }
}

bool use_vnni() { return cpu_features().avx512_vnni && w8a8_vnni_allowed(); }

void w8a8_rows(const W8A8Params& p, int64_t j0, int64_t j1) {
  if (use_vnni()) w8a8_rows_impl<true>(p, j0, j1);
  else w8a8_rows_impl<false>(p, j0, j1);
}

const char* w8a8_name() {
  return use_vnni() ? "avx512_vnni vpdpbusd 4x4 tile (u8 = a + 128, minus 128·Σw)"
                    : "avx512 vpmaddwd 4x4 tile (int8 widened to int16)";
}

// ---- per-token int8 quantization --------------------------------------------------------------
void quantize_rows(const float* x, int64_t n, int64_t in, int64_t ldx, int8_t* q, int64_t ldq, float* scales) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * ldx;
    __m512 vmax = _mm512_setzero_ps();
    for (int64_t k = 0; k < in; k += 16) {
      const __mmask16 m = in - k >= 16 ? __mmask16(0xffff) : __mmask16((1u << (in - k)) - 1);
      vmax = _mm512_max_ps(vmax, _mm512_and_ps(_mm512_maskz_loadu_ps(m, xr + k), abs_mask));
    }
    const float amax = _mm512_reduce_max_ps(vmax);
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scales[i] = amax / 127.0f;
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int64_t k = 0; k < in; k += 16) {
      const __mmask16 m = in - k >= 16 ? __mmask16(0xffff) : __mmask16((1u << (in - k)) - 1);
      // cvtps rounds to nearest even (the default MXCSR mode), as nearbyint in the reference.
      __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + k), vinv));
      v = _mm512_min_epi32(_mm512_max_epi32(v, lo), hi);
      _mm512_mask_cvtsepi32_storeu_epi8(q + i * ldq + k, m, v);
    }
  }
}

// The weight-only tile shapes as a run-time choice (quant_tiles.h): GEMV tiles of 4, 8 (today's
// default) or 16 channels, 4-row tiles of 2 or 4 (default) channels. A channel's sum runs over
// k in the same order in each, so every choice gives the same bits.
static_assert(std::size(kWoGemvChannels) == 3 && kWoGemvChannels[0] == 4 && kWoGemvChannels[1] == 8 &&
                  kWoGemvChannels[2] == 16 && std::size(kWoRowsChannels) == 2 && kWoRowsChannels[0] == 2 &&
                  kWoRowsChannels[1] == 4,
              "TunedShapes instantiates exactly the weight-only candidates");
struct TunedShapes {
  template <class V, QuantFormat F>
  static void gemv(const QuantGemmParams& p, const float* xsums, int64_t j0, int64_t j1, const QuantTiles& q) {
    switch (q.wo_gemv) {
      case 4: return quant_detail::wo_gemv<V, F, 4>(p, xsums, j0, j1);
      case 16: return quant_detail::wo_gemv<V, F, 16>(p, xsums, j0, j1);
      default: return quant_detail::wo_gemv<V, F, 8>(p, xsums, j0, j1);
    }
  }
  template <class V, QuantFormat F>
  static void rows(const QuantGemmParams& p, const float* xsums, int64_t j0, int64_t j1, const QuantTiles& q) {
    if (q.wo_rows == 2) return quant_detail::wo_rows_tiles<V, F, 2, 4>(p, xsums, j0, j1);
    quant_detail::wo_rows_tiles<V, F, 4, 4>(p, xsums, j0, j1);
  }
};

QuantTargetKernels make_kernels() {
  QuantTargetKernels k;
  k.name = "avx512 decode tile (4 rows x 2|4 channels, 1 x 4|8|16 for one row, as the quant tiles say; 32 codes per step)";
  k.lanes = 2 * V512::kLanes;  // codes per decode2 step
  k.wo_rows = &quant_detail::wo_rows<V512, TunedShapes>;
  k.dequant_rows = &quant_detail::dequant_rows<V512>;
  k.w8a8_rows = &w8a8_rows;
  k.w8a8_name = &w8a8_name;
  k.quantize_rows = &quantize_rows;
  return k;
}

}  // namespace

const QuantTargetKernels& quant_kernels_avx512() {
  static const QuantTargetKernels k = make_kernels();
  return k;
}

}  // namespace kiln::cpu
