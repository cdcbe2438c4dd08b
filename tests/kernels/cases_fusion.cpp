// Fused elementwise kernels (perf/fusion.h, what the graph fusion pass generates) in the kernel
// harness like every other kernel: each chain compiled once by the JIT, then run under every
// SIMD target and thread count (the fused kernel splits its grid over the pool by rows) on the
// harness's odd shapes, against the unfused kiln kernels it replaces:
//  * exact math against kiln::ref's kernels (the GPT-2 MLP epilogue bias > GELU > residual, the
//    RMSNorm apply with a residual, SwiGLU > scale, an in-place residual update);
//  * polynomial math (what --graph fused uses) against kiln::cpu's kernels of the active target.
// Both within kTolElementwise: each output is a short chain of roundings of the same formulas.
// Without a compiler the chain runs unfused (fuse_or_fallback, one warning) and is compared
// the same way. The compiled objects go to a temporary directory removed at exit.
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "kiln/kernels/activation.h"
#include "kiln/kernels/elementwise.h"
#include "kiln/kernels/norm.h"
#include "kiln/perf/fusion.h"
#include "tests/kernels/ops_cases_util.h"

namespace kiln::testing {
namespace {

namespace fusion = perf::fusion;

// One cache for the process, in a mkdtemp directory removed at exit.
fusion::KernelCache& cache() {
  struct Dir {
    std::string path;
    Dir() {
      char tmpl[] = "/tmp/kiln-fusion-harness-XXXXXX";
      path = mkdtemp(tmpl) ? tmpl : "/tmp/kiln-fusion-harness";
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static Dir dir;
  static fusion::KernelCache c(dir.path);
  return c;
}

// The compiled chain (or its unfused fallback), once per distinct chain and process.
fusion::ChainFn compiled(const fusion::Chain& chain) { return fusion::fuse_or_fallback(cache(), chain); }

// out = residual + gelu(x + bias): the GPT-2 MLP's up-projection epilogue and residual.
fusion::Chain bias_gelu_residual(fusion::Math math) {
  fusion::Chain c;
  c.math = math;
  const fusion::Ref x = c.input(), bias = c.input(fusion::Layout::kPerCol), res = c.input();
  c.output(c.add(res, c.gelu_tanh(c.add(x, bias))));
  return c;
}

// out = residual + x · rstd(row) · weight(col): RMSNorm's apply step with a residual.
fusion::Chain norm_apply_residual() {
  fusion::Chain c;
  const fusion::Ref x = c.input(), rstd = c.input(fusion::Layout::kPerRow), w = c.input(fusion::Layout::kPerCol),
                    res = c.input();
  c.output(c.add(res, c.row_scale(x, rstd, w)));
  return c;
}

// out = 0.5 · silu(gate) · up, written twice: a fused kernel with two outputs.
fusion::Chain swiglu_scale(fusion::Math math) {
  fusion::Chain c;
  c.math = math;
  const fusion::Ref gate = c.input(), up = c.input();
  const fusion::Ref h = c.swiglu(gate, up);
  c.output(h);
  c.output(c.scale(h, 0.5f));
  return c;
}

// r += 0.25 · x in place (out aliases input 0).
fusion::Chain residual_update() {
  fusion::Chain c;
  const fusion::Ref r = c.input(), x = c.input();
  c.output(c.add(r, c.scale(x, 0.25f)), 0);
  return c;
}

}  // namespace

KILN_KERNEL_CASES(fusion) {
  std::vector<KernelCase> cases;
  for (int64_t rows : kCaseRows) {
    for (int64_t cols : kCaseCols) {
      const int64_t n = rows * cols;
      cases.push_back({fmt::format("rows={} cols={}", rows, cols), [rows, cols, n] {
        Rng rng(4100 + n + rows);
        const std::vector<float> x = random_vector(rng, n, -3.0f, 3.0f), res = random_vector(rng, n),
                                 bias = random_vector(rng, cols), w = random_vector(rng, cols, 0.5f, 1.5f),
                                 up = random_vector(rng, n, -2.0f, 2.0f);
        std::vector<Compare> out;
        std::vector<float> tmp(n), e(n), a(n, NAN);
        for (int64_t i = 0; i < n; ++i) tmp[i] = x[i] + bias[i % cols];
        {  // bias > gelu > residual, exact: kiln::ref
          ref::gelu_forward(e.data(), tmp.data(), n);
          ref::add(e.data(), res.data(), e.data(), n);
          const float* in[] = {x.data(), bias.data(), res.data()};
          float* o[] = {a.data()};
          compiled(bias_gelu_residual(fusion::Math::kExact))(in, o, rows, cols);
          out.push_back({"bias_gelu_residual exact vs ref", e, a, kTolElementwise});
        }
        {  // the same, polynomial: kiln::cpu's kernels on this target
          std::vector<float> g(n);
          cpu::gelu_forward(g.data(), tmp.data(), n);
          cpu::add(e.data(), res.data(), g.data(), n);
          const float* in[] = {x.data(), bias.data(), res.data()};
          std::vector<float> p(n, NAN);
          float* o[] = {p.data()};
          compiled(bias_gelu_residual(fusion::Math::kPolynomial))(in, o, rows, cols);
          out.push_back({"bias_gelu_residual polynomial vs cpu", e, p, kTolElementwise});
        }
        {  // RMSNorm apply + residual: rstd from the reference norm
          std::vector<float> normed(n), rstd(rows);
          ref::rmsnorm_forward(normed.data(), rstd.data(), x.data(), w.data(), rows, cols);
          ref::add(e.data(), res.data(), normed.data(), n);
          const float* in[] = {x.data(), rstd.data(), w.data(), res.data()};
          std::vector<float> p(n, NAN);
          float* o[] = {p.data()};
          compiled(norm_apply_residual())(in, o, rows, cols);
          out.push_back({"norm_apply_residual vs ref rmsnorm + add", e, p, kTolElementwise});
        }
        for (fusion::Math math : {fusion::Math::kExact, fusion::Math::kPolynomial}) {  // SwiGLU > scale, 2 outputs
          const bool exact = math == fusion::Math::kExact;
          std::vector<float> h(n), h2(n);
          if (exact) {
            ref::swiglu_forward(h.data(), x.data(), up.data(), n);
            ref::scale(h2.data(), h.data(), 0.5f, n);
          } else {
            cpu::swiglu_forward(h.data(), x.data(), up.data(), n);
            cpu::scale(h2.data(), h.data(), 0.5f, n);
          }
          const float* in[] = {x.data(), up.data()};
          std::vector<float> p(n, NAN), p2(n, NAN);
          float* o[] = {p.data(), p2.data()};
          compiled(swiglu_scale(math))(in, o, rows, cols);
          out.push_back({exact ? "swiglu exact" : "swiglu polynomial", h, p, kTolElementwise});
          out.push_back({exact ? "swiglu_scale exact" : "swiglu_scale polynomial", h2, p2, kTolElementwise});
        }
        {  // in place: r += 0.25 x
          std::vector<float> s(n);
          ref::scale(s.data(), x.data(), 0.25f, n);
          ref::add(e.data(), res.data(), s.data(), n);
          std::vector<float> r = res;
          const float* in[] = {r.data(), x.data()};
          float* o[] = {r.data()};
          compiled(residual_update())(in, o, rows, cols);
          out.push_back({"residual_update in place", e, r, 0.0});  // two roundings, the same ones
        }
        return out;
      }});
    }
  }
  return cases;
}

}  // namespace kiln::testing
