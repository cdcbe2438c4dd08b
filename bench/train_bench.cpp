// The training-step benchmark behind `kiln bench train`: one step is zero_grad, forward,
// backward and an AdamW update of every parameter entry (weight decay on matrices only, as
// kiln's trainer does; no clipping), on fresh random tokens each step. With --precision the
// step uses that precision's Linear backends (precision.h): a static loss scale of 1024 for
// fp16 (gradients unscaled before AdamW) and sync() of the low-precision weight copies after
// AdamW, both timed; `all` runs every precision in one process, interleaved step by step.
#include "bench/train_bench.h"

#include <fmt/format.h>

#include <memory>
#include <vector>

#include "bench/bench_util.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/core/trace.h"
#include "kiln/kernels/adamw.h"
#include "kiln/model/transformer.h"
#include "kiln/perf/memory_model.h"
#include "kiln/perf/peak.h"
#include "kiln/perf/profiler.h"
#include "kiln/train/precision.h"
#include "kiln/train/trainer.h"

namespace kiln::bench {

Expected<TrainWorkload> train_workload(const std::string& name) {
  if (name == "w1a") return TrainWorkload{"w1a", 8, 256};        // BENCH.md W1a
  if (name == "w1b") return TrainWorkload{"gpt2-124m", 4, 64};   // BENCH.md W1b: GPT-2 124M shape
  return invalid_argument("unknown workload '{}' (known: w1a, w1b)", name);
}

namespace {

// One model in one precision with its AdamW moments and timings.
struct Run {
  Precision precision = Precision::kF32;
  std::unique_ptr<Transformer> model;
  std::vector<float> m, v;
  std::vector<double> total, fwd, bwd, upd;
  float loss = 0;
};

constexpr float kF16LossScale = 1024.0f;  // static: enough for these shapes, never overflows

void step(Run& r, const std::vector<int32_t>& x, const std::vector<int32_t>& y, int64_t B, int64_t T, int s, bool timed) {
  Transformer& model = *r.model;
  AdamWConfig adam;  // torch.optim.AdamW defaults but lr 3e-4, weight decay 0.1 on matrices
  adam.lr = 3e-4;
  const float scale = r.precision == Precision::kF16 ? kF16LossScale : 1.0f;
  trace::Scope step_scope(trace::Category::kTrain, "step", [&](trace::Event& e) { e.add_arg("step", s); });
  const double t0 = now_seconds();
  model.zero_grad();
  r.loss = model.forward(x.data(), y.data(), B, T).value();
  const double t1 = now_seconds();
  model.backward(scale);
  const double t2 = now_seconds();
  if (scale != 1.0f)
    for (float& g : model.grads()) g /= scale;
  for (const ParamEntry& e : model.param_entries()) {
    adam.weight_decay = e.decay ? 0.1 : 0.0;
    cpu::adamw_step(model.params().data() + e.offset, model.grads().data() + e.offset, r.m.data() + e.offset,
                    r.v.data() + e.offset, e.shape.numel(), adam, s);
  }
  sync_backends(model);
  const double t3 = now_seconds();
  if (timed) {
    r.total.push_back(t3 - t0);
    r.fwd.push_back(t1 - t0);
    r.bwd.push_back(t2 - t1);
    r.upd.push_back(t3 - t2);
  }
}

}  // namespace

int run_train_bench(const TrainBenchOptions& opt) {
  auto w = train_workload(opt.preset);
  auto mode = parse_checkpoint_mode(opt.checkpoint);
  if (!w.ok() || !mode.ok()) {
    fmt::print(stderr, "kiln bench train: {}\n", (!w.ok() ? w.status() : mode.status()).message());
    return 2;
  }
  std::vector<Precision> precisions;
  if (opt.precision == "all") {
    precisions = {Precision::kF32, Precision::kBF16, Precision::kF16, Precision::kFP8};
  } else {
    auto p = parse_precision(opt.precision);
    if (!p.ok()) {
      fmt::print(stderr, "kiln bench train: {}\n", p.status().message());
      return 2;
    }
    precisions = {*p};
  }
  if (opt.threads > 0) set_num_threads(opt.threads);
  const int threads = num_threads();
  const ModelConfig cfg = preset(w->preset).value();
  const int64_t B = w->batch, T = w->seq_len, N = B * T;
  std::vector<Run> runs;
  for (Precision p : precisions) {
    Run r;
    r.precision = p;
    auto model_or = Transformer::create(cfg, 1);
    if (!model_or.ok()) {
      fmt::print(stderr, "kiln bench train: {}\n", model_or.status().message());
      return 2;
    }
    r.model = std::move(*model_or);
    r.model->set_checkpointing(*mode);
    if (auto ctx = install_precision(*r.model, p); !ctx.ok()) {
      fmt::print(stderr, "kiln bench train: {}\n", ctx.status().message());
      return 2;
    }
    r.m.assign(r.model->params().size(), 0.0f);
    r.v.assign(r.model->params().size(), 0.0f);
    runs.push_back(std::move(r));
  }
  std::vector<int32_t> x(static_cast<size_t>(N)), y(static_cast<size_t>(N));
  Rng rng(7);
  // Interleaved: step s of every precision on the same tokens before step s + 1, so drift in
  // the machine's speed (other processes, clocks) falls on all of them alike.
  for (int s = 1; s <= opt.warmup + opt.steps; ++s) {
    for (int64_t i = 0; i < N; ++i) {
      x[static_cast<size_t>(i)] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(cfg.vocab_size)));
      y[static_cast<size_t>(i)] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(cfg.vocab_size)));
    }
    if (s == opt.warmup + 1 && !opt.profile.empty()) trace::start();  // the timed steps only
    for (Run& r : runs) step(r, x, y, B, T, s, s > opt.warmup);
  }
  if (!opt.profile.empty()) {
    TrainOptions t;
    t.batch = B;
    t.seq_len = T;
    auto report = perf::finish_profile(opt.profile, nullptr,
                                       perf::train_profile_meta(cfg, t, 1, perf::fma_peak_gflops(threads)));
    if (!report.ok()) {
      fmt::print(stderr, "kiln bench train: {}\n", report.status().message());
      return 2;
    }
    fmt::print(stderr, "{}", *report);  // stdout may be --json
  }
  const double flops_per_token = cfg.train_flops_per_token(T);
  const double recompute = perf::recompute_flops_per_token(cfg, T, *mode);
  const double peak_f32 = perf::fma_peak_gflops(threads);
  const double peak_bf16 = perf::gemm_peak_gflops(threads, DType::kBF16);  // f32's when bf16 is widened
  double fp32_median = 0;
  for (const Run& r : runs) {
    const Summary st = summarize(r.total);
    if (r.precision == Precision::kF32) fp32_median = st.median;
    const double tokens_per_s = static_cast<double>(N) / st.median;
    const double gflops = tokens_per_s * flops_per_token / 1e9;
    const double peak = r.precision == Precision::kBF16 ? peak_bf16 : peak_f32;
    const double mfu = peak > 0 ? gflops / peak : 0;
    const double hfu = peak > 0 ? tokens_per_s * (flops_per_token + recompute) / 1e9 / peak : 0;
    const double f = summarize(r.fwd).median, b = summarize(r.bwd).median, u = summarize(r.upd).median;
    const double ratio = fp32_median > 0 ? fp32_median / st.median : 0;  // tokens/s vs fp32
    const std::string_view pname = precision_name(r.precision);
    if (opt.json) {
      fmt::print("{{\"bench\": \"train\", \"impl\": \"kiln\", \"workload\": \"{}\", \"precision\": \"{}\", "
                 "\"checkpoint\": \"{}\", \"threads\": {}, \"batch\": {}, "
                 "\"seq_len\": {}, \"params\": {}, \"steps\": {}, \"step_s\": {:.6f}, \"step_s_min\": {:.6f}, "
                 "\"step_s_max\": {:.6f}, \"tokens_per_s\": {:.2f}, \"gflops\": {:.2f}, \"peak_gflops\": {:.1f}, "
                 "\"mfu\": {:.4f}, \"hfu\": {:.4f}, \"forward_s\": {:.6f}, \"backward_s\": {:.6f}, \"optimizer_s\": {:.6f}, "
                 "\"loss\": {:.4f}{}}}\n",
                 opt.preset, pname, opt.checkpoint, threads, B, T, cfg.num_params(), opt.steps, st.median, st.min,
                 st.max, tokens_per_s, gflops, peak, mfu, hfu, f, b, u, r.loss,
                 fp32_median > 0 ? fmt::format(", \"speedup_vs_fp32\": {:.3f}", ratio) : std::string());
    } else {
      fmt::print("kiln bench train {}: {}; batch {} x seq {}; {} thread(s); {} (AdamW fp32){}\n", opt.preset,
                 cfg.describe(), B, T, threads, pname,
                 *mode == CheckpointMode::kNone ? "" : fmt::format("; checkpoint {}", opt.checkpoint));
      fmt::print("step {:.3f} s median of {} (min {:.3f}, max {:.3f}) = forward {:.3f} + backward {:.3f} + AdamW {:.3f}\n",
                 st.median, opt.steps, st.min, st.max, f, b, u);
      fmt::print("{:.1f} tokens/s, {:.1f} GFLOP/s ({:.1f} MFLOP/token), MFU {:.1f}% (HFU {:.1f}%) of {:.0f} GFLOP/s {} "
                 "peak; last loss {:.3f}{}\n",
                 tokens_per_s, gflops, flops_per_token / 1e6, 100 * mfu, 100 * hfu, peak,
                 peak == peak_f32 ? "FMA" : "bf16", r.loss,
                 fp32_median > 0 && r.precision != Precision::kF32
                     ? fmt::format("; {:.2f}x fp32 tokens/s (same run)", ratio)
                     : std::string());
    }
  }
  return 0;
}

}  // namespace kiln::bench
