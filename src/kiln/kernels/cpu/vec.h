// A tiny fp32 SIMD vector for the fast non-GEMM kernels, written once and compiled per target:
// the including file's flags pick the width (*_avx512.cpp: 16 lanes, *_avx2.cpp: 8, else 1) and
// the namespace kiln::cpu::{avx512,avx2,scalar}, so the three copies never collide (ODR).
// Also vectorized exp / exp2 / tanh / sigmoid (polynomial; accuracy stated next to each).
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define KILN_VEC_TARGET avx512
#define KILN_VEC_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define KILN_VEC_TARGET avx2
#define KILN_VEC_AVX2 1
#else
#define KILN_VEC_TARGET scalar
#define KILN_VEC_SCALAR 1
#endif

namespace kiln::cpu::KILN_VEC_TARGET {

#if defined(KILN_VEC_AVX512)
// ---- AVX-512: 16 lanes ----------------------------------------------------------------------
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
// GCC 12's AVX-512 intrinsics seed results with _mm512_undefined_ps(), which GCC itself then
// reports as -Wmaybe-uninitialized once inlined (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
inline constexpr int kLanes = 16;
using Mask = __mmask16;

struct Vec {
  __m512 v;
  static Vec zero() { return {_mm512_setzero_ps()}; }
  static Vec set1(float x) { return {_mm512_set1_ps(x)}; }
  // Loads `lanes` (1..kLanes) floats; the lanes past them read as `fill` and touch no memory.
  static Vec load(const float* p, int lanes = kLanes, float fill = 0.0f) {
    if (lanes == kLanes) return {_mm512_loadu_ps(p)};
    const Mask m = static_cast<Mask>((1u << lanes) - 1u);
    return {_mm512_mask_loadu_ps(_mm512_set1_ps(fill), m, p)};
  }
  // Stores the first `lanes` lanes; memory past them is not touched.
  void store(float* p, int lanes = kLanes) const {
    if (lanes == kLanes) {
      _mm512_storeu_ps(p, v);
    } else {
      _mm512_mask_storeu_ps(p, static_cast<Mask>((1u << lanes) - 1u), v);
    }
  }
};
inline Vec operator+(Vec a, Vec b) {
  return {_mm512_add_ps(a.v, b.v)};
}
inline Vec operator-(Vec a, Vec b) {
  return {_mm512_sub_ps(a.v, b.v)};
}
inline Vec operator*(Vec a, Vec b) {
  return {_mm512_mul_ps(a.v, b.v)};
}
inline Vec operator/(Vec a, Vec b) {
  return {_mm512_div_ps(a.v, b.v)};
}
inline Vec fmadd(Vec a, Vec b, Vec c) {
  return {_mm512_fmadd_ps(a.v, b.v, c.v)};
}  // a*b + c
inline Vec fnmadd(Vec a, Vec b, Vec c) {
  return {_mm512_fnmadd_ps(a.v, b.v, c.v)};
}  // c - a*b
inline Vec max(Vec a, Vec b) {
  return {_mm512_max_ps(a.v, b.v)};
}
inline Vec min(Vec a, Vec b) {
  return {_mm512_min_ps(a.v, b.v)};
}
inline Vec abs(Vec a) {
  return {_mm512_abs_ps(a.v)};
}
inline Vec sqrt(Vec a) {
  return {_mm512_sqrt_ps(a.v)};
}
inline Mask less(Vec a, Vec b) {
  return _mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ);
}
inline Mask is_nan(Vec a) {
  return _mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q);
}
inline Vec select(Mask m, Vec a, Vec b) {
  return {_mm512_mask_blend_ps(m, b.v, a.v)};
}  // m ? a : b
inline float reduce_add(Vec a) {
  return _mm512_reduce_add_ps(a.v);
}
inline float reduce_max(Vec a) {
  return _mm512_reduce_max_ps(a.v);
}
inline Vec round_nearest(Vec a) {
  return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
// 2^n for integral n in [-126, 127].
inline Vec pow2i(Vec n) {
  const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(e, 23))};
}

#elif defined(KILN_VEC_AVX2)
// ---- AVX2 + FMA: 8 lanes --------------------------------------------------------------------
inline constexpr int kLanes = 8;
using Mask = __m256;  // all-ones lanes where true

// Sliding window: loading 8 ints at kTailMaskTable + 8 - n gives n all-ones lanes, then zeros.
inline constexpr int32_t kTailMaskTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                               0,  0,  0,  0,  0,  0,  0,  0};
inline __m256i tail_mask(int lanes) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTailMaskTable + 8 - lanes));
}

struct Vec {
  __m256 v;
  static Vec zero() { return {_mm256_setzero_ps()}; }
  static Vec set1(float x) { return {_mm256_set1_ps(x)}; }
  static Vec load(const float* p, int lanes = kLanes, float fill = 0.0f) {
    if (lanes == kLanes) return {_mm256_loadu_ps(p)};
    const __m256i m = tail_mask(lanes);
    const __m256 x = _mm256_maskload_ps(p, m);  // masked lanes read 0 and never fault
    return {_mm256_blendv_ps(_mm256_set1_ps(fill), x, _mm256_castsi256_ps(m))};
  }
  void store(float* p, int lanes = kLanes) const {
    if (lanes == kLanes) {
      _mm256_storeu_ps(p, v);
    } else {
      _mm256_maskstore_ps(p, tail_mask(lanes), v);
    }
  }
};
inline Vec operator+(Vec a, Vec b) {
  return {_mm256_add_ps(a.v, b.v)};
}
inline Vec operator-(Vec a, Vec b) {
  return {_mm256_sub_ps(a.v, b.v)};
}
inline Vec operator*(Vec a, Vec b) {
  return {_mm256_mul_ps(a.v, b.v)};
}
inline Vec operator/(Vec a, Vec b) {
  return {_mm256_div_ps(a.v, b.v)};
}
inline Vec fmadd(Vec a, Vec b, Vec c) {
  return {_mm256_fmadd_ps(a.v, b.v, c.v)};
}
inline Vec fnmadd(Vec a, Vec b, Vec c) {
  return {_mm256_fnmadd_ps(a.v, b.v, c.v)};
}
inline Vec max(Vec a, Vec b) {
  return {_mm256_max_ps(a.v, b.v)};
}
inline Vec min(Vec a, Vec b) {
  return {_mm256_min_ps(a.v, b.v)};
}
inline Vec abs(Vec a) {
  return {_mm256_andnot_ps(_mm256_set1_ps(-0.0f), a.v)};
}
inline Vec sqrt(Vec a) {
  return {_mm256_sqrt_ps(a.v)};
}
inline Mask less(Vec a, Vec b) {
  return _mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ);
}
inline Mask is_nan(Vec a) {
  return _mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q);
}
inline Vec select(Mask m, Vec a, Vec b) {
  return {_mm256_blendv_ps(b.v, a.v, m)};
}
inline float reduce_add(Vec a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
inline float reduce_max(Vec a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
inline Vec round_nearest(Vec a) {
  return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
inline Vec pow2i(Vec n) {
  const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n.v), _mm256_set1_epi32(127));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(e, 23))};
}

#else
// ---- scalar: 1 lane (baseline x86-64, no FMA: fmadd is a rounded multiply then add) --------
inline constexpr int kLanes = 1;
using Mask = bool;

struct Vec {
  float v;
  static Vec zero() { return {0.0f}; }
  static Vec set1(float x) { return {x}; }
  static Vec load(const float* p, int lanes = kLanes, float fill = 0.0f) {
    return {lanes >= 1 ? *p : fill};
  }
  void store(float* p, int lanes = kLanes) const {
    if (lanes >= 1) *p = v;
  }
};
inline Vec operator+(Vec a, Vec b) {
  return {a.v + b.v};
}
inline Vec operator-(Vec a, Vec b) {
  return {a.v - b.v};
}
inline Vec operator*(Vec a, Vec b) {
  return {a.v * b.v};
}
inline Vec operator/(Vec a, Vec b) {
  return {a.v / b.v};
}
inline Vec fmadd(Vec a, Vec b, Vec c) {
  return {a.v * b.v + c.v};
}
inline Vec fnmadd(Vec a, Vec b, Vec c) {
  return {c.v - a.v * b.v};
}
inline Vec max(Vec a, Vec b) {
  return {a.v > b.v ? a.v : b.v};
}
inline Vec min(Vec a, Vec b) {
  return {a.v < b.v ? a.v : b.v};
}
inline Vec abs(Vec a) {
  return {fabsf(a.v)};
}
inline Vec sqrt(Vec a) {
  return {sqrtf(a.v)};
}
inline Mask less(Vec a, Vec b) {
  return a.v < b.v;
}
inline Mask is_nan(Vec a) {
  return a.v != a.v;
}
inline Vec select(Mask m, Vec a, Vec b) {
  return m ? a : b;
}
inline float reduce_add(Vec a) {
  return a.v;
}
inline float reduce_max(Vec a) {
  return a.v;
}
// Round-to-nearest-even by the 1.5·2^23 trick (|a| < 2^22; exact under the default rounding
// mode without -ffast-math, which kiln never uses; needs no SSE4.1).
inline Vec round_nearest(Vec a) {
  const float big = 12582912.0f;
  return {(a.v + big) - big};
}
inline Vec pow2i(Vec n) {
  const int32_t bits = (static_cast<int32_t>(n.v) + 127) << 23;
  float f;
  memcpy(&f, &bits, sizeof f);
  return {f};
}
#endif

// ---- shared by every target -----------------------------------------------------------------
inline Vec operator-(Vec a) {
  return Vec::zero() - a;
}

// Calls f(i, lanes) for i = 0, kLanes, 2·kLanes, ... < n; every call has lanes == kLanes except
// possibly the last (the tail), so the main loop inlines with full-width loads and stores.
template <class F>
inline void for_each_vec(int64_t n, F&& f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) f(i, kLanes);
  if (i < n) f(i, static_cast<int>(n - i));
}

// e^x: Cody–Waite reduction x = n·ln2 + r (|r| <= ln2/2) and Cephes' expf polynomial (degree 7
// with the leading 1 + r): max error 1.3 ulp over [-87.3, 88.3] on every target (measured
// against double exp by tests/kernels/cases_elementwise.cpp, which asserts <= 2). x > 88.376 gives
// +inf (true overflow is at 88.72), x < -87.33 gives 0, NaN gives NaN.
// No step makes a subnormal, not even in lanes whose result is then replaced by 0: x is clamped
// to -87.33 (n = -126, r = +0.0065, so p·2^n >= 2^-126), not to ln(2^-126) = -87.3365, where
// rounding left r < 0 and p·2^-126 subnormal. On Intel cores every subnormal result costs a
// microcode assist (~100+ cycles): the clamped lanes are the masked scores (−inf) of every causal
// attention tile, and with the old bound the flash forward at T = 256 spent 37% of its time in
// the softmax, 16% with this one (same tile, same values: the e^x in [-87.3365, -87.33) that
// now flush to 0 are below 1.0066·2^-126). tests/kernels/cases_elementwise.cpp checks MXCSR's
// underflow flag stays clear.
inline Vec exp(Vec x) {
  const Vec hi = Vec::set1(88.3762626647949f), lo = Vec::set1(-87.33f);
  const Mask under = less(x, lo), over = less(hi, x), nan = is_nan(x);
  const Vec xc = min(max(x, lo), hi);
  const Vec n = round_nearest(xc * Vec::set1(1.44269504088896341f));  // x·log2(e)
  Vec r = fnmadd(n, Vec::set1(0.693359375f), xc);                     // ln2 = 0.693359375
  r = fnmadd(n, Vec::set1(-2.12194440e-4f), r);                       //     - 2.12194440e-4
  Vec p = Vec::set1(1.9875691500e-4f);
  p = fmadd(p, r, Vec::set1(1.3981999507e-3f));
  p = fmadd(p, r, Vec::set1(8.3334519073e-3f));
  p = fmadd(p, r, Vec::set1(4.1665795894e-2f));
  p = fmadd(p, r, Vec::set1(1.6666665459e-1f));
  p = fmadd(p, r, Vec::set1(5.0000001201e-1f));
  p = fmadd(p, r * r, r + Vec::set1(1.0f));
  Vec y = p * pow2i(n);
  y = select(under, Vec::zero(), y);
  y = select(over, Vec::set1(INFINITY), y);
  return select(nan, x, y);
}

// 2^f for |f| <= 1/2: the Taylor polynomial of e^(f·ln 2), degree 7 (truncation below 6e-9
// relative). Shared by exp2 and the flash kernels' softmax exponent (attention_flash_impl.inc's
// exp2_scores, exp2 without the overflow lanes).
inline Vec exp2_fraction(Vec f) {
  Vec p = Vec::set1(1.5252733804059840e-5f);  // (ln 2)^7 / 7!, ..., ln 2, 1
  p = fmadd(p, f, Vec::set1(1.5403530393381609e-4f));
  p = fmadd(p, f, Vec::set1(1.3333558146428443e-3f));
  p = fmadd(p, f, Vec::set1(9.6181291076284772e-3f));
  p = fmadd(p, f, Vec::set1(5.5504108664821580e-2f));
  p = fmadd(p, f, Vec::set1(2.4022650695910071e-1f));
  p = fmadd(p, f, Vec::set1(6.9314718055994531e-1f));
  return fmadd(p, f, Vec::set1(1.0f));
}
// 2^x: x = n + f with n = round(x), |f| <= 1/2, 2^f by exp2_fraction: max error 1.1 ulp over
// [-126, 127.4] on every target (tests/kernels/cases_elementwise.cpp asserts <= 2), 21 vector
// instructions against exp's 24 (no two-step ln 2 reduction). x < -126 gives 0, x > 127.49 gives
// +inf (true overflow is at 128), NaN gives NaN. As in exp, x is clamped to -126 first
// (n >= -126, 2^f >= 1 there), so no step makes a subnormal.
inline Vec exp2(Vec x) {
  const Vec lo = Vec::set1(-126.0f), hi = Vec::set1(127.49f);
  const Mask under = less(x, lo), over = less(hi, x), nan = is_nan(x);
  const Vec xc = min(max(x, lo), hi);
  const Vec n = round_nearest(xc);
  Vec y = exp2_fraction(xc - n) * pow2i(n);
  y = select(under, Vec::zero(), y);
  y = select(over, Vec::set1(INFINITY), y);
  return select(nan, x, y);
}

// 1 / (1 + e^-x): exp's error plus one rounded add and divide, within 3 ulp.
inline Vec sigmoid(Vec x) {
  const Vec one = Vec::set1(1.0f);
  return one / (one + exp(-x));
}

// tanh: |x| < 0.625 by Cephes' tanhf odd polynomial x + x³·P(x²); otherwise
// sign(x)·(1 - 2/(e^{2|x|} + 1)), which cancels at most one bit near 0.625. Max error 1.3 ulp
// over [-10, 10] (measured by the same test, which asserts <= 2). NaN gives NaN.
inline Vec tanh(Vec x) {
  const Vec ax = abs(x), one = Vec::set1(1.0f);
  const Vec z = x * x;
  Vec p = Vec::set1(-5.70498872745e-3f);
  p = fmadd(p, z, Vec::set1(2.06390887954e-2f));
  p = fmadd(p, z, Vec::set1(-5.37397155531e-2f));
  p = fmadd(p, z, Vec::set1(1.33314422036e-1f));
  p = fmadd(p, z, Vec::set1(-3.33332819422e-1f));
  const Vec small = fmadd(p * z, x, x);
  Vec big = one - Vec::set1(2.0f) / (exp(ax + ax) + one);
  big = select(less(x, Vec::zero()), -big, big);
  return select(less(ax, Vec::set1(0.625f)), small, big);
}

// ---- activations and their derivatives: the elementwise kernels (ops_impl.inc) and the GEMM
// epilogue (gemm_simd.h) evaluate them with these same instructions, so an activation fused
// into a GEMM gives bitwise what the GEMM and then the kernel give.
inline constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float kGeluA = 0.044715f;

// s = sigmoid(x) and 1 - s, the latter as e·s (e = e^-x) rather than by subtraction, which
// would cancel to few correct bits where s is close to 1 (the derivatives need it there).
// e is capped at FLT_MAX so that e·s stays finite (≈ 1 · s) where e^-x overflows.
inline void sigmoid_pair(Vec x, Vec* s, Vec* one_minus_s) {
  const Vec e = min(exp(-x), Vec::set1(3.4028234663852886e38f));
  *s = Vec::set1(1.0f) / (Vec::set1(1.0f) + e);
  *one_minus_s = e * *s;
}

// gelu(x) = 0.5·x·(1 + tanh(u)), u = c·(x + a·x³), evaluated as x·sigmoid(2u) (the same
// function: 0.5·(1 + tanh(u)) = sigmoid(2u)) which does not cancel for negative x.
inline Vec gelu(Vec x) {
  return x * sigmoid(Vec::set1(2.0f * kGeluC) * fmadd(Vec::set1(kGeluA) * x, x * x, x));
}

// d gelu/dx = s + 2·x·s·(1 - s)·u', s = sigmoid(2u), u' = c·(1 + 3a·x²)
// (from 1 - tanh²(u) = 4·s·(1 - s)).
inline Vec gelu_grad(Vec x) {
  const Vec x2 = x * x;
  Vec s, oms;
  sigmoid_pair(Vec::set1(2.0f * kGeluC) * fmadd(Vec::set1(kGeluA) * x, x2, x), &s, &oms);
  const Vec du = Vec::set1(kGeluC) * fmadd(Vec::set1(3.0f * kGeluA), x2, Vec::set1(1.0f));
  return fmadd(Vec::set1(2.0f) * x * s * oms, du, s);
}

inline Vec silu(Vec x) {
  return x * sigmoid(x);
}

// d silu/dx = s·(1 + x·(1 - s)), s = sigmoid(x).
inline Vec silu_grad(Vec x) {
  Vec s, oms;
  sigmoid_pair(x, &s, &oms);
  return s * fmadd(x, oms, Vec::set1(1.0f));
}

inline Vec relu(Vec x) {
  return max(x, Vec::zero());
}

// 1 where x > 0, else 0 (NaN gives 0).
inline Vec relu_grad(Vec x) {
  return select(less(Vec::zero(), x), Vec::set1(1.0f), Vec::zero());
}

}  // namespace kiln::cpu::KILN_VEC_TARGET
