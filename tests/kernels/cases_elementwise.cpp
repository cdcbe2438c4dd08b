// Elementwise helper cases (add, scale, accumulate, add_bias and its backward, exp, exp2 and tanh
// arrays) for the kernel harness, plus the accuracy of the SIMD exp and tanh in ulp on every
// supported target, the numbers stated in src/kiln/kernels/cpu/vec.h.
#include <gtest/gtest.h>
#include <xmmintrin.h>

#include <cfloat>

#include <cmath>

#include "kiln/core/cpu_features.h"
#include "kiln/kernels/elementwise.h"
#include "tests/kernels/ops_cases_util.h"

namespace kiln::testing {
namespace {

// |a - e| in units of the fp32 ulp at e (e rounded to fp32 from the exact double value).
double ulp_error(float a, double exact) {
  const float e = static_cast<float>(exact);
  if (a == e) return 0;
  const float next = std::nextafter(std::fabs(e), INFINITY);
  return std::fabs(static_cast<double>(a) - exact) / (static_cast<double>(next) - std::fabs(e));
}

// Max ulp error of `fn` against `exact` over a dense sweep of [lo, hi].
double max_ulp(void (*fn)(float*, const float*, int64_t), double (*exact)(double), float lo,
               float hi, float* worst_x) {
  const int64_t n = 400003;  // odd: every target's tail path runs too
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) x[i] = lo + (hi - lo) * static_cast<float>(i) / (n - 1);
  fn(y.data(), x.data(), n);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double err = ulp_error(y[i], exact(x[i]));
    if (err > worst) {
      worst = err;
      *worst_x = x[i];
    }
  }
  return worst;
}

}  // namespace

KILN_KERNEL_CASES(elementwise) {
  std::vector<KernelCase> cases;
  for (int64_t rows : kCaseRows) {
    for (int64_t cols : kCaseCols) {
      const int64_t n = rows * cols;
      cases.push_back(
          {fmt::format("rows={} cols={}", rows, cols), [n, rows, cols] {
             Rng rng(900 + n);
             const std::vector<float> a = random_vector(rng, n, -3.0f, 3.0f);
             const std::vector<float> b = random_vector(rng, n, -3.0f, 3.0f);
             std::vector<Compare> out;
             std::vector<float> e(n), c(n, NAN);
             ref::add(e.data(), a.data(), b.data(), n);
             cpu::add(c.data(), a.data(), b.data(), n);
             out.push_back({"add", e, c, 0.0});  // one rounding, same on every target: exact
             ref::scale(e.data(), a.data(), 0.37f, n);
             cpu::scale(c.data(), a.data(), 0.37f, n);
             out.push_back({"scale", e, c, 0.0});
             e = b;
             c = b;
             ref::accumulate(e.data(), a.data(), n);
             cpu::accumulate(c.data(), a.data(), n);
             out.push_back({"accumulate", e, c, 0.0});
             const std::vector<float> bias = random_vector(rng, cols);
             ref::add_bias(e.data(), a.data(), bias.data(), rows, cols);
             cpu::add_bias(c.data(), a.data(), bias.data(), rows, cols);
             out.push_back({"add_bias", e, c, 0.0});
             std::vector<float> db_ref = bias, db = bias;  // += onto a nonzero gradient
             ref::bias_backward(db_ref.data(), a.data(), rows, cols);
             cpu::bias_backward(db.data(), a.data(), rows, cols);
             out.push_back({"bias_backward", db_ref, db, 0.0});  // the same sums in the same order
             ref::exp_array(e.data(), a.data(), n);
             cpu::exp_array(c.data(), a.data(), n);
             out.push_back({"exp", e, c, kTolElementwise});
             ref::exp2_array(e.data(), a.data(), n);
             cpu::exp2_array(c.data(), a.data(), n);
             out.push_back({"exp2", e, c, kTolElementwise});
             ref::tanh_array(e.data(), a.data(), n);
             cpu::tanh_array(c.data(), a.data(), n);
             out.push_back({"tanh", e, c, kTolElementwise});
             return out;
           }});
    }
  }
  cases.push_back({"exp edges", [] {  // overflow to inf: see SimdMath.ExpEdges
                     const std::vector<float> x = {-INFINITY, -1000.0f, -87.0f, -20.0f, -1e-30f,
                                                   0.0f,      1e-30f,   0.5f,   20.0f,  88.0f};
                     std::vector<float> e(x.size()), c(x.size(), NAN);
                     ref::exp_array(e.data(), x.data(), static_cast<int64_t>(x.size()));
                     cpu::exp_array(c.data(), x.data(), static_cast<int64_t>(x.size()));
                     return std::vector<Compare>{{"exp", e, c, kTolElementwise}};
                   }});
  cases.push_back({"exp2 edges", [] {
                     const std::vector<float> x = {-INFINITY, -1000.0f, -126.0f, -125.7f,
                                                   -20.0f,    -1e-30f,  0.0f,    1e-30f,
                                                   0.5f,      20.0f,    127.0f};
                     std::vector<float> e(x.size()), c(x.size(), NAN);
                     ref::exp2_array(e.data(), x.data(), static_cast<int64_t>(x.size()));
                     cpu::exp2_array(c.data(), x.data(), static_cast<int64_t>(x.size()));
                     return std::vector<Compare>{{"exp2", e, c, kTolElementwise}};
                   }});
  return cases;
}

// The accuracy claims of cpu/vec.h: exp within 2 ulp on [-87.3, 88.3], tanh within 2 ulp on
// [-10, 10], on every SIMD target this CPU has (measured: 1.3 ulp for both).
TEST(SimdMath, ExpAndTanhUlpError) {
  const SimdTarget saved = active_simd_target();
  for (const auto& info : kSimdTargets) {
    if (!set_simd_target(info.target)) continue;
    float wx = 0, wt = 0;
    const double exp_ulp = max_ulp(
        &cpu::exp_array, [](double x) { return std::exp(x); }, -87.3f, 88.3f, &wx);
    const double tanh_ulp = max_ulp(
        &cpu::tanh_array, [](double x) { return std::tanh(x); }, -10.0f, 10.0f, &wt);
    float w2 = 0;
    const double exp2_ulp = max_ulp(
        &cpu::exp2_array, [](double x) { return std::exp2(x); }, -126.0f, 127.4f, &w2);
    EXPECT_LE(exp2_ulp, 2.0) << info.name << " exp2 worst at x=" << w2;
    RecordProperty(std::string(info.name) + "_exp2_max_ulp", fmt::format("{:.2f}", exp2_ulp));
    std::printf("  %-7s exp2 max %.2f ulp (x=%g)\n", std::string(info.name).c_str(), exp2_ulp, w2);
    EXPECT_LE(exp_ulp, 2.0) << info.name << " worst at x=" << wx;
    EXPECT_LE(tanh_ulp, 2.0) << info.name << " worst at x=" << wt;
    RecordProperty(std::string(info.name) + "_exp_max_ulp", fmt::format("{:.2f}", exp_ulp));
    RecordProperty(std::string(info.name) + "_tanh_max_ulp", fmt::format("{:.2f}", tanh_ulp));
    std::printf("  %-7s exp max %.2f ulp (x=%g), tanh max %.2f ulp (x=%g)\n",
                std::string(info.name).c_str(), exp_ulp, wx, tanh_ulp, wt);
  }
  set_simd_target(saved);
}

// The SIMD exp makes no subnormal on the way, even in lanes it then sets to 0 (vec.h: each costs
// a microcode assist on Intel): over inputs at and below its underflow bound, -inf included (the
// masked attention scores), MXCSR's underflow flag stays clear, on every target.
TEST(SimdMath, ExpMakesNoSubnormal) {
  const SimdTarget saved = active_simd_target();
  std::vector<float> x = {-INFINITY, -1000.0f, -104.0f, -88.0f, -87.3365448f, -87.3365f, -87.336f, -87.331f, -87.33f};
  for (float v = -87.4f; v < -87.2f; v += 0.001f) x.push_back(v);
  for (const auto& info : kSimdTargets) {
    if (!set_simd_target(info.target)) continue;
    std::vector<float> e(x.size());
    _mm_setcsr(_mm_getcsr() & ~0x3Fu);  // clear the exception flags
    cpu::exp_array(e.data(), x.data(), static_cast<int64_t>(x.size()));
    const unsigned flags = _mm_getcsr();
    EXPECT_EQ(flags & 0x10u, 0u) << info.name << ": a step underflowed (a subnormal result)";
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_TRUE(e[i] == 0.0f || e[i] >= FLT_MIN) << info.name << " x=" << x[i] << " e=" << e[i];
    // exp2 at and below its bound of -126 (2^-126 is FLT_MIN), in steps of 1/512.
    std::vector<float> x2 = {-INFINITY, -1000.0f, -150.0f, -127.0f};
    for (float v = -126.6f; v < -125.4f; v += 1.0f / 512) x2.push_back(v);
    std::vector<float> e2(x2.size());
    _mm_setcsr(_mm_getcsr() & ~0x3Fu);
    cpu::exp2_array(e2.data(), x2.data(), static_cast<int64_t>(x2.size()));
    EXPECT_EQ(_mm_getcsr() & 0x10u, 0u) << info.name << ": an exp2 step underflowed";
    for (size_t i = 0; i < x2.size(); ++i)
      EXPECT_TRUE(e2[i] == 0.0f || e2[i] >= FLT_MIN)
          << info.name << " x=" << x2[i] << " 2^x=" << e2[i];
  }
  set_simd_target(saved);
}

// Overflow, underflow and NaN of the SIMD exp and tanh, on every target.
TEST(SimdMath, ExpEdges) {
  const SimdTarget saved = active_simd_target();
  const std::vector<float> x = {-INFINITY, -1000.0f, -88.0f, 89.0f, 1000.0f, INFINITY, NAN};
  for (const auto& info : kSimdTargets) {
    if (!set_simd_target(info.target)) continue;
    std::vector<float> e(x.size()), t(x.size());
    cpu::exp_array(e.data(), x.data(), static_cast<int64_t>(x.size()));
    cpu::tanh_array(t.data(), x.data(), static_cast<int64_t>(x.size()));
    EXPECT_EQ(e[0], 0.0f) << info.name;
    EXPECT_EQ(e[1], 0.0f) << info.name;
    EXPECT_EQ(e[2], 0.0f) << info.name;  // e^-88 is subnormal: flushed to 0 (documented)
    EXPECT_EQ(e[3], INFINITY) << info.name;
    EXPECT_EQ(e[4], INFINITY) << info.name;
    EXPECT_EQ(e[5], INFINITY) << info.name;
    EXPECT_TRUE(std::isnan(e[6])) << info.name;
    EXPECT_EQ(t[0], -1.0f) << info.name;
    EXPECT_EQ(t[1], -1.0f) << info.name;
    EXPECT_EQ(t[4], 1.0f) << info.name;
    EXPECT_EQ(t[5], 1.0f) << info.name;
    EXPECT_TRUE(std::isnan(t[6])) << info.name;
    std::vector<float> e2(x.size());
    cpu::exp2_array(e2.data(), x.data(), static_cast<int64_t>(x.size()));
    EXPECT_EQ(e2[0], 0.0f) << info.name;
    EXPECT_EQ(e2[1], 0.0f) << info.name;
    EXPECT_EQ(e2[2], std::exp2f(-88.0f)) << info.name;
    EXPECT_EQ(e2[4], INFINITY) << info.name;
    EXPECT_EQ(e2[5], INFINITY) << info.name;
    EXPECT_TRUE(std::isnan(e2[6])) << info.name;
  }
  set_simd_target(saved);
}

}  // namespace kiln::testing
