// AVX-512 GEMM kernels: the 14x32 f32 micro-kernel (28 zmm accumulators, two B vectors per k,
// A broadcast from memory into the FMAs), the AVX512_BF16 14x32 micro-kernel on pairs-of-k
// packing (vdpbf16ps: two bf16 products per f32 lane per instruction), SIMD packing (A rows
// transposed 16 x 16 for f32 and bf16 pairs, bf16 B rows interleaved into pairs), and the
// small-M kernels.
#include <immintrin.h>

#include <cstdlib>
#include <cstring>

#include "kiln/core/cpu_features.h"
#include "kiln/kernels/cpu/gemm_amx.h"
#include "kiln/kernels/cpu/gemm_simd.h"

// GCC 12's AVX-512 headers seed some intrinsics with _mm512_undefined_*(), which -Wextra
// reports as uninitialized once inlined; the values are fully overwritten (false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kiln::cpu {
namespace {

struct V512 {
  using T = __m512;
  static constexpr int kLanes = 16;
  static __mmask16 mask(int n) { return static_cast<__mmask16>(n >= 16 ? 0xffffu : (1u << n) - 1u); }
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static T load_half(const uint16_t* p) {  // 16 IEEE halves widened (vcvtph2ps)
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static T loadu(const float* p) { return _mm512_loadu_ps(p); }
  static T loadu(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static T load_n(const float* p, int n) {
    return n >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(mask(n), p);
  }
  static T load_n(const uint16_t* p, int n) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask(n), p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static void store_n(float* p, T x, int n) {
    if (n >= 16) _mm512_storeu_ps(p, x);
    else _mm512_mask_storeu_ps(p, mask(n), x);
  }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T div(T a, T b) { return _mm512_div_ps(a, b); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static float reduce_add(T a) { return _mm512_reduce_add_ps(a); }
  using Vec = avx512::Vec;  // vec.h: the epilogue's activations
};

// 14 x 32 over bf16 pairs: per k pair, two B vectors (16 columns x 2 k each) and 14 broadcast A
// pairs feed 28 vdpbf16ps, each adding two products into every f32 lane. rows<R>: the first R
// rows of the strip (a partial last strip, see run_partial_strip).
struct MicroTileBf16 {
  template <int R>
  static void rows(int64_t steps, const void* a_packed, const void* b_packed, float* c, int64_t ldc, int m,
                   int n, const TileEpilogue& ep) {
    constexpr int kMr = 14;
    const uint32_t* a = static_cast<const uint32_t*>(a_packed);
    const uint32_t* b = static_cast<const uint32_t*>(b_packed);
    __m512 acc[R][2];
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t l = 0; l < steps; ++l) {
      const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
      const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + 16);
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) {
        const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[i]));
        acc[i][0] = _mm512_dpbf16_ps(acc[i][0], av, b0);
        acc[i][1] = _mm512_dpbf16_ps(acc[i][1], av, b1);
      }
      a += kMr;
      b += 32;
    }
    gemm_detail::store_tile<V512, R, 2>(acc, c, ldc, m, n, ep);
  }
};

void micro_kernel_bf16_14x32(int64_t steps, const void* a_packed, const void* b_packed, float* c,
                             int64_t ldc, int m, int n, const TileEpilogue& ep) {
  if (!gemm_detail::run_partial_strip<MicroTileBf16, 14>(steps, a_packed, b_packed, c, ldc, m, n, ep))
    MicroTileBf16::rows<14>(steps, a_packed, b_packed, c, ldc, m, n, ep);
}

// micro_kernel_bf16_14x32 with A read in place: 14 full rows of bf16 A, lda elements apart,
// each k pair one 32-bit broadcast from its row.
void micro_kernel_bf16_14x32_direct(int64_t steps, const void* a_rows, int64_t lda, const void* b_packed,
                                    float* c, int64_t ldc, int n, const TileEpilogue& ep) {
  constexpr int kMr = 14;
  const uint16_t* a = static_cast<const uint16_t*>(a_rows);
  const uint32_t* b = static_cast<const uint32_t*>(b_packed);
  __m512 acc[kMr][2];
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t l = 0; l < steps; ++l) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + 16);
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) {
      uint32_t pair;
      std::memcpy(&pair, a + i * lda + 2 * l, sizeof pair);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], av, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], av, b1);
    }
    b += 32;
  }
  gemm_detail::store_tile<V512, kMr, 2>(acc, c, ldc, kMr, n, ep);
}

// ---- SIMD packing: A rows transposed 16 x 16 (32-bit elements) instead of element by element --
// Transposes r[0..15] (16 rows of 16 32-bit elements) in place: afterwards r[q] holds element q
// of every row. Three shuffle stages (unpack ps, unpack pd, two rounds of 128-bit shuffles).
[[gnu::always_inline]] inline void transpose_16x16(__m512 (&r)[16]) {
  __m512 t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  __m512 u[16];  // u[4 i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 4) {
    const __m512d t0 = _mm512_castps_pd(t[i]), t1 = _mm512_castps_pd(t[i + 1]);
    const __m512d t2 = _mm512_castps_pd(t[i + 2]), t3 = _mm512_castps_pd(t[i + 3]);
    u[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    u[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    u[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    u[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512 x0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), x1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
    const __m512 y0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd), y1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
    r[c] = _mm512_shuffle_f32x4(x0, x1, 0x88);
    r[8 + c] = _mm512_shuffle_f32x4(x0, x1, 0xdd);
    r[4 + c] = _mm512_shuffle_f32x4(y0, y1, 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(y0, y1, 0xdd);
  }
}

// One full strip of kMr rows: dst[q * kStride + i] = element q of row i (32-bit elements: an
// f32, or a pair of bf16 for consecutive k), for q in [0, count) rounded down to 16; returns how
// many elements were done (the caller packs the rest with the generic code). A strips are kMr
// wide (kStride = kMr); a B strip of 32 columns is two of these, 16 rows each, 32 apart.
template <int kMr, int kStride = kMr>
int64_t pack_strip_16x16(const char* src, int64_t row_bytes, int64_t count, uint32_t* dst) {
  static_assert(kMr <= 16 && kStride >= kMr);
  constexpr __mmask16 kRowMask = static_cast<__mmask16>((1u << kMr) - 1u);
  // Each row's stream is fetched 4 lines ahead: with 14 rows in flight the hardware prefetchers
  // fall behind (2048^2 f32 A, 1 thread, EPYC VM: the pack went from 8.4 to 9.2 GB/s, the GEMM
  // gained ~1%; 8 lines ahead was slower than none).
  constexpr int64_t kAhead = 64;
  int64_t q = 0;
  for (; q + 16 <= count; q += 16) {
    if (q + kAhead + 16 <= count)
#pragma GCC unroll 16
      for (int i = 0; i < kMr; ++i)
        __builtin_prefetch(reinterpret_cast<const float*>(src + i * row_bytes) + q + kAhead, 0, 3);
    __m512 r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i)
      r[i] = i < kMr ? _mm512_loadu_ps(reinterpret_cast<const float*>(src + i * row_bytes) + q) : _mm512_setzero_ps();
    transpose_16x16(r);
    float* d = reinterpret_cast<float*>(dst + q * kStride);
#pragma GCC unroll 16
    for (int c = 0; c < 16; ++c) _mm512_mask_storeu_ps(d + c * kStride, kRowMask, r[c]);
  }
  return q;
}

// op(A) not transposed: f32 (m, k) rows, or bf16 rows read as pairs of k. Full 14-row strips go
// through pack_strip_16x16; partial strips and the k tail through the generic packing.
template <bool kPairs>
void pack_a_avx512_14(const GemmParams& p, int64_t i0, int64_t rows, int64_t k0, int64_t kc, void* dst) {
  constexpr int kMr = 14;
  const bool simd = !p.trans_a && (kPairs ? p.a_dtype == DType::kBF16 : p.a_dtype == DType::kF32);
  auto generic = [&](int64_t r0, int64_t nrows, int64_t kk0, int64_t nk, uint32_t* d) {
    if constexpr (kPairs) gemm_detail::pack_a_pairs<kMr>(p, r0, nrows, kk0, nk, d);
    else gemm_detail::pack_a_f32<kMr>(p, r0, nrows, kk0, nk, d);
  };
  auto* out = static_cast<uint32_t*>(dst);
  if constexpr (kPairs) {
    if (p.trans_a && p.a_dtype == DType::kBF16) {
      // Stored (k, m) bf16: a k pair of a strip interleaves two rows' kMr consecutive elements
      // (vpunpck{l,h}wd, then the 128-bit halves put in order); an odd k's last pair pads 0.
      const auto* a = static_cast<const uint16_t*>(p.a);
      const int64_t kp = (kc + 1) / 2;
      for (int64_t s = 0; s < rows; s += kMr, out += kMr * kp) {
        const int mr = static_cast<int>(std::min<int64_t>(kMr, rows - s));
        const auto load_mask = static_cast<__mmask16>((1u << mr) - 1u);
        const uint16_t* src = a + k0 * p.lda + i0 + s;
        for (int64_t l2 = 0; l2 < kp; ++l2) {
          const __m256i r0 = _mm256_maskz_loadu_epi16(load_mask, src + 2 * l2 * p.lda);
          const __m256i r1 = 2 * l2 + 1 < kc ? _mm256_maskz_loadu_epi16(load_mask, src + (2 * l2 + 1) * p.lda)
                                             : _mm256_setzero_si256();
          const __m256i lo = _mm256_unpacklo_epi16(r0, r1), hi = _mm256_unpackhi_epi16(r0, r1);
          uint32_t* d = out + l2 * kMr;
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), _mm256_permute2x128_si256(lo, hi, 0x20));
          _mm256_mask_storeu_epi32(d + 8, static_cast<__mmask8>((1u << (kMr - 8)) - 1u),
                                   _mm256_permute2x128_si256(lo, hi, 0x31));
        }
      }
      return;
    }
  } else {
    if (p.trans_a && p.a_dtype == DType::kF32) {
      // Stored (k, m) (dY^T in a weight gradient): each k step of a strip is kMr consecutive
      // floats already, one masked load and store (the generic copy moved them one at a time).
      // Row by row: each stored row's `rows` floats are read left to right and dealt to the
      // strips, and the row two ahead is prefetched. Strip by strip instead, every k step jumped
      // to another row, lda floats on (6 KiB for the MLP's dY): beyond the reach of the hardware
      // prefetchers, every row a miss to DRAM.
      const auto* a = static_cast<const float*>(p.a);
      constexpr auto kStoreMask = static_cast<__mmask16>((1u << kMr) - 1u);
      const int64_t strips = (rows + kMr - 1) / kMr;
      if (strips == 0) return;
      const int last = static_cast<int>(rows - (strips - 1) * kMr);
      const auto last_mask = static_cast<__mmask16>((1u << last) - 1u);
      auto* d = reinterpret_cast<float*>(out);
      for (int64_t l = 0; l < kc; ++l) {
        const float* src = a + (k0 + l) * p.lda + i0;
        if (l + 2 < kc) gemm_detail::prefetch_row_ahead(src, p.lda, rows * 4);
        for (int64_t s = 0; s + 1 < strips; ++s)
          _mm512_mask_storeu_ps(d + (s * kc + l) * kMr, kStoreMask,
                                _mm512_maskz_loadu_ps(kStoreMask, src + s * kMr));
        _mm512_mask_storeu_ps(d + ((strips - 1) * kc + l) * kMr, kStoreMask,
                              _mm512_maskz_loadu_ps(last_mask, src + (strips - 1) * kMr));
      }
      return;
    }
  }
  if (!simd) return generic(i0, rows, k0, kc, out);
  const int64_t elem_bytes = kPairs ? 2 : 4;
  const int64_t steps = kPairs ? (kc + 1) / 2 : kc;  // 32-bit elements per row in the strip
  const int64_t full_pairs = kPairs ? kc / 2 : kc;   // those the SIMD path may read whole
  int64_t s = 0;
  for (; s + kMr <= rows; s += kMr, out += kMr * steps) {
    const char* src = static_cast<const char*>(p.a) + ((i0 + s) * p.lda + k0) * elem_bytes;
    const int64_t done = pack_strip_16x16<kMr>(src, p.lda * elem_bytes, full_pairs, out);
    if (done < steps) {
      const int64_t kd = kPairs ? 2 * done : done;
      generic(i0 + s, kMr, k0 + kd, kc - kd, out + done * kMr);
    }
  }
  if (s < rows) generic(i0 + s, rows - s, k0, kc, out);
}

// B stored (n, k) as rows of 32-bit words (an f32, or a bf16 pair of k): each full 32-column
// strip (strip_words words per column) is two 16 x 16 transposes per 16 words, where the generic
// packing moved one element at a time (W1b's 256 x 3072 x 768 forward GEMM, 1 thread, EPYC VM:
// the pack was 13% of kiln's time there). tail(t, done, dst) packs strip t's words from `done`
// on (the part not a multiple of 16, or not readable as whole words); returns the columns done.
template <class Tail>
int64_t pack_b_transposed_words(const char* rows, int64_t row_bytes, int64_t cols, int64_t readable,
                                int64_t strip_words, uint32_t* out, Tail&& tail) {
  constexpr int kNr = 32;
  int64_t t = 0;
  for (; t + kNr <= cols; t += kNr, out += kNr * strip_words, rows += kNr * row_bytes) {
    const int64_t done = pack_strip_16x16<16, kNr>(rows, row_bytes, readable, out);
    pack_strip_16x16<16, kNr>(rows + 16 * row_bytes, row_bytes, readable, out + 16);
    if (done < strip_words) tail(t, done, out + done * kNr);
  }
  return t;
}

// op(B) = f32: stored (n, k) (a Linear weight read as W^T, the forward pass's case) through
// pack_b_transposed_words; (k, n), bf16 and a partial last strip: the generic packing.
void pack_b_f32_avx512_32(const GemmParams& p, int64_t j0, int64_t cols, int64_t k0, int64_t kc, void* dst) {
  constexpr int kNr = 32;
  auto* out = static_cast<uint32_t*>(dst);
  if (!p.trans_b || p.b_dtype != DType::kF32) return gemm_detail::pack_b_f32<kNr>(p, j0, cols, k0, kc, out);
  const char* rows = static_cast<const char*>(p.b) + (j0 * p.ldb + k0) * 4;
  const int64_t t = pack_b_transposed_words(rows, p.ldb * 4, cols, kc, kc, out, [&](int64_t s, int64_t done, uint32_t* d) {
    gemm_detail::pack_b_f32<kNr>(p, j0 + s, kNr, k0 + done, kc - done, d);
  });
  if (t < cols) gemm_detail::pack_b_f32<kNr>(p, j0 + t, cols - t, k0, kc, out + t * kc);
}

// op(B) = bf16 into pairs of k: stored (k, n), rows 2 l2 and 2 l2 + 1 interleaved 16 bits at a
// time (vpunpck{l,h}wd + a qword permute), 32 columns per strip; stored (n, k), through
// pack_b_transposed_words; f32 B (rounded here) and the tails generic.
void pack_b_pairs_avx512_32(const GemmParams& p, int64_t j0, int64_t cols, int64_t k0, int64_t kc, void* dst) {
  constexpr int kNr = 32;
  auto* out = static_cast<uint32_t*>(dst);
  if (p.b_dtype != DType::kBF16) return gemm_detail::pack_b_pairs<kNr>(p, j0, cols, k0, kc, out);
  const int64_t kp = (kc + 1) / 2, full = kc / 2;
  if (p.trans_b) {
    // Stored (n, k) (a bf16 weight read as W^T): a pair of k is one 32-bit word of its row.
    const char* rows = static_cast<const char*>(p.b) + (j0 * p.ldb + k0) * 2;
    const int64_t t = pack_b_transposed_words(rows, p.ldb * 2, cols, full, kp, out, [&](int64_t s, int64_t done, uint32_t* d) {
      gemm_detail::pack_b_pairs<kNr>(p, j0 + s, kNr, k0 + 2 * done, kc - 2 * done, d);
    });
    if (t < cols) gemm_detail::pack_b_pairs<kNr>(p, j0 + t, cols - t, k0, kc, out + t * kp);
    return;
  }
  const auto* b = static_cast<const uint16_t*>(p.b);
  const __m512i lo_idx = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i hi_idx = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  int64_t t = 0;
  for (; t + kNr <= cols; t += kNr, out += kNr * kp) {
    for (int64_t l2 = 0; l2 < full; ++l2) {
      const uint16_t* r0 = b + (k0 + 2 * l2) * p.ldb + j0 + t;
      const __m512i a = _mm512_loadu_si512(r0), c = _mm512_loadu_si512(r0 + p.ldb);
      const __m512i lo = _mm512_unpacklo_epi16(a, c), hi = _mm512_unpackhi_epi16(a, c);
      _mm512_storeu_si512(out + l2 * kNr, _mm512_permutex2var_epi64(lo, lo_idx, hi));
      _mm512_storeu_si512(out + l2 * kNr + 16, _mm512_permutex2var_epi64(lo, hi_idx, hi));
    }
    if (kp > full) gemm_detail::pack_b_pairs<kNr>(p, j0 + t, kNr, k0 + 2 * full, kc - 2 * full, out + full * kNr);
  }
  if (t < cols) gemm_detail::pack_b_pairs<kNr>(p, j0 + t, cols - t, k0, kc, out);
}

// ---- decode-like small M with B stored (n, k) (Linear weights): dot products ---------------
// One step = one 64-byte line of each B row: 16 f32 (FMA) or 32 bf16 (vdpbf16ps, A in bf16 too).
struct DotF32 {
  using E = float;
  using Op = __m512;
  static constexpr int kElems = 16;
  static Op load(const E* p) { return _mm512_loadu_ps(p); }
  static Op load_n(const E* p, int n) { return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1u), p); }
  static __m512 dot(__m512 acc, Op a, Op b) { return _mm512_fmadd_ps(a, b, acc); }
};
struct DotBf16 {
  using E = uint16_t;
  using Op = __m512i;
  static constexpr int kElems = 32;
  static Op load(const E* p) { return _mm512_loadu_si512(p); }
  static Op load_n(const E* p, int n) { return _mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << n) - 1u), p); }
  static __m512 dot(__m512 acc, Op a, Op b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }
};

// The 16 lane sums of v[0..15] as one vector (lane q = sum of v[q]): three add stages over
// unpack/shuffle pairs, 45 instructions instead of 16 separate horizontal reductions. The loops
// are unrolled so the temporaries stay in registers: left as stack arrays, GCC 12 gave them the
// stack slot of the caller's `sums` and the second call overwrote the first's result.
[[gnu::always_inline]] inline __m512 reduce_16(const __m512* v) {
  __m512 x[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // per 128-bit block: [v2i, v2i+1, v2i, v2i+1] partials
    x[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  __m512 z[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // per 128-bit block: [v4i, v4i+1, v4i+2, v4i+3] partials
    const __m512d a = _mm512_castps_pd(x[2 * i]), b = _mm512_castps_pd(x[2 * i + 1]);
    z[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  __m512 w[2];
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)  // blocks: [z2i 0+1, z2i 2+3, z2i+1 0+1, z2i+1 2+3]
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(z[2 * i], z[2 * i + 1], 0x88), _mm512_shuffle_f32x4(z[2 * i], z[2 * i + 1], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xdd));
}

// out(M, J) = A(M, k) . B(J rows from b, k). While it streams, one line of each of the pf_rows
// rows at pf (ldb apart) is prefetched into L2 per line consumed, and with kNear > 0 its own
// rows kNear lines ahead into L1.
template <class D, int M, int J, int kNear>
void tb_group(const typename D::E* a, int64_t lda, int64_t k, const typename D::E* b, int64_t ldb,
              float* out, int64_t ldo, const typename D::E* pf, int pf_rows) {
  constexpr int L = D::kElems;
  __m512 acc[M * J];
#pragma GCC unroll 32
  for (int q = 0; q < M * J; ++q) acc[q] = _mm512_setzero_ps();
  const typename D::E* pfr[3 * J];  // pf_rows <= 3 J
  for (int r = 0; r < pf_rows; ++r) pfr[r] = pf + r * ldb;
  int64_t l = 0;
  for (; l + L <= k; l += L) {
    for (int r = 0; r < pf_rows; ++r) __builtin_prefetch(pfr[r] + l, 0, 2);
    if constexpr (kNear > 0) {
#pragma GCC unroll 8
      for (int j = 0; j < J; ++j) __builtin_prefetch(b + j * ldb + l + kNear * L, 0, 3);
    }
    typename D::Op bv[J];
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) bv[j] = D::load(b + j * ldb + l);
#pragma GCC unroll 8
    for (int i = 0; i < M; ++i) {
      typename D::Op av = D::load(a + i * lda + l);
      asm("" : "+v"(av));  // one load per A vector, not one folded into each of the J dots
#pragma GCC unroll 8
      for (int j = 0; j < J; ++j) acc[i * J + j] = D::dot(acc[i * J + j], av, bv[j]);
    }
  }
  if (l < k) {
    const int n = static_cast<int>(k - l);
    typename D::Op bv[J];
    for (int j = 0; j < J; ++j) bv[j] = D::load_n(b + j * ldb + l, n);
    for (int i = 0; i < M; ++i) {
      const typename D::Op av = D::load_n(a + i * lda + l, n);
      for (int j = 0; j < J; ++j) acc[i * J + j] = D::dot(acc[i * J + j], av, bv[j]);
    }
  }
  constexpr int kGroups = (M * J + 15) / 16;
  __m512 v[16 * kGroups];
#pragma GCC unroll 32
  for (int q = 0; q < 16 * kGroups; ++q) v[q] = q < M * J ? acc[q] : _mm512_setzero_ps();
  alignas(64) float sums[16 * kGroups];
#pragma GCC unroll 2
  for (int g = 0; g < kGroups; ++g) _mm512_store_ps(sums + 16 * g, reduce_16(v + 16 * g));
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < J; ++j) out[i * ldo + j] = sums[i * J + j];
}

// B rows j0..j1 in groups of J; as a group streams, the rows of the next kPfGroups groups are
// prefetched into L2 (one line per row per line consumed: each is one more sequential stream,
// and one core needs many in flight to approach the DRAM read rate). Measured on Zen 4 (1
// thread, K = N = 4096, cold, % of the DRAM read probe): next 1 / 2 / 3 / 4 groups gave f32
// M = 1 87 / 81 / 101 / - %, M = 4 81 / 88 / 91 / 74 %, bf16 M = 2 82 / 84 / 95 / - %, M = 4
// 74 / 73 / 91 / 91 %; starting 2 or 3 groups ahead instead of 1 was no better.
template <class D, int M>
void small_m_tb_avx512(const typename D::E* a, int64_t lda, const SmallMArgs& s, int64_t j0, int64_t j1, float* out) {
  using E = typename D::E;
  constexpr int J = M <= 3 ? 8 : M == 4 ? 6 : M <= 6 ? 4 : 3;  // M*J <= 24 accumulators
  constexpr int kLineWork = M * static_cast<int>(sizeof(float) / sizeof(E));
  constexpr int kNear = kLineWork >= 4 && kLineWork < 8 ? 4 : 0;
  constexpr int kPfGroups = 3;
  const E* b = static_cast<const E*>(s.b);
  const int64_t ldo = j1 - j0;
  int64_t j = j0;
  for (; j + J <= j1; j += J) {
    const int64_t p0 = j + J;
    const int pf_rows = static_cast<int>(std::clamp<int64_t>(j1 - p0, 0, kPfGroups * J));
    tb_group<D, M, J, kNear>(a, lda, s.k, b + j * s.ldb, s.ldb, out + (j - j0), ldo,
                             pf_rows > 0 ? b + p0 * s.ldb : nullptr, pf_rows);
  }
  for (; j < j1; ++j) tb_group<D, M, 1, 0>(a, lda, s.k, b + j * s.ldb, s.ldb, out + (j - j0), ldo, nullptr, 0);
}

template <class D>
void small_m_tb_dispatch(const typename D::E* a, int64_t lda, const SmallMArgs& s, int64_t j0, int64_t j1, float* out) {
  switch (s.m) {
    case 1: return small_m_tb_avx512<D, 1>(a, lda, s, j0, j1, out);
    case 2: return small_m_tb_avx512<D, 2>(a, lda, s, j0, j1, out);
    case 3: return small_m_tb_avx512<D, 3>(a, lda, s, j0, j1, out);
    case 4: return small_m_tb_avx512<D, 4>(a, lda, s, j0, j1, out);
    case 5: return small_m_tb_avx512<D, 5>(a, lda, s, j0, j1, out);
    case 6: return small_m_tb_avx512<D, 6>(a, lda, s, j0, j1, out);
    case 7: return small_m_tb_avx512<D, 7>(a, lda, s, j0, j1, out);
    case 8: return small_m_tb_avx512<D, 8>(a, lda, s, j0, j1, out);
    default: KILN_CHECK(s.m >= 1 && s.m <= 8);
  }
}

// Element ops of the small-M packed kernels (gemm_simd.h) for bf16 weights packed in pairs of
// k (pack_b_pairs_avx512_32): one element is two bf16 of consecutive k (the even k low), a
// vector 16 columns x 2 k, the dot one vdpbf16ps (A rounded to bf16 pairs likewise).
struct PackedBf16PairOps {
  using EA = uint32_t;
  using EW = uint32_t;
  using B = __m512i;
  static constexpr int kLanes = 16;
  static B load(const EW* p) { return _mm512_loadu_si512(p); }
  static B bcast(const EA* a) { return _mm512_set1_epi32(static_cast<int>(*a)); }
  static __m512 dot(__m512 acc, B a, B b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }
};

// B (n, k): the kernels above (bf16 B with AVX512_BF16: vdpbf16ps on a bf16 copy of A);
// B (k, n), or bf16 without AVX512_BF16: the shared templates (bf16 widened to f32).
void small_m_avx512(const SmallMArgs& s, int64_t j0, int64_t j1, float* out) {
  if (s.trans_b && s.k > 0) {
    if (s.b_dtype == DType::kF32) return small_m_tb_dispatch<DotF32>(s.a, s.lda, s, j0, j1, out);
    if (s.a16 && cpu_features().avx512_bf16) return small_m_tb_dispatch<DotBf16>(s.a16, s.lda16, s, j0, j1, out);
  }
  gemm_detail::small_m<V512>(s, j0, j1, out);
}

GemmTargetKernels make_kernels() {
  using namespace gemm_detail;
  GemmTargetKernels k;
  k.f32 = {"avx512 14x32 micro-kernel", 14, 32, 1, &pack_a_avx512_14<false>, &pack_b_f32_avx512_32,
           &micro_kernel_f32<V512, 14, 2>, &micro_kernel_f32_direct<V512, 14, 2>, DType::kF32};
  k.bf16_f32 = k.f32;
  k.bf16_f32.kernel_direct_a = nullptr;  // bf16 A is widened while packing here
  k.bf16_f32.name = "avx512 14x32 micro-kernel, bf16 widened to f32 in packing";
  if (cpu_features().avx512_bf16) {
    k.bf16 = {"avx512_bf16 dpbf16ps 14x32 micro-kernel (pairs-of-k packing)", 14, 32, 2,
              &pack_a_avx512_14<true>, &pack_b_pairs_avx512_32, &micro_kernel_bf16_14x32,
              &micro_kernel_bf16_14x32_direct, DType::kBF16};
  } else {
    k.bf16 = k.bf16_f32;
  }
  k.bf16_amx = amx_bf16_path();  // its B strips are the vdpbf16ps path's (32 pairs per step)
  if (k.bf16_amx.kernel) k.bf16_amx.pack_b = &pack_b_pairs_avx512_32;
  k.small_m_name = cpu_features().avx512_bf16
                       ? "avx512 small-M (m<=8) streaming kernel, B unpacked (bf16 B (n, k): vdpbf16ps)"
                       : "avx512 small-M (m<=8) streaming kernel, B unpacked";
  k.small_m = &small_m_avx512;
  k.small_m_packed = &small_m_packed<V512, PackedF32Ops<V512>, 2>;
  if (cpu_features().avx512_bf16) k.small_m_packed_pairs = &small_m_packed<V512, PackedBf16PairOps, 2>;
  k.f16 = {"avx512 14x32 micro-kernel, f16 weights widened in registers", 14, 32, 1,
           &pack_a_avx512_14<false>, &pack_b_half<32>, &micro_kernel_f32<V512, 14, 2, uint16_t>,
           nullptr, DType::kF32, 2};
  k.small_m_packed_half = &small_m_packed<V512, PackedHalfOps<V512>, 2>;
  k.epilogue_rows = &epilogue_rows<V512>;
  // 24 accumulators each (32 zmm: the B vectors and a broadcast take the rest).
  k.f32_other_tiles = {
      {"avx512 12x32", 12, 32, 1, &pack_a_f32<12>, &pack_b_f32<32>, &micro_kernel_f32<V512, 12, 2>},
      {"avx512 8x48", 8, 48, 1, &pack_a_f32<8>, &pack_b_f32<48>, &micro_kernel_f32<V512, 8, 3>},
      {"avx512 6x64", 6, 64, 1, &pack_a_f32<6>, &pack_b_f32<64>, &micro_kernel_f32<V512, 6, 4>}};
  return k;
}

}  // namespace

const GemmTargetKernels& gemm_kernels_avx512() {
  static const GemmTargetKernels k = make_kernels();
  return k;
}

}  // namespace kiln::cpu
