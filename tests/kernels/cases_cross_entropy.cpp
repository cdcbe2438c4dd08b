// Fused softmax + cross-entropy cases for the kernel harness: cpu vs ref losses and dlogits
// over rows × vocab (V not a multiple of any SIMD width: 1, 7, 65, 1000, 1025, 50257), ignored
// targets (-1), large logit offsets, in-place gradients (dlogits aliasing logits); the
// reference backward against finite differences; the target check.
// Tolerance: kTolLongReduction (ops_cases_util.h).
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/kernels/cross_entropy.h"
#include "tests/kernels/ops_cases_util.h"

namespace kiln::testing {
namespace {

struct CeInputs {
  std::vector<float> logits, dlosses;
  std::vector<int32_t> targets;
};
CeInputs ce_inputs(int64_t rows, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  CeInputs in;
  in.logits = random_vector(rng, rows * vocab, -6.0f, 6.0f);
  for (int64_t r = 1; r < rows; r += 3) {  // every third row shifted: max subtraction matters
    for (int64_t v = 0; v < vocab; ++v) in.logits[r * vocab + v] += 90.0f;
  }
  in.targets.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    in.targets[r] = r % 4 == 2 ? kIgnoreTarget : static_cast<int32_t>(rng.below(vocab));
  }
  in.dlosses = random_vector(rng, rows, 0.1f, 1.0f);
  return in;
}

std::vector<double> losses_d(const std::vector<float>& x, const std::vector<int32_t>& t,
                             int64_t rows, int64_t vocab) {
  std::vector<double> l(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (t[r] < 0) continue;
    double m = -INFINITY, s = 0;
    for (int64_t v = 0; v < vocab; ++v) m = std::max(m, static_cast<double>(x[r * vocab + v]));
    for (int64_t v = 0; v < vocab; ++v) s += std::exp(x[r * vocab + v] - m);
    l[r] = m + std::log(s) - x[r * vocab + t[r]];
  }
  return l;
}

}  // namespace

KILN_KERNEL_CASES(cross_entropy) {
  std::vector<KernelCase> cases;
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1},    {3, 7},    {17, 65},   {64, 257},
                                                {4, 1000}, {5, 1025}, {3, 50257}, {64, 1}};
  for (const auto& shape : shapes) {
    const int64_t rows = shape.first, vocab = shape.second;  // not a structured binding: clang 14 cannot capture one
    cases.push_back(
        {fmt::format("rows={} V={}", rows, vocab), [rows, vocab] {
           const CeInputs in = ce_inputs(rows, vocab, 1600 + rows + vocab);
           const size_t n = in.logits.size();
           std::vector<float> l_ref(rows), l_cpu(rows, NAN);
           ref::cross_entropy_forward(l_ref.data(), in.logits.data(), in.targets.data(), rows,
                                      vocab);
           cpu::cross_entropy_forward(l_cpu.data(), in.logits.data(), in.targets.data(), rows,
                                      vocab);
           std::vector<float> d_ref(n), d_cpu(n, NAN), d_inplace = in.logits;
           ref::cross_entropy_backward(d_ref.data(), in.logits.data(), in.targets.data(),
                                       in.dlosses.data(), rows, vocab);
           cpu::cross_entropy_backward(d_cpu.data(), in.logits.data(), in.targets.data(),
                                       in.dlosses.data(), rows, vocab);
           cpu::cross_entropy_backward(d_inplace.data(), d_inplace.data(), in.targets.data(),
                                       in.dlosses.data(), rows, vocab);
           std::vector<Compare> out{{"dlogits", d_ref, d_cpu, kTolLongReduction},
                                    {"dlogits in place", d_ref, d_inplace, kTolLongReduction}};
           // V = 1: every loss is exactly 0 (log 1); nothing relative to compare against.
           if (vocab > 1) out.push_back({"losses", l_ref, l_cpu, kTolLongReduction});
           return out;
         }});
  }
  return cases;
}

KILN_GRAD_CASES(cross_entropy) {
  std::vector<GradCase> cases;
  for (const auto& shape : {std::pair<int64_t, int64_t>{3, 7}, {4, 65}}) {
    const int64_t rows = shape.first, vocab = shape.second;  // not a structured binding: clang 14 cannot capture one
    CeInputs in = ce_inputs(rows, vocab, 1700 + vocab);
    for (float& x : in.logits) x = std::fmod(x, 10.0f);  // no +90 rows: FD steps are relative
    cases.push_back({fmt::format("dlogits rows={} V={}", rows, vocab), in.logits,
                     [=](const std::vector<float>& x) {
                       const std::vector<double> l = losses_d(x, in.targets, rows, vocab);
                       double s = 0;
                       for (int64_t r = 0; r < rows; ++r) s += in.dlosses[r] * l[r];
                       return s;
                     },
                     [=](const std::vector<float>& x) {
                       std::vector<float> d(x.size());
                       ref::cross_entropy_backward(d.data(), x.data(), in.targets.data(),
                                                   in.dlosses.data(), rows, vocab);
                       return d;
                     }});
  }
  return cases;
}

TEST(CrossEntropyKernels, CheckTargets) {
  const std::vector<int32_t> ok = {0, -1, 9};
  EXPECT_TRUE(check_targets(ok, 10).ok());
  const std::vector<int32_t> bad = {0, 10};
  const Status s = check_targets(bad, 10);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("target 10 in row 1"), std::string::npos) << s.message();
  const std::vector<int32_t> minus_two = {-2};
  EXPECT_FALSE(check_targets(minus_two, 10).ok());
}

// Hand-checked: logits (0, ln 3) → softmax (1/4, 3/4); target 1: loss = ln(4/3).
TEST(CrossEntropyKernels, TwoClassExampleByHand) {
  const float logits[2] = {0.0f, static_cast<float>(std::log(3.0))};
  const int32_t target[1] = {1};
  const float dloss[1] = {2.0f};
  float loss[1], d[2];
  cpu::cross_entropy_forward(loss, logits, target, 1, 2);
  cpu::cross_entropy_backward(d, logits, target, dloss, 1, 2);
  EXPECT_NEAR(loss[0], std::log(4.0 / 3.0), 1e-6);
  EXPECT_NEAR(d[0], 2.0 * 0.25, 1e-6);
  EXPECT_NEAR(d[1], 2.0 * (0.75 - 1.0), 1e-6);
}

}  // namespace kiln::testing
