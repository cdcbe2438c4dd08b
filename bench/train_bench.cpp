// The training-step benchmark behind `kiln bench train`: one step is zero_grad, forward,
// backward and an AdamW update of every parameter entry (weight decay on matrices only, as
// kiln's trainer does; no clipping), on fresh random tokens each step.
#include "bench/train_bench.h"

#include <fmt/format.h>

#include <vector>

#include "bench/bench_util.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/adamw.h"
#include "kiln/model/transformer.h"
#include "kiln/perf/peak.h"

namespace kiln::bench {
namespace {

struct Workload {
  const char* preset;  // ModelConfig preset with the same shape
  int64_t batch, seq_len;
};

Expected<Workload> workload(const std::string& name) {
  if (name == "w1a") return Workload{"w1a", 8, 256};        // BENCH.md W1a
  if (name == "w1b") return Workload{"gpt2-124m", 4, 64};   // BENCH.md W1b: GPT-2 124M shape
  return invalid_argument("[bench train] unknown workload '{}' (known: w1a, w1b)", name);
}

}  // namespace

int run_train_bench(const TrainBenchOptions& opt) {
  auto w = workload(opt.preset);
  if (!w.ok()) {
    fmt::print(stderr, "kiln bench train: {}\n", w.status().message());
    return 2;
  }
  if (opt.threads > 0) set_num_threads(opt.threads);
  const int threads = num_threads();
  const ModelConfig cfg = preset(w->preset).value();
  auto model_or = Transformer::create(cfg, 1);
  if (!model_or.ok()) {
    fmt::print(stderr, "kiln bench train: {}\n", model_or.status().message());
    return 2;
  }
  Transformer& model = **model_or;
  const int64_t B = w->batch, T = w->seq_len, N = B * T;
  const size_t n_params = model.params().size();
  std::vector<float> m(n_params, 0.0f), v(n_params, 0.0f);  // AdamW moments
  std::vector<int32_t> x(static_cast<size_t>(N)), y(static_cast<size_t>(N));
  Rng rng(7);
  AdamWConfig adam;  // torch.optim.AdamW defaults but lr 3e-4, weight decay 0.1 on matrices
  adam.lr = 3e-4;

  std::vector<double> total, fwd, bwd, upd;
  float loss = 0;
  for (int s = 1; s <= opt.warmup + opt.steps; ++s) {
    for (int64_t i = 0; i < N; ++i) {
      x[static_cast<size_t>(i)] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(cfg.vocab_size)));
      y[static_cast<size_t>(i)] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(cfg.vocab_size)));
    }
    const double t0 = now_seconds();
    model.zero_grad();
    loss = model.forward(x.data(), y.data(), B, T).value();
    const double t1 = now_seconds();
    model.backward();
    const double t2 = now_seconds();
    for (const ParamEntry& e : model.param_entries()) {
      adam.weight_decay = e.decay ? 0.1 : 0.0;
      cpu::adamw_step(model.params().data() + e.offset, model.grads().data() + e.offset, m.data() + e.offset,
                      v.data() + e.offset, e.shape.numel(), adam, s);
    }
    const double t3 = now_seconds();
    if (s > opt.warmup) {
      total.push_back(t3 - t0);
      fwd.push_back(t1 - t0);
      bwd.push_back(t2 - t1);
      upd.push_back(t3 - t2);
    }
  }
  const Summary st = summarize(total);
  const double tokens_per_s = static_cast<double>(N) / st.median;
  const double gflops = tokens_per_s * cfg.train_flops_per_token(T) / 1e9;
  const double peak = perf::fma_peak_gflops(threads);
  const double mfu = peak > 0 ? gflops / peak : 0;
  const double f = summarize(fwd).median, b = summarize(bwd).median, u = summarize(upd).median;
  if (opt.json) {
    fmt::print("{{\"bench\": \"train\", \"impl\": \"kiln\", \"workload\": \"{}\", \"threads\": {}, \"batch\": {}, "
               "\"seq_len\": {}, \"params\": {}, \"steps\": {}, \"step_s\": {:.6f}, \"step_s_min\": {:.6f}, "
               "\"step_s_max\": {:.6f}, \"tokens_per_s\": {:.2f}, \"gflops\": {:.2f}, \"peak_gflops\": {:.1f}, "
               "\"mfu\": {:.4f}, \"forward_s\": {:.6f}, \"backward_s\": {:.6f}, \"optimizer_s\": {:.6f}, "
               "\"loss\": {:.4f}}}\n",
               opt.preset, threads, B, T, cfg.num_params(), opt.steps, st.median, st.min, st.max, tokens_per_s,
               gflops, peak, mfu, f, b, u, loss);
  } else {
    fmt::print("kiln bench train {}: {}; batch {} x seq {}; {} thread(s); AdamW fp32\n", opt.preset, cfg.describe(), B,
               T, threads);
    fmt::print("step {:.3f} s median of {} (min {:.3f}, max {:.3f}) = forward {:.3f} + backward {:.3f} + AdamW {:.3f}\n",
               st.median, opt.steps, st.min, st.max, f, b, u);
    fmt::print("{:.1f} tokens/s, {:.1f} GFLOP/s ({:.1f} MFLOP/token), MFU {:.1f}% of {:.0f} GFLOP/s FMA peak; "
               "last loss {:.3f}\n",
               tokens_per_s, gflops, cfg.train_flops_per_token(T) / 1e6, 100 * mfu, peak, loss);
  }
  return 0;
}

}  // namespace kiln::bench
