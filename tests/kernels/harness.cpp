// Harness driver: registers one GoogleTest per (family, SIMD target) for kernel cases and one
// per family for gradient cases, then runs them all. Thread counts 1, 2 and 3 are covered
// inside each test (3 > cores checks uneven splits).
//
// Tolerance notes: a length-k fp32 dot product has a worst-case relative error of about k·u
// (u = 2^-24) and a typical one of about sqrt(k)·u, so its nmse is ~k·u²; cases use a bound
// one or two orders above that to stay robust across summation orders. bf16 inputs carry
// u = 2^-8 from rounding each input: nmse ~ 2·u² ≈ 3e-5 before accumulation.
#include "tests/kernels/harness.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "kiln/core/cpu_features.h"
#include "kiln/core/thread_pool.h"

namespace kiln::testing {
namespace {

std::map<std::string, KernelCaseFactory>& kernel_registry() {
  static std::map<std::string, KernelCaseFactory> r;
  return r;
}
std::map<std::string, GradCaseFactory>& grad_registry() {
  static std::map<std::string, GradCaseFactory> r;
  return r;
}

double nmse(const std::vector<float>& e, const std::vector<float>& a, double* max_abs) {
  double num = 0, den = 0;
  *max_abs = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    const double d = static_cast<double>(a[i]) - e[i];
    num += d * d;
    den += static_cast<double>(e[i]) * e[i];
    *max_abs = std::max(*max_abs, std::fabs(d));
    if (std::isnan(a[i]) != std::isnan(e[i])) return INFINITY;
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return num / den;
}

class KernelTest : public ::testing::Test {
 public:
  KernelTest(KernelCaseFactory f, SimdTarget t) : factory_(f), target_(t) {}
  void TestBody() override {
    const SimdTarget saved = active_simd_target();
    const int saved_threads = num_threads();
    ASSERT_TRUE(set_simd_target(target_));
    const std::vector<KernelCase> cases = factory_();
    ASSERT_FALSE(cases.empty()) << "a family with no cases tests nothing";
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      for (const KernelCase& c : cases) {
        for (const Compare& cmp : c.run()) {
          ASSERT_EQ(cmp.expected.size(), cmp.actual.size()) << c.name << " " << cmp.what;
          double max_abs = 0;
          const double err = nmse(cmp.expected, cmp.actual, &max_abs);
          EXPECT_LE(err, cmp.max_nmse) << c.name << " [" << cmp.what << "] threads=" << threads
                                       << " nmse=" << err << " max_abs=" << max_abs;
        }
      }
    }
    set_num_threads(saved_threads);
    set_simd_target(saved);
  }

 private:
  KernelCaseFactory factory_;
  SimdTarget target_;
};

class GradTest : public ::testing::Test {
 public:
  explicit GradTest(GradCaseFactory f) : factory_(f) {}
  void TestBody() override {
    const std::vector<GradCase> cases = factory_();
    ASSERT_FALSE(cases.empty());
    Rng rng(1234);
    for (const GradCase& c : cases) {
      const std::vector<float> g = c.grad(c.x);
      ASSERT_EQ(g.size(), c.x.size()) << c.name;
      double scale = 0;
      for (float v : g) scale = std::max(scale, std::fabs(static_cast<double>(v)));
      const int probes = std::min<int>(c.num_probes, static_cast<int>(c.x.size()));
      for (int p = 0; p < probes; ++p) {
        const size_t i = p < probes / 2 ? static_cast<size_t>(p) : rng.below(c.x.size());
        std::vector<float> xp = c.x, xm = c.x;
        const float h = static_cast<float>(c.step * std::max(1.0, std::fabs(static_cast<double>(c.x[i]))));
        xp[i] += h;
        xm[i] -= h;
        const double hh = static_cast<double>(xp[i]) - xm[i];  // the step actually taken
        const double fd = (c.loss(xp) - c.loss(xm)) / hh;
        EXPECT_NEAR(g[i], fd, c.rel_tol * std::max(std::fabs(fd), 0.05 * scale) + c.abs_tol)
            << c.name << " coordinate " << i;
      }
    }
  }

 private:
  GradCaseFactory factory_;
};

}  // namespace

bool register_kernel_cases(const char* family, KernelCaseFactory factory) {
  kernel_registry()[family] = factory;
  return true;
}
bool register_grad_cases(const char* family, GradCaseFactory factory) {
  grad_registry()[family] = factory;
  return true;
}

std::vector<float> random_vector(Rng& rng, size_t n, float lo, float hi) {
  std::vector<float> v(n);
  rng.fill_uniform(v, lo, hi);
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

void register_all_tests() {
  for (const auto& [family, factory] : kernel_registry()) {
    for (const auto& info : kSimdTargets) {
      if (!simd_target_supported(info.target)) continue;
      const KernelCaseFactory f = factory;
      const SimdTarget t = info.target;
      ::testing::RegisterTest("Kernels", (family + "/" + std::string(info.name)).c_str(), nullptr,
                              nullptr, __FILE__, __LINE__,
                              [f, t]() -> ::testing::Test* { return new KernelTest(f, t); });
    }
  }
  for (const auto& [family, factory] : grad_registry()) {
    const GradCaseFactory f = factory;
    ::testing::RegisterTest("Gradients", family.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                            [f]() -> ::testing::Test* { return new GradTest(f); });
  }
}

std::vector<Compare> compare_strided(const std::string& what, const std::vector<float>& expected,
                                     const std::vector<float>& actual, int64_t rows, int64_t cols, int64_t ld,
                                     double max_nmse) {
  Compare valid{what, {}, {}, max_nmse};
  float touched = 0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < ld; ++j) {
      const float e = expected[static_cast<size_t>(i * ld + j)], f = actual[static_cast<size_t>(i * ld + j)];
      if (j < cols) {
        valid.expected.push_back(e);
        valid.actual.push_back(f);
      } else if (f != kPaddingSentinel) {
        touched += 1;
      }
    }
  }
  return {valid, Compare{what + " padding untouched", {0.0f}, {touched}, 0.0}};
}

}  // namespace kiln::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kiln::testing::register_all_tests();
  return RUN_ALL_TESTS();
}
