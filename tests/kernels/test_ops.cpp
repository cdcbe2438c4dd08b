// The tensor-level ops (kernels/ops.h) on host tensors: each against its scalar reference on
// (.., C) inputs, and the checks every op makes first (undefined, dtype, layout, shapes). The
// same ops on CUDA tensors, and inputs on two devices, are in tests/cuda (they need a device).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kiln/core/rng.h"
#include "kiln/kernels/activation.h"
#include "kiln/kernels/gemm.h"
#include "kiln/kernels/ops.h"
#include "kiln/kernels/softmax.h"

namespace kiln {
namespace {

Tensor random_tensor(const Shape& shape, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  Rng rng(seed);
  for (float& x : v) x = rng.uniform(-2.0f, 2.0f);
  return Tensor::from_floats(shape, v).value();
}

// sum((a - e)^2) / sum(e^2): the fast kernels differ from the references by summation order and
// polynomial exp only (fp32, C <= 100 here: ~1e-14 per element).
double nmse(const std::vector<float>& expected, const std::vector<float>& actual) {
  EXPECT_EQ(expected.size(), actual.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < expected.size() && i < actual.size(); ++i) {
    num += (static_cast<double>(actual[i]) - expected[i]) * (static_cast<double>(actual[i]) - expected[i]);
    den += static_cast<double>(expected[i]) * expected[i];
  }
  return den > 0 ? num / den : num;
}
constexpr double kBound = 1e-9;

TEST(Ops, RowOpsMatchTheReferencesOnLeadingDims) {
  const Tensor x = random_tensor({2, 3, 37}, 1), w = random_tensor({37}, 2), b = random_tensor({37}, 3);
  const int64_t rows = 6, cols = 37;
  std::vector<float> e(static_cast<size_t>(rows * cols)), stat(static_cast<size_t>(2 * rows));
  const std::vector<float> xv = x.to_floats(), wv = w.to_floats(), bv = b.to_floats();

  ref::rmsnorm_forward(e.data(), stat.data(), xv.data(), wv.data(), rows, cols);
  const Tensor r = ops::rmsnorm(x, w).value();
  EXPECT_EQ(r.shape(), x.shape());
  EXPECT_EQ(r.device(), Device::kHost);
  EXPECT_LE(nmse(e, r.to_floats()), kBound);

  ref::layernorm_forward(e.data(), stat.data(), stat.data() + rows, xv.data(), wv.data(), bv.data(), rows, cols);
  EXPECT_LE(nmse(e, ops::layernorm(x, w, b).value().to_floats()), kBound);

  ref::softmax_forward(e.data(), xv.data(), rows, cols);
  EXPECT_LE(nmse(e, ops::softmax(x).value().to_floats()), kBound);
}

TEST(Ops, ElementwiseOpsMatchTheReferences) {
  const Tensor x = random_tensor({5, 19}, 4), up = random_tensor({5, 19}, 5);
  const std::vector<float> xv = x.to_floats(), uv = up.to_floats();
  std::vector<float> e(xv.size());
  ref::gelu_forward(e.data(), xv.data(), x.numel());
  EXPECT_LE(nmse(e, ops::gelu(x).value().to_floats()), kBound);
  ref::silu_forward(e.data(), xv.data(), x.numel());
  EXPECT_LE(nmse(e, ops::silu(x).value().to_floats()), kBound);
  ref::swiglu_forward(e.data(), xv.data(), uv.data(), x.numel());
  EXPECT_LE(nmse(e, ops::swiglu(x, up).value().to_floats()), kBound);
}

TEST(Ops, MatmulOnHostTensorsStaysOnTheHost) {
  const Tensor a = random_tensor({3, 4, 8}, 6), b = random_tensor({5, 8}, 7);
  const Tensor c = matmul(a, b, /*trans_b=*/true).value();
  EXPECT_EQ(c.device(), Device::kHost);
  EXPECT_EQ(c.shape(), Shape({3, 4, 5}));
  EXPECT_NEAR(c.get({2, 3, 4}), [&] {
    float s = 0;
    for (int64_t l = 0; l < 8; ++l) s += a.get({2, 3, l}) * b.get({4, l});
    return s;
  }(), 1e-5f);
}

// Every refusal names the op and what is wrong with which input.
TEST(Ops, BadInputsAreNamedErrors) {
  const Tensor x = random_tensor({4, 6}, 8), w = random_tensor({6}, 9);
  const auto expect = [](const Status& s, const char* op, const char* what) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(op), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find(what), std::string::npos) << s.to_string();
  };
  expect(ops::rmsnorm(Tensor(), w).status(), "[rmsnorm]", "x is undefined");
  expect(ops::rmsnorm(x, random_tensor({5}, 10)).status(), "[rmsnorm]", "weight");
  expect(ops::rmsnorm(x.to(DType::kBF16).value(), w).status(), "[rmsnorm]", "dtype bf16");
  expect(ops::softmax(x.transpose(0, 1).value()).status(), "[softmax]", "not contiguous");
  expect(ops::layernorm(x, w, random_tensor({6, 1}, 11)).status(), "[layernorm]", "bias");
  expect(ops::swiglu(x, random_tensor({6, 4}, 12)).status(), "[swiglu]", "one shape");
  expect(ops::gelu(Tensor()).status(), "[gelu]", "undefined");
  expect(matmul(x, random_tensor({5, 7}, 13)).status(), "[matmul]", "must match");
}

TEST(Ops, CommonDeviceOfHostInputs) {
  const Tensor x = random_tensor({2, 2}, 14), y = random_tensor({2}, 15);
  EXPECT_EQ(ops::common_device("op", {{"x", &x}, {"y", &y}}).value(), Device::kHost);
}

}  // namespace
}  // namespace kiln
