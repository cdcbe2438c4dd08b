// RoPE cases for the kernel harness: cpu vs ref forward and backward over (B, T, H, D) shapes
// (odd head_dim/2, position offsets for decode, in place), the reference backward against
// finite differences, the rotate_half pairing on a hand-checked example, and the argument
// checks. Tolerance: kTolElementwise (one rotation per pair, a few roundings).
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/kernels/rope.h"
#include "tests/kernels/ops_cases_util.h"

namespace kiln::testing {
namespace {

struct RopeShape {
  int64_t b, t, h, d, offset;
};

// The forward in double with angles from the definition (not the table).
std::vector<double> rope_d(const std::vector<float>& x, const RopeShape& s, double theta) {
  std::vector<double> y(x.size());
  const int64_t half = s.d / 2;
  for (int64_t bt = 0; bt < s.b * s.t; ++bt) {
    const double pos = static_cast<double>(s.offset + bt % s.t);
    for (int64_t h = 0; h < s.h; ++h) {
      const int64_t base = (bt * s.h + h) * s.d;
      for (int64_t i = 0; i < half; ++i) {
        const double a = pos * std::pow(theta, -2.0 * i / s.d);
        const double x1 = x[base + i], x2 = x[base + half + i];
        y[base + i] = x1 * std::cos(a) - x2 * std::sin(a);
        y[base + half + i] = x2 * std::cos(a) + x1 * std::sin(a);
      }
    }
  }
  return y;
}

}  // namespace

KILN_KERNEL_CASES(rope) {
  std::vector<KernelCase> cases;
  const RopeShape shapes[] = {{1, 1, 1, 2, 0},   {1, 5, 3, 6, 0},    {2, 17, 2, 34, 0},
                              {1, 3, 4, 64, 7},  {2, 9, 3, 128, 40}, {3, 1, 12, 64, 63},
                              {1, 33, 1, 66, 5}, {2, 16, 4, 32, 0}};
  for (const RopeShape& s : shapes) {
    cases.push_back(
        {fmt::format("B={} T={} H={} D={} offset={}", s.b, s.t, s.h, s.d, s.offset), [s] {
           const RopeTable table = make_rope_table(s.d, 64, 10000.0).value();
           Rng rng(1000 + s.d + s.t);
           const int64_t n = s.b * s.t * s.h * s.d;
           const std::vector<float> x = random_vector(rng, n), dy = random_vector(rng, n);
           std::vector<float> y_ref(n), y_cpu(n, NAN), dx_ref(n), dx_cpu(n, NAN), y_inplace = x;
           ref::rope_forward(y_ref.data(), x.data(), table, s.b, s.t, s.h, s.d, s.offset);
           cpu::rope_forward(y_cpu.data(), x.data(), table, s.b, s.t, s.h, s.d, s.offset);
           cpu::rope_forward(y_inplace.data(), y_inplace.data(), table, s.b, s.t, s.h, s.d,
                             s.offset);
           ref::rope_backward(dx_ref.data(), dy.data(), table, s.b, s.t, s.h, s.d, s.offset);
           cpu::rope_backward(dx_cpu.data(), dy.data(), table, s.b, s.t, s.h, s.d, s.offset);
           return std::vector<Compare>{{"out", y_ref, y_cpu, kTolElementwise},
                                       {"out in place", y_ref, y_inplace, kTolElementwise},
                                       {"dinp", dx_ref, dx_cpu, kTolElementwise}};
         }});
  }
  return cases;
}

KILN_GRAD_CASES(rope) {
  std::vector<GradCase> cases;
  for (const RopeShape s : {RopeShape{2, 3, 2, 8, 5}, RopeShape{1, 4, 1, 6, 0}}) {
    const RopeTable table = make_rope_table(s.d, 16, 10000.0).value();
    Rng rng(1100 + s.d);
    const int64_t n = s.b * s.t * s.h * s.d;
    const std::vector<float> x = random_vector(rng, n), dy = random_vector(rng, n);
    cases.push_back(
        {fmt::format("dinp B={} T={} H={} D={} offset={}", s.b, s.t, s.h, s.d, s.offset), x,
         [=](const std::vector<float>& v) { return dot_d(dy, rope_d(v, s, 10000.0)); },
         [=](const std::vector<float>&) {
           std::vector<float> dx(n);
           ref::rope_backward(dx.data(), dy.data(), table, s.b, s.t, s.h, s.d, s.offset);
           return dx;
         }});
  }
  return cases;
}

// HF rotate_half pairing: with head_dim 4 (pairs (0,2), (1,3)), position 1, theta 100:
// angles are 1·100^0 = 1 and 1·100^(-1/2) = 0.1.
TEST(RopeKernels, RotateHalfPairingByHand) {
  const RopeTable table = make_rope_table(4, 2, 100.0).value();
  const float x[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  float y[4];
  cpu::rope_forward(y, x, table, 1, 1, 1, 4, /*pos_offset=*/1);
  EXPECT_NEAR(y[0], 1 * std::cos(1.0) - 3 * std::sin(1.0), 1e-6);
  EXPECT_NEAR(y[1], 2 * std::cos(0.1) - 4 * std::sin(0.1), 1e-6);
  EXPECT_NEAR(y[2], 3 * std::cos(1.0) + 1 * std::sin(1.0), 1e-6);
  EXPECT_NEAR(y[3], 4 * std::cos(0.1) + 2 * std::sin(0.1), 1e-6);
  float back[4];
  cpu::rope_backward(back, y, table, 1, 1, 1, 4, 1);  // the inverse rotation
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(back[i], x[i], 1e-6);
}

TEST(RopeKernels, MakeTableRejectsBadArguments) {
  EXPECT_FALSE(make_rope_table(7, 16).ok());
  EXPECT_FALSE(make_rope_table(0, 16).ok());
  EXPECT_FALSE(make_rope_table(8, 0).ok());
  EXPECT_FALSE(make_rope_table(8, 16, 1.0).ok());
  EXPECT_FALSE(make_rope_table(8, 16, NAN).ok());
  const Expected<RopeTable> bad = make_rope_table(7, 16);
  EXPECT_NE(bad.status().message().find("[rope]"), std::string::npos);
  const Expected<RopeTable> t = make_rope_table(8, 16, 500000.0);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->cos.size(), 16u * 4u);
  EXPECT_EQ(t->cos[0], 1.0f);  // position 0: no rotation
  EXPECT_EQ(t->sin[0], 0.0f);
}

TEST(RopeKernels, CheckArgsNamesTheShapes) {
  const RopeTable t = make_rope_table(8, 16).value();
  EXPECT_TRUE(check_rope_args(t, 2, 16, 4, 8, 0).ok());
  EXPECT_TRUE(check_rope_args(t, 1, 1, 4, 8, 15).ok());
  const Status past_end = check_rope_args(t, 1, 2, 4, 8, 15);
  EXPECT_FALSE(past_end.ok());
  EXPECT_NE(past_end.message().find("exceed"), std::string::npos) << past_end.message();
  const Status wrong_dim = check_rope_args(t, 1, 2, 4, 6, 0);
  EXPECT_FALSE(wrong_dim.ok());
  EXPECT_NE(wrong_dim.message().find("head_dim 8"), std::string::npos) << wrong_dim.message();
  EXPECT_FALSE(check_rope_args(t, -1, 2, 4, 8, 0).ok());
}

}  // namespace kiln::testing
