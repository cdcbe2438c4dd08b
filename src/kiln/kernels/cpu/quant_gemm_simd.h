// Weight-only quantized GEMM kernels written once over a vector type V (quant_gemm_avx512.cpp,
// quant_gemm_avx2.cpp, or the 1-lane scalar in quant_gemm.cpp). V supplies the f32 vector ops
// and decode<F>(row, k): kLanes codes of one stored weight row starting at element k, as f32
// (fp8 E4M3 scaled by 1 / V::kE4M3Factor). Internal linkage: each target keeps its own copy.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kiln/kernels/cpu/quant_gemm_kernels.h"

namespace kiln::cpu::quant_detail {
namespace {

inline float group_scale(const QuantWeight& w, int64_t j, int64_t g) {
  return w.per_tensor_scale ? w.scales[0] : w.scales[j * w.num_groups() + g];
}

// One register tile: rows [i0, i0 + rows) (rows <= R) x channels [j0, j0 + cols) (cols <= C).
// Missing rows/channels repeat the last valid one and are not stored, so only full-size tiles
// are compiled. acc[r][c] holds lane-wise partial sums of x[i]·(scale·q[j]) over all of in.
// SIMD targets (V::kPairs) take 2·kLanes codes per step through V::decode2; for int4 those
// come as (even, odd) elements, unsigned (q + V::kInt4Bias), and x arrives permuted to match
// (see wo_rows_fmt); the bias is removed with the group sums of x, like a zero-point.
template <class V, QuantFormat F, int R, int C>
void wo_tile(const QuantGemmParams& p, const float* xsums, int64_t i0, int rows, int64_t j0, int cols) {
  using T = typename V::T;
  constexpr int L = V::kLanes;
  constexpr int kStep = V::kPairs ? 2 * L : L;
  constexpr float kBias = F == QuantFormat::kInt4 ? V::kInt4Bias : 0.0f;
  const QuantWeight& w = *p.w;
  const int64_t ng = w.num_groups(), gsize = w.in / ng;
  const int64_t row_bytes = quant_row_bytes(F, w.in);
  const float factor = F == QuantFormat::kFp8E4M3 ? V::kE4M3Factor : 1.0f;
  int64_t jc[C];
  const uint8_t* wr[C];
  const float* xr[R];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    jc[c] = j0 + std::min(c, cols - 1);
    wr[c] = w.data + jc[c] * row_bytes;
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) xr[r] = p.x + (i0 + std::min(r, rows - 1)) * p.ldx;
  const int64_t next = C * row_bytes;  // from a row to the same row of the next tile
  T acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = V::zero();
  for (int64_t g = 0; g < ng; ++g) {
    T s[C], part[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      s[c] = V::set1(group_scale(w, jc[c], g) * factor);
      part[c] = V::zero();
    }
    const int64_t k1 = (g + 1) * gsize;
    for (int64_t k = g * gsize; k < k1; k += kStep) {
      // Stream the next tile's rows into L2 while this one computes: one line per row per line
      // consumed. Rows are short (a few KiB), too short for the hardware prefetcher to lock on;
      // without this, 2-thread int8 GEMV from DRAM ran at ~14 GB/s (Zen 5, w2-s shapes).
      constexpr int64_t kStepBytes = F == QuantFormat::kInt4 ? kStep / 2 : F == QuantFormat::kF16 ? 2 * kStep : kStep;
      const int64_t off = F == QuantFormat::kInt4 ? k / 2 : F == QuantFormat::kF16 ? 2 * k : k;
      if ((off & 63) < kStepBytes) {
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) __builtin_prefetch(wr[c] + next + (off & ~int64_t{63}), 0, 2);
      }
      if constexpr (V::kPairs && R == 1) {
        // One row (GEMV): unscaled codes into per-group partial sums, scaled once per group
        // below — the decode stays the only work per code besides its FMA.
        const T x0 = V::loadu(xr[0] + k), x1 = V::loadu(xr[0] + k + L);
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
          T lo, hi;
          V::template decode2<F>(wr[c], k, lo, hi);
          part[c] = V::fmadd(hi, x1, V::fmadd(lo, x0, part[c]));
        }
      } else if constexpr (V::kPairs) {
        T x0[R], x1[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          x0[r] = V::loadu(xr[r] + k);
          x1[r] = V::loadu(xr[r] + k + L);
        }
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
          T lo, hi;
          V::template decode2<F>(wr[c], k, lo, hi);
          lo = V::mul(lo, s[c]);
          hi = V::mul(hi, s[c]);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][c] = V::fmadd(hi, x1[r], V::fmadd(lo, x0[r], acc[r][c]));
        }
      } else {
        T wv[C];
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) wv[c] = V::mul(V::template decode<F>(wr[c], k), s[c]);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const T xv = V::loadu(xr[r] + k);
#pragma GCC unroll 8
          for (int c = 0; c < C; ++c) acc[r][c] = V::fmadd(wv[c], xv, acc[r][c]);
        }
      }
    }
    if constexpr (V::kPairs && R == 1) {
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[0][c] = V::fmadd(part[c], s[c], acc[0][c]);
    }
  }
  for (int r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    for (int c = 0; c < cols; ++c) {
      const int64_t j = jc[c];
      float v = V::reduce_add(acc[r][c]);
      if (w.zeros || kBias != 0.0f) {  // Σ_k x·scale·(q − z) = Σ_k x·scale·q − Σ_g scale·z·Σ_{k in g} x
        float corr = 0.0f;
        for (int64_t g = 0; g < ng; ++g)
          corr += group_scale(w, j, g) * ((w.zeros ? w.zeros[j * ng + g] : 0.0f) + kBias) * xsums[i * ng + g];
        v -= corr;
      }
      if (p.bias) v += p.bias[j];
      if (p.residual) v += p.residual[i * p.ldr + j];
      p.y[i * p.ldy + j] = v;
    }
  }
}

template <class V, QuantFormat F, int C, int RMax>
void wo_rows_block(const QuantGemmParams& p, const float* xsums, int64_t j0, int cols) {
  for (int64_t i0 = 0; i0 < p.n; i0 += RMax) {
    const int rows = static_cast<int>(std::min<int64_t>(RMax, p.n - i0));
    // Row tails get their own (smaller) tile: repeated rows would cost real FMAs.
    switch (rows) {
      case 1: wo_tile<V, F, 1, C>(p, xsums, i0, 1, j0, cols); break;
      case 2: if constexpr (RMax >= 2) wo_tile<V, F, 2, C>(p, xsums, i0, 2, j0, cols); break;
      case 3: if constexpr (RMax >= 3) wo_tile<V, F, 3, C>(p, xsums, i0, 3, j0, cols); break;
      default: if constexpr (RMax >= 4) wo_tile<V, F, RMax, C>(p, xsums, i0, rows, j0, cols); break;
    }
  }
}

// One row (GEMV): CG channels per tile, CG independent accumulator chains per decoded x vector.
template <class V, QuantFormat F, int CG>
void wo_gemv(const QuantGemmParams& p, const float* xsums, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; j += CG)
    wo_tile<V, F, 1, CG>(p, xsums, 0, 1, j, static_cast<int>(std::min<int64_t>(CG, j1 - j)));
}

// Several rows: tiles of C channels x RMax rows.
template <class V, QuantFormat F, int C, int RMax>
void wo_rows_tiles(const QuantGemmParams& p, const float* xsums, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; j += C)
    wo_rows_block<V, F, C, RMax>(p, xsums, j, static_cast<int>(std::min<int64_t>(C, j1 - j)));
}

// A target's tile shapes, fixed at compile time (AVX2, scalar): the run-time choice is ignored.
// A target with variants supplies the same two members, switching on the QuantTiles.
template <int C, int RMax, int CGemv>
struct FixedShapes {
  template <class V, QuantFormat F>
  static void gemv(const QuantGemmParams& p, const float* xsums, int64_t j0, int64_t j1, const QuantTiles&) {
    wo_gemv<V, F, CGemv>(p, xsums, j0, j1);
  }
  template <class V, QuantFormat F>
  static void rows(const QuantGemmParams& p, const float* xsums, int64_t j0, int64_t j1, const QuantTiles&) {
    wo_rows_tiles<V, F, C, RMax>(p, xsums, j0, j1);
  }
};

// Channels [j0, j1) in blocks: one row (GEMV) takes Shapes::gemv's tiles for more independent
// accumulator chains; several rows take Shapes::rows' tiles.
template <class V, QuantFormat F, class Shapes>
void wo_rows_fmt(const QuantGemmParams& p_in, const float* xsums, int64_t j0, int64_t j1, const QuantTiles& q) {
  QuantGemmParams p = p_in;
  if constexpr (F == QuantFormat::kInt4 && V::kPairs) {
    // x in the order decode2 yields int4 codes: per chunk of 2L inputs, the L even ones, then
    // the L odd ones. One copy per call and thread: n·in floats against out·in/2 weight bytes.
    constexpr int L = V::kLanes;
    thread_local std::vector<float> xp;
    const int64_t in = p.w->in;
    xp.resize(static_cast<size_t>(p.n * in));
    for (int64_t i = 0; i < p.n; ++i) {
      const float* src = p.x + i * p.ldx;
      float* dst = xp.data() + i * in;
      for (int64_t c0 = 0; c0 < in; c0 += 2 * L)
        for (int e = 0; e < L; ++e) {
          dst[c0 + e] = src[c0 + 2 * e];
          dst[c0 + L + e] = src[c0 + 2 * e + 1];
        }
    }
    p.x = xp.data();
    p.ldx = in;
  }
  if (p.n == 1) return Shapes::template gemv<V, F>(p, xsums, j0, j1, q);
  Shapes::template rows<V, F>(p, xsums, j0, j1, q);
}

template <class V, class Shapes>
void wo_rows(const QuantGemmParams& p, const float* xsums, int64_t j0, int64_t j1, const QuantTiles& q) {
  switch (p.w->format) {
    case QuantFormat::kInt8: return wo_rows_fmt<V, QuantFormat::kInt8, Shapes>(p, xsums, j0, j1, q);
    case QuantFormat::kInt4: return wo_rows_fmt<V, QuantFormat::kInt4, Shapes>(p, xsums, j0, j1, q);
    case QuantFormat::kFp8E4M3: return wo_rows_fmt<V, QuantFormat::kFp8E4M3, Shapes>(p, xsums, j0, j1, q);
    case QuantFormat::kFp8E5M2: return wo_rows_fmt<V, QuantFormat::kFp8E5M2, Shapes>(p, xsums, j0, j1, q);
    case QuantFormat::kF16: return wo_rows_fmt<V, QuantFormat::kF16, Shapes>(p, xsums, j0, j1, q);
    case QuantFormat::kCount: break;
  }
}

template <class V, QuantFormat F>
void dequant_rows_fmt(const QuantWeight& w, int64_t j0, int64_t j1, float* dst) {
  constexpr int L = V::kLanes;
  const int64_t ng = w.num_groups(), gsize = w.in / ng, row_bytes = quant_row_bytes(F, w.in);
  const float factor = F == QuantFormat::kFp8E4M3 ? V::kE4M3Factor : 1.0f;
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = w.data + j * row_bytes;
    float* d = dst + (j - j0) * w.in;  // (in,)
    for (int64_t g = 0; g < ng; ++g) {
      const float scale = group_scale(w, j, g);
      const auto s = V::set1(scale * factor);
      const auto b = V::set1(w.zeros ? -scale * w.zeros[j * ng + g] : 0.0f);
      for (int64_t k = g * gsize; k < (g + 1) * gsize; k += L) V::storeu(d + k, V::fmadd(V::template decode<F>(row, k), s, b));
    }
  }
}

template <class V>
void dequant_rows(const QuantWeight& w, int64_t j0, int64_t j1, float* dst) {
  switch (w.format) {
    case QuantFormat::kInt8: return dequant_rows_fmt<V, QuantFormat::kInt8>(w, j0, j1, dst);
    case QuantFormat::kInt4: return dequant_rows_fmt<V, QuantFormat::kInt4>(w, j0, j1, dst);
    case QuantFormat::kFp8E4M3: return dequant_rows_fmt<V, QuantFormat::kFp8E4M3>(w, j0, j1, dst);
    case QuantFormat::kFp8E5M2: return dequant_rows_fmt<V, QuantFormat::kFp8E5M2>(w, j0, j1, dst);
    case QuantFormat::kF16: return dequant_rows_fmt<V, QuantFormat::kF16>(w, j0, j1, dst);
    case QuantFormat::kCount: break;
  }
}

}  // namespace
}  // namespace kiln::cpu::quant_detail
