// Blocking of the packed CPU GEMM and its tuning (gemm_cpu.h): the cache model, the tune file
// (one entry per CPU), the bf16 kernel choice, the micro-kernel loop behind the FMA-peak
// self-check, and the first-use autotune (the GEMM blocking and the quantized tiles).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/core/cpu_features.h"
#include "kiln/core/dtype.h"
#include "kiln/core/env.h"
#include "kiln/core/file_io.h"
#include "kiln/core/json.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/cpu/gemm_amx.h"
#include "kiln/kernels/cpu/attention_tiles.h"
#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/cpu/gemm_driver.h"
#include "kiln/kernels/cpu/quant_tiles.h"
#include "kiln/kernels/gemm.h"

namespace kiln::cpu {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t round_down(int64_t v, int64_t multiple) { return std::max(multiple, v / multiple * multiple); }

GemmBlocking clamp_blocking(GemmBlocking b, GemmBlocking fallback) {
  if (b.mc < 1 || b.kc < 2 || b.nc < 1) return fallback;
  b.mc = std::clamp(b.mc, 8, 8192);
  b.kc = std::clamp(b.kc & ~1, 16, 8192);
  b.nc = std::clamp(b.nc, 32, 1 << 16);
  return b;
}

// ---- the tune file ----------------------------------------------------------------------------
struct TuneState {
  std::mutex mu;
  bool loaded = false;
  GemmBlocking current[2];
  std::string source = "cache model";
  bool has_entry = false;                 // this CPU has an entry in the tune file
  std::optional<Bf16Kernel> file_bf16;    // the entry's bf16 kernel, when it names one
};
TuneState& tune_state() {
  static TuneState s;
  return s;
}

const char* path_key(int i) { return i == 0 ? "f32" : "bf16"; }

// The bf16 kernels' names in KILN_BF16_GEMM and the tune file.
const char* bf16_kernel_name(Bf16Kernel k) {
  return k == Bf16Kernel::kDot ? "dot" : k == Bf16Kernel::kAmx ? "amx" : "widen";
}
std::optional<Bf16Kernel> bf16_kernel_named(std::string_view name) {
  for (Bf16Kernel k : {Bf16Kernel::kDot, Bf16Kernel::kWiden, Bf16Kernel::kAmx})
    if (name == bf16_kernel_name(k)) return k;
  return std::nullopt;
}

void load_tuning_locked(TuneState& s) {
  s.current[0] = default_gemm_blocking(GemmPath::kF32);
  s.current[1] = default_gemm_blocking(GemmPath::kBF16);
  s.loaded = true;
  const Expected<nlohmann::json> entry = read_tune_entry();
  if (entry.ok() && entry->is_null()) return;  // absent: the cache model, silently
  try {
    if (!entry.ok()) throw std::runtime_error(entry.status().message());
    const nlohmann::json* e = &*entry;
    if (e->is_object() && !e->contains("f32")) return;  // only other kernels' tunings: the cache model
    if (e->contains("bf16_kernel")) s.file_bf16 = bf16_kernel_named(e->at("bf16_kernel").get<std::string>());
    // A bf16 blocking timed on another kernel than AMX does not carry over to AMX, which this
    // CPU now runs (an entry written before kiln had the AMX path): the AMX model instead.
    const bool stale_bf16 = gemm_target_kernels().bf16_amx.kernel != nullptr && s.file_bf16 != Bf16Kernel::kAmx;
    for (int i = 0; i < 2; ++i) {
      if (!e->contains(path_key(i)) || (i == 1 && stale_bf16)) continue;
      const auto& b = e->at(path_key(i));
      s.current[i] = clamp_blocking({b.at("mc").get<int>(), b.at("kc").get<int>(), b.at("nc").get<int>()},
                                    s.current[i]);
    }
    s.source = "tune file (" + e->value("source", std::string("bench --tune")) + ")";
    s.has_entry = true;
  } catch (const std::exception& ex) {
    fmt::print(stderr, "kiln: warning: ignoring unreadable GEMM tuning file {} ({}); using the cache model\n",
               gemm_tune_file(), ex.what());
    s.current[0] = default_gemm_blocking(GemmPath::kF32);
    s.current[1] = default_gemm_blocking(GemmPath::kBF16);
    s.file_bf16.reset();
    s.has_entry = false;
  }
}

TuneState& loaded_state(std::unique_lock<std::mutex>& lock) {
  TuneState& s = tune_state();
  lock = std::unique_lock<std::mutex>(s.mu);
  if (!s.loaded) load_tuning_locked(s);
  return s;
}

// ---- the micro-kernel loop ----------------------------------------------------------------------
int decided_bf16_kernel();  // -1 while undecided (the bf16 choice, below)

// The micro-kernel `path` runs on. For bf16 before the choice is made (the cache model's blocking
// is derived while the tune file loads, and the choice may read that file): AMX where this target
// has it, since the choice takes it there unless KILN_BF16_GEMM says otherwise.
const PackedPath& micro_path(GemmPath path) {
  const GemmTargetKernels& k = gemm_target_kernels();
  if (path == GemmPath::kF32) return k.f32;
  const int d = decided_bf16_kernel();
  const Bf16Kernel choice = d >= 0 ? static_cast<Bf16Kernel>(d) : Bf16Kernel::kAmx;
  return choice == Bf16Kernel::kWiden ? k.bf16 : bf16_packed_path(k, choice);
}

double kernel_loop(const PackedPath& path, int64_t reps) {
  // A strip and B micro-panel in 3/4 of L1 (the C tile is written once per run: with half of L1
  // the f32 tile ran ~7% below this on a Xeon VM, its epilogue a larger share of each run).
  const int64_t step_bytes = 4 * (path.mr + path.nr);
  const int64_t steps = std::clamp<int64_t>(this_cpu_caches().l1d_bytes * 3 / 4 / step_bytes / 16 * 16, 16, 1024);
  struct Free {
    void operator()(uint32_t* p) const { std::free(p); }
  };
  const size_t elems = static_cast<size_t>((path.mr + path.nr) * steps + path.mr * path.nr);
  std::unique_ptr<uint32_t, Free> buf(static_cast<uint32_t*>(std::aligned_alloc(64, (elems * 4 + 63) & ~size_t{63})));
  if (!buf) return 0.0;
  // 0.001 as f32, or a pair of bf16 0.001: sums stay small and normal.
  const uint32_t bits = path.k_per_step == 2 ? 0x3a833a83u : 0x3a83126fu;
  std::fill(buf.get(), buf.get() + elems, bits);
  const uint32_t* a = buf.get();
  const uint32_t* b = a + path.mr * steps;
  float* c = reinterpret_cast<float*>(buf.get() + (path.mr + path.nr) * steps);
  const TileEpilogue ep;
  for (int64_t r = 0; r < reps; ++r) path.kernel(steps, a, b, c, path.nr, path.mr, path.nr, ep);
  return static_cast<double>(reps) * 2.0 * path.mr * path.nr * steps * path.k_per_step;
}

// Best GFLOP/s of the kernel over `rounds` runs of ~`seconds` each, on the calling thread.
double kernel_rate(const PackedPath& path, double seconds, int rounds) {
  int64_t reps = 64;
  double t0 = now_seconds();
  kernel_loop(path, reps);
  const double cal = std::max(now_seconds() - t0, 1e-7);
  reps = std::max<int64_t>(reps, static_cast<int64_t>(static_cast<double>(reps) * seconds / cal));
  double best = 0;
  for (int r = 0; r < rounds; ++r) {
    t0 = now_seconds();
    const double flops = kernel_loop(path, reps);
    best = std::max(best, flops / std::max(now_seconds() - t0, 1e-9) * 1e-9);
  }
  return best;
}

// ---- the bf16 choice ----------------------------------------------------------------------------
struct Bf16State {
  std::mutex mu;
  std::atomic<int> kernel{-1};  // -1 undecided, else a Bf16Kernel
  std::string why;
};
Bf16State& bf16_state() {
  static Bf16State s;
  return s;
}
int decided_bf16_kernel() { return bf16_state().kernel.load(std::memory_order_acquire); }

// In order: a target without bf16 products widens; KILN_BF16_GEMM; AMX where the CPU and the OS
// have it (a 16 x 32 x 16 product per instruction: no timing needed); the tune file's choice
// (an entry written on this CPU; "amx" there counts only where AMX is usable); else timed.
void decide_bf16_locked(Bf16State& b) {
  const GemmTargetKernels& k = gemm_target_kernels();
  auto set = [&](Bf16Kernel kernel, std::string why) {
    b.why = std::string(bf16_kernel_name(kernel)) + ": " + why;
    b.kernel.store(static_cast<int>(kernel));
  };
  if (k.bf16.k_per_step != 2) return set(Bf16Kernel::kWiden, "no vdpbf16ps on this target");
  const bool amx = k.bf16_amx.kernel != nullptr;
  const auto env = env_choice("KILN_BF16_GEMM", kBf16GemmChoices);
  if (!env.ok()) fmt::print(stderr, "kiln: warning: {}; choosing automatically\n", env.status().message());
  if (env.ok() && *env && **env != "auto") {
    const Bf16Kernel want = *bf16_kernel_named(**env);
    if (want != Bf16Kernel::kAmx || amx) return set(want, "KILN_BF16_GEMM");
    fmt::print(stderr, "kiln: warning: KILN_BF16_GEMM=amx, but this CPU or OS has no usable AMX-BF16 "
                       "(kiln info: cpu); choosing automatically\n");
  } else if (amx) {
    return set(Bf16Kernel::kAmx, "AMX-BF16 tiles on this CPU");
  }
  {
    std::unique_lock<std::mutex> lock;
    const TuneState& s = loaded_state(lock);
    if (s.file_bf16 && *s.file_bf16 != Bf16Kernel::kAmx) return set(*s.file_bf16, "tune file");
  }
  // Warm the vector units (and the clock) on the f32 kernel, then alternate the two.
  kernel_rate(k.f32, 0.01, 1);
  double dot = 0, f32 = 0;
  for (int r = 0; r < 3; ++r) {
    dot = std::max(dot, kernel_rate(k.bf16, 0.002, 1));
    f32 = std::max(f32, kernel_rate(k.f32, 0.002, 1));
  }
  set(dot >= 1.15 * f32 ? Bf16Kernel::kDot : Bf16Kernel::kWiden,
      fmt::format("vdpbf16ps {:.0f} GFLOP/s vs f32 FMA {:.0f} on one core (timed)", dot, f32));
}

// ---- first use ----------------------------------------------------------------------------------
std::atomic<int> g_first_use{0};  // 0 off, 1 armed, 2 taken
AutotuneOptions& first_use_search() {  // set before arming, read once by the taker
  static AutotuneOptions opt;
  return opt;
}

// A candidate replaces the best only when it is this much faster: on the shared VMs the same
// blocking's best-of-3 moved by 3-5% between neighbouring runs, and a smaller threshold chose noise.
constexpr double kMinGain = 0.04;

}  // namespace

CacheGeometry this_cpu_caches() {
  const CpuFeatures& f = cpu_features();
  CacheGeometry c;
  if (f.l1d_bytes > 0) c.l1d_bytes = f.l1d_bytes;
  if (f.l2_bytes > 0) c.l2_bytes = f.l2_bytes;
  if (f.l3_bytes > 0) c.l3_bytes = f.l3_bytes;
  c.l1d_ways = std::max(2, f.l1d_ways);
  c.l2_ways = std::max(2, f.l2_ways);
  return c;
}

GemmBlocking blocking_from_caches(const CacheGeometry& c, int mr, int nr, int k_per_step) {
  constexpr int64_t e = 4;  // bytes per k step of a row: one f32 or one bf16 pair
  const int64_t l1_for_a = c.l1d_bytes * (c.l1d_ways - 1) / c.l1d_ways;
  const int64_t steps = std::clamp<int64_t>(round_down(l1_for_a / (int64_t{mr} * e), 16), 64, 2048);
  const int64_t l2_rows = c.l2_bytes * (c.l2_ways - 1) / c.l2_ways / (steps * e);
  const int64_t mc = std::max<int64_t>(2 * mr, round_down(l2_rows - int64_t{kStripGroup} * nr, mr));
  const int64_t nc = std::clamp<int64_t>(round_down(c.l3_bytes / 8 / (steps * e), 256), 1024, 4096);
  return {static_cast<int>(mc), static_cast<int>(steps * k_per_step), static_cast<int>(nc)};
}

GemmBlocking amx_blocking_from_caches(const CacheGeometry& c) {
  constexpr int64_t kc = kAmxKc, e = 2;  // bytes per bf16
  const int64_t mc = std::clamp<int64_t>(round_down(2 * c.l2_bytes / (kc * e), kAmxMr), 2 * kAmxMr, 4096);
  const int64_t nc = std::clamp<int64_t>(round_down(c.l3_bytes / 8 / (kc * e), 256), 1024, 4096);
  return {static_cast<int>(mc), static_cast<int>(kc), static_cast<int>(nc)};
}

GemmBlocking default_gemm_blocking(GemmPath path) {
  const PackedPath& p = micro_path(path);
  if (&p == &gemm_target_kernels().bf16_amx) return amx_blocking_from_caches(this_cpu_caches());
  return blocking_from_caches(this_cpu_caches(), p.mr, p.nr, p.k_per_step);
}

GemmBlocking gemm_blocking(GemmPath path) {
  std::unique_lock<std::mutex> lock;
  return loaded_state(lock).current[path == GemmPath::kBF16 ? 1 : 0];
}

void set_gemm_blocking(GemmPath path, GemmBlocking b) {
  std::unique_lock<std::mutex> lock;
  TuneState& s = loaded_state(lock);
  const int i = path == GemmPath::kBF16 ? 1 : 0;
  s.current[i] = clamp_blocking(b, s.current[i]);
}

std::string gemm_blocking_source() {
  std::unique_lock<std::mutex> lock;
  return loaded_state(lock).source;
}

std::string gemm_tune_file() {
  if (const char* f = std::getenv("KILN_TUNE_FILE"); f && *f) return f;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/kiln/gemm_tune.json";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/kiln/gemm_tune.json";
  return ".kiln_gemm_tune.json";
}

std::string tune_cpu_key() {
  const CacheGeometry c = this_cpu_caches();
  return fmt::format("{} | L1d {} KiB {}-way, L2 {} KiB {}-way, L3 {} KiB", cpu_features().brand,
                     c.l1d_bytes >> 10, c.l1d_ways, c.l2_bytes >> 10, c.l2_ways, c.l3_bytes >> 10);
}

Expected<nlohmann::json> read_tune_entry() {
  const std::string path = gemm_tune_file();
  auto text = read_file(path, int64_t{1} << 20);
  if (!text.ok()) return nlohmann::json();  // absent
  auto parsed = parse_json(*text, path);
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  if (!j.is_object()) return invalid_argument("{}: not a JSON object", path);
  const auto cpus = j.find("cpus");
  if (cpus != j.end()) {
    const std::string key = tune_cpu_key();
    return cpus->is_object() && cpus->contains(key) ? cpus->at(key) : nlohmann::json();
  }
  const auto cpu = j.find("cpu");  // a version-1 file (one blocking, the CPU's brand beside it)
  return cpu != j.end() && *cpu == cpu_features().brand ? j : nlohmann::json();
}

Status merge_tune_entry(const nlohmann::json& fields) {
  const std::string path = gemm_tune_file();
  nlohmann::json j = nlohmann::json::object();
  if (auto text = read_file(path, int64_t{1} << 20); text.ok()) {
    auto parsed = parse_json(*text, path);
    if (parsed.ok() && parsed->is_object() && parsed->contains("cpus") && parsed->at("cpus").is_object())
      j = *parsed;  // other CPUs' entries are kept; a version-1 or unreadable file is replaced
  }
  nlohmann::json& e = j["cpus"][tune_cpu_key()];
  if (!e.is_object()) e = nlohmann::json::object();
  for (const auto& [name, value] : fields.items()) e[name] = value;
  j["version"] = 2;
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) return not_found("[tune file] cannot create directory {}: {}", dir.string(), ec.message());
  return write_file_atomic(path, {j.dump(2), "\n"});
}

Status save_gemm_tuning(const std::string& source) {
  nlohmann::json e;
  e["cpu"] = cpu_features().brand;
  e["source"] = source;
  for (GemmPath gp : {GemmPath::kF32, GemmPath::kBF16}) {
    const GemmBlocking b = gemm_blocking(gp);
    e[gp == GemmPath::kF32 ? "f32" : "bf16"] = {{"mc", b.mc}, {"kc", b.kc}, {"nc", b.nc}};
  }
  e["bf16_kernel"] = bf16_kernel_name(bf16_gemm_kernel());
  Status st = merge_tune_entry(e);
  if (st.ok()) {
    std::unique_lock<std::mutex> lock;
    TuneState& s = loaded_state(lock);
    s.has_entry = true;
    s.source = "tune file (" + source + ")";
  }
  return st;
}

Bf16Kernel bf16_gemm_kernel() {
  Bf16State& b = bf16_state();
  int k = b.kernel.load(std::memory_order_acquire);
  if (k < 0) {
    std::lock_guard<std::mutex> lock(b.mu);
    if (b.kernel.load() < 0) decide_bf16_locked(b);
    k = b.kernel.load();
  }
  return static_cast<Bf16Kernel>(k);
}

void set_bf16_gemm_kernel(Bf16Kernel k) {
  Bf16State& b = bf16_state();
  std::lock_guard<std::mutex> lock(b.mu);
  b.why = std::string(bf16_kernel_name(k)) + ": set";
  b.kernel.store(static_cast<int>(k));
}

std::string bf16_gemm_choice() {
  bf16_gemm_kernel();
  Bf16State& b = bf16_state();
  std::lock_guard<std::mutex> lock(b.mu);
  return b.why;
}

std::vector<TileRate> f32_tile_rates(double seconds, int rounds) {
  const GemmTargetKernels& k = gemm_target_kernels();
  std::vector<const PackedPath*> paths = {&k.f32};
  for (const PackedPath& p : k.f32_other_tiles) paths.push_back(&p);
  std::vector<TileRate> out;
  for (const PackedPath* p : paths) out.push_back({p->name, p->mr, p->nr, 0.0, p == &k.f32});
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < paths.size(); ++i)
      out[i].gflops = std::max(out[i].gflops, kernel_rate(*paths[i], seconds, 1));
  return out;
}

double run_micro_kernel_in_l1(GemmPath path, int64_t reps) {
  bf16_gemm_kernel();  // decided, so micro_path names the kernel cpu::gemm runs
  return kernel_loop(micro_path(path), reps);
}

bool bf16_amx_available() { return gemm_target_kernels().bf16_amx.kernel != nullptr; }
bool bf16_gemm_on_bf16_products() {
  return bf16_gemm_kernel() != Bf16Kernel::kWiden && gemm_target_kernels().bf16.k_per_step == 2;
}
double run_bf16_amx_peak_loop(int64_t reps) { return bf16_amx_available() ? amx_bf16_peak_loop(reps) : 0.0; }

AutotuneResult autotune_gemm(const AutotuneOptions& opt) {
  const double t_start = now_seconds();
  g_first_use.store(2);  // its own GEMMs (and any later ones) must not start another search
  AutotuneResult result;
  auto tune_path = [&](GemmPath gp, double* gflops_out) {
    const bool bf16 = gp == GemmPath::kBF16;
    const int64_t n = std::max<int64_t>(64, opt.size);
    std::vector<float> a(static_cast<size_t>(n * n)), c(a.size());
    Rng(1).fill_uniform(a);
    std::vector<uint16_t> a16(bf16 ? a.size() : 0);
    for (size_t i = 0; i < a16.size(); ++i) a16[i] = f32_to_bf16(a[i]);
    GemmParams p;  // B = A: the values do not matter, only their dtype and layout
    p.m = p.n = p.k = n;
    p.a = p.b = bf16 ? static_cast<const void*>(a16.data()) : a.data();
    p.c = c.data();
    p.lda = p.ldb = p.ldc = n;
    p.a_dtype = p.b_dtype = bf16 ? DType::kBF16 : DType::kF32;
    const double flops = 2.0 * static_cast<double>(n) * n * n;
    auto measure = [&](GemmBlocking blk) {
      set_gemm_blocking(gp, blk);
      double best = 0;
      for (int r = 0; r < std::max(1, opt.reps); ++r) {
        const double t0 = now_seconds();
        gemm(p);
        best = std::max(best, flops / std::max(now_seconds() - t0, 1e-9) * 1e-9);
      }
      if (opt.log)
        opt.log(fmt::format("  tune {:<4} mc={:<4} kc={:<4} nc={:<5} {:7.1f} GFLOP/s", bf16 ? "bf16" : "f32",
                            blk.mc, blk.kc, blk.nc, best));
      return best;
    };
    const PackedPath& pp = micro_path(gp);
    const int kc_step = 16 * pp.k_per_step;
    const GemmBlocking base = default_gemm_blocking(gp);
    set_gemm_blocking(gp, base);
    gemm(p);  // warm-up: buffers, pages, clock
    GemmBlocking best = base;
    double best_gf = measure(base);
    for (int pass = 0; pass < 3; ++pass) {
      std::vector<int> cands;
      if (pass == 0)
        for (double f : {0.5, 0.75, 1.25, 1.5}) cands.push_back(static_cast<int>(round_down(static_cast<int64_t>(base.kc * f), kc_step)));
      if (pass == 1)
        for (double f : {0.5, 0.75, 1.5, 2.0}) cands.push_back(static_cast<int>(round_down(static_cast<int64_t>(best.mc * f), pp.mr)));
      if (pass == 2) cands = {1024, 2048, 4096};
      for (int v : cands) {
        GemmBlocking blk = best;
        (pass == 0 ? blk.kc : pass == 1 ? blk.mc : blk.nc) = v;
        if (blk.mc == best.mc && blk.kc == best.kc && blk.nc == best.nc) continue;
        const double gf = measure(blk);
        if (gf > best_gf * (1 + kMinGain)) {
          best_gf = gf;
          best = blk;
        }
      }
    }
    set_gemm_blocking(gp, best);
    *gflops_out = best_gf;
    return best;
  };
  result.f32 = tune_path(GemmPath::kF32, &result.f32_gflops);
  if (bf16_gemm_on_bf16_products())
    result.bf16 = tune_path(GemmPath::kBF16, &result.bf16_gflops);
  else
    result.bf16 = gemm_blocking(GemmPath::kBF16);  // unused: widened bf16 runs on the f32 blocking
  {
    std::unique_lock<std::mutex> lock;
    loaded_state(lock).source = "autotune (this run)";
  }
  result.seconds = now_seconds() - t_start;
  return result;
}

void set_first_use_autotune(bool on, const AutotuneOptions& search) {
  first_use_search() = search;
  g_first_use.store(on ? 1 : 0);
}

namespace {

// The trigger is taken: runs what this CPU's tune-file entry lacks.
void run_first_use_search() {
  bool gemm_needed = false;
  {
    std::unique_lock<std::mutex> lock;
    gemm_needed = !loaded_state(lock).has_entry;
  }
  const bool quant_needed = !quant_tiles_in_tune_file();
  const bool flash_needed = !flash_v_packing_in_tune_file() && flash_tiles_source() == "cache model";
  if (!gemm_needed && !quant_needed && !flash_needed) return;
  if (mpi_local_ranks() > 1) return;  // ranks on this machine would time each other: the defaults stay
  const AutotuneOptions& search = first_use_search();
  const auto print_saved = [](const Status& st) {
    if (st.ok())
      fmt::print(stderr, "; saved to {}\n", gemm_tune_file());
    else
      fmt::print(stderr, "; not saved: {}\n", st.message());
  };
  std::vector<std::string> what;
  if (gemm_needed) what.push_back("GEMM cache blockings");
  if (quant_needed) what.push_back("quantized GEMM tiles");
  if (flash_needed) what.push_back("flash attention's V packing");
  fmt::print(stderr,
             "kiln: first use on this CPU: timing {} once (a few seconds; --no-autotune or KILN_AUTOTUNE=0 skips)\n",
             fmt::join(what, " and "));
  if (gemm_needed) {
    const AutotuneResult r = autotune_gemm(search);
    const Status st = save_gemm_tuning("autotune");
    fmt::print(stderr, "kiln: GEMM tuned in {:.1f} s at {} thread(s): f32 mc={} kc={} nc={} ({:.0f} GFLOP/s)", r.seconds,
               num_threads(), r.f32.mc, r.f32.kc, r.f32.nc, r.f32_gflops);
    if (r.bf16_gflops > 0)
      fmt::print(stderr, ", bf16 mc={} kc={} nc={} ({:.0f} GFLOP/s)", r.bf16.mc, r.bf16.kc, r.bf16.nc, r.bf16_gflops);
    print_saved(st);
  }
  if (quant_needed) {
    QuantTuneOptions qo;
    qo.size = search.quant_size;
    qo.reps = search.reps;
    const QuantTuneResult r = autotune_quant_tiles(qo);
    const Status st = save_quant_tuning("autotune");
    fmt::print(stderr, "kiln: quantized GEMM tiles {} in {:.1f} s at {} thread(s): {}", r.searched ? "tuned" : "fixed on this target",
               r.seconds, num_threads(), quant_tiles_name(r.best));
    print_saved(st);
  }
  if (flash_needed) {
    const FlashPackResult r = autotune_flash_v_packing(search.reps, search.flash_seq);
    const Status st = save_flash_tuning("autotune: V packing");
    fmt::print(stderr, "kiln: flash attention forward {} V in {:.1f} s at {} thread(s): {:.2f} ms in place, {:.2f} ms packed",
               r.pack_v ? "packs" : "reads in place", r.seconds, num_threads(), r.in_place_ms, r.packed_ms);
    print_saved(st);
  }
}

// Takes the first-use trigger once, from the first call large enough to be worth a search.
void first_use(bool large_enough) {
  if (g_first_use.load(std::memory_order_relaxed) != 1) return;
  if (!large_enough || in_pool_task()) return;
  int armed = 1;
  if (!g_first_use.compare_exchange_strong(armed, 2)) return;
  run_first_use_search();
}
}  // namespace

void maybe_autotune_first_use(int64_t m, int64_t n, int64_t k) {
  first_use(static_cast<double>(m) * n * k >= 512.0 * 512 * 512);
}

void maybe_autotune_first_use_flash(int64_t q_len, int64_t kv_len, int64_t heads) {
  first_use(static_cast<double>(q_len) * kv_len * heads >= 512.0 * 512 * 4);
}

void maybe_autotune_first_use_quant(int64_t out, int64_t in) {
  first_use(static_cast<double>(out) * in >= 512.0 * 512);
}

void disarm_first_use_autotune() { g_first_use.store(2); }

}  // namespace kiln::cpu
