// The one kernel test harness (in the spirit of ggml's test-backend-ops): every fast kernel
// in kernels/cpu is run against its scalar twin in kernels/reference over many shapes (odd
// sizes included), every SIMD target this CPU supports and several thread counts; backward
// kernels are also checked against central finite differences.
//
// Adding a kernel means adding its cases: in a file tests/kernels/cases_<family>.cpp write
//   KILN_KERNEL_CASES(my_family) { std::vector<KernelCase> cases; ...; return cases; }
// and/or KILN_GRAD_CASES(my_family) { ... return std::vector<GradCase>{...}; }
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kiln/core/rng.h"

namespace kiln::testing {

// One output to compare: the fast kernel's values against the reference's.
// Passes when the normalized MSE  sum((a-e)^2) / sum(e^2)  is at most max_nmse. Choose
// max_nmse from the dtype's unit roundoff u and the reduction length (see harness.cpp notes).
struct Compare {
  std::string what;
  std::vector<float> expected;  // reference
  std::vector<float> actual;    // fast kernel
  double max_nmse;
};

// Fills the padding columns [cols, ld) of strided outputs before a kernel runs; a kernel that
// writes there is wrong.
inline constexpr float kPaddingSentinel = 7.25f;

// Compares the first `cols` of each of `rows` rows (leading dimension ld) of the reference and
// fast outputs, and requires the fast output's padding columns to still hold kPaddingSentinel.
std::vector<Compare> compare_strided(const std::string& what, const std::vector<float>& expected,
                                     const std::vector<float>& actual, int64_t rows, int64_t cols, int64_t ld,
                                     double max_nmse);

struct KernelCase {
  std::string name;  // shapes and variant, e.g. "m=7 n=33 k=257 ta=0 tb=1"
  // Runs the fast kernel (under the harness's SIMD target and thread count) and the reference
  // on the same inputs; returns what to compare. Must be deterministic for a given case.
  std::function<std::vector<Compare>()> run;
};

// A backward kernel against central differences of a scalar loss L(x) = <dy, f(x)> (dy fixed
// and random). `loss` evaluates in double if it can; `grad` returns dL/dx from the backward
// kernel. The harness probes `num_probes` random coordinates.
struct GradCase {
  std::string name;
  std::vector<float> x;
  std::function<double(const std::vector<float>& x)> loss;
  std::function<std::vector<float>(const std::vector<float>& x)> grad;
  double rel_tol = 2e-2;  // |fd - g| <= rel_tol * max(|fd|, scale) + abs_tol
  double abs_tol = 1e-4;
  int num_probes = 24;
  double step = 1e-3;     // relative finite-difference step
};

using KernelCaseFactory = std::vector<KernelCase> (*)();
using GradCaseFactory = std::vector<GradCase> (*)();

bool register_kernel_cases(const char* family, KernelCaseFactory factory);
bool register_grad_cases(const char* family, GradCaseFactory factory);

// Helpers for writing cases.
std::vector<float> random_vector(Rng& rng, size_t n, float lo = -1.0f, float hi = 1.0f);
double dot(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace kiln::testing

#define KILN_KERNEL_CASES(family)                                                          \
  static std::vector<::kiln::testing::KernelCase> kiln_kernel_cases_##family();            \
  [[maybe_unused]] static const bool kiln_kernel_cases_registered_##family =               \
      ::kiln::testing::register_kernel_cases(#family, &kiln_kernel_cases_##family);        \
  static std::vector<::kiln::testing::KernelCase> kiln_kernel_cases_##family()

#define KILN_GRAD_CASES(family)                                                            \
  static std::vector<::kiln::testing::GradCase> kiln_grad_cases_##family();                \
  [[maybe_unused]] static const bool kiln_grad_cases_registered_##family =                 \
      ::kiln::testing::register_grad_cases(#family, &kiln_grad_cases_##family);            \
  static std::vector<::kiln::testing::GradCase> kiln_grad_cases_##family()
