// AVX-512 GEMM kernels: the 14x32 f32 micro-kernel (28 zmm accumulators, two B vectors per k,
// A broadcast from memory into the FMAs), the AVX512_BF16 14x32 micro-kernel on pairs-of-k
// packing (vdpbf16ps: two bf16 products per f32 lane per instruction), and the small-M kernels.
#include <immintrin.h>

#include "kiln/core/cpu_features.h"
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
  // e^x: x = n ln2 + r, |r| <= ln2/2, degree-6 Taylor polynomial for e^r (rel. error ~2e-7),
  // then scalef by 2^n. Inputs are clamped to the range where the result is a normal float.
  static T exp(T x) {
    x = _mm512_min_ps(_mm512_max_ps(x, set1(-87.3f)), set1(88.3f));
    const T n = _mm512_roundscale_ps(_mm512_mul_ps(x, set1(1.4426950408889634f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    T r = _mm512_fnmadd_ps(n, set1(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, set1(1.4286068203094172e-06f), r);
    T q = set1(1.0f / 720);
    q = fmadd(q, r, set1(1.0f / 120));
    q = fmadd(q, r, set1(1.0f / 24));
    q = fmadd(q, r, set1(1.0f / 6));
    q = fmadd(q, r, set1(0.5f));
    q = fmadd(q, r, set1(1.0f));
    q = fmadd(q, r, set1(1.0f));
    return _mm512_scalef_ps(q, n);
  }
};

// 14 x 32 over bf16 pairs: per k pair, two B vectors (16 columns x 2 k each) and 14 broadcast A
// pairs feed 28 vdpbf16ps, each adding two products into every f32 lane.
void micro_kernel_bf16_14x32(int64_t steps, const void* a_packed, const void* b_packed, float* c,
                             int64_t ldc, int m, int n, const TileEpilogue& ep) {
  constexpr int kMr = 14;
  const uint32_t* a = static_cast<const uint32_t*>(a_packed);
  const uint32_t* b = static_cast<const uint32_t*>(b_packed);
  for (int i = 0; i < m; ++i) {  // C tile: fetched during the k loop (see micro_kernel_f32)
    __builtin_prefetch(c + i * ldc, 1, 3);
    __builtin_prefetch(c + i * ldc + 31, 1, 3);
  }
  __m512 acc[kMr][2];
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t l = 0; l < steps; ++l) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + 16);
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[i]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], av, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], av, b1);
    }
    a += kMr;
    b += 32;
  }
  gemm_detail::store_tile<V512, kMr, 2>(acc, c, ldc, m, n, ep);
}

GemmTargetKernels make_kernels() {
  using namespace gemm_detail;
  GemmTargetKernels k;
  k.f32 = {"avx512 14x32 micro-kernel", 14, 32, 1, &pack_a_f32<14>, &pack_b_f32<32>,
           &micro_kernel_f32<V512, 14, 2>};
  if (cpu_features().avx512_bf16) {
    k.bf16 = {"avx512_bf16 dpbf16ps 14x32 micro-kernel (pairs-of-k packing)", 14, 32, 2,
              &pack_a_pairs<14>, &pack_b_pairs<32>, &micro_kernel_bf16_14x32};
  } else {
    k.bf16 = k.f32;
    k.bf16.name = "avx512 14x32 micro-kernel, bf16 widened to f32 in packing";
  }
  k.small_m_name = "avx512 small-M (m<=8) streaming kernel, B unpacked";
  k.small_m = &small_m<V512>;
  k.epilogue_rows = &epilogue_rows<V512>;
  return k;
}

}  // namespace

const GemmTargetKernels& gemm_kernels_avx512() {
  static const GemmTargetKernels k = make_kernels();
  return k;
}

}  // namespace kiln::cpu
