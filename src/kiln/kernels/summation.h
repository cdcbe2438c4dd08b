// Summation of n floats four ways — naive (recursive), pairwise, Kahan (compensated) and
// Neumaier (improved Kahan) — with the running state held in an fp32 or a bf16 accumulator, as
// kiln::ref (strict sequential order, the theory's algorithms) and kiln::cpu (SIMD lanes and
// threads, same bounds). Error bounds, with u the accumulator's unit roundoff and S1 = Σ|x_i|:
//   naive    |ŝ - s| <= (n-1)·u·S1          pairwise <= ceil(log2 n)·u·S1 (ref; cpu: + leaf)
//   Kahan    |ŝ - s| <= (2u + O(n·u²))·S1    Neumaier same, and exact on e.g. [1, 2^60, 1, -2^60]
// (a bf16 accumulator rounds the first term too: one more u). The compensated bounds need
// n·u << 1 for the second-order term: Kahan (c fed back every step) holds to n ~ 1/u² (bf16:
// ~1e5), while Neumaier's c — a plain running sum of the lost parts — stagnates like a naive sum
// once n·u >~ 1 (measured: bf16 from n ~ 3e3, f32 at n = 1e8 on uniform [0,1) values).
// `kiln bench numerics` measures them against an exact (double-double) sum as n grows.
#pragma once

#include <cstdint>
#include <string_view>

#include "kiln/core/dtype.h"
#include "kiln/kernels/op_cost.h"

namespace kiln {

enum class SumMethod : uint8_t { kNaive, kPairwise, kKahan, kNeumaier, kCount };
inline constexpr SumMethod kSumMethods[] = {SumMethod::kNaive, SumMethod::kPairwise,
                                            SumMethod::kKahan, SumMethod::kNeumaier};
inline constexpr std::string_view kSumMethodNames[] = {"naive", "pairwise", "kahan", "neumaier"};
static_assert(std::size(kSumMethodNames) == static_cast<size_t>(SumMethod::kCount));
constexpr std::string_view sum_method_name(SumMethod m) { return kSumMethodNames[static_cast<size_t>(m)]; }

// n reads; one add per element (naive, pairwise), four (Kahan), four plus a compare (Neumaier).
constexpr OpCost sum_cost(SumMethod m, int64_t n) {
  const double flops_per = m == SumMethod::kKahan || m == SumMethod::kNeumaier ? 4.0 : 1.0;
  return {flops_per * n, 4.0 * n};
}

// The accumulator: kF32, or kBF16 (every stored partial sum / compensation rounded to bf16 to
// nearest even after an f32 add — a bf16 register fed by an fp32 adder). Inputs are f32.
inline float round_accum(float v, DType accum) {
  return accum == DType::kBF16 ? bf16_to_f32(f32_to_bf16(v)) : v;
}

// Running state of a sequential sum (naive, Kahan, Neumaier): feed chunks, read the value.
// Continuing from a state gives bit-for-bit the result of one call over the concatenation.
struct SumState {
  float s = 0.0f;  // running sum
  float c = 0.0f;  // compensation: Kahan's -(lost low part); Neumaier's +(lost low part)
};

namespace ref {
// The algorithms exactly as written in the textbooks (Higham, "Accuracy and Stability of
// Numerical Algorithms", ch. 4): one element at a time, left to right; pairwise splits at n/2
// down to single elements. accum: kF32 or kBF16.
float sum(const float* x, int64_t n, SumMethod method, DType accum);
// Continues a sequential method (not pairwise) over x[0, n).
void sum_continue(SumState& state, const float* x, int64_t n, SumMethod method, DType accum);
float sum_value(const SumState& state, SumMethod method, DType accum);

// The reference for measuring errors: the sum in double-double (TwoSum), rounded to double.
// Relative error <= 2^-53 + n·2^-105·S1/|s|: exact for every practical purpose here.
struct ExactSum {
  double hi = 0.0, lo = 0.0;
  void add(const float* x, int64_t n);
  double value() const { return hi + lo; }
};
double sum_exact(const float* x, int64_t n);
}  // namespace ref

namespace cpu {
// Same contract; f32 accumulators run SIMD lanes (vec.h) over fixed 64K-element blocks spread
// over threads (the result does not depend on the thread count). Bounds: naive and Kahan as
// ref; pairwise <= (log2 n + kPairwiseLeafPerLane)·u·S1. bf16 accumulators have no fast path
// (every add rounds; they exist to be measured) and run the reference.
inline constexpr int64_t kPairwiseLeafPerLane = 32;
float sum(const float* x, int64_t n, SumMethod method, DType accum);
}  // namespace cpu

KILN_SAME_SIGNATURE(sum);

}  // namespace kiln
