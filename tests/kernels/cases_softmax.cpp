// Softmax cases for the kernel harness: cpu vs ref forward and backward over rows × cols
// (odd sizes, large offsets that would overflow an unshifted exp, in-place use), and the
// reference backward against finite differences. Tolerances: ops_cases_util.h.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/kernels/softmax.h"
#include "tests/kernels/ops_cases_util.h"

namespace kiln::testing {
namespace {

std::vector<double> softmax_d(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, static_cast<double>(x[r * cols + c]));
    for (int64_t c = 0; c < cols; ++c) s += std::exp(x[r * cols + c] - m);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = std::exp(x[r * cols + c] - m) / s;
  }
  return y;
}

// Logits spread over [-8, 8], with every third row shifted by +100 (exp would overflow
// without the max subtraction).
std::vector<float> logits(Rng& rng, int64_t rows, int64_t cols) {
  std::vector<float> x = random_vector(rng, rows * cols, -8.0f, 8.0f);
  for (int64_t r = 0; r < rows; r += 3) {
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] += 100.0f;
  }
  return x;
}

}  // namespace

KILN_KERNEL_CASES(softmax) {
  std::vector<KernelCase> cases;
  for (int64_t rows : kCaseRows) {
    for (int64_t cols : kCaseCols) {
      cases.push_back({fmt::format("rows={} cols={}", rows, cols), [rows, cols] {
                         Rng rng(500 * rows + cols);
                         const std::vector<float> x = logits(rng, rows, cols);
                         const std::vector<float> dy = random_vector(rng, x.size());
                         std::vector<float> y_ref(x.size()), y_cpu(x.size());
                         ref::softmax_forward(y_ref.data(), x.data(), rows, cols);
                         cpu::softmax_forward(y_cpu.data(), x.data(), rows, cols);
                         std::vector<float> dx_ref(x.size()), dx_cpu(x.size(), NAN);
                         ref::softmax_backward(dx_ref.data(), dy.data(), y_ref.data(), rows, cols);
                         cpu::softmax_backward(dx_cpu.data(), dy.data(), y_ref.data(), rows, cols);
                         std::vector<Compare> out{{"out", y_ref, y_cpu, kTolReduction}};
                         // cols = 1: y = 1 and the exact dinp is 0 (only rounding noise): not
                         // comparable.
                         if (cols > 1) out.push_back({"dinp", dx_ref, dx_cpu, kTolReduction});
                         return out;
                       }});
    }
  }
  cases.push_back({"in place rows=4 cols=129", [] {
                     Rng rng(9);
                     const std::vector<float> x = logits(rng, 4, 129);
                     std::vector<float> y_ref(x.size()), y_cpu = x;
                     ref::softmax_forward(y_ref.data(), x.data(), 4, 129);
                     cpu::softmax_forward(y_cpu.data(), y_cpu.data(), 4, 129);
                     return std::vector<Compare>{{"out", y_ref, y_cpu, kTolReduction}};
                   }});
  return cases;
}

KILN_GRAD_CASES(softmax) {
  std::vector<GradCase> cases;
  for (const auto& shape : {std::pair<int64_t, int64_t>{3, 7}, {2, 65}}) {
    const int64_t rows = shape.first, cols = shape.second;  // not a structured binding: clang 14 cannot capture one
    Rng rng(600 + cols);
    const std::vector<float> x = random_vector(rng, rows * cols, -3.0f, 3.0f);
    const std::vector<float> dy = random_vector(rng, x.size());
    cases.push_back(
        {fmt::format("dinp rows={} cols={}", rows, cols), x,
         [=](const std::vector<float>& xs) { return dot_d(dy, softmax_d(xs, rows, cols)); },
         [=](const std::vector<float>& xs) {
           std::vector<float> y(xs.size()), dx(xs.size());
           ref::softmax_forward(y.data(), xs.data(), rows, cols);
           ref::softmax_backward(dx.data(), dy.data(), y.data(), rows, cols);
           return dx;
         }});
  }
  return cases;
}

}  // namespace kiln::testing
