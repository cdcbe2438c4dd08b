// The FlashAttention tile choice (attention_tiles.h): cache model, KILN_FLASH_TILES, this CPU's
// entry in the tune file (shared with the GEMM blocking, gemm_tuning.cpp), and the timed sweep.
#include "kiln/kernels/cpu/attention_tiles.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "kiln/core/env.h"
#include "kiln/core/rng.h"
#include "kiln/kernels/attention.h"

namespace kiln::cpu {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static_assert(std::ranges::all_of(kFlashTileQ, [](int64_t v) { return v % 16 == 0; }) &&
                  std::ranges::all_of(kFlashTileK, [](int64_t v) { return v % 16 == 0; }),
              "full tiles must need no masked loads on any target (16 / 8 / 1 lanes)");

// "<q>x<k>" → tiles (0 × 0 when it is not of that form).
constexpr FlashTiles parse_tiles(std::string_view s) {
  FlashTiles t{0, 0};
  int64_t* f = &t.q;
  for (char c : s) {
    if (c == 'x' && f == &t.q) {
      f = &t.k;
    } else if (c >= '0' && c <= '9') {
      *f = *f * 10 + (c - '0');
    } else {
      return {0, 0};
    }
  }
  return t;
}

constexpr bool candidate(FlashTiles t) {
  return std::ranges::find(kFlashTileQ, t.q) != std::end(kFlashTileQ) &&
         std::ranges::find(kFlashTileK, t.k) != std::end(kFlashTileK);
}

// KILN_FLASH_TILES' choices (core/env.h) are "auto" and exactly the candidates.
static_assert([] {
  size_t n = 0;
  for (std::string_view c : kFlashTilesChoices) {
    if (c == "auto") continue;
    if (!candidate(parse_tiles(c))) return false;
    ++n;
  }
  return n == std::size(kFlashTileQ) * std::size(kFlashTileK);
}());

struct TileState {
  std::mutex mu;
  bool loaded = false;
  FlashTileChoice current;
  std::string source = "cache model";
};
TileState& tile_state() {
  static TileState s;
  return s;
}

FlashTiles tiles_from_json(const nlohmann::json& j) {
  const FlashTiles t{j.at("q").get<int64_t>(), j.at("k").get<int64_t>(), j.value("pack_v", false)};
  if (!candidate(t)) throw std::runtime_error(fmt::format("{} is not a candidate", flash_tiles_name(t)));
  return t;
}

void load_locked(TileState& s) {
  s.loaded = true;
  s.current = default_flash_tiles();
  s.source = "cache model";
  const auto env = env_choice("KILN_FLASH_TILES", kFlashTilesChoices);
  if (!env.ok()) fmt::print(stderr, "kiln: warning: {}; using the tune file or the cache model\n", env.status().message());
  if (env.ok() && *env && **env != "auto") {
    s.current.fwd = s.current.bwd = parse_tiles(**env);
    s.source = "KILN_FLASH_TILES";
    return;
  }
  const Expected<nlohmann::json> entry = read_tune_entry();
  try {
    if (!entry.ok()) throw std::runtime_error(entry.status().message());
    if (!entry->is_object() || !entry->contains("flash_attention")) return;
    const nlohmann::json& f = entry->at("flash_attention");
    s.current = {tiles_from_json(f.at("fwd")), tiles_from_json(f.at("bwd"))};
    s.source = "tune file (" + f.value("source", std::string("bench attention --tune")) + ")";
  } catch (const std::exception& ex) {
    fmt::print(stderr, "kiln: warning: ignoring the flash-attention tiles in {} ({}); using the cache model\n",
               gemm_tune_file(), ex.what());
    s.current = default_flash_tiles();
  }
}

TileState& loaded_state(std::unique_lock<std::mutex>& lock) {
  TileState& s = tile_state();
  lock = std::unique_lock<std::mutex>(s.mu);
  if (!s.loaded) load_locked(s);
  return s;
}

// A candidate replaces the best only when it is this much faster (the GEMM sweep's threshold:
// the same configuration's best-of-3 moves by 3-5% between neighbouring runs on shared VMs).
constexpr double kMinGain = 0.04;

}  // namespace

bool is_flash_tile_candidate(FlashTiles t) { return candidate(t); }

std::string flash_tiles_name(FlashTiles t) { return fmt::format("{}x{}{}", t.q, t.k, t.pack_v ? " packed V" : ""); }

// The cache model. A key tile's pass runs its products through one register-blocked
// micro-kernel (6 rows × 64 columns of C in registers on AVX-512):
//  * Sᵀ = K_j · Qᵀ streams the D × Br block of Qᵀ once per 6 keys, and P·V streams the Bc × D
//    tile V_j once per 6 queries: those are the operands that must stay in L1. V_j is the larger
//    at Bc >= Br, so Bc·D·4 <= L1d / 2 (the other half: the K and Pᵀ rows, the output rows).
//  * The online softmax reads the Bc × Br block of Sᵀ twice (max, then exp) and P·V reads it
//    again: Sᵀ, Qᵀ and the output block (2·Br·D) and the K_j, V_j tiles (2·Bc·D) must stay in L2,
//    with half of it left for the next tiles' rows that the hardware prefetcher brings in.
//    Larger Br reads each K/V tile once for more queries, but wastes more of the causal diagonal
//    (about Br / T of the work at length T): the forward stops at 64.
//  * The backward keeps Qᵀ, dOᵀ and the packed Q and dO rows (4·Br·D) and two Bc × Br blocks per
//    query tile, and streams K_j, V_j: the same L1 bound for Bc, the L2 bound with 4·Br·D. It
//    packs each query tile once and streams every visible K/V tile past it, so a larger Br
//    halves those streams and the packing's share: no cap at 64.
// Bc is the largest candidate meeting the L1 bound (at least the smallest), Br the largest
// meeting the L2 bound (the forward's at most 64). On the 2-core Zen 4 VM (32 KiB L1d, 1 MiB L2)
// at head_dim 64 this gives 64 × 64 forward and 128 × 64 backward, what the sweep there chose
// (forward: every candidate within 4% of 64 × 64 at T = 1024, 128-row tiles 3-10% slower;
// backward: 128 × 64 9% faster than 64 × 64): docs/results/attention-tiles-2026-12-06.md.
// The backward's larger tiles take more scratch (attention_backward_scratch_bytes), but only
// inside the backward: perf/memory_model counts it in that phase alone (StepPhase), so it does
// not add to a ZeRO-1/2 peak that falls in the optimizer step.
FlashTileChoice flash_tiles_from_caches(const CacheGeometry& c, int64_t head_dim) {
  int64_t bc = kFlashTileK[0];
  for (int64_t k : kFlashTileK)
    if (k * head_dim * 4 <= c.l1d_bytes / 2) bc = k;
  const auto rows = [&](int64_t per_row_floats, int64_t cap) {
    int64_t br = kFlashTileQ[0];
    for (int64_t q : kFlashTileQ)
      if (q <= cap && (q * per_row_floats + 2 * bc * head_dim) * 4 <= c.l2_bytes / 2) br = q;
    return br;
  };
  // Floats per query row: forward Qᵀ, O and a column of Sᵀ; backward Qᵀ, dOᵀ, Q, dO and a
  // column each of Sᵀ and dSᵀ.
  const FlashTiles fwd{rows(2 * head_dim + bc, 64), bc};
  const FlashTiles bwd{rows(4 * head_dim + 2 * bc, kFlashTileQ[std::size(kFlashTileQ) - 1]), bc};
  return {fwd, bwd};
}

FlashTiles flash_tiles_for_length(FlashTiles tuned, int64_t q_len, bool masked) {
  if (!masked) return tuned;
  const auto fit = [&](int64_t size) {
    while (size > 64 && 8 * size > q_len) size /= 2;
    return size;
  };
  return {fit(tuned.q), fit(tuned.k), tuned.pack_v};
}
FlashTileChoice flash_tiles_for_length(FlashTileChoice tuned, int64_t q_len, bool masked) {
  return {flash_tiles_for_length(tuned.fwd, q_len, masked),
          flash_tiles_for_length(tuned.bwd, q_len, masked)};
}

FlashTileChoice default_flash_tiles() { return flash_tiles_from_caches(this_cpu_caches(), 64); }

FlashTileChoice flash_tiles() {
  std::unique_lock<std::mutex> lock;
  return loaded_state(lock).current;
}

void set_flash_tiles(FlashTileChoice t) {
  KILN_CHECK(candidate(t.fwd) && candidate(t.bwd));
  std::unique_lock<std::mutex> lock;
  TileState& s = loaded_state(lock);
  s.current = t;
  s.source = "set";
}

std::string flash_tiles_source() {
  std::unique_lock<std::mutex> lock;
  return loaded_state(lock).source;
}

Status save_flash_tuning(const std::string& source) {
  const FlashTileChoice t = flash_tiles();
  nlohmann::json f;
  f["fwd"] = {{"q", t.fwd.q}, {"k", t.fwd.k}, {"pack_v", t.fwd.pack_v}};
  f["bwd"] = {{"q", t.bwd.q}, {"k", t.bwd.k}};
  f["source"] = source;
  Status st = merge_tune_entry({{"flash_attention", f}});
  if (st.ok()) {
    std::unique_lock<std::mutex> lock;
    loaded_state(lock).source = "tune file (" + source + ")";
  }
  return st;
}

namespace {
// A causal W5-shaped problem (T × heads of 64) to time the flash kernels on.
struct TuneProblem {
  AttentionParams p;
  std::vector<float> q, k, v, dout, o, dq, dk, dv, lse;
  TuneProblem(int64_t seq_len, int64_t heads) {
    p.q_len = p.kv_len = std::max<int64_t>(64, seq_len);
    p.n_heads = p.n_kv_heads = std::max<int64_t>(1, heads);
    p.head_dim = 64;
    p.causal = true;
    p = check_attention(p).value();
    const auto n = static_cast<size_t>(p.q_len * p.n_heads * p.head_dim);
    for (std::vector<float>* x : {&q, &k, &v, &dout, &o, &dq, &dk, &dv}) x->resize(n);
    lse.resize(static_cast<size_t>(p.n_heads * p.q_len));
    Rng rng(1);
    for (std::vector<float>* x : {&q, &k, &v, &dout}) rng.fill_uniform(*x);
  }
  void forward() { attention_forward_flash(o.data(), lse.data(), q.data(), k.data(), v.data(), p); }
  void backward() {
    attention_backward_flash(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), o.data(),
                             lse.data(), p);
  }
};
// The best of `reps` runs of f, in ms.
template <class F>
double best_ms(int reps, const F& f) {
  double best = INFINITY;
  for (int r = 0; r < std::max(1, reps); ++r) {
    const double t0 = now_seconds();
    f();
    best = std::min(best, (now_seconds() - t0) * 1e3);
  }
  return best;
}
}  // namespace

FlashPackResult autotune_flash_v_packing(int reps, int64_t seq_len) {
  const double t_start = now_seconds();
  TuneProblem pr(seq_len, 12);
  FlashTileChoice c = flash_tiles();
  const auto time_with = [&](bool pack) {
    c.fwd.pack_v = pack;
    set_flash_tiles(c);
    pr.forward();  // warm-up: scratch, pages, clock
    return best_ms(reps, [&] { pr.forward(); });
  };
  FlashPackResult r;
  r.in_place_ms = time_with(false);
  r.packed_ms = time_with(true);
  r.pack_v = r.packed_ms < r.in_place_ms * (1 - kMinGain);
  c.fwd.pack_v = r.pack_v;
  set_flash_tiles(c);
  r.seconds = now_seconds() - t_start;
  return r;
}

bool flash_v_packing_in_tune_file() {
  const Expected<nlohmann::json> entry = read_tune_entry();
  if (!entry.ok() || !entry->is_object() || !entry->contains("flash_attention")) return false;
  const nlohmann::json& f = entry->at("flash_attention");
  return f.is_object() && f.contains("fwd") && f.at("fwd").is_object() && f.at("fwd").contains("pack_v");
}

FlashTuneResult autotune_flash_tiles(const FlashTuneOptions& opt) {
  const double t_start = now_seconds();
  TuneProblem pr(opt.seq_len, opt.heads);
  const auto forward = [&] { pr.forward(); };
  const auto backward = [&] { pr.backward(); };
  const FlashTileChoice base = default_flash_tiles();
  FlashTuneResult result;
  result.best = base;
  // One pass: the cache model's tiles first, then every other candidate.
  const auto sweep = [&](bool bwd, double* best_out, double* default_out) {
    std::vector<FlashTiles> cands{bwd ? base.bwd : base.fwd};
    for (bool pack_v : {false, true}) {  // the forward's tiles both ways (the backward always packs)
      if (bwd && pack_v) break;
      for (int64_t tq : kFlashTileQ)
        for (int64_t tk : kFlashTileK)
          // Tiles a causal call of this length would shrink (flash_tiles_for_length) are not timed.
          if (const FlashTiles t{tq, tk, pack_v};
              t != cands[0] && flash_tiles_for_length(t, opt.seq_len, true) == t)
            cands.push_back(t);
    }
    double best = INFINITY;
    for (const FlashTiles& t : cands) {
      FlashTileChoice c = result.best;
      (bwd ? c.bwd : c.fwd) = t;
      set_flash_tiles(c);
      if (bwd) forward();  // the saved output and logsumexp (the backward reads them)
      bwd ? backward() : forward();  // warm-up: scratch, pages, clock
      const double ms = bwd ? best_ms(opt.reps, backward) : best_ms(opt.reps, forward);
      if (opt.log)
        opt.log(fmt::format("  tune flash {} Br={:<3} Bc={:<3} {:8.2f} ms{}", bwd ? "bwd" : "fwd", t.q, t.k, ms,
                            t.pack_v ? " (V packed)" : ""));
      if (&t == &cands[0]) *default_out = ms;
      if (ms < best * (1 - kMinGain)) {
        best = ms;
        (bwd ? result.best.bwd : result.best.fwd) = t;
      }
    }
    *best_out = best;
  };
  sweep(false, &result.fwd_ms, &result.fwd_default_ms);
  if (opt.backward) sweep(true, &result.bwd_ms, &result.bwd_default_ms);
  set_flash_tiles(result.best);
  {
    std::unique_lock<std::mutex> lock;
    loaded_state(lock).source = "autotune (this run)";
  }
  result.seconds = now_seconds() - t_start;
  return result;
}

}  // namespace kiln::cpu
