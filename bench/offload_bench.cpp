// `kiln bench offload` (offload_bench.h).
#include "bench/offload_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "bench/bench_util.h"
#include "bench/train_bench.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/model/config.h"
#include "kiln/train/trainer.h"

namespace kiln::bench {

int run_offload_bench(const OffloadBenchOptions& opt) {
  auto w = train_workload(opt.preset);
  if (!w.ok()) {
    fmt::print(stderr, "kiln bench offload: {}\n", w.status().message());
    return 2;
  }
  if (opt.threads > 0) set_num_threads(opt.threads);
  const ModelConfig cfg = preset(w->preset).value();
  TrainOptions o;  // the trainer's defaults (warm-up, clipping, decay), no validation
  o.batch = w->batch;
  o.seq_len = w->seq_len;
  o.max_steps = opt.warmup + opt.steps;
  o.eval_every = 0;
  TokenShard data;  // uniform random tokens: the step's cost does not depend on them
  data.vocab_size = cfg.vocab_size;
  Rng rng(7);
  data.tokens.resize(static_cast<size_t>(std::max<int64_t>(o.batch * (o.seq_len + 1) * 64, 1 << 16)));
  for (int32_t& t : data.tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(cfg.vocab_size)));

  auto in_memory_model = Transformer::create(cfg, 1), offloaded_model = Transformer::create(cfg, 1);
  if (!in_memory_model.ok() || !offloaded_model.ok()) {
    fmt::print(stderr, "kiln bench offload: {}\n", in_memory_model.status().message());
    return 2;
  }
  Trainer in_memory(**in_memory_model, data, nullptr, o);
  Trainer offloaded(**offloaded_model, data, nullptr, o);
  if (const Status st = offloaded.offload_optimizer_state(opt.dir); !st.ok()) {
    fmt::print(stderr, "kiln bench offload: {}\n", st.message());
    return 2;
  }
  const OffloadedMoments& file = *offloaded.offloaded_moments();
  std::vector<double> t_mem, t_off, io, exposed;
  int64_t moved = 0;
  bool same_losses = true;
  // In turn, step by step, so drift in the machine's speed falls on both alike.
  for (int s = 1; s <= opt.warmup + opt.steps; ++s) {
    const StepStats a = in_memory.step(), b = offloaded.step();
    same_losses &= a.loss == b.loss;
    if (s <= opt.warmup) continue;
    t_mem.push_back(a.seconds);
    t_off.push_back(b.seconds);
    io.push_back(b.offload.io_seconds);
    exposed.push_back(b.offload.exposed_seconds);
    moved = b.offload.bytes_read + b.offload.bytes_written;
  }
  const Summary m = summarize(t_mem), f = summarize(t_off), i = summarize(io), e = summarize(exposed);
  const double moments_mib = 8.0 * static_cast<double>(in_memory.plan().state_size()) / 1048576.0;
  const double staging_mib = static_cast<double>(file.staging_bytes()) / 1048576.0;
  const double rate = i.median > 0 ? static_cast<double>(moved) / i.median / 1e9 : 0;
  if (opt.json) {
    fmt::print("{{\"bench\": \"offload\", \"workload\": \"{}\", \"threads\": {}, \"params\": {}, \"direct_io\": {}, "
               "\"step_s_in_memory\": {:.6f}, \"step_s_offloaded\": {:.6f}, \"slowdown\": {:.3f}, "
               "\"bytes_moved_per_step\": {}, \"io_s\": {:.6f}, \"io_gb_per_s\": {:.3f}, \"exposed_s\": {:.6f}, "
               "\"moments_mib\": {:.2f}, \"staging_mib\": {:.2f}, \"same_losses\": {}}}\n",
               opt.preset, num_threads(), cfg.num_params(), file.direct_io(), m.median, f.median, f.median / m.median,
               moved, i.median, rate, e.median, moments_mib, staging_mib, same_losses);
    return same_losses ? 0 : 1;
  }
  fmt::print("offload: {} ({}, B {}, T {}), {:.1f} M parameters, {} threads; moments in a file in {} ({})\n",
             opt.preset, w->preset, o.batch, o.seq_len, static_cast<double>(cfg.num_params()) / 1e6, num_threads(),
             opt.dir, file.direct_io() ? "direct I/O" : "page cache: this file system refuses O_DIRECT");
  fmt::print("in memory: step {:.3f} s median of {} (min {:.3f}, max {:.3f})\n", m.median, opt.steps, m.min, m.max);
  fmt::print("offloaded: step {:.3f} s median of {} (min {:.3f}, max {:.3f}); {:.0f} MiB moved a step (16 bytes a "
             "parameter) in {:.3f} s of I/O = {:.2f} GB/s, the update waited {:.3f} s of it (exposed)\n",
             f.median, opt.steps, f.min, f.max, static_cast<double>(moved) / 1048576.0, i.median, rate, e.median);
  fmt::print("offloaded / in memory step time: {:.2f}x; memory: the moments' {:.1f} MiB → {:.1f} MiB of staging; "
             "losses {}\n",
             f.median / m.median, moments_mib, staging_mib, same_losses ? "bitwise equal" : "DIFFER");
  return same_losses ? 0 : 1;
}

}  // namespace kiln::bench
