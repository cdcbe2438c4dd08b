// kiln's non-GEMM kernels (ref and cpu, every SIMD target) against PyTorch: the values in
// tests/reference/kernels_torch.json, written by tests/reference/kernels_torch.py (float64
// torch from fp32 inputs; AdamW from torch.optim.AdamW in fp32). Needs no Python at test time.
// Tolerances as in ops_cases_util.h: kernels against an exact reference.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "kiln/core/cpu_features.h"
#include "kiln/kernels/activation.h"
#include "kiln/kernels/adamw.h"
#include "kiln/kernels/cross_entropy.h"
#include "kiln/kernels/embedding.h"
#include "kiln/kernels/norm.h"
#include "kiln/kernels/rope.h"
#include "kiln/kernels/softmax.h"
#include "tests/kernels/ops_cases_util.h"

namespace kiln::testing {
namespace {

using nlohmann::json;
using Floats = std::vector<float>;

const json& torch_cases() {
  static const json doc = [] {
    std::ifstream f(KILN_SOURCE_DIR "/tests/reference/kernels_torch.json");
    return f ? json::parse(f, nullptr, /*allow_exceptions=*/false) : json();
  }();
  return doc;
}

// Every case of `op` in the file (at least one, or the test fails).
std::vector<json> cases_of(const std::string& op) {
  std::vector<json> out;
  const json& doc = torch_cases();
  if (doc.is_object() && doc.contains("cases")) {
    for (const json& c : doc["cases"]) {
      if (c.value("op", "") == op) out.push_back(c);
    }
  }
  EXPECT_FALSE(out.empty()) << "no '" << op << "' case in tests/reference/kernels_torch.json";
  return out;
}

double nmse(const Floats& expected, const Floats& actual) {
  double num = 0, den = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double d = static_cast<double>(actual[i]) - expected[i];
    num += d * d;
    den += static_cast<double>(expected[i]) * expected[i];
  }
  return den == 0 ? (num == 0 ? 0 : INFINITY) : num / den;
}

void expect_close(const std::string& what, const json& expected, const Floats& actual, double tol) {
  const Floats e = expected.get<Floats>();
  ASSERT_EQ(e.size(), actual.size()) << what;
  EXPECT_LE(nmse(e, actual), tol) << what;
}

// Runs `body(label, use_cpu)` for the reference and for cpu on every supported SIMD target.
void for_each_impl(const std::function<void(const std::string&, bool)>& body) {
  body("ref", false);
  const SimdTarget saved = active_simd_target();
  for (const auto& info : kSimdTargets) {
    if (!set_simd_target(info.target)) continue;
    body("cpu/" + std::string(info.name), true);
  }
  set_simd_target(saved);
}

}  // namespace

TEST(TorchReference, FileIsPresent) {
  ASSERT_TRUE(torch_cases().is_object())
      << "tests/reference/kernels_torch.json missing or unreadable; regenerate with "
         "python3 tests/reference/kernels_torch.py";
}

TEST(TorchReference, LayerNorm) {
  for (const json& c : cases_of("layernorm")) {
    const int64_t rows = c["rows"], cols = c["cols"];
    const Floats x = c["x"], w = c["weight"], b = c["bias"], dy = c["dy"];
    for_each_impl([&](const std::string& impl, bool use_cpu) {
      Floats y(x.size()), mean(rows), rstd(rows), dx(x.size()), dw(cols, 0.0f), db(cols, 0.0f);
      auto fwd = use_cpu ? &cpu::layernorm_forward : &ref::layernorm_forward;
      auto bwd = use_cpu ? &cpu::layernorm_backward : &ref::layernorm_backward;
      fwd(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, cols,
          c["eps"].get<float>());
      bwd(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(),
          rows, cols, false);
      expect_close(impl + " y", c["y"], y, kTolReduction);
      expect_close(impl + " dx", c["dx"], dx, kTolReduction);
      expect_close(impl + " dweight", c["dweight"], dw, kTolReduction);
      expect_close(impl + " dbias", c["dbias"], db, kTolReduction);
    });
  }
}

TEST(TorchReference, RmsNorm) {
  for (const json& c : cases_of("rmsnorm")) {
    const int64_t rows = c["rows"], cols = c["cols"];
    const Floats x = c["x"], w = c["weight"], dy = c["dy"];
    for_each_impl([&](const std::string& impl, bool use_cpu) {
      Floats y(x.size()), rstd(rows), dx(x.size()), dw(cols, 0.0f);
      auto fwd = use_cpu ? &cpu::rmsnorm_forward : &ref::rmsnorm_forward;
      auto bwd = use_cpu ? &cpu::rmsnorm_backward : &ref::rmsnorm_backward;
      fwd(y.data(), rstd.data(), x.data(), w.data(), rows, cols, c["eps"].get<float>());
      bwd(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, cols, false);
      expect_close(impl + " y", c["y"], y, kTolReduction);
      expect_close(impl + " dx", c["dx"], dx, kTolReduction);
      expect_close(impl + " dweight", c["dweight"], dw, kTolReduction);
    });
  }
}

TEST(TorchReference, Softmax) {
  for (const json& c : cases_of("softmax")) {
    const int64_t rows = c["rows"], cols = c["cols"];
    const Floats x = c["x"], dy = c["dy"];
    for_each_impl([&](const std::string& impl, bool use_cpu) {
      Floats y(x.size()), dx(x.size());
      (use_cpu ? &cpu::softmax_forward : &ref::softmax_forward)(y.data(), x.data(), rows, cols);
      (use_cpu ? &cpu::softmax_backward : &ref::softmax_backward)(dx.data(), dy.data(), y.data(),
                                                                  rows, cols);
      expect_close(impl + " y", c["y"], y, kTolReduction);
      expect_close(impl + " dx", c["dx"], dx, kTolReduction);
    });
  }
}

TEST(TorchReference, Activations) {
  for (const json& c : cases_of("activations")) {
    const int64_t n = c["n"];
    const Floats x = c["x"], up = c["up"], dy = c["dy"];
    for_each_impl([&](const std::string& impl, bool use_cpu) {
      Floats y(n), d(n), d2(n);
      (use_cpu ? &cpu::gelu_forward : &ref::gelu_forward)(y.data(), x.data(), n);
      expect_close(impl + " gelu", c["gelu"], y, kTolElementwise);
      (use_cpu ? &cpu::gelu_backward : &ref::gelu_backward)(d.data(), dy.data(), x.data(), n);
      expect_close(impl + " dgelu", c["dgelu"], d, kTolElementwise);
      (use_cpu ? &cpu::silu_forward : &ref::silu_forward)(y.data(), x.data(), n);
      expect_close(impl + " silu", c["silu"], y, kTolElementwise);
      (use_cpu ? &cpu::silu_backward : &ref::silu_backward)(d.data(), dy.data(), x.data(), n);
      expect_close(impl + " dsilu", c["dsilu"], d, kTolElementwise);
      (use_cpu ? &cpu::swiglu_forward : &ref::swiglu_forward)(y.data(), x.data(), up.data(), n);
      expect_close(impl + " swiglu", c["swiglu"], y, kTolElementwise);
      (use_cpu ? &cpu::swiglu_backward : &ref::swiglu_backward)(d.data(), d2.data(), dy.data(),
                                                                x.data(), up.data(), n);
      expect_close(impl + " swiglu dgate", c["swiglu_dgate"], d, kTolElementwise);
      expect_close(impl + " swiglu dup", c["swiglu_dup"], d2, kTolElementwise);
    });
  }
}

TEST(TorchReference, RopeMatchesHuggingFaceRotateHalf) {
  for (const json& c : cases_of("rope")) {
    const int64_t b = c["batch"], t = c["seq_len"], h = c["n_heads"], d = c["head_dim"];
    const int64_t offset = c["pos_offset"];
    const Floats x = c["x"], dy = c["dy"];
    const RopeTable table = make_rope_table(d, offset + t, c["theta"].get<double>()).value();
    for_each_impl([&](const std::string& impl, bool use_cpu) {
      Floats y(x.size()), dx(x.size());
      (use_cpu ? &cpu::rope_forward : &ref::rope_forward)(y.data(), x.data(), table, b, t, h, d,
                                                          offset);
      (use_cpu ? &cpu::rope_backward : &ref::rope_backward)(dx.data(), dy.data(), table, b, t, h, d,
                                                            offset);
      expect_close(impl + " y", c["y"], y, kTolElementwise);
      expect_close(impl + " dx", c["dx"], dx, kTolElementwise);
    });
  }
}

TEST(TorchReference, EmbeddingAndPositional) {
  for (const json& c : cases_of("embedding")) {
    const int64_t vocab = c["vocab"], cols = c["cols"], batch = c["batch"], seq = c["seq_len"];
    const std::vector<int32_t> ids = c["ids"];
    const Floats w = c["weight"], wpe = c["wpe"], dy = c["dy"];
    const int64_t tokens = batch * seq;
    for_each_impl([&](const std::string& impl, bool use_cpu) {
      Floats y(tokens * cols), dw(vocab * cols, 0.0f), dwpe(seq * cols, 0.0f);
      (use_cpu ? &cpu::embedding_forward : &ref::embedding_forward)(y.data(), ids.data(), w.data(),
                                                                    tokens, vocab, cols);
      (use_cpu ? &cpu::positional_forward : &ref::positional_forward)(y.data(), wpe.data(), batch,
                                                                      seq, cols);
      (use_cpu ? &cpu::embedding_backward : &ref::embedding_backward)(
          dw.data(), dy.data(), ids.data(), tokens, vocab, cols);
      (use_cpu ? &cpu::positional_backward : &ref::positional_backward)(dwpe.data(), dy.data(),
                                                                        batch, seq, cols);
      expect_close(impl + " y", c["y"], y, kTolElementwise);
      expect_close(impl + " dweight", c["dweight"], dw, kTolElementwise);
      expect_close(impl + " dwpe", c["dwpe"], dwpe, kTolElementwise);
    });
  }
}

TEST(TorchReference, CrossEntropyWithIgnoreIndex) {
  for (const json& c : cases_of("cross_entropy")) {
    const int64_t rows = c["rows"], vocab = c["vocab"];
    const Floats x = c["logits"], dl = c["dlosses"];
    const std::vector<int32_t> targets = c["targets"];
    for_each_impl([&](const std::string& impl, bool use_cpu) {
      Floats loss(rows), d(x.size());
      (use_cpu ? &cpu::cross_entropy_forward : &ref::cross_entropy_forward)(
          loss.data(), x.data(), targets.data(), rows, vocab);
      (use_cpu ? &cpu::cross_entropy_backward : &ref::cross_entropy_backward)(
          d.data(), x.data(), targets.data(), dl.data(), rows, vocab);
      expect_close(impl + " losses", c["losses"], loss, kTolLongReduction);
      expect_close(impl + " dlogits", c["dlogits"], d, kTolLongReduction);
    });
  }
}

TEST(TorchReference, AdamWMatchesTorchOptim) {
  for (const json& c : cases_of("adamw")) {
    const int64_t n = c["n"], steps = c["steps"];
    AdamWConfig cfg;
    cfg.lr = c["lr"];
    cfg.beta1 = c["beta1"];
    cfg.beta2 = c["beta2"];
    cfg.eps = c["eps"];
    cfg.weight_decay = c["weight_decay"];
    for_each_impl([&](const std::string& impl, bool use_cpu) {
      Floats p = c["param0"], m(n, 0.0f), v(n, 0.0f);
      for (int64_t s = 0; s < steps; ++s) {
        const Floats g = c["grads"][s];
        (use_cpu ? &cpu::adamw_step : &ref::adamw_step)(p.data(), g.data(), m.data(), v.data(), n,
                                                        cfg, s + 1);
      }
      expect_close(impl + " param", c["param"], p, kTolElementwise);
      expect_close(impl + " m", c["m"], m, kTolElementwise);
      expect_close(impl + " v", c["v"], v, kTolElementwise);
    });
  }
}

}  // namespace kiln::testing
