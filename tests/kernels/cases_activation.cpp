// GELU, SiLU and SwiGLU cases for the kernel harness: cpu vs ref forward and backward over
// many lengths (every tail size of every target) and wide input ranges including saturation
// (|x| up to 20) and exp overflow (±90); reference backward against finite differences.
// Tolerance: kTolElementwise (the SIMD sigmoid is within 3 ulp; see ops_cases_util.h).
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/kernels/activation.h"
#include "tests/kernels/ops_cases_util.h"

namespace kiln::testing {
namespace {

double gelu_d(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
}
double silu_d(double x) {
  return x / (1.0 + std::exp(-x));
}

std::vector<float> inputs(Rng& rng, int64_t n, float range) {
  std::vector<float> x = random_vector(rng, n, -range, range);
  const float extremes[] = {0.0f, -0.0f, 20.0f, -20.0f, 90.0f, -90.0f, 1e-6f, -1e-6f};
  for (size_t i = 0; i < std::size(extremes) && static_cast<int64_t>(i * 3) < n; ++i) {
    x[i * 3] = extremes[i];
  }
  return x;
}

std::vector<int64_t> lengths() {
  std::vector<int64_t> n;
  for (int64_t i = 1; i <= 40; ++i) n.push_back(i);  // every tail of 8 and 16 lanes
  for (int64_t rows : kCaseRows) {
    for (int64_t cols : kCaseCols) n.push_back(rows * cols);
  }
  return n;
}

}  // namespace

KILN_KERNEL_CASES(activation) {
  std::vector<KernelCase> cases;
  for (int64_t n : lengths()) {
    cases.push_back(
        {fmt::format("n={}", n), [n] {
           Rng rng(700 + n);
           const std::vector<float> x = inputs(rng, n, 6.0f),
                                    up = random_vector(rng, n, -2.0f, 2.0f);
           const std::vector<float> dy = random_vector(rng, n);
           std::vector<Compare> out;
           auto both = [&](const char* what, auto ref_fn, auto cpu_fn) {
             std::vector<float> e(n), a(n, NAN);
             ref_fn(e.data());
             cpu_fn(a.data());
             out.push_back({what, e, a, kTolElementwise});
           };
           both(
               "gelu", [&](float* o) { ref::gelu_forward(o, x.data(), n); },
               [&](float* o) { cpu::gelu_forward(o, x.data(), n); });
           both(
               "dgelu", [&](float* o) { ref::gelu_backward(o, dy.data(), x.data(), n); },
               [&](float* o) { cpu::gelu_backward(o, dy.data(), x.data(), n); });
           both(
               "silu", [&](float* o) { ref::silu_forward(o, x.data(), n); },
               [&](float* o) { cpu::silu_forward(o, x.data(), n); });
           both(
               "dsilu", [&](float* o) { ref::silu_backward(o, dy.data(), x.data(), n); },
               [&](float* o) { cpu::silu_backward(o, dy.data(), x.data(), n); });
           both(
               "swiglu", [&](float* o) { ref::swiglu_forward(o, x.data(), up.data(), n); },
               [&](float* o) { cpu::swiglu_forward(o, x.data(), up.data(), n); });
           std::vector<float> dg_ref(n), du_ref(n), dg_cpu(n, NAN), du_cpu(n, NAN);
           ref::swiglu_backward(dg_ref.data(), du_ref.data(), dy.data(), x.data(), up.data(), n);
           cpu::swiglu_backward(dg_cpu.data(), du_cpu.data(), dy.data(), x.data(), up.data(), n);
           out.push_back({"swiglu dgate", dg_ref, dg_cpu, kTolElementwise});
           out.push_back({"swiglu dup", du_ref, du_cpu, kTolElementwise});
           return out;
         }});
  }
  cases.push_back({"in place gelu n=100", [] {
                     Rng rng(3);
                     const std::vector<float> x = inputs(rng, 100, 6.0f);
                     std::vector<float> e(100), a = x;
                     ref::gelu_forward(e.data(), x.data(), 100);
                     cpu::gelu_forward(a.data(), a.data(), 100);
                     return std::vector<Compare>{{"gelu", e, a, kTolElementwise}};
                   }});
  return cases;
}

KILN_GRAD_CASES(activation) {
  const int64_t n = 37;
  Rng rng(800);
  const std::vector<float> x = random_vector(rng, n, -4.0f, 4.0f);
  const std::vector<float> up = random_vector(rng, n, -2.0f, 2.0f);
  const std::vector<float> dy = random_vector(rng, n);
  auto apply = [](const std::vector<float>& v, double (*f)(double)) {
    std::vector<double> y(v.size());
    for (size_t i = 0; i < v.size(); ++i) y[i] = f(v[i]);
    return y;
  };
  std::vector<GradCase> cases;
  cases.push_back({"gelu", x,
                   [=](const std::vector<float>& v) { return dot_d(dy, apply(v, gelu_d)); },
                   [=](const std::vector<float>& v) {
                     std::vector<float> dx(n);
                     ref::gelu_backward(dx.data(), dy.data(), v.data(), n);
                     return dx;
                   }});
  cases.push_back({"silu", x,
                   [=](const std::vector<float>& v) { return dot_d(dy, apply(v, silu_d)); },
                   [=](const std::vector<float>& v) {
                     std::vector<float> dx(n);
                     ref::silu_backward(dx.data(), dy.data(), v.data(), n);
                     return dx;
                   }});
  auto swiglu_loss = [=](const std::vector<float>& g, const std::vector<float>& u) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += dy[i] * silu_d(g[i]) * u[i];
    return s;
  };
  auto swiglu_grad = [=](const std::vector<float>& g, const std::vector<float>& u, bool dgate) {
    std::vector<float> dg(n), du(n);
    ref::swiglu_backward(dg.data(), du.data(), dy.data(), g.data(), u.data(), n);
    return dgate ? dg : du;
  };
  cases.push_back({"swiglu dgate", x,
                   [=](const std::vector<float>& g) { return swiglu_loss(g, up); },
                   [=](const std::vector<float>& g) { return swiglu_grad(g, up, true); }});
  cases.push_back({"swiglu dup", up, [=](const std::vector<float>& u) { return swiglu_loss(x, u); },
                   [=](const std::vector<float>& u) { return swiglu_grad(x, u, false); }});
  return cases;
}

}  // namespace kiln::testing
