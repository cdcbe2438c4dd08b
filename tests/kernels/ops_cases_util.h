// Shared pieces of the non-GEMM kernel cases (cases_norm.cpp, cases_softmax.cpp, ...): the
// shape lists, the tolerances and why, and small helpers.
//
// Tolerances are normalized MSE bounds (harness.h: sum((a-e)^2) / sum(e^2)); fp32 unit
// roundoff u = 2^-24 ≈ 6e-8, so an output correct to r ulp (rms) has nmse ≈ (r·u)² = r²·3.6e-15.
//  * kTolElementwise 1e-12: elementwise ops (add, RoPE, AdamW, SIMD exp/sigmoid at ≤ 4 ulp, so
//    nmse ≤ ~6e-14) — a margin of ~20x, while one wrong element of 1000 gives > 1e-7.
//  * kTolReduction 1e-10: rows reduced in fp32 (norms, softmax, dot products; lengths ≤ 50257):
//    a length-k fp32 sum has typical relative error ~sqrt(k)·u (≤ 1.3e-5 at k = 50257, nmse
//    ≤ 2e-10 in the very worst row; ≤ 4e-12 at k = 1000), and the reference sums in double.
//  * kTolLongReduction 1e-9: cross-entropy, whose loss log-sum-exp over up to 50257 logits in
//    lane-wise fp32 partial sums may lose ~sqrt(V)·u relative.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <vector>

#include "tests/kernels/harness.h"

namespace kiln::testing {

inline constexpr int64_t kCaseRows[] = {1, 3, 17, 64};
inline constexpr int64_t kCaseCols[] = {1, 7, 33, 65, 257, 768, 1000};

inline constexpr double kTolElementwise = 1e-12;
inline constexpr double kTolReduction = 1e-10;
inline constexpr double kTolLongReduction = 1e-9;

inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// <dy, y> in double: the scalar loss of a gradient case.
inline double dot_d(const std::vector<float>& dy, const std::vector<double>& y) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += dy[i] * y[i];
  return s;
}

}  // namespace kiln::testing
