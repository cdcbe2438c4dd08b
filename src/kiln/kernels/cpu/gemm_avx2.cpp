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
  // e^x as in the AVX-512 target; 2^n is built in the exponent field.
  static T exp(T x) {
    x = _mm256_min_ps(_mm256_max_ps(x, set1(-87.3f)), set1(88.3f));
    const T n = _mm256_round_ps(_mm256_mul_ps(x, set1(1.4426950408889634f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    T r = _mm256_fnmadd_ps(n, set1(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, set1(1.4286068203094172e-06f), r);
    T q = set1(1.0f / 720);
    q = fmadd(q, r, set1(1.0f / 120));
    q = fmadd(q, r, set1(1.0f / 24));
    q = fmadd(q, r, set1(1.0f / 6));
    q = fmadd(q, r, set1(0.5f));
    q = fmadd(q, r, set1(1.0f));
    q = fmadd(q, r, set1(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(q, _mm256_castsi256_ps(e));
  }
};

GemmTargetKernels make_kernels() {
  using namespace gemm_detail;
  GemmTargetKernels k;
  k.f32 = {"avx2 6x16 micro-kernel", 6, 16, 1, &pack_a_f32<6>, &pack_b_f32<16>,
           &micro_kernel_f32<V256, 6, 2>};
  k.bf16 = k.f32;
  k.bf16.name = "avx2 6x16 micro-kernel, bf16 widened to f32 in packing";
  k.bf16_f32 = k.bf16;
  k.small_m_name = "avx2 small-M (m<=8) streaming kernel, B unpacked";
  k.small_m = &small_m<V256>;
  k.small_m_packed = &small_m_packed<V256, PackedF32Ops<V256>, 2>;
  k.f16 = {"avx2 6x16 micro-kernel, f16 weights widened in registers", 6, 16, 1, &pack_a_f32<6>,
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
