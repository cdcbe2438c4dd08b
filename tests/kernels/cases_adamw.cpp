// AdamW cases: cpu vs ref over several steps (the step count drives the bias corrections)
// on odd lengths; the reference against a hand-computed first step; the config check.
// Tolerance: kTolElementwise — per element a dozen fp32 roundings per step against the
// double reference, five steps.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/kernels/adamw.h"
#include "tests/kernels/ops_cases_util.h"

namespace kiln::testing {

KILN_KERNEL_CASES(adamw) {
  std::vector<KernelCase> cases;
  for (int64_t n : {1, 7, 33, 1000, 65537}) {
    for (double wd : {0.0, 0.1}) {
      cases.push_back(
          {fmt::format("n={} weight_decay={}", n, wd), [n, wd] {
             Rng rng(1800 + n);
             AdamWConfig cfg;
             cfg.lr = 1e-2;
             cfg.weight_decay = wd;
             std::vector<float> p_ref = random_vector(rng, n), p_cpu = p_ref;
             std::vector<float> m_ref(n, 0.0f), m_cpu(n, 0.0f), v_ref(n, 0.0f), v_cpu(n, 0.0f);
             for (int64_t step = 1; step <= 5; ++step) {
               const std::vector<float> g = random_vector(rng, n);
               ref::adamw_step(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, cfg, step);
               cpu::adamw_step(p_cpu.data(), g.data(), m_cpu.data(), v_cpu.data(), n, cfg, step);
             }
             return std::vector<Compare>{{"param", p_ref, p_cpu, kTolElementwise},
                                         {"m", m_ref, m_cpu, kTolElementwise},
                                         {"v", v_ref, v_cpu, kTolElementwise}};
           }});
    }
  }
  return cases;
}

// Step 1 by hand: m = 0.1·g, v = 0.001·g², bias corrections 0.1 and 0.001 make m̂ = g,
// v̂ = g², so p ← p·(1 - lr·λ) - lr·g / (|g| + eps).
TEST(AdamWKernels, FirstStepByHand) {
  AdamWConfig cfg;
  cfg.lr = 0.1;
  cfg.weight_decay = 0.01;
  float p[3] = {1.0f, -2.0f, 0.5f};
  const float g[3] = {0.5f, 0.25f, -4.0f};
  float m[3] = {0, 0, 0}, v[3] = {0, 0, 0};
  ref::adamw_step(p, g, m, v, 3, cfg, 1);
  const double expected_p[3] = {1.0 * 0.999 - 0.1 * 0.5 / (0.5 + 1e-8),
                                -2.0 * 0.999 - 0.1 * 0.25 / (0.25 + 1e-8),
                                0.5 * 0.999 + 0.1 * 4.0 / (4.0 + 1e-8)};
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(p[i], expected_p[i], 1e-7) << i;
    EXPECT_NEAR(m[i], 0.1 * g[i], 1e-8) << i;
    EXPECT_NEAR(v[i], 0.001 * g[i] * g[i], 1e-9) << i;
  }
  // the same numbers by hand for step 1: 0.899, -2.098, 0.5995
  EXPECT_NEAR(p[0], 0.899, 1e-6);
  EXPECT_NEAR(p[1], -2.098, 1e-6);
  EXPECT_NEAR(p[2], 0.5995, 1e-6);
}

TEST(AdamWKernels, CheckConfig) {
  EXPECT_TRUE(check_adamw_config(AdamWConfig{}).ok());
  AdamWConfig c;
  c.lr = -1;
  EXPECT_FALSE(check_adamw_config(c).ok());
  c = AdamWConfig{};
  c.beta1 = 1.0;
  const Status s = check_adamw_config(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("beta1"), std::string::npos) << s.message();
  c = AdamWConfig{};
  c.beta2 = -0.1;
  EXPECT_FALSE(check_adamw_config(c).ok());
  c = AdamWConfig{};
  c.eps = -1e-8;
  EXPECT_FALSE(check_adamw_config(c).ok());
  c = AdamWConfig{};
  c.weight_decay = NAN;
  EXPECT_FALSE(check_adamw_config(c).ok());
}

}  // namespace kiln::testing
