// AVX2 block-quantized GEMM kernels (block_quant_gemm.h): the AVX-512 kernel's scheme on
// 8-channel halves of each 16-channel tile (16 ymm registers: R ≤ 2 rows × one tile), the dot
// as vpmaddubsw + vpmaddwd (Q8's codes made signed, their sign moved onto the activations with
// vpsignb, so no 16-bit pair sum saturates); per-block int8 activation quantization.
// AVX-VNNI (the VEX vpdpbusd of AVX2-only CPUs since Alder Lake) is not used yet.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kiln/kernels/cpu/block_quant_gemm_kernels.h"
#include "kiln/kernels/cpu/vec.h"

namespace kiln::cpu {
namespace {

template <BlockQuantFormat F>
inline __m256i dot4(__m256i dot, __m256i w, __m256i a) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (F == BlockQuantFormat::kQ4) {
    return _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), ones));
  } else {
    const __m256i q = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
    return _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(a, q)), ones));
  }
}

int32_t hsum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// R rows × the two 8-channel halves (H = 2) of tile t.
template <BlockQuantFormat F, int R>
void tile(const BlockQuantGemmParams& p, const BlockQuantActs& a, int64_t i0, int64_t t) {
  constexpr int H = 2;
  const BlockQuantWeight& w = *p.w;
  const int64_t nb = w.blocks(), bb = w.block_bytes(), cb = w.code_bytes();
  const int32_t offset = F == BlockQuantFormat::kQ4 ? w.offset() : 0;  // signed Q8: no correction
  const uint8_t* wt = w.data + t * w.tile_bytes();
  __m256 acc[R][H];
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < H; ++h) acc[r][h] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rec = wt + b * bb;
    __m256i dot[R][H];
    const int8_t* qa[R];
    for (int r = 0; r < R; ++r) {
      qa[r] = a.q + (i0 + r) * a.ldq + b * kQuantBlock;
      const __m256i init = _mm256_set1_epi32(-offset * a.sums[(i0 + r) * nb + b]);
      for (int h = 0; h < H; ++h) dot[r][h] = init;
    }
    for (int u = 0; u < 8; ++u) {  // quads
      __m256i wv[H];
      for (int h = 0; h < H; ++h) {
        if constexpr (F == BlockQuantFormat::kQ8) {
          wv[h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + u * 64 + 32 * h));
        } else {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + (u / 2) * 64 + 32 * h));
          wv[h] = u % 2 == 0 ? _mm256_and_si256(v, low4) : _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m256i av = _mm256_set1_epi32(load_quad(qa[r] + 4 * u));
        for (int h = 0; h < H; ++h) dot[r][h] = dot4<F>(dot[r][h], wv[h], av);
      }
    }
    for (int h = 0; h < H; ++h) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + cb + 16 * h)));
      for (int r = 0; r < R; ++r) {
        const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(a.scales[(i0 + r) * nb + b]));
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][h]), s, acc[r][h]);
      }
    }
  }
  for (int h = 0; h < H; ++h) {
    const int64_t j0 = t * kQuantTile + 8 * h;
    const int64_t cols = std::min<int64_t>(8, w.out - j0);
    if (cols <= 0) break;
    for (int r = 0; r < R; ++r) {
      const int64_t i = i0 + r;
      alignas(32) float v[8];
      _mm256_store_ps(v, acc[r][h]);
      for (int64_t c = 0; c < cols; ++c) {
        float y = v[c];
        if (p.bias) y += p.bias[j0 + c];
        if (p.residual) y += p.residual[i * p.ldr + j0 + c];
        p.y[i * p.ldy + j0 + c] = y;
      }
    }
  }
}

template <BlockQuantFormat F>
void tiles_impl(const BlockQuantGemmParams& p, const BlockQuantActs& a, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t i0 = 0; i0 < p.n; i0 += 2) {
      if (p.n - i0 >= 2) tile<F, 2>(p, a, i0, t);
      else tile<F, 1>(p, a, i0, t);
    }
}

void tiles(const BlockQuantGemmParams& p, const BlockQuantActs& a, int64_t t0, int64_t t1, bool, const QuantTiles&) {
  if (p.w->format == BlockQuantFormat::kQ8) tiles_impl<BlockQuantFormat::kQ8>(p, a, t0, t1);
  else tiles_impl<BlockQuantFormat::kQ4>(p, a, t0, t1);
}

void quantize(const float* x, int64_t n, int64_t in, int64_t ldx, int8_t* q, int64_t ldq, float* scales,
              int32_t* sums) {
  const int64_t nb = in / kQuantBlock;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + i * ldx + b * kQuantBlock;
      __m256 xv[4];
      __m256 m = _mm256_setzero_ps();
      for (int s = 0; s < 4; ++s) {
        xv[s] = _mm256_loadu_ps(xb + 8 * s);
        m = _mm256_max_ps(m, _mm256_and_ps(xv[s], abs_mask));
      }
      const float amax = avx2::reduce_max(avx2::Vec{m});
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      const __m256 vinv = _mm256_set1_ps(inv);
      __m256i v[4];
      for (int s = 0; s < 4; ++s) v[s] = _mm256_cvtps_epi32(_mm256_mul_ps(xv[s], vinv));  // half to even
      // packs interleave the 128-bit lanes; the permute puts the 4-byte groups back in order.
      const __m256i p16 = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i * ldq + b * kQuantBlock),
                          _mm256_permutevar8x32_epi32(p16, order));
      scales[i * nb + b] = amax / 127.0f;
      sums[i * nb + b] = hsum8(_mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3])));
    }
  }
}

const char* name(bool) { return "avx2 vpmaddubsw + vpmaddwd, 2 rows x 16 channels"; }
bool has_vnni() { return false; }

}  // namespace

const BlockQuantTargetKernels& block_quant_kernels_avx2() {
  static const BlockQuantTargetKernels k{&tiles, &quantize, &name, &has_vnni};
  return k;
}

}  // namespace kiln::cpu
