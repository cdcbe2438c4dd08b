// GEMM building blocks written once over a vector type V (V::T = __m512 or __m256, see
// gemm_avx512.cpp / gemm_avx2.cpp, or a 1-lane scalar): packing, the register-tiled f32
// micro-kernel with its fused epilogue, and the decode-like small-M kernels. Everything here
// has internal linkage so each target's translation unit keeps its own copy (compiled with its
// own flags) and the linker can never mix an AVX-512 copy into the baseline path.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kiln/core/dtype.h"
#include "kiln/kernels/cpu/gemm_kernels.h"
#include "kiln/kernels/cpu/vec.h"

namespace kiln::cpu::gemm_detail {
namespace {

inline float bf16_bits_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16_bits(float f) {  // round to nearest even, NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t v) { return bf16_bits_to_f32(v); }
inline uint16_t to_bf16(float v) { return f32_to_bf16_bits(v); }
inline uint16_t to_bf16(uint16_t v) { return v; }

// ---- packing into f32 strips: strip[l][i] (A, MR rows) or strip[l][j] (B, NR columns) ----
template <int MR, class T>
void pack_a_f32_impl(const GemmParams& p, int64_t i0, int64_t rows, int64_t k0, int64_t kc,
                     float* dst) {
  const T* a = static_cast<const T*>(p.a);
  for (int64_t s = 0; s < rows; s += MR, dst += MR * kc) {
    const int mr = static_cast<int>(std::min<int64_t>(MR, rows - s));
    if (p.trans_a) {  // stored (k, m): op(A)(i, l) = a[l*lda + i], contiguous in i
      for (int64_t l = 0; l < kc; ++l) {
        const T* src = a + (k0 + l) * p.lda + i0 + s;
        float* d = dst + l * MR;
        for (int i = 0; i < mr; ++i) d[i] = to_f32(src[i]);
        for (int i = mr; i < MR; ++i) d[i] = 0.0f;
      }
    } else {  // stored (m, k): transpose MR rows into the strip, 8 k at a time
      int64_t l = 0;
      for (; l + 8 <= kc; l += 8) {
        for (int i = 0; i < MR; ++i) {
          if (i < mr) {
            const T* src = a + (i0 + s + i) * p.lda + k0 + l;
            for (int q = 0; q < 8; ++q) dst[(l + q) * MR + i] = to_f32(src[q]);
          } else {
            for (int q = 0; q < 8; ++q) dst[(l + q) * MR + i] = 0.0f;
          }
        }
      }
      for (; l < kc; ++l)
        for (int i = 0; i < MR; ++i)
          dst[l * MR + i] = i < mr ? to_f32(a[(i0 + s + i) * p.lda + k0 + l]) : 0.0f;
    }
  }
}

// The packs that sweep a stored matrix row by row (B (k, n), A (k, m)) fetch the row two ahead
// while they deal this one: rows ld elements apart sit in other pages, where the hardware
// prefetchers start over. `bytes` of row l + 2 from `row` (row l's first element used).
template <class T>
[[gnu::always_inline]] inline void prefetch_row_ahead(const T* row, int64_t ld, int64_t bytes) {
  const char* ahead = reinterpret_cast<const char*>(row + 2 * ld);
  for (int64_t q = 0; q < bytes; q += 64) __builtin_prefetch(ahead + q, 0, 3);
}

template <int NR, class T>
void pack_b_f32_impl(const GemmParams& p, int64_t j0, int64_t cols, int64_t k0, int64_t kc,
                     float* dst) {
  const T* b = static_cast<const T*>(p.b);
  const int64_t full_strips = cols / NR;
  if (!p.trans_b) {
    // Stored (k, n): sweep each row of B once, left to right, dealing NR-wide runs to the strips
    // (the row two ahead prefetched).
    for (int64_t l = 0; l < kc; ++l) {
      const T* src = b + (k0 + l) * p.ldb + j0;
      if (l + 2 < kc) prefetch_row_ahead(src, p.ldb, cols * static_cast<int64_t>(sizeof(T)));
      for (int64_t t = 0; t < full_strips; ++t) {
        float* d = dst + t * NR * kc + l * NR;
        const T* s = src + t * NR;
        if constexpr (std::is_same_v<T, float>) {
          std::memcpy(d, s, NR * sizeof(float));
        } else {
          for (int j = 0; j < NR; ++j) d[j] = to_f32(s[j]);
        }
      }
      const int rem = static_cast<int>(cols - full_strips * NR);
      if (rem > 0) {
        float* d = dst + full_strips * NR * kc + l * NR;
        const T* s = src + full_strips * NR;
        for (int j = 0; j < rem; ++j) d[j] = to_f32(s[j]);
        for (int j = rem; j < NR; ++j) d[j] = 0.0f;
      }
    }
    return;
  }
  for (int64_t t = 0; t < cols; t += NR, dst += NR * kc) {
    const int nr = static_cast<int>(std::min<int64_t>(NR, cols - t));
    // Stored (n, k): transpose NR rows of B into the strip, 8 k at a time.
    int64_t l = 0;
    for (; l + 8 <= kc; l += 8) {
      for (int j = 0; j < NR; ++j) {
        if (j < nr) {
          const T* src = b + (j0 + t + j) * p.ldb + k0 + l;
          for (int q = 0; q < 8; ++q) dst[(l + q) * NR + j] = to_f32(src[q]);
        } else {
          for (int q = 0; q < 8; ++q) dst[(l + q) * NR + j] = 0.0f;
        }
      }
    }
    for (; l < kc; ++l)
      for (int j = 0; j < NR; ++j)
        dst[l * NR + j] = j < nr ? to_f32(b[(j0 + t + j) * p.ldb + k0 + l]) : 0.0f;
  }
}

template <int MR>
void pack_a_f32(const GemmParams& p, int64_t i0, int64_t rows, int64_t k0, int64_t kc, void* dst) {
  if (p.a_dtype == DType::kBF16)
    pack_a_f32_impl<MR, uint16_t>(p, i0, rows, k0, kc, static_cast<float*>(dst));
  else
    pack_a_f32_impl<MR, float>(p, i0, rows, k0, kc, static_cast<float*>(dst));
}
template <int NR>
void pack_b_f32(const GemmParams& p, int64_t j0, int64_t cols, int64_t k0, int64_t kc, void* dst) {
  if (p.b_dtype == DType::kBF16)
    pack_b_f32_impl<NR, uint16_t>(p, j0, cols, k0, kc, static_cast<float*>(dst));
  else
    pack_b_f32_impl<NR, float>(p, j0, cols, k0, kc, static_cast<float*>(dst));
}

// ---- packing B into IEEE-half strips: strip[l][j] = op(B)(l, j) as f16 bits ----------------
// For weights packed once (gemm_prepacked's half path): B f16 (bits copied) or f32 (rounded to
// nearest even); partial strips padded with +0. Not on a hot path, so written for clarity.
template <int NR>
void pack_b_half(const GemmParams& p, int64_t j0, int64_t cols, int64_t k0, int64_t kc, void* dst) {
  auto* out = static_cast<uint16_t*>(dst);
  const bool half = p.b_dtype == DType::kF16;
  auto at = [&](int64_t l, int64_t j) -> uint16_t {  // op(B)(l, j)
    const int64_t off = p.trans_b ? j * p.ldb + l : l * p.ldb + j;
    return half ? static_cast<const uint16_t*>(p.b)[off] : f32_to_f16(static_cast<const float*>(p.b)[off]);
  };
  for (int64_t t = 0; t < cols; t += NR, out += NR * kc) {
    const int nr = static_cast<int>(std::min<int64_t>(NR, cols - t));
    for (int64_t l = 0; l < kc; ++l)
      for (int j = 0; j < NR; ++j) out[l * NR + j] = j < nr ? at(k0 + l, j0 + t + j) : uint16_t{0};
  }
}

// ---- packing into bf16 pairs: strip[l2][i] = {op(X)(i, 2 l2), op(X)(i, 2 l2 + 1)} ----------
// f32 inputs are rounded to bf16 here (the bf16 compute path, like autocast); odd k pads 0.
template <int MR, class T>
void pack_a_pairs_impl(const GemmParams& p, int64_t i0, int64_t rows, int64_t k0, int64_t kc,
                       uint32_t* dst) {
  const T* a = static_cast<const T*>(p.a);
  const int64_t kp = (kc + 1) / 2;
  for (int64_t s = 0; s < rows; s += MR, dst += MR * kp) {
    const int mr = static_cast<int>(std::min<int64_t>(MR, rows - s));
    for (int i = 0; i < MR; ++i) {
      if (i >= mr) {
        for (int64_t l2 = 0; l2 < kp; ++l2) dst[l2 * MR + i] = 0;
        continue;
      }
      const int64_t row = i0 + s + i;
      if (p.trans_a) {
        for (int64_t l2 = 0; l2 < kp; ++l2) {
          const int64_t l = k0 + 2 * l2;
          const uint32_t lo = to_bf16(a[l * p.lda + row]);
          const uint32_t hi = 2 * l2 + 1 < kc ? to_bf16(a[(l + 1) * p.lda + row]) : 0;
          dst[l2 * MR + i] = lo | hi << 16;
        }
      } else {
        const T* src = a + row * p.lda + k0;
        const int64_t full = kc / 2;
        for (int64_t l2 = 0; l2 < full; ++l2)
          dst[l2 * MR + i] = static_cast<uint32_t>(to_bf16(src[2 * l2])) |
                             static_cast<uint32_t>(to_bf16(src[2 * l2 + 1])) << 16;
        if (kc & 1) dst[full * MR + i] = to_bf16(src[kc - 1]);
      }
    }
  }
}

template <int NR, class T>
void pack_b_pairs_impl(const GemmParams& p, int64_t j0, int64_t cols, int64_t k0, int64_t kc,
                       uint32_t* dst) {
  const T* b = static_cast<const T*>(p.b);
  const int64_t kp = (kc + 1) / 2;
  for (int64_t t = 0; t < cols; t += NR, dst += NR * kp) {
    const int nr = static_cast<int>(std::min<int64_t>(NR, cols - t));
    if (!p.trans_b) {  // interleave rows 2 l2 and 2 l2 + 1 of B
      for (int64_t l2 = 0; l2 < kp; ++l2) {
        const T* r0 = b + (k0 + 2 * l2) * p.ldb + j0 + t;
        const bool has1 = 2 * l2 + 1 < kc;
        const T* r1 = r0 + p.ldb;
        uint32_t* d = dst + l2 * NR;
        for (int j = 0; j < nr; ++j)
          d[j] = static_cast<uint32_t>(to_bf16(r0[j])) |
                 (has1 ? static_cast<uint32_t>(to_bf16(r1[j])) << 16 : 0u);
        for (int j = nr; j < NR; ++j) d[j] = 0;
      }
    } else {  // row j of stored B is contiguous in k: a pair is two adjacent elements
      for (int j = 0; j < NR; ++j) {
        if (j >= nr) {
          for (int64_t l2 = 0; l2 < kp; ++l2) dst[l2 * NR + j] = 0;
          continue;
        }
        const T* src = b + (j0 + t + j) * p.ldb + k0;
        const int64_t full = kc / 2;
        for (int64_t l2 = 0; l2 < full; ++l2)
          dst[l2 * NR + j] = static_cast<uint32_t>(to_bf16(src[2 * l2])) |
                             static_cast<uint32_t>(to_bf16(src[2 * l2 + 1])) << 16;
        if (kc & 1) dst[full * NR + j] = to_bf16(src[kc - 1]);
      }
    }
  }
}

template <int MR>
void pack_a_pairs(const GemmParams& p, int64_t i0, int64_t rows, int64_t k0, int64_t kc, void* dst) {
  if (p.a_dtype == DType::kBF16)
    pack_a_pairs_impl<MR, uint16_t>(p, i0, rows, k0, kc, static_cast<uint32_t*>(dst));
  else
    pack_a_pairs_impl<MR, float>(p, i0, rows, k0, kc, static_cast<uint32_t*>(dst));
}
template <int NR>
void pack_b_pairs(const GemmParams& p, int64_t j0, int64_t cols, int64_t k0, int64_t kc, void* dst) {
  if (p.b_dtype == DType::kBF16)
    pack_b_pairs_impl<NR, uint16_t>(p, j0, cols, k0, kc, static_cast<uint32_t*>(dst));
  else
    pack_b_pairs_impl<NR, float>(p, j0, cols, k0, kc, static_cast<uint32_t*>(dst));
}

// ---- fused epilogue on one vector of n (<= lanes) valid columns ------------------------------
// The activations and their derivatives are vec.h's, compiled for the same target as V (V::Vec),
// which the elementwise kernels use too: act = GELU here gives bitwise what gelu_forward gives
// on this GEMM's output, act_grad what gelu_backward gives.
template <class V>
inline typename V::T act_vec(Activation act, typename V::T x) {
  using Vec = typename V::Vec;
  switch (act) {
    case Activation::kNone: return x;
    case Activation::kRelu:
      return relu(Vec{x}).v;
    case Activation::kSilu:
      return silu(Vec{x}).v;
    case Activation::kGeluTanh:
      return gelu(Vec{x}).v;
  }
  return x;
}

template <class V>
inline typename V::T act_grad_vec(Activation act, typename V::T x) {
  using Vec = typename V::Vec;
  switch (act) {
    case Activation::kNone:
      return V::set1(1.0f);
    case Activation::kRelu:
      return relu_grad(Vec{x}).v;
    case Activation::kSilu:
      return silu_grad(Vec{x}).v;
    case Activation::kGeluTanh:
      return gelu_grad(Vec{x}).v;
  }
  return V::set1(1.0f);
}

// C's vector at (row i, column j) of the tile the epilogue's pointers start at.
template <class V>
[[gnu::always_inline]] inline typename V::T epilogue_vec(typename V::T acc, const float* c,
                                                         int64_t i, int64_t j, int n,
                                                         const TileEpilogue& ep) {
  typename V::T x = ep.alpha == 1.0f ? acc : V::mul(V::set1(ep.alpha), acc);
  if (ep.beta != 0.0f) x = V::fmadd(V::set1(ep.beta), V::load_n(c, n), x);
  if (ep.bias) x = V::add(x, V::load_n(ep.bias + j, n));
  if (ep.save_pre) V::store_n(ep.save_pre + i * ep.ldpre + j, x, n);
  if (ep.act_grad != Activation::kNone)
    x = V::mul(x, act_grad_vec<V>(ep.act_grad, V::load_n(ep.pre + i * ep.ldpre + j, n)));
  if (ep.act != Activation::kNone) x = act_vec<V>(ep.act, x);
  if (ep.residual) x = V::add(x, V::load_n(ep.residual + i * ep.ldr + j, n));
  return x;
}

template <class V>
void epilogue_rows(float* c, int64_t ldc, const float* acc, int64_t ld_acc, int64_t rows,
                   int64_t cols, const TileEpilogue& ep) {
  constexpr int L = V::kLanes;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; j += L) {
      const int n = static_cast<int>(std::min<int64_t>(L, cols - j));
      const typename V::T x =
          epilogue_vec<V>(V::load_n(acc + i * ld_acc + j, n), c + i * ldc + j, i, j, n, ep);
      V::store_n(c + i * ldc + j, x, n);
    }
  }
}

// ---- the register-tiled micro-kernel: MR rows x NV vectors, broadcast A, FMA into C ---------
template <class V, int MR, int NV>
[[gnu::always_inline]] inline void store_tile(typename V::T (&acc)[MR][NV], float* c, int64_t ldc, int m, int n,
                       const TileEpilogue& ep) {
  constexpr int L = V::kLanes;
  // A whole tile with C = AB or C += AB (every K block but the last, and most GEMMs' last): plain
  // stores or adds, decided once per tile rather than per vector. The per-vector checks cost the
  // 14x32 kernel ~6% in L1 (`kiln bench gemm --tiles`, Xeon VM: 79 -> 84.5% of the FMA loop);
  // W1a's 2048 x 384 x 384 GEMM, 1 thread, paired: +2.5%.
  if (m == MR && n == NV * L && ep.alpha == 1.0f && (ep.beta == 0.0f || ep.beta == 1.0f) && ep.scales_only()) {
    if (ep.beta == 0.0f) {
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) V::store_n(c + i * ldc + v * L, acc[i][v], L);
    } else {  // beta·C + AB with beta = 1, as the general path's fused multiply-add rounds it
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          float* cp = c + i * ldc + v * L;
          V::store_n(cp, V::add(acc[i][v], V::load(cp)), L);
        }
    }
    return;
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    if (i >= m) break;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const int nv = n - v * L;
      if (nv <= 0) break;
      float* cp = c + i * ldc + v * L;
      const typename V::T x = epilogue_vec<V>(acc[i][v], cp, i, v * L, nv, ep);
      V::store_n(cp, x, nv);
    }
  }
}

// A partial strip (m < MR rows hold data, the rest is zero padding) runs only R = m rounded up
// to even rows of it: Tile::template rows<R> is the kernel for the first R rows of an MR-row
// packed strip. The last strip of M = 256 (4 of 14 rows) then costs 4/14 of a full one instead
// of all of it: +3.5% at 256^3 f32 and bf16, 1 thread, EPYC VM (+1.2% at 512^3).
template <class Tile, int MR>
[[gnu::always_inline]] inline bool run_partial_strip(int64_t steps, const void* a, const void* b, float* c,
                                                     int64_t ldc, int m, int n, const TileEpilogue& ep) {
  if constexpr (MR <= 2) {
    return false;
  } else {
    if (m >= MR - 1) return false;  // rounds up to MR: the full kernel
    using Fn = void (*)(int64_t, const void*, const void*, float*, int64_t, int, int, const TileEpilogue&);
    constexpr auto table = []<size_t... I>(std::index_sequence<I...>) {
      return std::array<Fn, sizeof...(I)>{&Tile::template rows<2 * static_cast<int>(I + 1)>...};
    }(std::make_index_sequence<(MR - 1) / 2>{});
    table[(m - 1) / 2](steps, a, b, c, ldc, m, n, ep);
    return true;
  }
}

// A vector of V::kLanes weights widened to f32: f32 as is, IEEE halves converted (vcvtph2ps).
template <class V>
[[gnu::always_inline]] inline typename V::T load_weights(const float* p) { return V::load(p); }
template <class V>
[[gnu::always_inline]] inline typename V::T load_weights(const uint16_t* p) { return V::load_half(p); }

// The B micro-panel (KC x NR, 64 KiB at KC = 512) does not fit L1 and streams from L2: each k
// step of the f32 kernels fetches the step 8 ahead (b: this step's NV vectors of W elements).
// Measured: packed kernel, EPYC VM, f32 2048^3 1 thread, paired against OpenBLAS: +0.7% alone, and
// part of the blocking change in gemm.cpp; the in-place-A kernel, Xeon VM, W1a's K = 384 and 1536
// shapes, 1 thread, paired: +1.5-4%.
template <class V, int NV, class W>
[[gnu::always_inline]] inline void prefetch_b_ahead(const W* b) {
  constexpr int L = V::kLanes;
  if constexpr (L > 1)
    for (int v = 0; v < NV * L * static_cast<int>(sizeof(W)); v += 64)
      __builtin_prefetch(reinterpret_cast<const char*>(b + 8 * NV * L) + v, 0, 3);
}

// The register-tiled f32 kernel: rows<R> runs the first R rows of an MR-row packed strip
// (R = MR: all of it). W is the packed B's element: float, or uint16_t for IEEE halves (the same
// FMAs in the same order on the widened values).
template <class V, int MR, int NV, class W = float>
struct MicroTileF32 {
  template <int R>
  static void rows(int64_t steps, const void* a_packed, const void* b_packed, float* c, int64_t ldc, int m,
                   int n, const TileEpilogue& ep) {
    constexpr int L = V::kLanes;
    const float* a = static_cast<const float*>(a_packed);
    const W* b = static_cast<const W*>(b_packed);
    typename V::T acc[R][NV];
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = V::zero();
    for (int64_t l = 0; l < steps; ++l) {
      __builtin_prefetch(a + 16 * MR, 0, 3);  // the A strip streams from L2, ~16 k steps ahead
      prefetch_b_ahead<V, NV>(b);
      typename V::T bv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) bv[v] = load_weights<V>(b + v * L);
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) {
        const typename V::T av = V::set1(a[i]);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[i][v] = V::fmadd(av, bv[v], acc[i][v]);
      }
      a += MR;
      b += NV * L;
    }
    store_tile<V, R, NV>(acc, c, ldc, m, n, ep);
  }
};

template <class V, int MR, int NV, class W = float>
void micro_kernel_f32(int64_t steps, const void* a_packed, const void* b_packed, float* c,
                      int64_t ldc, int m, int n, const TileEpilogue& ep) {
  using Tile = MicroTileF32<V, MR, NV, W>;
  if (!run_partial_strip<Tile, MR>(steps, a_packed, b_packed, c, ldc, m, n, ep))
    Tile::template rows<MR>(steps, a_packed, b_packed, c, ldc, m, n, ep);
}

// micro_kernel_f32 with A read in place: MR full rows of f32 A, lda elements apart (the
// kernel_direct_a of the packed paths; each row is a sequential stream the prefetchers follow).
template <class V, int MR, int NV>
void micro_kernel_f32_direct(int64_t steps, const void* a_rows, int64_t lda, const void* b_packed,
                             float* c, int64_t ldc, int n, const TileEpilogue& ep) {
  constexpr int L = V::kLanes;
  const float* a = static_cast<const float*>(a_rows);
  const float* b = static_cast<const float*>(b_packed);
  typename V::T acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = V::zero();
  for (int64_t l = 0; l < steps; ++l) {
    prefetch_b_ahead<V, NV>(b);
    typename V::T bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = V::load(b + v * L);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const typename V::T av = V::set1(a[i * lda + l]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = V::fmadd(av, bv[v], acc[i][v]);
    }
    b += NV * L;
  }
  store_tile<V, MR, NV>(acc, c, ldc, MR, n, ep);
}

// ---- decode-like small M over a pre-packed weight (gemm_prepacked) -------------------------
// C (m <= 8 rows) = epilogue(A x W) over the (steps, NR) strips [s0, s1) of W, A interleaved
// (steps, M): a[l * M + i]. The loop of micro_kernel_f32 for a few rows, but W is read once from
// DRAM, in memory order, so how it streams decides the speed. Per M: how many strips run side by
// side (sequential streams for the hardware prefetchers, and independent accumulators), and whether
// W is also prefetched 64 KiB (kSmallMPackedAhead floats) ahead. Measured on the Zen 4 VM (1
// thread, K = N = 4096 f32, cold, huge pages; DRAM read probe 31.5 GB/s), GB/s, one strip vs
// the choice: the prefetch costs ~6 GB/s while the core mostly waits (M <= 5) and gains 1.5-6
// once the FMAs keep it busy (M >= 6, where the hardware prefetchers alone fall behind); more
// strips side by side lift M = 3, 4 from 24-25 to 28-29 (`kiln bench prepacked --min-mib 128`
// with M = 1..8 then gave 32, 31, 29, 29, 26, 26, 28, 27 GB/s).
struct SmallMPackedShape {
  int strips;
  bool prefetch;
};
inline constexpr SmallMPackedShape kSmallMPackedShapes[9] = {{1, false}, {1, false}, {2, false},
                                                             {2, false}, {3, false}, {1, false},
                                                             {1, true},  {1, true},  {1, true}};
inline constexpr int64_t kSmallMPackedAhead = 16384;

// Element ops of the small-M packed kernels. f32 strips: one element is one f32 of A or W, a
// vector V::kLanes columns of W at one k, the dot an FMA. (gemm_avx512.cpp adds bf16 pairs:
// one element is two bf16 of consecutive k, the dot vdpbf16ps.)
// EA / EW: the element types of A and of W.
template <class V>
struct PackedF32Ops {
  using EA = float;
  using EW = float;
  using B = typename V::T;
  static constexpr int kLanes = V::kLanes;  // W columns per vector
  static B load(const EW* p) { return V::load(p); }
  static B bcast(const EA* a) { return V::set1(*a); }
  static typename V::T dot(typename V::T acc, B a, B b) { return V::fmadd(a, b, acc); }
};
// IEEE-half W (f16.pack_b's strips), f32 A: each vector of halves widened in registers, then the
// f32 FMA — PackedF32Ops on the widened weight, at half the bytes streamed.
template <class V>
struct PackedHalfOps : PackedF32Ops<V> {
  using EW = uint16_t;
  static typename V::T load(const EW* p) { return V::load_half(p); }
};

// One k step (one element) for S strips side by side: acc[s] += A column (M elements at a) x
// strip s's NV vectors at b.
template <class V, class Ops, int NV, int M, int S, bool kPf>
[[gnu::always_inline]] inline void small_m_packed_step(typename V::T (&acc)[S][M][NV],
                                                       const typename Ops::EA* a,
                                                       const typename Ops::EW* b,
                                                       int64_t strip_elems,
                                                       const typename Ops::EW* pf_limit) {
  constexpr int kStepBytes = NV * Ops::kLanes * static_cast<int>(sizeof(typename Ops::EW));
  constexpr int kLineBytes = kStepBytes >= 64 ? 64 : kStepBytes;
#pragma GCC unroll 4
  for (int s = 0; s < S; ++s) {
    const typename Ops::EW* bs = b + s * strip_elems;
    if constexpr (kPf) {
      const typename Ops::EW* pf = bs + kSmallMPackedAhead * 4 / static_cast<int64_t>(sizeof(typename Ops::EW));
      if (pf < pf_limit) {
        for (int q = 0; q < kStepBytes; q += kLineBytes)
          __builtin_prefetch(reinterpret_cast<const char*>(pf) + q, 0, 2);
      }
    }
    typename Ops::B bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = Ops::load(bs + v * Ops::kLanes);
#pragma GCC unroll 8
    for (int i = 0; i < M; ++i) {
      const typename Ops::B av = Ops::bcast(a + i);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[s][i][v] = Ops::dot(acc[s][i][v], av, bv[v]);
    }
  }
}

// S strips from `strip` (strip_elems apart) over `steps` elements into the C columns from c;
// n = the columns left from c (each strip writes min(NR, what remains)); ep.bias / ep.residual
// at c's column.
template <class V, class Ops, int NV, int M, int S, bool kPf>
void small_m_packed_group(int64_t steps, const typename Ops::EA* a, const typename Ops::EW* strip,
                          int64_t strip_elems, const typename Ops::EW* pf_limit, float* c,
                          int64_t ldc, int64_t n, const TileEpilogue& ep) {
  constexpr int NR = NV * Ops::kLanes;
  static_assert(NR == NV * V::kLanes, "one accumulator per vector of W columns");
  typename V::T acc[S][M][NV];
#pragma GCC unroll 4
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 8
    for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[s][i][v] = V::zero();
  const typename Ops::EW* b = strip;
  for (int64_t l = 0; l < steps; ++l, a += M, b += NR)
    small_m_packed_step<V, Ops, NV, M, S, kPf>(acc, a, b, strip_elems, pf_limit);
#pragma GCC unroll 4
  for (int s = 0; s < S; ++s) {
    const int64_t col = s * NR;
    if (col >= n) break;
    store_tile<V, M, NV>(acc[s], c + col, ldc, M, static_cast<int>(std::min<int64_t>(NR, n - col)),
                         ep.at_col(col));
  }
}

template <class V, class Ops, int NV, int M>
void small_m_packed_rows(int64_t steps, const typename Ops::EA* a, const typename Ops::EW* w,
                         int64_t s0, int64_t s1, float* c, int64_t ldc, int64_t n,
                         const TileEpilogue& ep) {
  constexpr int NR = NV * Ops::kLanes;
  constexpr int S = Ops::kLanes == 1 ? 1 : kSmallMPackedShapes[M].strips;
  constexpr bool kPf = Ops::kLanes > 1 && kSmallMPackedShapes[M].prefetch;
  const int64_t strip_elems = NR * steps;
  const typename Ops::EW* limit = w + s1 * strip_elems;
  auto at = [&](int64_t s) { return ep.at_col(s * NR); };
  int64_t s = s0;
  for (; s + S <= s1; s += S)
    small_m_packed_group<V, Ops, NV, M, S, kPf>(steps, a, w + s * strip_elems, strip_elems, limit,
                                                c + s * NR, ldc, n - s * NR, at(s));
  for (; s < s1; ++s)
    small_m_packed_group<V, Ops, NV, M, 1, kPf>(steps, a, w + s * strip_elems, strip_elems, limit,
                                                c + s * NR, ldc, n - s * NR, at(s));
}

// small_m_packed_rows<..., M> for M = 1 .. sizeof...(I), indexed by M - 1.
template <class V, class Ops, int NV, size_t... I>
constexpr auto small_m_packed_table(std::index_sequence<I...>) {
  return std::array{&small_m_packed_rows<V, Ops, NV, static_cast<int>(I) + 1>...};
}

// C (m, n) columns of strips [s0, s1) for a run-time row count m in 1..kGemmSmallM (8); a and w
// hold Ops::EA / Ops::EW elements (`steps` per A row and per strip column); c, ep.bias and
// ep.residual at column 0 of W.
template <class V, class Ops, int NV>
void small_m_packed(int m, int64_t steps, const void* a, const void* w, int64_t s0, int64_t s1,
                    float* c, int64_t ldc, int64_t n, const TileEpilogue& ep) {
  static constexpr auto kRows = small_m_packed_table<V, Ops, NV>(std::make_index_sequence<8>{});
  KILN_CHECK(m >= 1 && m <= 8);
  kRows[m - 1](steps, static_cast<const typename Ops::EA*>(a), static_cast<const typename Ops::EW*>(w),
               s0, s1, c, ldc, n, ep);
}

// ---- small-M (decode-like) kernels: stream B once, A stays in L1/L2 --------------------------
// Keeps a loaded vector in a register: without this GCC folds the same A load into each of the
// J FMAs that use it (J memory operands instead of one load), which made the M = 8 kernel
// load-bound at ~30% of the FMA peak.
template <class T>
[[gnu::always_inline]] inline void pin_register(T& x) {
  if constexpr (!std::is_same_v<T, float>) asm("" : "+v"(x));
}

// B stored (n, k) (trans_b, PyTorch weights): J rows of B at a time, M x J dot products stored
// into out. `pf` (pf_rows rows, ldb apart; may be null) is prefetched into L2 alongside, one
// line per row per line of B consumed; with kNearLines > 0 the group's own rows are also
// prefetched into L1 that many lines ahead.
template <class V, int M, int J, class BT, int kNearLines = 0>
void small_m_tb_group(const float* a, int64_t lda, int64_t k, const BT* b, int64_t ldb, float* out,
                      int64_t ldo, const BT* pf, int pf_rows) {
  constexpr int L = V::kLanes;
  constexpr int64_t kLineElems = 64 / sizeof(BT);
  // Hidden from the optimizer so the prefetches stay a separate branch at the end of the loop
  // body (where GCC puts the test) even for f32, where one step is one line and the test would
  // fold away: with them inline, f32 M = 8 streamed at 15 instead of 19 GB/s (Zen 4, GCC 12).
  int64_t line_mask = kLineElems - 1;
  asm("" : "+r"(line_mask));
  typename V::T acc[M][J];
#pragma GCC unroll 8
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) acc[i][j] = V::zero();
  int64_t l = 0;
  for (; l + L <= k; l += L) {
    if (pf && (l & line_mask) == 0) {
#pragma GCC unroll 8
      for (int j = 0; j < pf_rows; ++j) __builtin_prefetch(pf + j * ldb + l, 0, 2);
    }
    if (kNearLines > 0 && (l & line_mask) == 0) {
#pragma GCC unroll 8
      for (int j = 0; j < J; ++j)
        __builtin_prefetch(b + j * ldb + l + kNearLines * kLineElems, 0, 3);
    }
    typename V::T bv[J];
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) bv[j] = V::loadu(b + j * ldb + l);
#pragma GCC unroll 8
    for (int i = 0; i < M; ++i) {
      typename V::T av = V::loadu(a + i * lda + l);
      pin_register(av);
#pragma GCC unroll 8
      for (int j = 0; j < J; ++j) acc[i][j] = V::fmadd(av, bv[j], acc[i][j]);
    }
  }
  if (l < k) {
    const int n = static_cast<int>(k - l);
    typename V::T bv[J];
    for (int j = 0; j < J; ++j) bv[j] = V::load_n(b + j * ldb + l, n);
    for (int i = 0; i < M; ++i) {
      const typename V::T av = V::load_n(a + i * lda + l, n);
      for (int j = 0; j < J; ++j) acc[i][j] = V::fmadd(av, bv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < J; ++j) {
      out[i * ldo + j] = V::reduce_add(acc[i][j]);
    }
}

// Row groups in order; while one group streams, the rows that follow it are prefetched line by
// line into L2 with prefetcht1 (one line per row per line consumed). Each prefetched row is one
// more sequential stream for the L2 hardware prefetcher, and with few rows per group (J = 3 at
// M = 8) too few streams kept too few DRAM reads in flight, so when a group does >= 8 FMA per
// 16 k per B row (f32 M >= 8 - bf16 lines hold twice the k, so bf16 M >= 4), the next two
// groups' rows are prefetched instead of one. Measured on Zen 4 (1 thread, K = N = 4096, cold):
// no prefetch -> next group: M = 4 f32 19 -> 22-25 GB/s; next group -> next two: f32 M = 8
// 16.5 -> 19.5-20 GB/s, bf16 M = 4 22 -> 25 GB/s; three or four groups ahead, prefetching every
// other line, prefetcht0/nta, or K blocks that keep A in L1 were no better or worse. In between
// (f32 M = 4..7, bf16 M = 2, 3) a prefetcht0 of the group's own rows 4 lines ahead moved f32
// M = 4 from 22.5 to 24.5 GB/s; it cost f32 M = 8 ~3% and did nothing at M <= 2.
template <class V, int M, class BT>
void small_m_tb(const SmallMArgs& s, int64_t j0, int64_t j1, float* out) {
  constexpr int J = M <= 3 ? 8 : M == 4 ? 6 : M <= 6 ? 4 : 3;  // M*J <= 24 accumulators
  constexpr int kLineWork = M * static_cast<int>(sizeof(float) / sizeof(BT));  // f32 M equivalent
  constexpr int kPfRows = (kLineWork >= 8 ? 2 : 1) * J;
  constexpr int kNearLines = kLineWork >= 4 && kLineWork < 8 ? 4 : 0;
  const BT* b = static_cast<const BT*>(s.b);
  const int64_t ldo = j1 - j0;
  int64_t j = j0;
  for (; j + J <= j1; j += J) {
    const int pf_rows = static_cast<int>(std::min<int64_t>(kPfRows, j1 - (j + J)));
    small_m_tb_group<V, M, J, BT, kNearLines>(s.a, s.lda, s.k, b + j * s.ldb, s.ldb,
                                              out + (j - j0), ldo,
                                              pf_rows > 0 ? b + (j + J) * s.ldb : nullptr, pf_rows);
  }
  for (; j < j1; ++j)
    small_m_tb_group<V, M, 1, BT>(s.a, s.lda, s.k, b + j * s.ldb, s.ldb, out + (j - j0), ldo,
                                  nullptr, 0);
}

// B stored (k, n): a chunk of NV vectors of columns for kKb rows at a time, accumulated in out;
// the kKb rows advance together so B is read as kKb sequential streams.
template <class V, int M, class BT>
void small_m_nb(const SmallMArgs& s, int64_t j0, int64_t j1, float* out) {
  constexpr int L = V::kLanes;
  constexpr int NV = M <= 4 ? 4 : 3;  // M*NV <= 24 accumulators
  constexpr int64_t kKb = 8;
  const BT* b = static_cast<const BT*>(s.b);
  const int64_t ldo = j1 - j0;
  for (int64_t l0 = 0; l0 < s.k; l0 += kKb) {
    const int64_t l1 = std::min(s.k, l0 + kKb);
    for (int64_t j = j0; j < j1; j += NV * L) {
      const int64_t cols = std::min<int64_t>(NV * L, j1 - j);
      typename V::T acc[M][NV];
      for (int i = 0; i < M; ++i)
        for (int v = 0; v < NV; ++v) {
          const int n = static_cast<int>(std::clamp<int64_t>(cols - v * L, 0, L));
          acc[i][v] = l0 == 0 ? V::zero() : V::load_n(out + i * ldo + (j - j0) + v * L, n);
        }
      if (cols == NV * L) {
        for (int64_t l = l0; l < l1; ++l) {
          typename V::T bv[NV];
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) bv[v] = V::loadu(b + l * s.ldb + j + v * L);
#pragma GCC unroll 8
          for (int i = 0; i < M; ++i) {
            const typename V::T av = V::set1(s.a[i * s.lda + l]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[i][v] = V::fmadd(av, bv[v], acc[i][v]);
          }
        }
      } else {
        for (int64_t l = l0; l < l1; ++l) {
          typename V::T bv[NV];
          for (int v = 0; v < NV; ++v) {
            const int n = static_cast<int>(std::clamp<int64_t>(cols - v * L, 0, L));
            bv[v] = n > 0 ? V::load_n(b + l * s.ldb + j + v * L, n) : V::zero();
          }
          for (int i = 0; i < M; ++i) {
            const typename V::T av = V::set1(s.a[i * s.lda + l]);
            for (int v = 0; v < NV; ++v) acc[i][v] = V::fmadd(av, bv[v], acc[i][v]);
          }
        }
      }
      for (int i = 0; i < M; ++i)
        for (int v = 0; v < NV; ++v) {
          const int n = static_cast<int>(std::clamp<int64_t>(cols - v * L, 0, L));
          if (n > 0) V::store_n(out + i * ldo + (j - j0) + v * L, acc[i][v], n);
        }
    }
  }
}

template <class V, int M>
void small_m_fixed(const SmallMArgs& s, int64_t j0, int64_t j1, float* out) {
  if (s.k == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < j1 - j0; ++j) out[i * (j1 - j0) + j] = 0.0f;
    return;
  }
  if (s.trans_b) {
    if (s.b_dtype == DType::kBF16)
      small_m_tb<V, M, uint16_t>(s, j0, j1, out);
    else
      small_m_tb<V, M, float>(s, j0, j1, out);
  } else {
    if (s.b_dtype == DType::kBF16)
      small_m_nb<V, M, uint16_t>(s, j0, j1, out);
    else
      small_m_nb<V, M, float>(s, j0, j1, out);
  }
}

template <class V>
void small_m(const SmallMArgs& s, int64_t j0, int64_t j1, float* out) {
  switch (s.m) {
    case 1: return small_m_fixed<V, 1>(s, j0, j1, out);
    case 2: return small_m_fixed<V, 2>(s, j0, j1, out);
    case 3: return small_m_fixed<V, 3>(s, j0, j1, out);
    case 4: return small_m_fixed<V, 4>(s, j0, j1, out);
    case 5: return small_m_fixed<V, 5>(s, j0, j1, out);
    case 6: return small_m_fixed<V, 6>(s, j0, j1, out);
    case 7: return small_m_fixed<V, 7>(s, j0, j1, out);
    case 8: return small_m_fixed<V, 8>(s, j0, j1, out);
    default: KILN_CHECK(s.m >= 1 && s.m <= 8);
  }
}

}  // namespace
}  // namespace kiln::cpu::gemm_detail
