// `kiln bench quant`: decode-shaped GEMV (rows = 1 by default) of every linear shape of the W2
// presets (w2-s, w2-l; BENCH.md) in f32, bf16, W8A16 (int8 g128), W4A16 (int4 g128), W8A8
// (per-token int8 activations, quantization timed too), fp8 E4M3 (per-channel) and Q8_0 / Q4_0
// (block kernels: groups of 32, int8 activations per block, timed too): time, weight
// bytes / time as effective bandwidth, the speed ratio vs f32, and the per-token matmul total.
// Each shape cycles through enough weight copies (>= --min-mib) that weights come from DRAM.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "apps/kiln/commands.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/dtype.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/block_quant_gemm.h"
#include "kiln/kernels/gemm.h"
#include "kiln/kernels/quant_gemm.h"
#include "kiln/model/config.h"

namespace kiln::app {
namespace {

struct QuantBenchOptions {
  std::vector<std::string> presets = {"w2-s", "w2-l"};
  std::vector<int64_t> rows = {1};
  int reps = 7;
  int64_t min_mib = 128;
};

enum class Fmt { kF32, kBF16, kW8A16, kW4A16, kW8A8, kFp8, kQ8_0, kQ4_0, kCount };
constexpr const char* kFmtNames[] = {"f32", "bf16", "W8A16", "W4A16", "W8A8", "fp8", "Q8_0", "Q4_0"};
static_assert(std::size(kFmtNames) == static_cast<size_t>(Fmt::kCount));
constexpr int64_t kGroup = 128;

struct Shape2 {
  const char* what;
  int64_t out, in, per_token;  // linears of this shape per decoded token
};

std::vector<Shape2> model_shapes(const ModelConfig& c) {
  const int64_t kv = c.n_kv_heads * c.head_dim(), L = c.n_layers;
  return {{"q,o", c.d_model, c.d_model, 2 * L}, {"k,v", kv, c.d_model, 2 * L}, {"gate,up", c.d_ff, c.d_model, 2 * L},
          {"down", c.d_model, c.d_ff, L}, {"lm_head", c.vocab_size, c.d_model, 1}};
}

// One weight copy in a given format; values are random (speed does not depend on them).
struct Weight {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  std::vector<int32_t> sums;
  QuantWeight qw;
  PackedBlockWeight block;  // Q8_0 / Q4_0: the block kernels' layout
  int64_t weight_bytes = 0;  // what one GEMV must read
};

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Weight make_weight(Fmt f, int64_t out, int64_t in, uint64_t seed) {
  Weight w;
  const int64_t n = out * in;
  uint64_t s = seed;
  auto small_float = [&] { return static_cast<float>(static_cast<int64_t>(splitmix(s) >> 40) - (1 << 23)) * 1e-7f; };
  switch (f) {
    case Fmt::kF32: {
      w.bytes.resize(static_cast<size_t>(4 * n));
      auto* p = reinterpret_cast<float*>(w.bytes.data());
      for (int64_t i = 0; i < n; ++i) p[i] = small_float();
      break;
    }
    case Fmt::kBF16: {
      w.bytes.resize(static_cast<size_t>(2 * n));
      auto* p = reinterpret_cast<uint16_t*>(w.bytes.data());
      for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(small_float());
      break;
    }
    default: {
      const QuantFormat qf = (f == Fmt::kW4A16 || f == Fmt::kQ4_0) ? QuantFormat::kInt4
                             : f == Fmt::kFp8                       ? QuantFormat::kFp8E4M3
                                                                    : QuantFormat::kInt8;
      const bool block = f == Fmt::kQ8_0 || f == Fmt::kQ4_0;
      const int64_t group = (f == Fmt::kW8A8 || f == Fmt::kFp8) ? in : block ? kQuantBlock : kGroup;
      w.bytes.resize(static_cast<size_t>(out * quant_row_bytes(qf, in)));
      for (size_t i = 0; i < w.bytes.size(); i += 8) {
        const uint64_t r = splitmix(s);
        for (size_t b = 0; b < 8 && i + b < w.bytes.size(); ++b) w.bytes[i + b] = static_cast<uint8_t>(r >> (8 * b));
      }
      if (qf == QuantFormat::kFp8E4M3)
        for (uint8_t& b : w.bytes) b &= 0xbf;  // |x| < 2: no NaN patterns
      w.scales.assign(static_cast<size_t>(out * (in / group)), 0.01f);
      w.qw = QuantWeight{qf, out, in, group, w.bytes.data(), w.scales.data(), nullptr, false};
      if (f == Fmt::kW8A8) {
        w.sums.resize(static_cast<size_t>(out));
        w8a8_row_sums(w.qw, w.sums.data());
      }
      w.weight_bytes = quant_weight_bytes(w.qw);
      if (block) {
        KILN_CHECK(pack_block_quant(w.qw, &w.block).ok());
        w.weight_bytes = w.block.w.bytes();
        w.bytes = {};  // only the packed copy is read
        w.scales = {};
      }
      return w;
    }
  }
  w.weight_bytes = static_cast<int64_t>(w.bytes.size());
  return w;
}

struct Timing {
  double median = 0, lo = 0, hi = 0;  // seconds per GEMV
};

Timing time_format(Fmt f, const Shape2& sh, int64_t rows, const QuantBenchOptions& o, int64_t* bytes_out) {
  const int64_t one = make_weight(f, 1, sh.in, 1).weight_bytes * sh.out;  // estimate for the copy count
  const int64_t copies = std::max<int64_t>(1, (o.min_mib << 20) / std::max<int64_t>(1, one));
  std::vector<Weight> ws;
  for (int64_t c = 0; c < copies; ++c) ws.push_back(make_weight(f, sh.out, sh.in, 1000 + c));
  *bytes_out = ws[0].weight_bytes;
  std::vector<float> x(static_cast<size_t>(rows * sh.in)), y(static_cast<size_t>(rows * sh.out));
  uint64_t s = 7;
  for (float& v : x) v = static_cast<float>(static_cast<int64_t>(splitmix(s) >> 40) - (1 << 23)) * 1e-7f;
  std::vector<int8_t> xq(x.size());
  std::vector<float> xs(static_cast<size_t>(rows));
  auto run = [&](const Weight& w) {
    if (f == Fmt::kF32 || f == Fmt::kBF16) {
      GemmParams p;
      p.m = rows; p.n = sh.out; p.k = sh.in;
      p.a = x.data(); p.lda = sh.in;
      p.b = w.bytes.data(); p.ldb = sh.in; p.trans_b = true;
      p.b_dtype = f == Fmt::kBF16 ? DType::kBF16 : DType::kF32;
      p.c = y.data(); p.ldc = sh.out;
      cpu::gemm(p);
    } else if (f == Fmt::kQ8_0 || f == Fmt::kQ4_0) {
      BlockQuantGemmParams p;
      p.w = &w.block.w; p.n = rows;
      p.x = x.data(); p.ldx = sh.in;
      p.y = y.data(); p.ldy = sh.out;
      cpu::block_quant_gemm(p);
    } else if (f == Fmt::kW8A8) {
      cpu::quantize_rows_int8(x.data(), rows, sh.in, sh.in, xq.data(), sh.in, xs.data());
      W8A8Params p;
      p.w = &w.qw; p.w_row_sums = w.sums.data(); p.n = rows;
      p.a = xq.data(); p.lda = sh.in; p.a_scales = xs.data();
      p.y = y.data(); p.ldy = sh.out;
      cpu::w8a8_gemm(p);
    } else {
      QuantGemmParams p{&w.qw, rows, x.data(), sh.in, y.data(), sh.out, nullptr, nullptr, 0};
      cpu::quant_gemm(p);
    }
  };
  for (const Weight& w : ws) run(w);  // warm-up (and first touch of y)
  std::vector<double> t;
  for (int r = 0; r < o.reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const Weight& w : ws) run(w);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(copies));
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front(), t.back()};
}

int run_quant_bench(const QuantBenchOptions& o) {
  fmt::print("kiln bench quant: decode GEMV y = x·Wᵀ per linear shape; threads {}, SIMD {}; quant path: {}; "
             "W8A8: {}; Q8_0/Q4_0: {}\n",
             num_threads(), simd_target_name(active_simd_target()), cpu::quant_gemm_path_name(), cpu::w8a8_path_name(),
             cpu::block_quant_path_name());
  fmt::print("W8A16/W4A16: group {} scales; W8A8: per-channel weight, per-token activation scales (quantization "
             "timed); Q8_0/Q4_0: groups of 32, activations int8 per block of 32 (timed); fp8: E4M3, per-channel scales. Median of {} after warm-up (min-max); GB/s = weight bytes / "
             "time.\n",
             kGroup, o.reps);
  for (const std::string& name : o.presets) {
    auto cfg = preset(name);
    if (!cfg.ok()) {
      fmt::print(stderr, "kiln bench quant: {}\n", cfg.status().message());
      return kUserError;
    }
    for (int64_t rows : o.rows) {
      fmt::print("\n{} ({}), rows {}\n", name, cfg->describe(), rows);
      fmt::print("{:>8} {:>12} {:>6} {:>10} {:>26} {:>8} {:>9}\n", "linear", "out x in", "format", "MiB",
                 "us per GEMV (min-max)", "GB/s", "vs f32");
      constexpr int kF = static_cast<int>(Fmt::kCount);
      double total_s[kF] = {}, total_b[kF] = {};
      for (const Shape2& sh : model_shapes(*cfg)) {
        double f32_s = 0;
        for (int fi = 0; fi < kF; ++fi) {
          int64_t bytes = 0;
          const Timing t = time_format(static_cast<Fmt>(fi), sh, rows, o, &bytes);
          if (fi == 0) f32_s = t.median;
          total_s[fi] += t.median * static_cast<double>(sh.per_token);
          total_b[fi] += static_cast<double>(bytes) * static_cast<double>(sh.per_token);
          fmt::print("{:>8} {:>12} {:>6} {:>10.2f} {:>10.1f} ({:>6.1f}-{:>6.1f}) {:>8.1f} {:>8.2f}x\n", sh.what,
                     fmt::format("{}x{}", sh.out, sh.in), kFmtNames[fi], bytes / 1048576.0, t.median * 1e6, t.lo * 1e6,
                     t.hi * 1e6, bytes / t.median * 1e-9, f32_s / t.median);
        }
      }
      fmt::print("one decode step, all linears ({} row{} sharing one read of the weights):\n", rows, rows == 1 ? "" : "s");
      fmt::print("{:>6} {:>12} {:>12} {:>10} {:>12} {:>9}\n", "format", "MiB/step", "ms/step", "GB/s", "tokens/s",
                 "vs f32");
      for (int fi = 0; fi < kF; ++fi)
        fmt::print("{:>6} {:>12.1f} {:>12.3f} {:>10.1f} {:>12.1f} {:>8.2f}x\n", kFmtNames[fi], total_b[fi] / 1048576.0,
                   total_s[fi] * 1e3, total_b[fi] / total_s[fi] * 1e-9, static_cast<double>(rows) / total_s[fi],
                   total_s[0] / total_s[fi]);
    }
  }
  return 0;
}

}  // namespace

void register_bench_quant(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto opt = std::make_shared<QuantBenchOptions>();
  CLI::App* cmd = bench->add_subcommand(
      "quant", "Quantized GEMV on the W2 decode shapes: f32, bf16, W8A16, W4A16, W8A8, fp8 time and GB/s");
  cmd->add_option("--preset", opt->presets, "Model shapes, e.g. w2-s,w2-l")->delimiter(',');
  cmd->add_option("--rows", opt->rows, "Rows (tokens) per GEMV, e.g. 1,8")->delimiter(',')->check(CLI::Range(1, 4096));
  cmd->add_option("--reps", opt->reps, "Timed repetitions after warm-up (median)")->check(CLI::Range(1, 1000));
  cmd->add_option("--min-mib", opt->min_mib, "Cycle through weight copies of at least this many MiB per shape")
      ->check(CLI::Range(1, 1 << 16));
  cmd->callback([opt] {
    const int rc = run_quant_bench(*opt);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace kiln::app
