// The GEMM benchmark behind `kiln bench gemm`: the three implementations are called in turn
// inside every repetition (interleaved, so drift hits all alike), each sample long enough to
// time (>= ~30 ms of calls), median of the repetitions after a warm-up, min-max printed.
#include "bench/gemm_bench.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/peers.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/cpu/gemm_driver.h"
#include "kiln/kernels/cpu/quant_tiles.h"
#include "kiln/kernels/gemm.h"
#include "kiln/kernels/gemm_f16.h"
#include "kiln/kernels/gemm_prepacked.h"
#include "kiln/perf/peak.h"
#include "kiln/perf/roofline.h"

namespace kiln::bench {
namespace {

// Owned, 64-byte aligned, first-touched operand storage (f32 or bf16 elements).
class Buffer {
 public:
  Buffer(int64_t elems, DType dtype, Rng& rng) : dtype_(dtype) {
    // Large operands on transparent huge pages (THP is "madvise" on these VMs), like the buffer
    // perf::measure_dram_read_gbps streams: the ceiling and the GEMMs see the same TLB reach.
    const size_t align = elems * 4 >= (4 << 20) ? size_t{2} << 20 : 64;
    const size_t bytes = (static_cast<size_t>(dtype_nbytes(dtype, elems)) + align - 1) & ~(align - 1);
    mem_.reset(static_cast<char*>(std::aligned_alloc(align, bytes)));
    if (align > 64) madvise(mem_.get(), bytes, MADV_HUGEPAGE);
    if (dtype == DType::kBF16) {
      auto* p = reinterpret_cast<uint16_t*>(mem_.get());
      for (int64_t i = 0; i < elems; ++i) p[i] = f32_to_bf16(rng.uniform(-1.0f, 1.0f));
    } else {
      auto* p = reinterpret_cast<float*>(mem_.get());
      for (int64_t i = 0; i < elems; ++i) p[i] = rng.uniform(-1.0f, 1.0f);
    }
  }
  void* data() const { return mem_.get(); }
  float* f32() const { return reinterpret_cast<float*>(mem_.get()); }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> mem_;
  DType dtype_;
};

struct Impl {
  std::string name;
  std::function<void(const void* a, const void* b, float* c)> run;
};

struct Row {
  std::string dtype, mode;
  bool packed = false;  // kiln ran gemm_prepacked on the weight packed once (decode rows)
  GemmShape shape;
  int threads = 1;
  std::vector<std::string> names;
  std::vector<Summary> gflops;  // per impl, [0] = kiln
  double bytes_b = 0;           // weight bytes per call (decode rows)
  Summary dram;                 // decode rows: DRAM read probe, one pass per round (GB/s)
  // Cold decode rows, per round: kiln's GFLOP/s and the DRAM pass (GB/s) timed right after it.
  std::vector<std::pair<double, double>> kiln_dram_rounds;
};

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Before another implementation runs on several threads, waits until the previous one's
// workers stop spinning (OpenBLAS spins ~2^28 cycles after a call, OpenMP and kiln's pool less):
// sleeps in 5 ms steps until the process uses < 10% of a core, at most 400 ms.
void settle(int threads, const std::string& previous) {
  if (threads <= 1 || previous.empty()) return;
  for (int i = 0; i < 80; ++i) {
    const double c0 = process_cpu_seconds(), w0 = now_seconds();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (process_cpu_seconds() - c0 < 0.1 * (now_seconds() - w0)) return;
  }
}

// Times each impl `reps` times (after one warm-up), interleaved; each sample runs `inner` calls,
// rotating over `num_b` weight matrices (cold decode) when there are several. With a probe, each
// round also times one DRAM read pass right after kiln's sample (GB/s into *dram; the pair of
// kiln's GFLOP/s and the pass's GB/s into *paired): a cold decode row is rated against the
// ceiling taken at the start, against the best pass of its own rounds, and pass by pass against
// the one beside it.
// The VM's 2-thread DRAM rate jumps between ~35 and ~60 GB/s within seconds; a pair of samples
// taken back to back nearly always sees one state, a row's median and its best pass may not.
std::vector<Summary> time_impls(const std::vector<Impl>& impls, const void* a,
                                const std::vector<const void*>& bs, float* c, double flops,
                                int reps, int threads, const perf::DramReadProbe* probe = nullptr,
                                Summary* dram = nullptr,
                                std::vector<std::pair<double, double>>* paired = nullptr) {
  size_t next_b = 0;
  auto call = [&](const Impl& im) { im.run(a, bs[next_b++ % bs.size()], c); };
  // Warm-up (also sizes the inner loop from kiln's time).
  double t_kiln = 0;
  std::string prev;
  for (const Impl& im : impls) {
    settle(threads, prev);
    const double t0 = now_seconds();
    call(im);
    if (im.name == "kiln") t_kiln = now_seconds() - t0;
    prev = im.name;
  }
  const int inner = static_cast<int>(std::clamp(std::ceil(0.03 / std::max(t_kiln, 1e-7)), 1.0, 2000.0));
  std::vector<std::vector<double>> samples(impls.size());
  std::vector<double> dram_samples;
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < impls.size(); ++i) {
      settle(threads, prev);
      const double t0 = now_seconds();
      for (int q = 0; q < inner; ++q) call(impls[i]);
      const double dt = (now_seconds() - t0) / inner;
      samples[i].push_back(flops / dt * 1e-9);
      prev = impls[i].name;
      if (i == 0 && probe && dram) {
        settle(threads, prev);
        dram_samples.push_back(probe->pass(threads));
        if (paired) paired->emplace_back(samples[0].back(), dram_samples.back());
        prev = "dram probe";
      }
    }
  }
  if (probe && dram) *dram = summarize(dram_samples);
  std::vector<Summary> out;
  for (auto& s : samples) out.push_back(summarize(s));
  return out;
}

// Weight copies packed once (pack_weight_as), each beside the plain weight it was packed from.
using PackedCopies = std::vector<std::pair<const void*, PackedMatrix>>;

// With `packed` (B stored (n, k)), kiln runs gemm_prepacked on the packed copy of the weight it
// is handed; the peers always read the plain weights.
std::vector<Impl> make_impls(const GemmShape& s, std::shared_ptr<const PackedCopies> packed = nullptr) {
  std::vector<Impl> impls;
  impls.push_back({"kiln", [s, packed](const void* a, const void* b, float* c) {
                     GemmParams p;
                     p.m = s.m; p.n = s.n; p.k = s.k;
                     p.a = a; p.lda = s.k; p.a_dtype = s.dtype;
                     p.b = b; p.ldb = s.trans_b ? s.k : s.n; p.b_dtype = s.dtype; p.trans_b = s.trans_b;
                     p.c = c; p.ldc = s.n;
                     if (!packed) return cpu::gemm(p);
                     for (const auto& [plain, pm] : *packed)
                       if (plain == b) return gemm_prepacked(p, pm);
                     KILN_CHECK_MSG(false, "bench gemm: no packed copy of weight {}", b);
                   }});
  std::shared_ptr<PeerGemm> ob = make_openblas_gemm(s), od = make_onednn_gemm(s);
  if (ob) impls.push_back({"openblas", [ob](const void* a, const void* b, float* c) { ob->run(a, b, c); }});
  if (od) impls.push_back({"onednn", [od](const void* a, const void* b, float* c) { od->run(a, b, c); }});
  return impls;
}

struct Context {
  explicit Context(const GemmBenchOptions& o) : opt(o) {}
  const GemmBenchOptions& opt;
  double peak_f32[8] = {}, peak_bf16[8] = {}, dram[8] = {};
  std::unique_ptr<perf::DramReadProbe> dram_probe;  // decode rows: one pass per timing round
  std::vector<Row> rows;
};

void print_row(Context& ctx, const Row& r) {
  // bf16 rows against the peak of the products their kernel issues (vdpbf16ps or AMX tiles; f32
  // FMA when widened).
  const double peak = (r.dtype == "bf16" && cpu::bf16_gemm_on_bf16_products() ? ctx.peak_bf16 : ctx.peak_f32)[r.threads];
  const Summary& k = r.gflops[0];
  const double pct = peak > 0 ? 100.0 * k.median / peak : 0.0;
  const double flops = gemm_flops(r.shape.m, r.shape.n, r.shape.k);
  auto gbs = [&](double gf) { return r.bytes_b > 0 ? gf * 1e9 / flops * r.bytes_b * 1e-9 : 0.0; };
  // The roofline (perf/roofline.h): decode rows move the weight once (bytes_b), squares their
  // compulsory traffic; both against this thread count's FMA peak and DRAM ceiling.
  GemmParams gp;
  gp.m = r.shape.m, gp.n = r.shape.n, gp.k = r.shape.k;
  gp.a_dtype = gp.b_dtype = r.dtype == "bf16" ? DType::kBF16 : DType::kF32;
  const double intensity = flops / (r.bytes_b > 0 ? r.bytes_b : gemm_bytes(gp));
  const perf::Roofline roof{peak, ctx.dram[r.threads]};
  const double pct_roof = roof.attainable(intensity) > 0 ? 100 * k.median / roof.attainable(intensity) : 0.0;
  // Cold decode rows, pass by pass: kiln's weight rate over the DRAM pass beside it, and kiln
  // over the roof that pass sets (medians over the rounds).
  std::vector<double> dram_ratio, roof_ratio;
  for (const auto& [gf, d] : r.kiln_dram_rounds) {
    dram_ratio.push_back(gbs(gf) / d);
    roof_ratio.push_back(gf / perf::Roofline{peak, d}.attainable(intensity));
  }
  const double pct_dram_paired = 100 * summarize(dram_ratio).median;
  const double pct_roof_paired = 100 * summarize(roof_ratio).median;
  if (ctx.opt.json) {
    for (size_t i = 1; i < r.names.size(); ++i) {
      std::string extra;
      if (r.bytes_b > 0) {
        const double d = ctx.dram[r.threads];
        extra = fmt::format(R"(, "kiln_gbs": {:.2f}, "peer_gbs": {:.2f}, "dram_gbs": {:.2f}, "pct_dram": {:.1f})",
                            gbs(k.median), gbs(r.gflops[i].median), d, d > 0 ? 100 * gbs(k.median) / d : 0.0);
        if (r.dram.max > 0)
          extra += fmt::format(R"(, "dram_rounds_min": {:.2f}, "dram_rounds_max": {:.2f}, "pct_dram_rounds": {:.1f}, "pct_dram_paired": {:.1f}, "pct_roof_paired": {:.1f})",
                               r.dram.min, r.dram.max, 100 * gbs(k.median) / r.dram.max, pct_dram_paired,
                               pct_roof_paired);
      }
      fmt::print(R"({{"op": "gemm", "dtype": "{}", "mode": "{}", "w_layout": "{}", "m": {}, "n": {}, "k": {}, "trans_b": {}, "threads": {}, "kiln_gflops": {:.2f}, "kiln_min": {:.2f}, "kiln_max": {:.2f}, "peer": "{}", "peer_gflops": {:.2f}, "ratio": {:.3f}, "pct_peak": {:.1f}, "intensity": {:.3f}, "bound": "{}", "roof_gflops": {:.1f}, "pct_roof": {:.1f}{}}})"
                 "\n",
                 r.dtype, r.mode, r.packed ? "packed" : "plain", r.shape.m, r.shape.n, r.shape.k, r.shape.trans_b, r.threads,
                 k.median, k.min, k.max, r.names[i], r.gflops[i].median,
                 k.median / r.gflops[i].median, pct, intensity, roof.bound_name(intensity),
                 roof.attainable(intensity), pct_roof, extra);
    }
    std::fflush(stdout);
    return;
  }
  // A trailing t: B stored (n, k) (decode rows always are; --shapes 256x3072x768t asks for it).
  const std::string k_text = fmt::format("{}{}", r.shape.k, r.shape.trans_b && r.bytes_b == 0 ? "t" : "");
  std::string line = fmt::format("{:<5} {:<7} {:>4}x{:<4}x{:<5} {:>2}  {:>7.1f} ({:>6.1f}-{:<6.1f}) {:>5.1f}%",
                                 r.dtype, r.packed ? r.mode + "/pk" : r.mode, r.shape.m, r.shape.n, k_text, r.threads, k.median,
                                 k.min, k.max, pct);
  for (size_t i = 1; i < r.names.size(); ++i)
    line += fmt::format(" | {:<8} {:>7.1f} ({:>6.1f}-{:<6.1f}) x{:<5.2f}", r.names[i], r.gflops[i].median,
                        r.gflops[i].min, r.gflops[i].max, k.median / r.gflops[i].median);
  if (r.bytes_b > 0) {
    const double d = ctx.dram[r.threads];
    line += fmt::format(" | B {:.1f} GB/s = {:.0f}% of DRAM {:.1f}", gbs(k.median), d > 0 ? 100 * gbs(k.median) / d : 0.0, d);
    if (r.dram.max > 0)
      line += fmt::format(", {:.0f}% of {:.1f} in its rounds, {:.0f}% paired (passes {:.1f}-{:.1f}) | "
                          "{:.2f} FLOP/B, {}-bound: {:.0f}% of the roof, {:.0f}% paired",
                          100 * gbs(k.median) / r.dram.max, r.dram.max, pct_dram_paired, r.dram.min, r.dram.max,
                          intensity, roof.bound_name(intensity), pct_roof, pct_roof_paired);
  }
  fmt::print("{}\n", line);
  std::fflush(stdout);
}

void bench_shape(Context& ctx, const GemmShape& s, int threads, const std::string& mode,
                 int64_t l3_bytes, bool packed = false) {
  Rng rng(42);
  Buffer a(s.m * s.k, s.dtype, rng);
  Buffer c(s.m * s.n, DType::kF32, rng);
  const int64_t b_elems = s.k * s.n;
  const double b_bytes = static_cast<double>(dtype_nbytes(s.dtype, b_elems));
  int num_b = 1;
  if (mode == "cold") num_b = std::max(2, static_cast<int>(std::ceil(3.0 * l3_bytes / b_bytes)));
  std::vector<std::unique_ptr<Buffer>> bs;
  std::vector<const void*> b_ptrs;
  for (int i = 0; i < num_b; ++i) {
    bs.push_back(std::make_unique<Buffer>(b_elems, s.dtype, rng));
    b_ptrs.push_back(bs.back()->data());
  }
  std::shared_ptr<PackedCopies> pms;
  if (packed) {
    pms = std::make_shared<PackedCopies>();
    for (const void* b : b_ptrs) pms->emplace_back(b, pack_weight_as(b, s.dtype, s.n, s.k));
  }
  const std::vector<Impl> impls = make_impls(s, pms);
  Row r;
  r.dtype = std::string(dtype_name(s.dtype));
  r.mode = mode;
  r.packed = packed;
  r.shape = s;
  r.threads = threads;
  for (const Impl& im : impls) r.names.push_back(im.name);
  r.bytes_b = s.m <= cpu::kGemmSmallM ? b_bytes : 0.0;
  r.gflops = time_impls(impls, a.data(), b_ptrs, c.f32(), gemm_flops(s.m, s.n, s.k), ctx.opt.reps, threads,
                        r.bytes_b > 0 && mode == "cold" ? ctx.dram_probe.get() : nullptr, &r.dram,
                        &r.kiln_dram_rounds);
  print_row(ctx, r);
  ctx.rows.push_back(r);
}

// One --shapes token: "512" (square), "MxNxK" (B stored K x N), "MxNxKt" (B stored N x K), or "dM",
// "dMw", "dMc" (decode-like M rows against a 4096 x 4096 weight; warm and cold, warm or cold only).
// `--dtype f16`: the fp16-arithmetic GEMM (gemm_f16.h) beside the f32 GEMM on the same values
// (widened) and oneDNN's f16 matmul where it has one, C = A (m, k) · B^T with B stored (n, k);
// the normalized error of the fp16 sums against the f32 result, whose own error is ~1e-14.
void bench_f16(Context& ctx, int64_t m, int64_t n, int64_t k, int threads) {
  Rng rng(42);
  std::vector<uint16_t> a16(static_cast<size_t>(m * k)), b16(static_cast<size_t>(n * k));
  std::vector<float> a32(a16.size()), b32(b16.size());
  for (size_t i = 0; i < a16.size(); ++i)
    a32[i] = f16_to_f32(a16[i] = f32_to_f16(rng.uniform(-1.0f, 1.0f)));
  for (size_t i = 0; i < b16.size(); ++i)
    b32[i] = f16_to_f32(b16[i] = f32_to_f16(rng.uniform(-1.0f, 1.0f)));
  std::vector<float> c16(static_cast<size_t>(m * n)), c32(c16.size()), cpeer(c16.size());
  GemmF16Params p;
  p.m = m, p.n = n, p.k = k, p.chunk = ctx.opt.f16_chunk;
  p.a = a16.data(), p.lda = k, p.b = b16.data(), p.ldb = k, p.c = c16.data(), p.ldc = n;
  GemmParams g;
  g.m = m, g.n = n, g.k = k;
  g.a = a32.data(), g.lda = k, g.b = b32.data(), g.ldb = k, g.trans_b = true, g.c = c32.data(),
  g.ldc = n;
  std::vector<Impl> impls = {{"kiln", [&](const void*, const void*, float*) { cpu::gemm_f16(p); }},
                             {"kiln f32", [&](const void*, const void*, float*) { cpu::gemm(g); }}};
  std::shared_ptr<PeerGemm> od = make_onednn_gemm({m, n, k, true, DType::kF16});
  if (od)
    impls.push_back({"onednn", [&](const void*, const void*, float*) {
                       od->run(a16.data(), b16.data(), cpeer.data());
                     }});
  const double flops = gemm_flops(m, n, k);
  const std::vector<Summary> r =
      time_impls(impls, nullptr, {nullptr}, nullptr, flops, ctx.opt.reps, threads);
  double num = 0, den = 0, num_peer = 0;
  for (size_t i = 0; i < c32.size(); ++i) {
    num += (static_cast<double>(c16[i]) - c32[i]) * (static_cast<double>(c16[i]) - c32[i]);
    num_peer += (static_cast<double>(cpeer[i]) - c32[i]) * (static_cast<double>(cpeer[i]) - c32[i]);
    den += static_cast<double>(c32[i]) * c32[i];
  }
  // The fp16 FMA issues twice the f32 FMA's FLOPs per instruction: its peak is twice the f32 one.
  const double peak = (cpu::gemm_f16_native() ? 2.0 : 1.0) * ctx.peak_f32[threads];
  const std::string shape = fmt::format("{}x{}x{}", m, n, k);
  if (ctx.opt.json) {
    fmt::print(
        R"({{"op": "gemm_f16", "m": {}, "n": {}, "k": {}, "threads": {}, "chunk": {}, "native": {}, "kiln_f16_gflops": {:.1f}, "kiln_f32_gflops": {:.1f}, "onednn_f16_gflops": {:.1f}, "nmse_vs_f32": {:.3g}, "onednn_nmse_vs_f32": {:.3g}}})"
        "\n",
        m, n, k, threads, p.chunk, cpu::gemm_f16_native(), r[0].median, r[1].median,
        od ? r[2].median : 0.0, den > 0 ? num / den : 0.0, od && den > 0 ? num_peer / den : 0.0);
    return;
  }
  fmt::print("{:>15} {:>2}  {:>7.1f} {:>5.1f}%  {:>7.1f} {:>5.2f}x  {:>9.3g}", shape, threads,
             r[0].median, peak > 0 ? 100 * r[0].median / peak : 0.0, r[1].median,
             r[0].median / r[1].median, den > 0 ? num / den : 0.0);
  if (od)
    fmt::print("  | onednn f16 {:>7.1f} x{:.2f} (nmse {:.3g})", r[2].median,
               r[0].median / r[2].median, den > 0 ? num_peer / den : 0.0);
  fmt::print("\n");
}

struct ShapeToken {
  int64_t m = 0, n = 0, k = 0;
  bool trans_b = false;
  bool decode = false, warm = true, cold = true;
};

// Each dimension 1..16384, and A, B and C together at most 2^28 elements (1 GiB in f32).
std::optional<ShapeToken> parse_shape_token(std::string tok) {
  constexpr int64_t kMaxDim = 16384, kMaxElems = int64_t{1} << 28;
  const auto dim = [&](const std::string& text) -> int64_t {
    const bool digits = std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (text.empty() || text.size() > 5 || !digits) return 0;
    const int64_t v = std::stoll(text);
    return v <= kMaxDim ? v : 0;
  };
  ShapeToken st;
  if (!tok.empty() && tok[0] == 'd') {
    st.decode = true;
    tok.erase(0, 1);
    if (!tok.empty() && (tok.back() == 'w' || tok.back() == 'c')) {
      st.warm = tok.back() == 'w';
      st.cold = tok.back() == 'c';
      tok.pop_back();
    }
    st.m = dim(tok);
    return st.m > 0 ? std::optional(st) : std::nullopt;
  }
  if (!tok.empty() && tok.back() == 't') {
    st.trans_b = true;
    tok.pop_back();
  }
  std::vector<int64_t> dims;
  for (size_t start = 0;;) {
    const size_t x = tok.find('x', start);
    dims.push_back(dim(tok.substr(start, x == std::string::npos ? std::string::npos : x - start)));
    if (x == std::string::npos) break;
    start = x + 1;
  }
  if (dims.size() == 1 && !st.trans_b) dims = {dims[0], dims[0], dims[0]};
  if (dims.size() != 3 || std::find(dims.begin(), dims.end(), 0) != dims.end()) return std::nullopt;
  st.m = dims[0];
  st.n = dims[1];
  st.k = dims[2];
  if (st.m * st.k + st.k * st.n + st.m * st.n > kMaxElems) return std::nullopt;
  return st;
}

// --tiles: the f32 micro-kernel's register tilings in L1 (cpu::f32_tile_rates) beside the FMA loop,
// one thread. The loop is the ceiling of any tiling; how far each one stays below it, and whether
// the one cpu::gemm uses is the best of its neighbours, is this CPU's answer.
void bench_tiles(const GemmBenchOptions& opt) {
  set_num_threads(1);
  constexpr int kRounds = 5;
  const perf::FmaPeak pf = perf::measure_fma_peak(DType::kF32, 1);
  const std::vector<cpu::TileRate> rates = cpu::f32_tile_rates(0.05, kRounds);
  const double loop = pf.loop_gflops;
  if (!opt.json) {
    fmt::print("kiln bench gemm --tiles: the f32 micro-kernel's register tilings (MR x NR of C in registers)\n");
    fmt::print("each on one tile whose A strip and B micro-panel fit in 3/4 of L1, best of {} alternated rounds,\n",
               kRounds);
    fmt::print("beside the register-only FMA loop ({:.1f} GFLOP/s, 1 thread) on {}\n", loop, cpu_features().brand);
    fmt::print("{:<28} {:>5} {:>10} {:>9}\n", "tiling", "used", "GFLOP/s", "% loop");
  }
  for (const cpu::TileRate& r : rates) {
    const double pct = loop > 0 ? 100 * r.gflops / loop : 0.0;
    if (opt.json)
      fmt::print(
          R"({{"op": "tile", "name": "{}", "mr": {}, "nr": {}, "used": {}, "gflops": {:.1f}, "loop_gflops": {:.1f}, "pct_loop": {:.1f}}})"
          "\n",
          r.name, r.mr, r.nr, r.used, r.gflops, loop, pct);
    else
      fmt::print("{:<28} {:>5} {:>10.1f} {:>8.1f}%\n", r.name, r.used ? "yes" : "", r.gflops, pct);
  }
}

// --pack: the packing of B alone, as the driver runs it on one thread (each NC panel's K blocks
// into one panel buffer), for a W1b MLP weight (3072 x 768) in both stored layouts: (n, k) is a
// Linear weight in the forward (y = x W^T: packing transposes it), (k, n) the same weight in the
// input gradient (rows copied). GB/s of the stored weight read; cold rotates copies over 3x the
// L3, so the reads come from DRAM as in a training step.
void bench_pack(Context& ctx, DType dt, int64_t l3) {
  const cpu::GemmTargetKernels& kernels = cpu::gemm_target_kernels();
  const cpu::PackedPath& path = dt == DType::kF32 ? kernels.f32 : cpu::bf16_packed_path(kernels, cpu::bf16_gemm_kernel());
  const cpu::GemmBlocking blk = cpu::gemm_blocking(path.k_per_step == 2 ? cpu::GemmPath::kBF16 : cpu::GemmPath::kF32);
  constexpr int64_t kOut = 3072, kIn = 768;
  for (bool trans : {true, false}) {
    GemmParams p;
    p.m = 256;  // unused by pack_b
    p.n = trans ? kOut : kIn;
    p.k = trans ? kIn : kOut;
    p.b_dtype = dt;
    p.trans_b = trans;
    p.ldb = trans ? p.k : p.n;
    const double bytes = static_cast<double>(dtype_nbytes(dt, p.n * p.k));
    cpu::PanelLayout lay = cpu::panel_layout(p, path, blk);
    const int64_t nc_max = std::max<int64_t>(path.nr, blk.nc / path.nr * path.nr);
    lay.strips = (std::min(p.n, nc_max) + path.nr - 1) / path.nr;
    std::vector<uint32_t> panel(static_cast<size_t>(lay.elems()));
    for (const char* mode : {"cold", "warm"}) {
      const int copies = std::string(mode) == "cold" ? std::max(2, static_cast<int>(std::ceil(3.0 * l3 / bytes))) : 1;
      Rng rng(7);
      std::vector<std::unique_ptr<Buffer>> ws;
      for (int i = 0; i < copies; ++i) ws.push_back(std::make_unique<Buffer>(p.n * p.k, dt, rng));
      std::vector<double> gbs;
      for (int r = 0; r < ctx.opt.reps + copies; ++r) {
        p.b = ws[static_cast<size_t>(r % copies)]->data();
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t jc = 0; jc < p.n; jc += nc_max) cpu::pack_b_panel(p, path, lay, jc, std::min(nc_max, p.n - jc), panel.data());
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r >= copies) gbs.push_back(bytes * 1e-9 / sec);  // the first round over the copies warms up
      }
      const Summary g = summarize(gbs);
      const double dram = ctx.dram[1];
      if (ctx.opt.json) {
        fmt::print(R"({{"op": "pack_b", "dtype": "{}", "stored": "{}", "n": {}, "k": {}, "mode": "{}", "kc": {}, "nc": {}, "gbs": {:.2f}, "gbs_min": {:.2f}, "gbs_max": {:.2f}, "dram_gbs": {:.2f}}})"
                   "\n", dtype_name(dt), trans ? "n,k" : "k,n", p.n, p.k, mode, lay.kc_block, nc_max, g.median, g.min, g.max, dram);
      } else {
        fmt::print("{:<5} pack B (k {:>4}, n {:>4}) stored {} {:<4}  {:>6.1f} GB/s ({:.1f}-{:.1f}){}\n", dtype_name(dt), p.k,
                   p.n, trans ? "(n, k): transposed" : "(k, n): copied    ", mode, g.median, g.min, g.max,
                   std::string(mode) == "cold" && dram > 0 ? fmt::format(" = {:.0f}% of the DRAM read ceiling", 100 * g.median / dram) : "");
      }
      std::fflush(stdout);
    }
  }
}

}  // namespace

int run_gemm_bench(const GemmBenchOptions& opt) {
  std::vector<ShapeToken> shape_tokens;
  for (const std::string& tok : opt.shapes) {
    std::optional<ShapeToken> st = parse_shape_token(tok);
    if (!st) {
      fmt::print(stderr,
                 "kiln bench gemm: --shapes '{}' is not a shape: give 512 (a square), 256x3072x768 (M x N x K, "
                 "B stored K x N), 256x3072x768t (B stored N x K, as weights are), d4, d4w or d4c; each size "
                 "1..16384, A, B and C together at most 2^28 elements\n",
                 tok);
      return 2;
    }
    shape_tokens.push_back(*st);
  }
  reexec_without_openblas_env();
  Context ctx(opt);
  const CpuFeatures& f = cpu_features();
  const int64_t l3 = std::max(f.l3_bytes, 8 << 20);
  std::vector<DType> dtypes;
  if (opt.dtype == "f32" || opt.dtype == "all") dtypes.push_back(DType::kF32);
  if (opt.dtype == "bf16" || opt.dtype == "all") dtypes.push_back(DType::kBF16);
  const bool f16 = opt.dtype == "f16";  // its own table (bench_f16)
  std::vector<int> threads_list;
  for (int t : opt.threads_list)
    if (t >= 1 && t < 8) threads_list.push_back(t);
  if (opt.tiles) {
    if (opt.pack || opt.tune || f16 || !opt.shapes.empty()) {
      fmt::print(stderr,
                 "kiln bench gemm: --tiles runs alone (f32, 1 thread): drop --pack, --tune, "
                 "--dtype f16 and --shapes\n");
      return 2;
    }
    bench_tiles(opt);
    return 0;
  }
  if (f16 && opt.pack) {
    fmt::print(stderr, "kiln bench gemm: --pack times the f32 and bf16 packs; --dtype f16 has its own table\n");
    return 2;
  }
  if (threads_list.empty() || (dtypes.empty() && !f16)) {
    fmt::print(stderr, "kiln bench gemm: nothing to run (threads 1..7, dtype f32|bf16|all|f16)\n");
    return 2;
  }
  const int max_threads = *std::max_element(threads_list.begin(), threads_list.end());

  // Touch the peers once so OpenBLAS reports its core and oneDNN's runtime is loaded.
  set_peer_threads(1);
  {
    Rng rng(1);
    Buffer a(64 * 64, DType::kF32, rng), b(64 * 64, DType::kF32, rng), c(64 * 64, DType::kF32, rng);
    make_openblas_gemm({64, 64, 64})->run(a.data(), b.data(), c.f32());
    make_onednn_gemm({64, 64, 64})->run(a.data(), b.data(), c.f32());
  }
  if (!opt.json) {
    fmt::print("kiln bench gemm  (W3; median of {} after warm-up, GFLOP/s, min-max)\n", opt.reps);
    fmt::print("cpu        : {}, L2 {} KiB, L3 {} MiB\n", f.brand, f.l2_bytes >> 10, f.l3_bytes >> 20);
    fmt::print("openblas   : core {} ({})\n", openblas_core_name(), openblas_core_note());
    fmt::print("kiln paths : f32 {}; bf16 {}; m<=8 {}\n", cpu::gemm_path_name(cpu::GemmPath::kF32),
               cpu::gemm_path_name(cpu::GemmPath::kBF16), cpu::gemm_small_m_name());
    fmt::print("bf16 kernel: {}\n", cpu::bf16_gemm_choice());
    const cpu::GemmBlocking bf = cpu::gemm_blocking(cpu::GemmPath::kF32), bb = cpu::gemm_blocking(cpu::GemmPath::kBF16);
    const cpu::GemmBlocking mf = cpu::default_gemm_blocking(cpu::GemmPath::kF32), mb = cpu::default_gemm_blocking(cpu::GemmPath::kBF16);
    fmt::print("blocking   : f32 mc={} kc={} nc={}, bf16 mc={} kc={} nc={} from the {} (cache model: f32 {}/{}/{}, bf16 {}/{}/{})\n",
               bf.mc, bf.kc, bf.nc, bb.mc, bb.kc, bb.nc, cpu::gemm_blocking_source(), mf.mc, mf.kc, mf.nc, mb.mc, mb.kc, mb.nc);
    fmt::print("tune file  : {} (entry {})\n", cpu::gemm_tune_file(), cpu::tune_cpu_key());
    fmt::print("quant tiles: {} ({})\n", cpu::quant_tiles_name(cpu::quant_tiles()), cpu::quant_tiles_source());
    fmt::print("mode /pk   : decode rows with kiln on the weight packed once (pack_weight_as + gemm_prepacked, as\n"
               "             PackedLinear runs them); the peers read the same plain (n, k) weights\n");
    fmt::print("cold DRAM  : a cold decode row's B GB/s as % of the DRAM ceiling below (taken at the start), as %\n"
               "             of the best DRAM read pass timed in that row's own rounds (one pass per round, right\n"
               "             after kiln's sample), and paired: the median over rounds of kiln's rate over the pass\n"
               "             beside it (the 2-thread DRAM rate here jumps between ~35 and ~60 GB/s within seconds)\n"
               "roofline   : a cold decode row's intensity (FLOPs per weight byte: 2m / element size) against the\n"
               "             ridge point; % of the roof min(peak, intensity x DRAM), with the start ceiling and paired\n");
  }

  // Ceilings per thread count: FMA peak (f32, bf16) and DRAM read bandwidth over 256 MiB.
  {
    const int64_t dram_bytes = std::max<int64_t>(int64_t{256} << 20, 8 * l3);  // >= 8x L3
    for (int t : threads_list) {
      const perf::FmaPeak pf = perf::measure_fma_peak(DType::kF32, t), pb = perf::measure_fma_peak(DType::kBF16, t);
      ctx.peak_f32[t] = pf.gflops();
      ctx.peak_bf16[t] = pb.gflops();
      if (!opt.json)
        fmt::print("FMA peak {}T : f32 loop {:.1f}, micro-kernel in L1 {:.1f} GFLOP/s ({:.1f}% of the loop); bf16 loop {:.1f}, "
                   "micro-kernel {:.1f} ({:.1f}%){}\n", t, pf.loop_gflops, pf.kernel_gflops, 100 * pf.kernel_share(),
                   pb.loop_gflops, pb.kernel_gflops, 100 * pb.kernel_share(),
                   cpu::bf16_gemm_kernel() == cpu::Bf16Kernel::kAmx ? " [bf16: AMX TDPBF16PS]" : "");
      ctx.dram[t] = perf::measure_dram_read_gbps(t, dram_bytes);
      if (!ctx.dram_probe) ctx.dram_probe = std::make_unique<perf::DramReadProbe>(dram_bytes);
      if (opt.json) {
        fmt::print(R"({{"op": "ceilings", "threads": {}, "f32_peak_gflops": {:.1f}, "bf16_peak_gflops": {:.1f}, "dram_read_gbs": {:.2f}, "f32_ridge": {:.2f}, "bf16_ridge": {:.2f}}})"
                   "\n", t, ctx.peak_f32[t], ctx.peak_bf16[t], ctx.dram[t],
                   perf::Roofline{ctx.peak_f32[t], ctx.dram[t]}.ridge(), perf::Roofline{ctx.peak_bf16[t], ctx.dram[t]}.ridge());
      } else {
        fmt::print("ceilings {}T : FMA peak f32 {:.1f} GFLOP/s, bf16 {:.1f} GFLOP/s; DRAM read {:.1f} GB/s; ridge points "
                   "f32 {:.2f}, bf16 {:.2f} FLOP/B\n",
                   t, ctx.peak_f32[t], ctx.peak_bf16[t], ctx.dram[t], perf::Roofline{ctx.peak_f32[t], ctx.dram[t]}.ridge(),
                   perf::Roofline{ctx.peak_bf16[t], ctx.dram[t]}.ridge());
      }
    }
  }

  if (opt.tune) {
    // The first-use autotune's search, on a larger problem with one more repetition.
    set_num_threads(max_threads);
    cpu::AutotuneOptions ao;
    ao.size = 2048;
    ao.reps = 3;
    if (!opt.json) ao.log = [](const std::string& line) { fmt::print("{}\n", line); };
    const cpu::AutotuneResult tr = cpu::autotune_gemm(ao);
    if (!opt.json)
      fmt::print("  tune chose f32 mc={} kc={} nc={} ({:.1f} GFLOP/s), bf16 mc={} kc={} nc={} in {:.1f} s\n", tr.f32.mc,
                 tr.f32.kc, tr.f32.nc, tr.f32_gflops, tr.bf16.mc, tr.bf16.kc, tr.bf16.nc, tr.seconds);
    const Status st = cpu::save_gemm_tuning("bench --tune");
    if (!st.ok()) {
      fmt::print(stderr, "kiln bench gemm: {}\n", st.to_string());
      return 1;
    }
    if (!opt.json) fmt::print("  saved {}\n", cpu::gemm_tune_file());
    // The quantized GEMMs' tiles (quant_tiles.h), as the first-use autotune times them.
    cpu::QuantTuneOptions qo;
    if (!opt.json) qo.log = ao.log;
    const cpu::QuantTuneResult qr = cpu::autotune_quant_tiles(qo);
    const Status qst = cpu::save_quant_tuning("bench --tune");
    if (!qst.ok()) {
      fmt::print(stderr, "kiln bench gemm: {}\n", qst.to_string());
      return 1;
    }
    if (opt.json)
      fmt::print(R"({{"op": "quant_tiles", "tune": true, "searched": {}, "choice": {}, "bq_decode_ratio": {:.3f}, "bq_batch_ratio": {:.3f}, "bq_prefill_ratio": {:.3f}, "wo_gemv_ratio": {:.3f}, "wo_rows_ratio": {:.3f}, "seconds": {:.2f}}})"
                 "\n", qr.searched, cpu::quant_tiles_to_json(qr.best).dump(), qr.bq_decode_ratio, qr.bq_batch_ratio,
                 qr.bq_prefill_ratio, qr.wo_gemv_ratio, qr.wo_rows_ratio, qr.seconds);
    else
      fmt::print("  tune chose {} in {:.1f} s (time vs default: bq decode {:.2f}, batch {:.2f}, prefill {:.2f}, "
                 "wo gemv {:.2f}, rows {:.2f}){}; saved\n", cpu::quant_tiles_name(qr.best), qr.seconds, qr.bq_decode_ratio,
                 qr.bq_batch_ratio, qr.bq_prefill_ratio, qr.wo_gemv_ratio, qr.wo_rows_ratio,
                 qr.searched ? "" : " (one shape on this target)");
  }

  if (opt.pack) {
    set_num_threads(1);
    if (!opt.json) fmt::print("\npacking B alone, 1 thread (median of {}; the blocking above)\n", opt.reps);
    for (DType dt : dtypes) bench_pack(ctx, dt, l3);
    return 0;
  }

  const std::vector<int64_t> squares = opt.quick ? std::vector<int64_t>{256, 512}
                                                 : std::vector<int64_t>{256, 512, 1024, 2048, 4096};
  if (f16) {
    if (!opt.json)
      fmt::print(
          "\nf16 GEMM: {} (chunk {}); C = A x B^T, B stored (n, k); % of twice the f32 FMA peak "
          "when the\n"
          "products are fp16; nmse of the fp16 result against the f32 GEMM on the same values\n"
          "{:>15} {:>2}  {:>7} {:>6}  {:>7} {:>6}  {:>9}\n",
          cpu::gemm_f16_path_name(), opt.f16_chunk, "m x n x k", "T", "f16", "%peak", "f32",
          "f16/f32", "nmse");
    for (int t : threads_list) {
      set_num_threads(t);
      set_peer_threads(t);
      if (opt.shapes.empty()) {
        for (int64_t sq : squares) bench_f16(ctx, sq, sq, sq, t);
      } else {
        for (const ShapeToken& st : shape_tokens)
          if (!st.decode) bench_f16(ctx, st.m, st.n, st.k, t);
      }
    }
    return 0;
  }
  const std::vector<int64_t> decode_m = opt.quick ? std::vector<int64_t>{1}
                                                  : std::vector<int64_t>{1, 2, 4, 8};
  if (!opt.json)
    fmt::print("\n{:<5} {:<7} {:>15} {:>2}  {:>7} {:>15} {:>6} | peer GFLOP/s (min-max) x kiln/peer ...\n",
               "dtype", "mode", "m x n x k", "T", "kiln", "min-max", "%peak");
  for (int t : threads_list) {
    set_num_threads(t);
    set_peer_threads(t);
    for (DType dt : dtypes) {
      if (!opt.shapes.empty()) {
        for (const ShapeToken& st : shape_tokens) {
          if (!st.decode) {
            bench_shape(ctx, {st.m, st.n, st.k, st.trans_b, dt}, t, "warm", l3);
            continue;
          }
          for (bool pk : {false, true}) {
            if (st.warm) bench_shape(ctx, {st.m, 4096, 4096, true, dt}, t, "warm", l3, pk);
            if (st.cold) bench_shape(ctx, {st.m, 4096, 4096, true, dt}, t, "cold", l3, pk);
          }
        }
        continue;
      }
      for (int64_t s : squares) bench_shape(ctx, {s, s, s, false, dt}, t, "warm", l3);
      for (int64_t m : decode_m) {
        // Decode-like: weights (N, K) as PyTorch stores them (y = x W^T).
        bench_shape(ctx, {m, 4096, 4096, true, dt}, t, "warm", l3);
        bench_shape(ctx, {m, 4096, 4096, true, dt}, t, "cold", l3);
      }
      // The same decode shapes with the weight packed once, as the model's PackedLinear runs them.
      for (int64_t m : decode_m) {
        bench_shape(ctx, {m, 4096, 4096, true, dt}, t, "warm", l3, true);
        bench_shape(ctx, {m, 4096, 4096, true, dt}, t, "cold", l3, true);
      }
    }
  }
  return 0;
}

}  // namespace kiln::bench
