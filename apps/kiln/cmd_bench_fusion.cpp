// `kiln bench fusion`: a 4-op elementwise chain compiled into one kernel by the fusion JIT
// (perf/fusion.h) beside the same ops run one kernel at a time (kiln::cpu's eager kernels, and
// the unfused reference that is the graph's fallback): median time, GB/s of each variant's
// compulsory traffic (fused: inputs once, output once; eager: every intermediate) and the ratio.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <vector>

#include "apps/kiln/commands.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/activation.h"
#include "kiln/kernels/elementwise.h"
#include "kiln/perf/fusion.h"

namespace kiln::app {
namespace {

namespace fu = perf::fusion;

struct BenchChain {
  const char* name;
  fu::Chain chain;  // inputs x, y, residual (n,); out = residual
  std::function<void(float* t, const float* x, const float* y, float* res, int64_t n)> eager;
};

// out = residual + 0.5·gelu(x + y): GPT-2's MLP epilogue and residual, in place.
BenchChain gelu_chain(fu::Math math) {
  fu::Chain c;
  c.math = math;
  const fu::Ref x = c.input(), y = c.input(), r = c.input();
  c.output(c.add(c.scale(c.gelu_tanh(c.add(x, y)), 0.5f), r), /*aliases_input=*/2);
  auto eager = [](float* t, const float* x, const float* y, float* res, int64_t n) {
    cpu::add(t, x, y, n);
    cpu::gelu_forward(t, t, n);
    cpu::scale(t, t, 0.5f, n);
    cpu::add(res, t, res, n);
  };
  return {math == fu::Math::kExact ? "add, gelu_tanh, scale, add (exact math)"
                                   : "add, gelu_tanh, scale, add (polynomial math)",
          std::move(c), eager};
}

// out = 0.5·(residual + 0.5·(x + y)): arithmetic only, so the fused loop is plain SIMD.
BenchChain scale_residual_chain() {
  fu::Chain c;
  const fu::Ref x = c.input(), y = c.input(), r = c.input();
  c.output(c.scale(c.add(c.scale(c.add(x, y), 0.5f), r), 0.5f), /*aliases_input=*/2);
  auto eager = [](float* t, const float* x, const float* y, float* res, int64_t n) {
    cpu::add(t, x, y, n);
    cpu::scale(t, t, 0.5f, n);
    cpu::add(res, t, res, n);
    cpu::scale(res, res, 0.5f, n);
  };
  return {"add, scale, add, scale", std::move(c), eager};
}

// Median seconds of `reps` runs after one warm-up; `reset` (untimed) restores the inputs.
double median_seconds(int reps, const std::function<void()>& reset,
                      const std::function<void()>& run) {
  std::vector<double> secs;
  for (int r = 0; r <= reps; ++r) {
    reset();
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) secs.push_back(s);
  }
  std::sort(secs.begin(), secs.end());
  return secs[secs.size() / 2];
}

}  // namespace

void register_bench_fusion(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  struct Args {
    int log2_n = 22, reps = 10, threads = 1;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = bench->add_subcommand(
      "fusion", "A 4-op elementwise chain: JIT-fused kernel vs one kernel per op (GB/s, ratio)");
  cmd->add_option("--log2-n", a->log2_n, "Elements: 2^N (default 22)")->check(CLI::Range(4, 28));
  cmd->add_option("--reps", a->reps, "Timed repetitions")->check(CLI::Range(1, 1000));
  cmd->add_option("--threads", a->threads, "Threads (kiln's pool: eager kernels and the fused one)")
      ->check(CLI::Range(1, 64));
  cmd->callback([a] {
    set_num_threads(a->threads);
    const int64_t n = int64_t{1} << a->log2_n;
    fu::KernelCache cache;
    fmt::print("kiln bench fusion: n = {} f32, median of {}, {} thread(s), cache {}\n", n, a->reps,
               a->threads, cache.dir());
    Rng rng(1);
    std::vector<float> x(n), y(n), r0(n), res(n), t(n), check(n);
    rng.fill_uniform(x, -4, 4);
    rng.fill_uniform(y, -4, 4);
    rng.fill_uniform(r0, -4, 4);
    const auto reset = [&] { std::memcpy(res.data(), r0.data(), n * sizeof(float)); };
    const float* in[3] = {x.data(), y.data(), res.data()};
    float* out[1] = {res.data()};
    for (const BenchChain& bc : {gelu_chain(fu::Math::kExact), gelu_chain(fu::Math::kPolynomial),
                                 scale_residual_chain()}) {
      const int compiles_before = cache.stats().compiles;
      const auto t_compile = std::chrono::steady_clock::now();
      auto kernel = cache.get(bc.chain);
      if (!kernel.ok()) {
        fmt::print(stderr, "kiln bench fusion: {}\n", kernel.status().message());
        throw CLI::RuntimeError(kUserError);
      }
      const double compile_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t_compile).count();
      // The fused result must be the unfused reference's, bit for bit.
      reset();
      fu::run_unfused(bc.chain, in, out, n, 1);
      check = res;
      reset();
      (*kernel)(in, out, n, 1);
      const bool same = std::memcmp(check.data(), res.data(), n * sizeof(float)) == 0;

      const fu::ChainCost cost = fu::chain_cost(bc.chain, n, 1);
      const double fused_s = median_seconds(a->reps, reset, [&] { (*kernel)(in, out, n, 1); });
      const double eager_s = median_seconds(
          a->reps, reset, [&] { bc.eager(t.data(), x.data(), y.data(), res.data(), n); });
      const double ref_s =
          median_seconds(a->reps, reset, [&] { fu::run_unfused(bc.chain, in, out, n, 1); });
      fmt::print(
          "chain {} (get: {:.2f} s, {}; fused == unfused bitwise: {}):\n", bc.name, compile_s,
          cache.stats().compiles > compiles_before ? "compiled" : "loaded from the cache", same);
      const auto row = [&](const char* what, double s, double bytes) {
        fmt::print("  {:<22} {:8.2f} ms  {:6.2f} GB/s of {:.0f} MiB\n", what, s * 1e3,
                   bytes / s / 1e9, bytes / (1 << 20));
      };
      row("fused (JIT)", fused_s, cost.fused.bytes);
      row("eager kiln::cpu", eager_s, cost.unfused.bytes);
      row("reference, 1 thread", ref_s, cost.unfused.bytes);
      fmt::print("  fused speedup: {:.2f}x over eager, {:.2f}x over the reference\n",
                 eager_s / fused_s, ref_s / fused_s);
    }
  });
}

}  // namespace kiln::app
