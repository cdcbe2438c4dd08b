// AVX2 f32 reduction kernels of the collectives (reduce_kernels.h): 8 lanes, unaligned loads,
// the scalar kernel for the tail so the results match it bit for bit.
#include <immintrin.h>

#include "kiln/comm/reduce_kernels.h"

namespace kiln::comm::detail {

void combine_f32_avx2(ReduceOp op, float* dst, const float* a, const float* b, size_t n) {
  size_t i = 0;
  if (op == ReduceOp::kMax) {
    const __m256 qnan = _mm256_set1_ps(__builtin_nanf(""));
    for (; i + 8 <= n; i += 8) {
      const __m256 x = _mm256_loadu_ps(a + i), y = _mm256_loadu_ps(b + i);
      // Equal values (+0 / -0 included): the AND of their bits; then the larger; then NaN.
      __m256 r = _mm256_and_ps(x, y);
      r = _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, y, _CMP_GT_OQ));
      r = _mm256_blendv_ps(r, y, _mm256_cmp_ps(y, x, _CMP_GT_OQ));
      r = _mm256_blendv_ps(r, qnan, _mm256_cmp_ps(x, y, _CMP_UNORD_Q));
      _mm256_storeu_ps(dst + i, r);
    }
  } else {
    for (; i + 16 <= n; i += 16) {
      const __m256 s0 = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
      const __m256 s1 = _mm256_add_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8));
      _mm256_storeu_ps(dst + i, s0);
      _mm256_storeu_ps(dst + i + 8, s1);
    }
  }
  if (i < n) combine_f32_scalar(op, dst + i, a + i, b + i, n - i);
}

void divide_f32_avx2(float* x, size_t n, float d) {
  const __m256 dv = _mm256_set1_ps(d);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_loadu_ps(x + i), dv));
  if (i < n) divide_f32_scalar(x + i, n - i, d);
}

}  // namespace kiln::comm::detail
