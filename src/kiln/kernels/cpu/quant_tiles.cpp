// The quantized GEMMs' tile-shape choice (quant_tiles.h): the candidates, this CPU's entry in the
// tune file (shared with the GEMM blocking, gemm_tuning.cpp), and the timed search that the
// first-use autotune and `kiln bench gemm --tune` run.
#include "kiln/kernels/cpu/quant_tiles.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <iterator>
#include <mutex>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/core/cpu_features.h"
#include "kiln/core/rng.h"
#include "kiln/kernels/block_quant_gemm.h"
#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/quant_gemm.h"

namespace kiln::cpu {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <class T, size_t N>
int index_of(const T (&cands)[N], const T& v) {
  for (size_t i = 0; i < N; ++i)
    if (cands[i] == v) return static_cast<int>(i);
  return -1;
}

static_assert(std::size(kBqDecodeTiles) <= 4 && std::size(kBqShapes) <= 4 && std::size(kWoGemvChannels) <= 4 &&
                  std::size(kWoRowsChannels) <= 4,
              "each knob's candidate index takes 2 bits of the packed choice");

// The choice packed into one int (2 bits per knob, candidate indices) so that the kernels read
// it lock-free on every call; -1 until loaded.
int pack(const QuantTiles& t) {
  return index_of(kBqDecodeTiles, t.bq_decode) | index_of(kBqShapes, t.bq_batch) << 2 |
         index_of(kBqShapes, t.bq_prefill) << 4 | index_of(kWoGemvChannels, t.wo_gemv) << 6 |
         index_of(kWoRowsChannels, t.wo_rows) << 8;
}
QuantTiles unpack(int c) {
  QuantTiles t;
  t.bq_decode = kBqDecodeTiles[c & 3];
  t.bq_batch = kBqShapes[(c >> 2) & 3];
  t.bq_prefill = kBqShapes[(c >> 4) & 3];
  t.wo_gemv = kWoGemvChannels[(c >> 6) & 3];
  t.wo_rows = kWoRowsChannels[(c >> 8) & 3];
  return t;
}

struct State {
  std::mutex mu;
  std::atomic<int> packed{-1};
  std::string source = "default";
  bool in_file = false;  // this CPU's entry holds a valid quant_tiles member
};
State& state() {
  static State s;
  return s;
}

void load_locked(State& s) {
  QuantTiles t;
  s.source = "default";
  const Expected<nlohmann::json> entry = read_tune_entry();
  if (!entry.ok()) {
    fmt::print(stderr, "kiln: warning: ignoring the quantized GEMM tiles in {} ({}); using the defaults\n",
               gemm_tune_file(), entry.status().message());
  } else if (entry->is_object() && entry->contains("quant_tiles")) {
    std::string warnings;
    t = quant_tiles_from_json(entry->at("quant_tiles"), &warnings);
    if (!warnings.empty())
      fmt::print(stderr, "kiln: warning: tune file {}: {}; those keep their defaults\n", gemm_tune_file(), warnings);
    s.in_file = warnings.empty();  // a bad member is searched again at first use (and overwritten)
    const nlohmann::json& q = entry->at("quant_tiles");
    const auto src = q.is_object() ? q.find("source") : q.end();
    s.source = "tune file (" + (q.is_object() && src != q.end() && src->is_string() ? src->get<std::string>()
                                                                                    : std::string("bench --tune")) +
               ")";
  }
  s.packed.store(pack(t), std::memory_order_release);
}

State& loaded_state(std::unique_lock<std::mutex>& lock) {
  State& s = state();
  lock = std::unique_lock<std::mutex>(s.mu);
  if (s.packed.load(std::memory_order_relaxed) < 0) load_locked(s);
  return s;
}

// A candidate replaces the best only when it is this much faster (the GEMM sweep's threshold:
// the same configuration's best-of-3 moves by 3-5% between neighbouring runs on shared VMs).
constexpr double kMinGain = 0.04;

template <class T, size_t N>
std::string list(const T (&cands)[N], std::string (*name)(T)) {
  std::vector<std::string> v;
  for (const T& c : cands) v.push_back(name(c));
  return fmt::format("{}", fmt::join(v, ", "));
}
std::string int_name(int v) { return std::to_string(v); }

// One knob's field: absent keeps the default silently; a value of the wrong type or not among
// the candidates keeps the default and adds a line naming the field.
template <class T, size_t N>
void read_field(const nlohmann::json& j, const char* key, const T (&cands)[N], T* out, std::string* warnings,
                std::string (*name)(T), T (*parse)(const nlohmann::json&)) {
  const auto it = j.find(key);
  if (it == j.end()) return;
  const T v = parse(*it);
  if (index_of(cands, v) >= 0) {
    *out = v;
    return;
  }
  if (!warnings->empty()) *warnings += "; ";
  *warnings += fmt::format("quant_tiles.{}: {} is not a candidate ({})", key, it->dump(), list(cands, name));
}
int parse_int(const nlohmann::json& j) { return j.is_number_integer() ? j.get<int>() : -1; }
BqShape parse_shape(const nlohmann::json& j) { return j.is_string() ? parse_bq_shape(j.get<std::string>()) : BqShape{0, 0}; }

}  // namespace

bool is_quant_tiles_candidate(const QuantTiles& t) {
  return index_of(kBqDecodeTiles, t.bq_decode) >= 0 && index_of(kBqShapes, t.bq_batch) >= 0 &&
         index_of(kBqShapes, t.bq_prefill) >= 0 && index_of(kWoGemvChannels, t.wo_gemv) >= 0 &&
         index_of(kWoRowsChannels, t.wo_rows) >= 0;
}

std::string bq_shape_name(BqShape s) { return fmt::format("{}x{}", s.rows, s.tiles); }

BqShape parse_bq_shape(const std::string& s) {
  BqShape r{0, 0};
  int* f = &r.rows;
  bool digits = false;
  for (char c : s) {
    if (c == 'x' && f == &r.rows && digits) {
      f = &r.tiles;
      digits = false;
    } else if (c >= '0' && c <= '9' && *f < 1000) {
      *f = *f * 10 + (c - '0');
      digits = true;
    } else {
      return {0, 0};
    }
  }
  return f == &r.tiles && digits ? r : BqShape{0, 0};
}

std::string quant_tiles_name(const QuantTiles& t) {
  return fmt::format("q4_0 decode {} tiles (q8_0 1), batch {}, prefill {}; weight-only gemv {} ch, rows 4x{}", t.bq_decode,
                     bq_shape_name(t.bq_batch), bq_shape_name(t.bq_prefill), t.wo_gemv, t.wo_rows);
}

QuantTiles quant_tiles() {
  const int c = state().packed.load(std::memory_order_acquire);
  if (c >= 0) return unpack(c);
  std::unique_lock<std::mutex> lock;
  return unpack(loaded_state(lock).packed.load());
}

void set_quant_tiles(const QuantTiles& t) {
  KILN_CHECK(is_quant_tiles_candidate(t));
  std::unique_lock<std::mutex> lock;
  State& s = loaded_state(lock);
  s.packed.store(pack(t), std::memory_order_release);
  s.source = "set";
}

std::string quant_tiles_source() {
  std::unique_lock<std::mutex> lock;
  return loaded_state(lock).source;
}

bool quant_tiles_in_tune_file() {
  std::unique_lock<std::mutex> lock;
  return loaded_state(lock).in_file;
}

nlohmann::json quant_tiles_to_json(const QuantTiles& t) {
  return {{"bq_decode", t.bq_decode},
          {"bq_batch", bq_shape_name(t.bq_batch)},
          {"bq_prefill", bq_shape_name(t.bq_prefill)},
          {"wo_gemv", t.wo_gemv},
          {"wo_rows", t.wo_rows}};
}

QuantTiles quant_tiles_from_json(const nlohmann::json& j, std::string* warnings) {
  QuantTiles t;
  if (!j.is_object()) {
    *warnings = fmt::format("quant_tiles: {} is not an object", j.dump());
    return t;
  }
  read_field(j, "bq_decode", kBqDecodeTiles, &t.bq_decode, warnings, &int_name, &parse_int);
  read_field(j, "bq_batch", kBqShapes, &t.bq_batch, warnings, &bq_shape_name, &parse_shape);
  read_field(j, "bq_prefill", kBqShapes, &t.bq_prefill, warnings, &bq_shape_name, &parse_shape);
  read_field(j, "wo_gemv", kWoGemvChannels, &t.wo_gemv, warnings, &int_name, &parse_int);
  read_field(j, "wo_rows", kWoRowsChannels, &t.wo_rows, warnings, &int_name, &parse_int);
  return t;
}

Status save_quant_tuning(const std::string& source) {
  nlohmann::json q = quant_tiles_to_json(quant_tiles());
  q["source"] = source;
  Status st = merge_tune_entry({{"quant_tiles", q}});
  if (st.ok()) {
    std::unique_lock<std::mutex> lock;
    State& s = loaded_state(lock);
    s.source = "tune file (" + source + ")";
    s.in_file = true;
  }
  return st;
}

// ---- the search ---------------------------------------------------------------------------------
QuantTuneResult autotune_quant_tiles(const QuantTuneOptions& opt) {
  const double t_start = now_seconds();
  disarm_first_use_autotune();  // its own quantized GEMMs must not start another search
  QuantTuneResult result;
  result.best = quant_tiles();
  if (active_simd_target() != SimdTarget::kAvx512) {  // one shape per kernel there
    result.seconds = now_seconds() - t_start;
    return result;
  }
  result.searched = true;
  const int64_t size = std::max<int64_t>(256, opt.size / 128 * 128);  // K = N; g128 divides it
  const int64_t rows_max = 128;
  Rng rng(1);
  // Weights: random codes over the whole grid, scales in [0.01, 0.1) (the values do not change
  // the time; the layouts and formats do).
  struct OwnedWeight {
    std::vector<uint8_t> codes;
    std::vector<float> scales, zeros;
    QuantWeight w;
  };
  const auto make_weight = [&](QuantFormat f, int64_t group, bool zeros) {
    OwnedWeight o;
    o.w.format = f;
    o.w.out = o.w.in = size;
    o.w.group = group;
    o.codes.resize(static_cast<size_t>(size * quant_row_bytes(f, size)));
    for (uint8_t& b : o.codes) b = static_cast<uint8_t>(rng.below(256));
    o.scales.resize(static_cast<size_t>(size * (size / group)));
    rng.fill_uniform(o.scales, 0.01f, 0.1f);
    if (zeros) {
      o.zeros.resize(o.scales.size());
      rng.fill_uniform(o.zeros, -4.0f, 4.0f);
    }
    o.w.data = o.codes.data();
    o.w.scales = o.scales.data();
    o.w.zeros = zeros ? o.zeros.data() : nullptr;
    return o;
  };
  // Block kernels: Q8_0 and Q4_0; weight-only: int8 per channel and int4 g128 with zero-points
  // (what `kiln bench quant-decode` runs as w8a16 and w4a16).
  const OwnedWeight w8 = make_weight(QuantFormat::kInt8, size, false), w4 = make_weight(QuantFormat::kInt4, 128, true);
  const OwnedWeight b8 = make_weight(QuantFormat::kInt8, kQuantBlock, false),
                    b4 = make_weight(QuantFormat::kInt4, kQuantBlock, false);
  PackedBlockWeight q8, q4;
  KILN_CHECK(pack_block_quant(b8.w, &q8).ok() && pack_block_quant(b4.w, &q4).ok());
  std::vector<float> x(static_cast<size_t>(rows_max * size)), y(x.size());
  rng.fill_uniform(x, -1.0f, 1.0f);

  const auto run_block = [&](const BlockQuantWeight& w, int64_t n) {
    BlockQuantGemmParams p;
    p.w = &w;
    p.n = n;
    p.x = x.data();
    p.ldx = size;
    p.y = y.data();
    p.ldy = size;
    block_quant_gemm(p);
  };
  const auto run_wo = [&](const QuantWeight& w, int64_t n) {
    QuantGemmParams p;
    p.w = &w;
    p.n = n;
    p.x = x.data();
    p.ldx = size;
    p.y = y.data();
    p.ldy = size;
    quant_gemm(p);
  };
  // Best seconds per call of f: calls repeated for at least opt.min_seconds per rep.
  const auto per_call = [&](const auto& f) {
    f();  // warm-up: buffers, pages, clock
    double t0 = now_seconds();
    f();
    const double once = std::max(now_seconds() - t0, 1e-7);
    const int calls = static_cast<int>(std::clamp(opt.min_seconds / once, 1.0, 1000.0));
    double best = INFINITY;
    for (int r = 0; r < std::max(1, opt.reps); ++r) {
      t0 = now_seconds();
      for (int c = 0; c < calls; ++c) f();
      best = std::min(best, (now_seconds() - t0) / calls);
    }
    return best;
  };
  // One knob: its candidates (the current value first), each timed at `rows` on the formats that
  // read it: both block formats, Q4_0 alone (decode: Q8_0 decode takes one tile per pass
  // whatever bq_decode says), or both weight-only formats.
  enum class Timed { kBlock, kBlockQ4, kWeightOnly };
  const auto sweep = [&](const char* knob, int64_t rows, Timed timed, const std::vector<QuantTiles>& cands,
                         double* ratio, std::string (*value)(const QuantTiles&)) {
    double best = INFINITY, base = 0;
    QuantTiles winner = cands[0];
    for (const QuantTiles& t : cands) {
      set_quant_tiles(t);
      double s = 0;
      if (timed == Timed::kBlock) s += per_call([&] { run_block(q8.w, rows); });
      if (timed != Timed::kWeightOnly) s += per_call([&] { run_block(q4.w, rows); });
      else s += per_call([&] { run_wo(w8.w, rows); }) + per_call([&] { run_wo(w4.w, rows); });
      if (&t == &cands[0]) base = s;
      const char* formats = timed == Timed::kBlock ? "q8_0 + q4_0" : timed == Timed::kBlockQ4 ? "q4_0" : "int8 + int4 g128";
      if (opt.log)
        opt.log(fmt::format("  tune quant {:<10} m={:<3} {:>3} {:9.1f} us ({})", knob, rows, value(t), s * 1e6, formats));
      if (s < best * (1 - kMinGain)) {
        best = s;
        winner = t;
      }
    }
    *ratio = best / base;
    result.best = winner;
    set_quant_tiles(winner);
  };
  const auto vary = [&](auto field, const auto& values) {
    std::vector<QuantTiles> cands{result.best};
    for (const auto& v : values) {
      QuantTiles t = result.best;
      t.*field = v;
      if (!(t == cands[0])) cands.push_back(t);
    }
    return cands;
  };
  sweep("bq_decode", 1, Timed::kBlockQ4, vary(&QuantTiles::bq_decode, kBqDecodeTiles), &result.bq_decode_ratio,
        [](const QuantTiles& t) { return std::to_string(t.bq_decode); });
  sweep("bq_batch", 8, Timed::kBlock, vary(&QuantTiles::bq_batch, kBqShapes), &result.bq_batch_ratio,
        [](const QuantTiles& t) { return bq_shape_name(t.bq_batch); });
  sweep("bq_prefill", rows_max, Timed::kBlock, vary(&QuantTiles::bq_prefill, kBqShapes), &result.bq_prefill_ratio,
        [](const QuantTiles& t) { return bq_shape_name(t.bq_prefill); });
  sweep("wo_gemv", 1, Timed::kWeightOnly, vary(&QuantTiles::wo_gemv, kWoGemvChannels), &result.wo_gemv_ratio,
        [](const QuantTiles& t) { return std::to_string(t.wo_gemv); });
  sweep("wo_rows", 8, Timed::kWeightOnly, vary(&QuantTiles::wo_rows, kWoRowsChannels), &result.wo_rows_ratio,
        [](const QuantTiles& t) { return "4x" + std::to_string(t.wo_rows); });
  {
    std::unique_lock<std::mutex> lock;
    loaded_state(lock).source = "autotune (this run)";
  }
  result.seconds = now_seconds() - t_start;
  return result;
}

}  // namespace kiln::cpu
