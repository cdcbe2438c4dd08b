// AVX-512 block-quantized GEMM kernels (block_quant_gemm.h): an R-row × C-tile register tile
// (16 channels per zmm) that streams each tile's blocks once, one zmm of weight codes per
// 4-input quad (int4: two quads per load, split with one AND and one shift), activation quads
// broadcast as 32-bit words, and per block one int32 → f32 conversion and one FMA with the
// f32 product dw · da. The dot is vpdpbusd (AVX512-VNNI) or, without VNNI, vpmaddubsw +
// vpmaddwd; per-block int8 activation quantization.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <iterator>

#include "kiln/core/cpu_features.h"
#include "kiln/kernels/cpu/block_quant_gemm_kernels.h"

// GCC 12's AVX-512 reductions start from _mm512_undefined_*(), which -Wextra reports as
// uninitialized once inlined (a false positive; the values are fully overwritten).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kiln::cpu {
namespace {

// dot += Σ over each lane's 4 bytes of w (u8) · a (s8). Without VNNI: Q4's codes are at most
// 15, so vpmaddubsw's 16-bit pair sums (≤ 2·15·127) cannot saturate; Q8's unsigned codes
// (≤ 255) could, so its codes are made signed again and their sign moved onto a (|q| ≤ 128,
// |a| ≤ 127: pair sums ≤ 32512).
template <BlockQuantFormat F, bool kVnni>
inline __m512i dot4(__m512i dot, __m512i w, __m512i a) {
  if constexpr (kVnni) {
    return _mm512_dpbusd_epi32(dot, w, a);
  } else {
    const __m512i ones = _mm512_set1_epi16(1);
    if constexpr (F == BlockQuantFormat::kQ4) {
      return _mm512_add_epi32(dot, _mm512_madd_epi16(_mm512_maddubs_epi16(w, a), ones));
    } else {
      const __m512i q = _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
      const __mmask64 neg = _mm512_movepi8_mask(q);
      const __m512i as = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
      return _mm512_add_epi32(dot, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(q), as), ones));
    }
  }
}

// R rows x C tiles from tile t0; with pf_next, the next C tiles are prefetched meanwhile
// (NextTiles: the first row block of a pass, which brings the tiles in from memory).
template <BlockQuantFormat F, int R, int C, bool kVnni>
void tile(const BlockQuantGemmParams& p, const BlockQuantActs& a, int64_t i0, int64_t t0, bool pf_next) {
  const BlockQuantWeight& w = *p.w;
  const int64_t nb = w.blocks(), bb = w.block_bytes(), cb = w.code_bytes();
  // The offset o of the unsigned codes comes back out through the block sums (Σ (q + o)·a =
  // Σ q·a + o·Σ a), except in the signed Q8 fallback, which needs no correction.
  constexpr bool kOffset = kVnni || F == BlockQuantFormat::kQ4;
  const int32_t offset = w.offset();
  const uint8_t* wt[C];
#pragma GCC unroll 4
  for (int c = 0; c < C; ++c) wt[c] = w.data + (t0 + c) * w.tile_bytes();
  __m512 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const NextTiles next(w, t0, C, pf_next && F == BlockQuantFormat::kQ4);  // Q4 only: see NextTiles
  for (int64_t b = 0; b < nb; ++b) {
    next.prefetch(b);
    __m512i dot[R][C];
    const int8_t* qa[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      qa[r] = a.q + (i0 + r) * a.ldq + b * kQuantBlock;
      const __m512i init = _mm512_set1_epi32(kOffset ? -offset * a.sums[(i0 + r) * nb + b] : 0);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) dot[r][c] = init;
    }
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h) {  // quads 2h and 2h + 1
      __m512i wlo[C], whi[C];
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        const uint8_t* rec = wt[c] + b * bb;
        if constexpr (F == BlockQuantFormat::kQ8) {
          wlo[c] = _mm512_loadu_si512(rec + (2 * h) * 64);
          whi[c] = _mm512_loadu_si512(rec + (2 * h + 1) * 64);
        } else {
          const __m512i v = _mm512_loadu_si512(rec + h * 64);
          wlo[c] = _mm512_and_si512(v, low4);
          whi[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512i a0 = _mm512_set1_epi32(load_quad(qa[r] + 8 * h));
        const __m512i a1 = _mm512_set1_epi32(load_quad(qa[r] + 8 * h + 4));
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
          dot[r][c] = dot4<F, kVnni>(dot[r][c], wlo[c], a0);
          dot[r][c] = dot4<F, kVnni>(dot[r][c], whi[c], a1);
        }
      }
    }
    __m512 dw[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c)
      dw[c] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt[c] + b * bb + cb)));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 da = _mm512_set1_ps(a.scales[(i0 + r) * nb + b]);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c)
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][c]), _mm512_mul_ps(dw[c], da), acc[r][c]);
    }
  }
#pragma GCC unroll 4
  for (int c = 0; c < C; ++c) {
    const int64_t j0 = (t0 + c) * kQuantTile;
    const int64_t cols = std::min<int64_t>(kQuantTile, w.out - j0);
    const __mmask16 m = static_cast<__mmask16>(cols >= 16 ? 0xffff : (1u << cols) - 1);
    for (int r = 0; r < R; ++r) {
      const int64_t i = i0 + r;
      __m512 v = acc[r][c];
      if (p.bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, p.bias + j0));
      if (p.residual) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, p.residual + i * p.ldr + j0));
      _mm512_mask_storeu_ps(p.y + i * p.ldy + j0, m, v);
    }
  }
}

// Decode (one row): C tiles per pass, C independent dot chains (default 4; measured on W2-S
// Q8_0 / Q4_0 decode, interleaved A/B on the noisy 2-core VM: 1.1-1.4x over two). More rows:
// register tiles of R rows x C tiles, the row blocks inner (the C tiles' weights stay in L1/L2
// across row blocks); remainders take the smaller instantiations (fewer rows, one tile). The
// shape is a run-time choice among kBqDecodeTiles / kBqShapes (quant_tiles.h): each output's
// sum runs over the blocks in the same order in every instantiation, so all give the same bits.
template <BlockQuantFormat F, bool kVnni, int C>
void decode_pass(const BlockQuantGemmParams& p, const BlockQuantActs& a, int64_t t0, int64_t t1) {
  int64_t t = t0;
  for (; t + C <= t1; t += C) tile<F, 1, C, kVnni>(p, a, 0, t, true);
  for (; t < t1; ++t) tile<F, 1, 1, kVnni>(p, a, 0, t, true);
}

// rows (1..R) of tile width C at (i0, t): the instantiation for exactly that many rows.
template <BlockQuantFormat F, bool kVnni, int R, int C>
void rows_tile(const BlockQuantGemmParams& p, const BlockQuantActs& a, int64_t rows, int64_t i0, int64_t t) {
  if constexpr (R > 1) {
    if (rows < R) return rows_tile<F, kVnni, R - 1, C>(p, a, rows, i0, t);
  }
  tile<F, R, C, kVnni>(p, a, i0, t, i0 == 0);
}

template <BlockQuantFormat F, bool kVnni, int R, int C>
void rows_pass(const BlockQuantGemmParams& p, const BlockQuantActs& a, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; t += C) {
    const bool full = t + C <= t1;
    for (int64_t i0 = 0; i0 < p.n; i0 += R) {
      const int64_t rows = std::min<int64_t>(R, p.n - i0);
      if (full) {
        rows_tile<F, kVnni, R, C>(p, a, rows, i0, t);
      } else {
        for (int64_t u = t; u < t1; ++u) rows_tile<F, kVnni, R, 1>(p, a, rows, i0, u);
      }
    }
  }
}

static_assert(std::size(kBqDecodeTiles) == 3 && kBqDecodeTiles[0] == 2 && kBqDecodeTiles[1] == 4 &&
                  kBqDecodeTiles[2] == 8,
              "tiles_impl instantiates exactly the decode candidates");
static_assert(std::size(kBqShapes) == 4 && kBqShapes[0] == BqShape{4, 2} && kBqShapes[1] == BqShape{2, 4} &&
                  kBqShapes[2] == BqShape{6, 2} && kBqShapes[3] == BqShape{8, 1},
              "tiles_impl instantiates exactly the rows x tiles candidates");

template <BlockQuantFormat F, bool kVnni>
void tiles_impl(const BlockQuantGemmParams& p, const BlockQuantActs& a, int64_t t0, int64_t t1,
                const QuantTiles& q) {
  if (p.n == 1) {
    // Q8_0 decode: one tile per pass, one sequential stream the hardware prefetchers follow (its
    // records are 544 bytes a block, twice Q4's per dot). W2-S Q8_0, `kiln bench quant-decode
    // --gguf`, Zen 4 VM, four rounds: 255-278 -> 287-373 tok/s at 1 thread; at 2, 385-394 ->
    // 443-478 in three of four rounds. Q4 keeps the tuned tiles with NextTiles (one tile per
    // pass there was within the noise of four).
    if constexpr (F == BlockQuantFormat::kQ8) return decode_pass<F, kVnni, 1>(p, a, t0, t1);
    switch (q.bq_decode) {
      case 2: return decode_pass<F, kVnni, 2>(p, a, t0, t1);
      case 8: return decode_pass<F, kVnni, 8>(p, a, t0, t1);
      default: return decode_pass<F, kVnni, 4>(p, a, t0, t1);
    }
  }
  const BqShape s = p.n >= kBqPrefillMinRows ? q.bq_prefill : q.bq_batch;
  if (s == BqShape{2, 4}) return rows_pass<F, kVnni, 2, 4>(p, a, t0, t1);
  if (s == BqShape{6, 2}) return rows_pass<F, kVnni, 6, 2>(p, a, t0, t1);
  if (s == BqShape{8, 1}) return rows_pass<F, kVnni, 8, 1>(p, a, t0, t1);
  return rows_pass<F, kVnni, 4, 2>(p, a, t0, t1);
}

void tiles(const BlockQuantGemmParams& p, const BlockQuantActs& a, int64_t t0, int64_t t1, bool vnni,
           const QuantTiles& q) {
  const bool q8 = p.w->format == BlockQuantFormat::kQ8;
  if (vnni) {
    if (q8) tiles_impl<BlockQuantFormat::kQ8, true>(p, a, t0, t1, q);
    else tiles_impl<BlockQuantFormat::kQ4, true>(p, a, t0, t1, q);
  } else {
    if (q8) tiles_impl<BlockQuantFormat::kQ8, false>(p, a, t0, t1, q);
    else tiles_impl<BlockQuantFormat::kQ4, false>(p, a, t0, t1, q);
  }
}

// ---- per-block int8 quantization ---------------------------------------------------------------
void quantize(const float* x, int64_t n, int64_t in, int64_t ldx, int8_t* q, int64_t ldq, float* scales,
              int32_t* sums) {
  const int64_t nb = in / kQuantBlock;
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + i * ldx + b * kQuantBlock;
      const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(x0, abs_mask), _mm512_and_ps(x1, abs_mask)));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      const __m512 vinv = _mm512_set1_ps(inv);
      // cvtps rounds to nearest even (the default MXCSR mode), as nearbyint in the reference;
      // |x · inv| ≤ 127, so the narrowing below never clips.
      const __m512i v0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, vinv));
      const __m512i v1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, vinv));
      int8_t* qb = q + i * ldq + b * kQuantBlock;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm512_cvtepi32_epi8(v0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16), _mm512_cvtepi32_epi8(v1));
      scales[i * nb + b] = amax / 127.0f;
      sums[i * nb + b] = _mm512_reduce_add_epi32(_mm512_add_epi32(v0, v1));
    }
  }
}

const char* name(bool vnni) {
  return vnni ? "avx512_vnni vpdpbusd, rows x 16-channel tiles as the quant tiles say, Q8_0 decode one tile a pass (u8 codes, offset through block sums)"
              : "avx512bw vpmaddubsw + vpmaddwd, rows x 16-channel tiles as the quant tiles say, Q8_0 decode one tile a pass";
}
bool has_vnni() { return cpu_features().avx512_vnni; }

}  // namespace

const BlockQuantTargetKernels& block_quant_kernels_avx512() {
  static const BlockQuantTargetKernels k{&tiles, &quantize, &name, &has_vnni};
  return k;
}

}  // namespace kiln::cpu
