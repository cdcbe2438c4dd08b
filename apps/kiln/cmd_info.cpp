// `kiln info`: the build, the CPU features detected, each kernel family's SIMD path, threads
// (`--formats`, `--memory` here; `--cuda` in cmd_info_cuda.cpp).
#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <memory>

#include "apps/kiln/commands.h"
#include "kiln/core/allocator.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/float_formats.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/registry.h"
#include "kiln/model/transformer.h"
#include "kiln/perf/memory_model.h"
#include "kiln/serve/kv_cache_manager.h"

namespace kiln::app {
namespace {
// Serving's KV cache per token (fp32), beside multi-head and grouped-query attention of the same
// width (n_heads heads of d_model / n_heads; GQA with a quarter of the heads as KV heads).
void print_kv_bytes(const ModelConfig& c) {
  const ModelConfig mha = mha_of_same_width(c), gqa = gqa_of_same_width(c);
  fmt::print("  KV cache (serving, fp32): {} bytes/token{}; MHA of the same width {}, GQA with {} KV heads {}\n",
             kv_bytes_per_token(c, DType::kF32), c.is_mla() ? " (latent attention: [c, k_pe] per layer)" : "",
             kv_bytes_per_token(mha, DType::kF32), gqa.n_kv_heads, kv_bytes_per_token(gqa, DType::kF32));
}


const char* yes_no(bool b) { return b ? "yes" : "no"; }

void run_info() {
  const CpuFeatures& f = cpu_features();
  fmt::print("kiln {}\n", "0.1.0");
  fmt::print("build      : {} , {} {}, C++{}\n", KILN_BUILD_TYPE,
#if defined(__clang__)
             "clang", __clang_version__,
#else
             "g++", __VERSION__,
#endif
             __cplusplus / 100 % 100);
  fmt::print("cpu        : {} ({}), {} logical CPUs\n", f.brand, f.vendor, f.num_logical_cpus);
  fmt::print("caches     : L1d {} KiB, L2 {} KiB, L3 {} KiB\n", f.l1d_bytes >> 10, f.l2_bytes >> 10,
             f.l3_bytes >> 10);
  fmt::print("features   : AVX2 {}  FMA {}  F16C {}  AVX-512F {}  AVX-512BW {}  AVX-512VL {}  "
             "AVX-512DQ {}\n",
             yes_no(f.avx2), yes_no(f.fma), yes_no(f.f16c), yes_no(f.avx512f), yes_no(f.avx512bw),
             yes_no(f.avx512vl), yes_no(f.avx512dq));
  fmt::print("             AVX512_BF16 {}  AVX512_VNNI {}  AVX512_FP16 {}  AVX-VNNI {}  AMX {}\n",
             yes_no(f.avx512_bf16), yes_no(f.avx512_vnni), yes_no(f.avx512_fp16), yes_no(f.avx_vnni),
             yes_no(f.amx_tile));
  fmt::print("simd       : best {}, active {}\n", simd_target_name(best_simd_target()),
             simd_target_name(active_simd_target()));
  fmt::print("threads    : {} ({})\n", num_threads(), thread_placement());
  fmt::print("kernels    :\n");
  for (const KernelPath& k : kernel_paths()) fmt::print("  {:<22} {}\n", k.family, k.path);
}

// `kiln info --formats`: every number measured from the conversion code (float_formats.h).
void run_formats() {
  fmt::print("float formats, measured from kiln's conversions (round to nearest, ties to even)\n");
  fmt::print("{:<7} {:>4} {:>3} {:>10} {:>10} {:>11} {:>11} {:>11} {:>8} {:>4}\n", "format", "bits", "p",
             "eps 2^1-p", "u 2^-p", "largest", "min normal", "min subnorm", "binades", "inf");
  for (const FloatFormatInfo& f : float_format_infos()) {
    fmt::print("{:<7} {:>4} {:>3} {:>10.3e} {:>10.3e} {:>11.4e} {:>11.4e} {:>11.4e} {:>8.1f} {:>4}\n", f.name,
               f.storage_bits, f.significant_bits, f.epsilon, f.unit_roundoff, f.largest_finite,
               f.smallest_normal, f.smallest_subnormal, std::log2(f.largest_finite / f.smallest_subnormal),
               yes_no(f.has_infinity));
  }
  fmt::print("p: significant bits (precision); eps: gap above 1; u: largest relative rounding error;\n"
             "binades: log2(largest / min subnormal), the range in powers of two\n");
}

// `kiln info --memory`: the memory model of one training step (perf/memory_model.h).
struct MemoryArgs {
  bool enabled = false;
  std::string preset = "llama-tiny", precision = "fp32", checkpoint = "none";
  int64_t batch = 8, seq = 256;
  // Data and tensor parallel (any of them given: the per-rank prediction).
  int dp = 1, zero = 0, hsdp = 0, fsdp_unit = 1, prefetch = 1, tp = 1;
  bool sp = false;
  bool data_parallel = false;
};

void run_memory(const MemoryArgs& a) {
  auto fail = [](const Status& s) {
    fmt::print(stderr, "kiln info --memory: {}\n", s.message());
    throw CLI::RuntimeError(kUserError);
  };
  auto cfg = preset(a.preset);
  if (!cfg.ok()) fail(cfg.status());
  if (a.seq > cfg->max_seq_len) fail(invalid_argument("--seq {} exceeds the preset's context {}", a.seq, cfg->max_seq_len));
  auto p = parse_precision(a.precision);
  if (!p.ok()) fail(p.status());
  auto m = parse_checkpoint_mode(a.checkpoint);
  if (!m.ok()) fail(m.status());
  if (a.data_parallel) {
    if (a.dp < 1) fail(invalid_argument("--dp {} must be >= 1", a.dp));
    if (a.zero < 0 || a.zero > 3) fail(invalid_argument("--zero {}: the ZeRO stage is 0, 1, 2 or 3", a.zero));
    if (a.batch % a.dp != 0)
      fail(invalid_argument("--batch {} (the global batch) does not divide over --dp {} ranks", a.batch, a.dp));
    if (a.hsdp < 0) fail(invalid_argument("--hsdp {} must be >= 1", a.hsdp));
    if (a.hsdp > 0 && a.zero == 0)
      fail(invalid_argument("--hsdp {} shards within groups: it needs --zero 1, 2 or 3", a.hsdp));
    if (a.hsdp > 0 && a.dp % a.hsdp != 0)
      fail(invalid_argument("--hsdp {} does not divide --dp {}: groups of {} ranks must tile the data-parallel ranks",
                            a.hsdp, a.dp, a.hsdp));
    if (a.fsdp_unit < 1) fail(invalid_argument("--fsdp-unit {} must be >= 1 block", a.fsdp_unit));
    if (a.prefetch < 0) fail(invalid_argument("--prefetch {} must be >= 0", a.prefetch));
    if (a.zero == 3 && *p != Precision::kF32)
      fail(invalid_argument("--zero 3 runs fp32 only (got --precision {})", precision_name(*p)));
    // Tensor parallel: the checks of parallel::check_tensor_parallel, in flag terms.
    if (a.tp < 1) fail(invalid_argument("--tp {} must be >= 1", a.tp));
    if (Status s = check_tensor_split(*cfg, a.tp); !s.ok()) fail(invalid_argument("--tp {}: {}", a.tp, s.message()));
    if (a.sp && a.tp < 2)
      fail(invalid_argument("--sp splits the sequence over the tensor-parallel ranks: it needs --tp 2 or more"));
    if (a.sp && a.seq % a.tp != 0)
      fail(invalid_argument("--sp splits the sequence over --tp {} ranks: --seq {} must be a multiple of it", a.tp, a.seq));
    if (a.tp > 1 && a.zero != 0)
      fail(invalid_argument("--zero {} with --tp {}: tensor parallelism composes with DDP (--zero 0) only", a.zero, a.tp));
    perf::DataParallelMemory d;
    d.dp = a.dp;
    d.zero = a.zero;
    d.shard_group = a.hsdp;
    d.fsdp_unit_blocks = a.fsdp_unit;
    d.prefetch = a.prefetch;
    fmt::print("{}", perf::format_memory_prediction(perf::predict_memory(*cfg, a.batch, a.seq, *p, *m, d, {a.tp, a.sp})));
    print_kv_bytes(*cfg);
    if (a.tp > 1 && a.seq % a.tp == 0) {  // what sequence parallelism saves, either way it was asked
      auto acts = [&](bool sp) {
        return static_cast<double>(perf::predict_memory(*cfg, a.batch, a.seq, *p, *m, d, {a.tp, sp}).activation_block_bytes()) /
               1048576.0;
      };
      const double with = acts(true), without = acts(false);
      fmt::print("  sequence parallel: activations and scratch per rank {:.2f} MiB with --sp, {:.2f} MiB without "
                 "({:.1f}% saved)\n", with, without, 100 * (1 - with / without));
    }
    return;
  }
  fmt::print("{}", perf::format_memory_prediction(perf::predict_memory(*cfg, a.batch, a.seq, *p, *m)));
  print_kv_bytes(*cfg);
  fmt::print("  (under full checkpointing one set of layer buffers is shared by all layers, under selective the\n"
             "   attention output O and lse are; kiln train --memory-report compares this with the caching\n"
             "   allocator's measured peak)\n");
}

}  // namespace

void register_info(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("info", "Print the build, CPU features, SIMD paths and threads");
  auto formats = std::make_shared<bool>(false);
  cmd->add_flag("--formats", *formats,
                "Print each float format's precision and range (f32, tf32, bf16, f16, fp8 e4m3/e5m2)");
  auto mem = std::make_shared<MemoryArgs>();
  cmd->add_flag("--memory", mem->enabled, "Print the memory model of a training step (with --preset, --batch, --seq, "
                                           "--precision, --checkpoint)");
  cmd->add_option("--preset", mem->preset, "--memory: model preset");
  cmd->add_option("--batch", mem->batch, "--memory: sequences per step")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--seq", mem->seq, "--memory: tokens per sequence; --cuda: attention's (default 4096)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--precision", mem->precision, "--memory: fp32 | bf16 | fp16 | fp8")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16", "fp8"}));
  cmd->add_option("--checkpoint", mem->checkpoint, "--memory: none | full | selective")
      ->check(CLI::IsMember({"none", "full", "selective"}));
  // Data parallel: validated in run_memory, so that the errors say what was wrong.
  auto dp_opt = [&](const char* name, int& v, const char* what) {
    cmd->add_option_function<int>(name, [mem, &v](int x) { v = x; mem->data_parallel = true; }, what);
  };
  dp_opt("--dp", mem->dp, "--memory: data-parallel ranks (per-rank prediction; --batch is the global batch)");
  dp_opt("--zero", mem->zero, "--memory: ZeRO stage 0 (DDP), 1, 2, 3 (FSDP)");
  dp_opt("--hsdp", mem->hsdp, "--memory: shard within groups of this many ranks (divides --dp)");
  dp_opt("--fsdp-unit", mem->fsdp_unit, "--memory: blocks per FSDP unit");
  dp_opt("--prefetch", mem->prefetch, "--memory: ZeRO-3 units gathered ahead");
  dp_opt("--tp", mem->tp, "--memory: tensor-parallel ranks (with --dp: dp × tp ranks; divides heads, d_ff, vocab)");
  cmd->add_flag_function("--sp", [mem](int64_t) { mem->sp = mem->data_parallel = true; },
                         "--memory: sequence parallelism over the --tp ranks (needs --tp >= 2, --seq divisible by it)");
  std::function<bool()> run_cuda = add_info_cuda(cmd);  // after --seq, which it shares
  cmd->callback([formats, mem, run_cuda] {
    if (run_cuda()) return;
    if (mem->enabled) run_memory(*mem);
    else if (*formats) run_formats();
    else run_info();
  });
}

}  // namespace kiln::app
