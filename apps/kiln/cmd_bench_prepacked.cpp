// `kiln bench prepacked`: the inference GEMM y = x Wᵀ with W packed once (gemm_prepacked) beside
// the plain cpu::gemm that packs W per call once m > kGemmSmallM, over decode batch sizes m and
// the Linear sizes of llama-tiny (384, 1024) and w2-s (768, 2048). At m <= 8 both run small-M
// kernels: cpu::gemm streams the plain (n, k) W, gemm_prepacked the packed strips.
// With --step-preset: the whole decode step (Transformer::forward_paged, S sequences of one new
// token each, random weights) vs S, with and without install_packed_weights.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "apps/kiln/commands.h"
#include "bench/bench_util.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/gemm.h"
#include "kiln/kernels/gemm_prepacked.h"
#include "kiln/model/config.h"
#include "kiln/model/packed_linear.h"
#include "kiln/model/transformer.h"

namespace kiln::app {
namespace {

struct PrepackedBenchOptions {
  std::vector<int64_t> ms = {1, 4, 8, 16, 32, 64};
  std::vector<int64_t> sizes = {384, 1024, 768, 2048};  // K = N
  std::vector<int> threads = {1, 2};
  int reps = 5;
  int64_t min_mib = 0;  // > 0: cycle through weight copies of at least this many MiB (cold W)
  std::vector<std::string> step_presets;  // decode-step timing for these model presets instead
  std::vector<int64_t> step_seqs = {1, 4, 8, 12, 16, 24, 32, 64};
  int64_t step_cached = 100;  // tokens already cached per sequence
  bool half = false;  // also time W packed as IEEE halves (the GGUF F16 path) beside the f32 packing
};

// Median seconds per call of fn(copy) over reps timed batches, each >= ~20 ms of calls.
template <class F>
double time_per_call(int reps, int copies, F&& fn) {
  for (int c = 0; c < copies; ++c) fn(c);  // warm-up (and first touch)
  double t0 = bench::now_seconds();
  int64_t calls = 0;
  while (bench::now_seconds() - t0 < 0.02 || calls < copies) fn(static_cast<int>(calls++ % copies));
  const int64_t per_batch = std::max<int64_t>(calls, 1);
  std::vector<double> v;
  for (int r = 0; r < reps; ++r) {
    t0 = bench::now_seconds();
    for (int64_t i = 0; i < per_batch; ++i) fn(static_cast<int>(i % copies));
    v.push_back((bench::now_seconds() - t0) / static_cast<double>(per_batch));
  }
  return bench::summarize(v).median;
}

int run_prepacked_bench(const PrepackedBenchOptions& opt) {
  fmt::print("kiln bench prepacked: y (m, n) = x (m, k) Wᵀ, W (n, k) f32, K = N; {}; weights {}\n",
             cpu::gemm_path_name(cpu::GemmPath::kF32),
             opt.min_mib > 0 ? fmt::format("cycled through >= {} MiB of copies (cold)", opt.min_mib) : "warm (one copy)");
  fmt::print("{:>5} {:>3} {:>4} | {:>10} {:>10} {:>7} | {:>14} {:>9}{}\n", "K=N", "thr", "m", "gemm us",
             "prepack us", "ratio", "prepack GFLOP/s", "W GB/s",
             opt.half ? fmt::format(" | {:>10} {:>9} {:>9}", "f16 us", "f16 GB/s", "f32/f16") : "");
  Rng rng(1);
  for (int64_t size : opt.sizes) {
    const int64_t n = size, k = size;
    const int64_t bytes = 4 * n * k;
    const int copies = static_cast<int>(std::max<int64_t>(1, (opt.min_mib << 20) / bytes + (opt.min_mib > 0)));
    std::vector<std::vector<float>> w(static_cast<size_t>(copies));
    for (auto& c : w) {
      c.resize(static_cast<size_t>(n * k));
      for (float& x : c) x = rng.uniform(-1.0f, 1.0f);
    }
    std::vector<PackedMatrix> packed, packed_half;
    for (auto& c : w) {
      packed.push_back(pack_weight(c.data(), n, k));
      if (!opt.half) continue;
      std::vector<uint16_t> h(c.size());
      for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_f16(c[i]);
      packed_half.push_back(pack_weight_as(h.data(), DType::kF16, n, k));
    }
    const int64_t max_m = *std::max_element(opt.ms.begin(), opt.ms.end());
    std::vector<float> x(static_cast<size_t>(max_m * k)), y(static_cast<size_t>(max_m * n));
    for (float& v : x) v = rng.uniform(-1.0f, 1.0f);
    for (int threads : opt.threads) {
      set_num_threads(threads);
      for (int64_t m : opt.ms) {
        GemmParams p;
        p.m = m; p.n = n; p.k = k;
        p.a = x.data(); p.lda = k;
        p.ldb = k; p.trans_b = true;
        p.c = y.data(); p.ldc = n;
        const double t_plain = time_per_call(opt.reps, copies, [&](int c) {
          GemmParams q = p;
          q.b = w[static_cast<size_t>(c)].data();
          cpu::gemm(q);
        });
        const double t_pre = time_per_call(opt.reps, copies, [&](int c) { gemm_prepacked(p, packed[static_cast<size_t>(c)]); });
        std::string half;
        if (opt.half) {  // the half copies are half the bytes: twice as many fit the same MiB
          const double t_half = time_per_call(opt.reps, copies, [&](int c) { gemm_prepacked(p, packed_half[static_cast<size_t>(c)]); });
          half = fmt::format(" | {:>10.1f} {:>9.1f} {:>8.2f}x", t_half * 1e6,
                             static_cast<double>(packed_half[0].packed_bytes()) / t_half * 1e-9, t_pre / t_half);
        }
        fmt::print("{:>5} {:>3} {:>4} | {:>10.1f} {:>10.1f} {:>6.2f}x | {:>14.1f} {:>9.1f}{}\n", size, threads, m,
                   t_plain * 1e6, t_pre * 1e6, t_plain / t_pre, gemm_flops(m, n, k) / t_pre * 1e-9,
                   static_cast<double>(packed[0].packed_bytes()) / t_pre * 1e-9, half);
      }
    }
  }
  fmt::print("ratio = gemm time / prepacked time (> 1: prepacked faster); W GB/s: packed weight bytes read per\n"
             "second by gemm_prepacked (once per call at m <= 8){}.\n",
             opt.half ? "; f16: W packed as IEEE halves (widened in registers), f32/f16 = f32 time / f16 time" : "");
  return 0;
}

// One decode step of S sequences (one new token each, step_cached positions already in the
// paged cache, logits for every row) through forward_paged: ms per step and per token.
int run_step_bench(const PrepackedBenchOptions& opt) {
  for (const std::string& name : opt.step_presets) {
    auto cfg = preset(name);
    if (!cfg.ok()) {
      fmt::print(stderr, "kiln bench prepacked: {}\n", cfg.status().message());
      return kUserError;
    }
    auto model = Transformer::create(*cfg, 1);
    if (!model.ok()) {
      fmt::print(stderr, "kiln bench prepacked: {}\n", model.status().message());
      return kUserError;
    }
    Transformer& m = **model;
    constexpr int64_t kBlock = 16;
    const int64_t max_s = *std::max_element(opt.step_seqs.begin(), opt.step_seqs.end());
    const int64_t blocks_per_seq = (opt.step_cached + 1 + kBlock - 1) / kBlock;
    PagedKvCache cache = m.make_paged_kv_cache(max_s * blocks_per_seq, kBlock);
    fmt::print("decode step, {} ({}), {} cached tokens per sequence, {} threads: ms per forward_paged\n", name,
               cfg->describe(), opt.step_cached, num_threads());
    fmt::print("{:>4} | {:>10} {:>10} {:>7} | {:>14} {:>14}\n", "S", "plain ms", "packed ms", "ratio",
               "plain us/tok", "packed us/tok");
    for (int64_t s : opt.step_seqs) {
      std::vector<int32_t> tokens(static_cast<size_t>(s)), cached(static_cast<size_t>(s), static_cast<int32_t>(opt.step_cached)),
          num_new(static_cast<size_t>(s), 1), table(static_cast<size_t>(s * blocks_per_seq)), rows(static_cast<size_t>(s));
      for (int64_t i = 0; i < s; ++i) {
        tokens[i] = static_cast<int32_t>((7 * i + 3) % cfg->vocab_size);
        rows[i] = static_cast<int32_t>(i);
      }
      for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
      PagedBatch b{tokens, cached, num_new, table, blocks_per_seq, rows};
      double t[2];
      for (int packed = 0; packed < 2; ++packed) {
        for (Linear* l : m.linears()) l->backend.reset();
        if (packed) install_packed_weights(m);
        t[packed] = time_per_call(opt.reps, 1, [&](int) {
          auto r = m.forward_paged(b, cache);
          KILN_CHECK_MSG(r.ok(), "{}", r.status().message());
        });
      }
      fmt::print("{:>4} | {:>10.2f} {:>10.2f} {:>6.2f}x | {:>14.0f} {:>14.0f}\n", s, t[0] * 1e3, t[1] * 1e3, t[0] / t[1],
                 t[0] * 1e6 / s, t[1] * 1e6 / s);
    }
  }
  return 0;
}

}  // namespace

void register_bench_prepacked(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto opt = std::make_shared<PrepackedBenchOptions>();
  CLI::App* cmd = bench->add_subcommand("prepacked", "Inference GEMM with W packed once vs per call (decode m)");
  cmd->add_option("--m", opt->ms, "Rows (batch sizes), e.g. 1,16,64")->delimiter(',')->check(CLI::Range(1, 4096));
  cmd->add_option("--sizes", opt->sizes, "K = N sizes, e.g. 384,2048")->delimiter(',')->check(CLI::Range(1, 16384));
  cmd->add_option("--threads", opt->threads, "Thread counts, e.g. 1,2")->delimiter(',')->check(CLI::Range(1, 256));
  cmd->add_option("--reps", opt->reps, "Timed repetitions (median)")->check(CLI::Range(1, 1000));
  cmd->add_option("--min-mib", opt->min_mib, "Cycle through weight copies of at least this many MiB (cold weights)")
      ->check(CLI::Range(0, 1 << 16));
  cmd->add_flag("--half", opt->half, "Also time W packed as IEEE halves (GGUF F16's path) beside the f32 packing");
  cmd->add_option("--step-preset", opt->step_presets, "Time whole decode steps of these presets instead, e.g. llama-tiny,w2-s")
      ->delimiter(',');
  cmd->add_option("--step-seqs", opt->step_seqs, "Sequences per decode step, e.g. 1,8,16")->delimiter(',')
      ->check(CLI::Range(1, 1024));
  cmd->callback([opt] {
    const int rc = opt->step_presets.empty() ? run_prepacked_bench(*opt) : run_step_bench(*opt);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace kiln::app
