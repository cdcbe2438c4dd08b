// AVX2 GEMM kernels: the 6x16 f32 micro-kernel (12 ymm accumulators, two B vectors and one A
// broadcast per k), bf16 inputs widened to f32 while packing, and the small-M kernels.
#include <immintrin.h>

#include "kiln/kernels/cpu/gemm_simd.h"

namespace kiln::cpu {
namespace {

struct V256 {
  using T = __m256;
  static constexpr int kLanes = 8;
  static __m256i mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static T load_half(const uint16_t* p) {  // 8 IEEE halves widened (F16C vcvtph2ps)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static T loadu(const float* p) { return _mm256_loadu_ps(p); }
  static T loadu(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static T load_n(const float* p, int n) {
    return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask(n));
  }
  static T load_n(const uint16_t* p, int n) {
    if (n >= 8) return loadu(p);
    alignas(16) uint16_t tmp[8] = {};
    for (int i = 0; i < n; ++i) tmp[i] = p[i];
    return loadu(tmp);
  }
  static void store_n(float* p, T x, int n) {
    if (n >= 8) _mm256_storeu_ps(p, x);
    else _mm256_maskstore_ps(p, mask(n), x);
  }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T div(T a, T b) { return _mm256_div_ps(a, b); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static float reduce_add(T a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  using Vec = avx2::Vec;  // vec.h: the epilogue's activations
};

// ---- SIMD packing (f32): 8 x 8 transposes instead of element-by-element copies --------------
// Transposes r[0..7] (8 rows of 8 floats) in place: afterwards r[q] holds element q of every
// row. Unpack ps, shuffle ps, then the 128-bit halves exchanged.
[[gnu::always_inline]] inline void transpose_8x8(__m256 (&r)[8]) {
  __m256 t[8], u[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// kRows (<= 8) rows, row_stride floats apart, transposed 8 k at a time: dst[q * kStride + i] =
// row i's element q, for q in [0, count) rounded down to 8; returns how many were done.
template <int kRows, int kStride>
int64_t pack_rows_8x8(const float* src, int64_t row_stride, int64_t count, float* dst) {
  const __m256i store_mask = V256::mask(kRows);
  int64_t q = 0;
  for (; q + 8 <= count; q += 8) {
    __m256 r[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) r[i] = i < kRows ? _mm256_loadu_ps(src + i * row_stride + q) : _mm256_setzero_ps();
    transpose_8x8(r);
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      if constexpr (kRows == 8) _mm256_storeu_ps(dst + (q + c) * kStride, r[c]);
      else _mm256_maskstore_ps(dst + (q + c) * kStride, store_mask, r[c]);
    }
  }
  return q;
}

// op(A) f32: stored (m, k), full 6-row strips transposed 8 k at a time; stored (k, m), each k
// step's 6 consecutive floats one masked load and store. bf16, partial strips, tails: generic.
void pack_a_avx2_6(const GemmParams& p, int64_t i0, int64_t rows, int64_t k0, int64_t kc, void* dst) {
  constexpr int kMr = 6;
  auto* out = static_cast<float*>(dst);
  if (p.a_dtype != DType::kF32) return gemm_detail::pack_a_f32<kMr>(p, i0, rows, k0, kc, out);
  const auto* a = static_cast<const float*>(p.a);
  if (p.trans_a) {
    // Row by row, the row two ahead prefetched (gemm_avx512.cpp's pack_a_avx512_14 says why).
    const __m256i store_mask = V256::mask(kMr);
    const int64_t strips = (rows + kMr - 1) / kMr;
    if (strips == 0) return;
    const __m256i last_mask = V256::mask(static_cast<int>(rows - (strips - 1) * kMr));
    for (int64_t l = 0; l < kc; ++l) {
      const float* src = a + (k0 + l) * p.lda + i0;
      if (l + 2 < kc) gemm_detail::prefetch_row_ahead(src, p.lda, rows * 4);
      for (int64_t s = 0; s + 1 < strips; ++s)
        _mm256_maskstore_ps(out + (s * kc + l) * kMr, store_mask,
                            _mm256_maskload_ps(src + s * kMr, store_mask));
      _mm256_maskstore_ps(out + ((strips - 1) * kc + l) * kMr, store_mask,
                          _mm256_maskload_ps(src + (strips - 1) * kMr, last_mask));
    }
    return;
  }
  int64_t s = 0;
  for (; s + kMr <= rows; s += kMr, out += kMr * kc) {
    const int64_t done = pack_rows_8x8<kMr, kMr>(a + (i0 + s) * p.lda + k0, p.lda, kc, out);
    if (done < kc) gemm_detail::pack_a_f32<kMr>(p, i0 + s, kMr, k0 + done, kc - done, out + done * kMr);
  }
  if (s < rows) gemm_detail::pack_a_f32<kMr>(p, i0 + s, rows - s, k0, kc, out);
}

// op(B) f32 stored (n, k) (a Linear weight read as W^T): each 16-column strip is two 8 x 8
// transposes per 8 k. Not transposed (rows copied as they are), bf16, partial strips and the k
// tail: generic.
void pack_b_avx2_16(const GemmParams& p, int64_t j0, int64_t cols, int64_t k0, int64_t kc, void* dst) {
  constexpr int kNr = 16;
  auto* out = static_cast<float*>(dst);
  if (!p.trans_b || p.b_dtype != DType::kF32) return gemm_detail::pack_b_f32<kNr>(p, j0, cols, k0, kc, out);
  const auto* b = static_cast<const float*>(p.b);
  int64_t t = 0;
  for (; t + kNr <= cols; t += kNr, out += kNr * kc) {
    const float* rows = b + (j0 + t) * p.ldb + k0;
    const int64_t done = pack_rows_8x8<8, kNr>(rows, p.ldb, kc, out);
    pack_rows_8x8<8, kNr>(rows + 8 * p.ldb, p.ldb, kc, out + 8);
    if (done < kc) gemm_detail::pack_b_f32<kNr>(p, j0 + t, kNr, k0 + done, kc - done, out + done * kNr);
  }
  if (t < cols) gemm_detail::pack_b_f32<kNr>(p, j0 + t, cols - t, k0, kc, out);
}

GemmTargetKernels make_kernels() {
  using namespace gemm_detail;
  GemmTargetKernels k;
  k.f32 = {"avx2 6x16 micro-kernel", 6, 16, 1, &pack_a_avx2_6, &pack_b_avx2_16, &micro_kernel_f32<V256, 6, 2>};
  // 12 accumulators each, as 6x16 (16 ymm).
  k.f32_other_tiles = {
      {"avx2 4x24", 4, 24, 1, &pack_a_f32<4>, &pack_b_f32<24>, &micro_kernel_f32<V256, 4, 3>},
      {"avx2 3x32", 3, 32, 1, &pack_a_f32<3>, &pack_b_f32<32>, &micro_kernel_f32<V256, 3, 4>}};
  k.bf16 = k.f32;
  k.bf16.name = "avx2 6x16 micro-kernel, bf16 widened to f32 in packing";
  k.bf16_f32 = k.bf16;
  k.small_m_name = "avx2 small-M (m<=8) streaming kernel, B unpacked";
  k.small_m = &small_m<V256>;
  k.small_m_packed = &small_m_packed<V256, PackedF32Ops<V256>, 2>;
  k.f16 = {"avx2 6x16 micro-kernel, f16 weights widened in registers", 6, 16, 1, &pack_a_avx2_6,
           &pack_b_half<16>, &micro_kernel_f32<V256, 6, 2, uint16_t>, nullptr, DType::kF32, 2};
  k.small_m_packed_half = &small_m_packed<V256, PackedHalfOps<V256>, 2>;
  k.epilogue_rows = &epilogue_rows<V256>;
  return k;
}

}  // namespace

const GemmTargetKernels& gemm_kernels_avx2() {
  static const GemmTargetKernels k = make_kernels();
  return k;
}

}  // namespace kiln::cpu
