// Register-tile shapes of the quantized CPU GEMMs as a run-time choice among compiled variants:
// the block-quantized Q8_0 / Q4_0 kernels (block_quant_gemm.h) and the weight-only decode tile
// (quant_gemm.h). Today's shapes are the defaults; this CPU's timed choice is kept in the tune
// file beside the GEMM blocking (gemm_cpu.h) and timed at first use with it. Every variant gives
// the same bits: only which outputs share a pass changes, never the order of any output's sum.
// Implemented in quant_tiles.cpp; the AVX-512 kernels honour the choice, AVX2 and scalar keep
// their one shape (16 ymm registers leave no room to vary).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "kiln/core/status.h"

namespace kiln::cpu {

// Rows x 16-channel tiles of one block-quantized register tile (acc and dot: 2·R·C zmm).
struct BqShape {
  int rows = 4, tiles = 2;
  bool operator==(const BqShape&) const = default;
};

struct QuantTiles {
  // Block-quantized Q4_0, one row (decode): 16-channel tiles per pass (independent dot chains;
  // each tile's weight stream is read once). Measured 1.1-1.4x over 2 on W2-S when 4 was chosen.
  // Q8_0 decode takes one tile per pass whatever this says (block_quant_gemm_avx512.cpp).
  int bq_decode = 4;
  // Block-quantized, 2..15 rows (batched decode) and >= 16 rows (prefill): rows x tiles per
  // register tile. Rows share each weight load, tiles share each activation broadcast.
  BqShape bq_batch{4, 2};
  BqShape bq_prefill{4, 2};
  // Weight-only, one row (GEMV): channels per tile (accumulator chains per decoded x vector).
  int wo_gemv = 8;
  // Weight-only, 2..15 rows: channels per 4-row tile. The rows stay 4: a remainder row of one
  // takes the GEMV form, whose per-group sums round differently, so rows cannot vary bitwise.
  int wo_rows = 4;
  bool operator==(const QuantTiles&) const = default;
};

// Rows from which the block-quantized kernels take bq_prefill instead of bq_batch.
inline constexpr int64_t kBqPrefillMinRows = 16;

// The compiled candidates (static_asserted against the kernels' instantiations).
inline constexpr int kBqDecodeTiles[] = {2, 4, 8};
inline constexpr BqShape kBqShapes[] = {{4, 2}, {2, 4}, {6, 2}, {8, 1}};
inline constexpr int kWoGemvChannels[] = {4, 8, 16};
inline constexpr int kWoRowsChannels[] = {2, 4};

bool is_quant_tiles_candidate(const QuantTiles& t);
std::string bq_shape_name(BqShape s);  // "4x2" (rows x tiles)
BqShape parse_bq_shape(const std::string& s);  // {0, 0} when not "<rows>x<tiles>"
// "q4_0 decode 4 tiles (q8_0 1), batch 4x2, prefill 4x2; weight-only gemv 8 ch, rows 4x4"
std::string quant_tiles_name(const QuantTiles& t);

// The shapes the kernels use now: set_quant_tiles(), else this CPU's tune-file entry (read once;
// a bad field falls back to its default with a warning naming it), else QuantTiles{}. Lock-free
// after the first call (the kernels read it per call).
QuantTiles quant_tiles();
void set_quant_tiles(const QuantTiles& t);  // candidates only (checked)
// "default", "set", "autotune (this run)" or "tune file (<source>)".
std::string quant_tiles_source();
// Whether this CPU's tune-file entry holds a quant_tiles member without bad fields (the
// first-use search skips the quantized part when it does).
bool quant_tiles_in_tune_file();
// Writes quant_tiles() into this CPU's tune-file entry, keeping its other members.
Status save_quant_tuning(const std::string& source = "bench --tune");
// The tune-file member <-> tiles. from_json: an absent field keeps its default; a bad one too,
// and `warnings` names it ("quant_tiles.bq_decode: 5 is not a candidate (2, 4, 8)"; several
// joined by "; "), so a hand-edited file never crashes a run.
nlohmann::json quant_tiles_to_json(const QuantTiles& t);
QuantTiles quant_tiles_from_json(const nlohmann::json& j, std::string* warnings);

// ---- the search ------------------------------------------------------------------------------
struct QuantTuneOptions {
  int64_t size = 2048;  // K = N of the timed weights (W2-S-like); m = 1, 8, 128
  int reps = 3;         // best of, each rep ~`min_seconds` of repeated calls
  double min_seconds = 0.004;
  std::function<void(const std::string&)> log;  // one line per candidate, when set
};
struct QuantTuneResult {
  QuantTiles best;
  // Time of each knob's winner over the default's on its shape (1.0: the default kept).
  double bq_decode_ratio = 1, bq_batch_ratio = 1, bq_prefill_ratio = 1, wo_gemv_ratio = 1, wo_rows_ratio = 1;
  double seconds = 0;
  bool searched = false;  // false where the active target has one shape (AVX2, scalar)
};
// Times each knob's candidates on its shape (Q8_0 + Q4_0 summed for the block kernels, int8 +
// int4 g128 for the weight-only ones) on the current thread count, the default first; a
// candidate must beat the best by 4% (the VMs' run-to-run noise). Sets the winners and leaves
// saving to the caller. About 0.5-1 s on the 2-core Zen 4 VM at size 2048.
QuantTuneResult autotune_quant_tiles(const QuantTuneOptions& opt = {});

}  // namespace kiln::cpu
