// Summation kernels (summation.h) against the theory: each method's error against the exact
// (double-double) sum stays inside its bound — naive (n-1)·u·S1, pairwise ceil(log2 n)·u·S1,
// Kahan / Neumaier (2u + O(n·u²))·S1 — on adversarial and random inputs, fp32 and bf16
// accumulators, ref and cpu on every SIMD target; plus the cases where the methods differ.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kiln/core/cpu_features.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/summation.h"

namespace kiln {
namespace {

// Unit roundoff of the accumulator; bf16 partial sums come from an f32 add rounded again to
// bf16, so their per-add relative error is at most u_bf16 + u_f32 (+ a negligible product).
double unit_roundoff(DType accum) {
  const double uf = std::ldexp(1.0, -24);
  return accum == DType::kBF16 ? std::ldexp(1.0, -8) + uf * 1.01 : uf;
}

// The bound on |ŝ - s| / S1 from the theory (Higham ch. 4), or a negative number where the
// first-order bound says nothing (n·u >= 1/2).
double bound_over_s1(SumMethod m, DType accum, int64_t n, bool cpu) {
  const double u = unit_roundoff(accum), uf = std::ldexp(1.0, -24);
  const double dn = static_cast<double>(n);
  const auto gamma = [&](double k) { return k * u < 0.5 ? k * u / (1 - k * u) : -1.0; };
  const double log2n = n > 1 ? std::ceil(std::log2(dn)) : 0.0;
  const bool fast_f32 = cpu && accum == DType::kF32;
  // A bf16 accumulator also rounds the first term it stores: one more rounding on every path.
  const double extra = accum == DType::kBF16 ? 1.0 : 0.0;
  switch (m) {
    case SumMethod::kNaive: return gamma(dn - 1 + extra);
    case SumMethod::kPairwise:
      return gamma((fast_f32 ? log2n + static_cast<double>(cpu::kPairwiseLeafPerLane) : log2n) + extra);
    case SumMethod::kNeumaier:
      // Neumaier's c is a plain running sum of the lost parts: the first-order analysis needs
      // n·u small (with n·u >~ 1 every term is lost and c stagnates like a naive sum; the bench
      // shows it in bf16 from n ~ 1e3 and in f32 at n = 1e8).
      if (dn * u > 0.1) return -1.0;
      [[fallthrough]];
    default: {
      // (2u + O(n u²))·S1, constant 4 on the second-order term; the fast path combines its
      // lanes and blocks in double and rounds once more at the end (+u). A bf16 accumulator
      // also rounds each f32-computed input correction (+2·u_f32).
      const double second = 4 * dn * u * u;
      return (fast_f32 ? 3 * u : 2 * u) + second + (accum == DType::kBF16 ? 2 * uf : 0.0);
    }
  }
}

double abs_sum(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += std::fabs(static_cast<double>(v));
  return s;
}

std::vector<float> make_input(const char* kind, int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) {
    if (std::string_view(kind) == "uniform") {
      v = rng.uniform();
    } else if (std::string_view(kind) == "normal") {
      v = rng.normal();
    } else {  // "mixed": random signs, magnitudes spread over 2^-20 .. 2^20
      v = std::ldexp(rng.uniform(0.5f, 1.0f), static_cast<int>(rng.below(41)) - 20) *
          (rng.below(2) ? -1.0f : 1.0f);
    }
  }
  return x;
}

using SumFn = float (*)(const float*, int64_t, SumMethod, DType);

// Checks every method and accumulator of `fn` against its bound on x.
void check_bounds(const std::vector<float>& x, SumFn fn, bool cpu, const std::string& what) {
  const int64_t n = static_cast<int64_t>(x.size());
  const double exact = ref::sum_exact(x.data(), n), s1 = abs_sum(x);
  for (DType accum : {DType::kF32, DType::kBF16}) {
    for (SumMethod m : kSumMethods) {
      const double b = bound_over_s1(m, accum, n, cpu);
      if (b < 0) continue;
      const double got = fn(x.data(), n, m, accum);
      EXPECT_LE(std::fabs(got - exact), b * s1)
          << what << " " << sum_method_name(m) << " " << dtype_name(accum) << " n=" << n
          << " got " << got << " exact " << exact;
    }
  }
}

const int64_t kSizes[] = {1, 2, 3, 17, 255, 1000, 4097, 65537, 300001};

TEST(Summation, RefWithinTheoreticalBoundsOnRandomInputs) {
  for (const char* kind : {"uniform", "normal", "mixed"})
    for (int64_t n : kSizes) check_bounds(make_input(kind, n, 11 + n), ref::sum, false, kind);
}

TEST(Summation, CpuWithinTheoreticalBoundsOnEveryTarget) {
  const SimdTarget saved = active_simd_target();
  for (const auto& info : kSimdTargets) {
    if (!set_simd_target(info.target)) continue;
    for (const char* kind : {"uniform", "normal", "mixed"}) {
      for (int64_t n : kSizes) {
        check_bounds(make_input(kind, n, 11 + n), cpu::sum, true,
                     fmt::format("{} {}", info.name, kind));
      }
    }
  }
  ASSERT_TRUE(set_simd_target(saved));
}

// 1 followed by n-1 copies of u = 2^-24: each naive add is a tie that rounds back to 1, so
// naive loses everything the bound allows, (n-1)·u; pairwise adds the small ones to each other
// first and Kahan / Neumaier carry them in the compensation: within 2u.
TEST(Summation, AdversarialNaiveAttainsItsBound) {
  const int64_t n = 4097;
  std::vector<float> x(n, std::ldexp(1.0f, -24));
  x[0] = 1.0f;
  const double exact = ref::sum_exact(x.data(), n), s1 = abs_sum(x);
  const double u = std::ldexp(1.0, -24);
  const double naive = ref::sum(x.data(), n, SumMethod::kNaive, DType::kF32);
  EXPECT_EQ(naive, 1.0);
  EXPECT_GT(std::fabs(naive - exact), 0.99 * (n - 1) * u * s1 / (1 + (n - 1) * u));
  EXPECT_LE(std::fabs(naive - exact), (n - 1) * u * s1);
  for (SumMethod m : {SumMethod::kPairwise, SumMethod::kKahan, SumMethod::kNeumaier}) {
    const double err = std::fabs(ref::sum(x.data(), n, m, DType::kF32) - exact);
    EXPECT_LE(err, 2 * u * s1) << sum_method_name(m);  // pairwise loses one u in its first pair
    EXPECT_LT(1000 * err, std::fabs(naive - exact)) << sum_method_name(m);
  }
  check_bounds(x, ref::sum, false, "adversarial");
  check_bounds(x, cpu::sum, true, "adversarial");
}

// Kahan's correction fails when a term is larger than the running sum; Neumaier's does not.
TEST(Summation, NeumaierHandlesTermsLargerThanTheSum) {
  const float big = std::ldexp(1.0f, 60);  // exact in f32 and bf16
  const std::vector<float> x = {1.0f, big, 1.0f, -big};  // exact sum 2
  EXPECT_EQ(ref::sum(x.data(), 4, SumMethod::kNaive, DType::kF32), 0.0f);
  EXPECT_EQ(ref::sum(x.data(), 4, SumMethod::kKahan, DType::kF32), 0.0f);
  EXPECT_EQ(ref::sum(x.data(), 4, SumMethod::kNeumaier, DType::kF32), 2.0f);
  EXPECT_EQ(cpu::sum(x.data(), 4, SumMethod::kNeumaier, DType::kF32), 2.0f);
  EXPECT_EQ(ref::sum(x.data(), 4, SumMethod::kNeumaier, DType::kBF16), 2.0f);
}

// What the bench shows, asserted at n = 1e5 uniform [0, 1): bf16 naive stagnates (the sum stops
// growing once u·s exceeds the terms); pairwise and Kahan keep bf16 useful (Kahan while
// n·u² << 1, n << 65536·few); Neumaier does not: its compensation c is itself a naive bf16 sum
// of the lost terms, and with n·u >> 1 every term is lost, so c stagnates too. In f32 the
// compensated sums are at the accuracy of the final rounding, far below naive.
TEST(Summation, AccumulatorPrecisionMattersAtLargeN) {
  const int64_t n = 100000;
  const std::vector<float> x = make_input("uniform", n, 5);
  const double exact = ref::sum_exact(x.data(), n);
  const auto rel = [&](SumMethod m, DType a) {
    return std::fabs(ref::sum(x.data(), n, m, a) - exact) / exact;
  };
  EXPECT_GT(rel(SumMethod::kNaive, DType::kBF16), 0.9);
  EXPECT_LT(rel(SumMethod::kPairwise, DType::kBF16), 0.02);
  EXPECT_LT(rel(SumMethod::kKahan, DType::kBF16), 0.01);
  EXPECT_GT(rel(SumMethod::kNeumaier, DType::kBF16), 0.5);
  EXPECT_GT(rel(SumMethod::kNaive, DType::kF32), 10 * rel(SumMethod::kKahan, DType::kF32));
  EXPECT_LE(rel(SumMethod::kKahan, DType::kF32), std::ldexp(1.0, -24) * 1.01);
  EXPECT_LE(rel(SumMethod::kNeumaier, DType::kF32), std::ldexp(1.0, -24) * 1.01);
}

TEST(Summation, ChunkedContinuationEqualsOneCall) {
  const std::vector<float> x = make_input("mixed", 10007, 3);
  for (DType accum : {DType::kF32, DType::kBF16}) {
    for (SumMethod m : {SumMethod::kNaive, SumMethod::kKahan, SumMethod::kNeumaier}) {
      SumState st;
      for (int64_t i = 0; i < 10007; i += 1000)
        ref::sum_continue(st, x.data() + i, std::min<int64_t>(1000, 10007 - i), m, accum);
      EXPECT_EQ(ref::sum_value(st, m, accum), ref::sum(x.data(), 10007, m, accum)) << sum_method_name(m);
    }
  }
}

// The double-double reference is exact on values that are multiples of 2^-24 (the exact sum is
// an integer count of 2^-24 below 2^53).
TEST(Summation, ExactReferenceIsExact) {
  const std::vector<float> x = make_input("uniform", 200000, 9);
  int64_t ticks = 0;
  for (float v : x) ticks += static_cast<int64_t>(std::ldexp(static_cast<double>(v), 24));
  EXPECT_EQ(ref::sum_exact(x.data(), 200000), std::ldexp(static_cast<double>(ticks), -24));
  const std::vector<float> y = {1e20f, 1.0f, -1e20f, 1.0f};
  EXPECT_EQ(ref::sum_exact(y.data(), 4), 2.0);
}

TEST(Summation, CpuResultDoesNotDependOnThreads) {
  const std::vector<float> x = make_input("normal", 500001, 4);
  const int saved = num_threads();
  for (SumMethod m : kSumMethods) {
    set_num_threads(1);
    const float one = cpu::sum(x.data(), 500001, m, DType::kF32);
    set_num_threads(2);
    EXPECT_EQ(cpu::sum(x.data(), 500001, m, DType::kF32), one) << sum_method_name(m);
  }
  set_num_threads(saved);
}

}  // namespace
}  // namespace kiln
