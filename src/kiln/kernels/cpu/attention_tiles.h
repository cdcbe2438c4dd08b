// Tile sizes of the CPU FlashAttention kernels (attention_flash_impl.inc) as a run-time choice:
// the candidates, the default from the cache sizes, this CPU's swept choice kept in the tune file
// beside the GEMM blocking (gemm_cpu.h), the sweep, and a profiled forward that says where a
// tile's time goes. Implemented in attention_tiles.cpp (the profiled run in attention_flash.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kiln/core/status.h"
#include "kiln/kernels/cpu/gemm_cpu.h"

namespace kiln {
struct AttentionParams;
namespace cpu {

// Queries per tile (Br) and keys per tile (Bc) of one pass; for the forward also whether V_j is
// copied into contiguous rows before P·V. In place its Bc rows sit n_kv_heads·D floats apart
// (3 KiB at 12 × 64), so the tile's 256 lines fall into a quarter of L1's sets, more lines per
// set than ways: P·V, which reads V_j once per 6 query rows, then streams it from L2. Packing
// costs one copy per key tile. Which wins depends on the core, not on the cache sizes alone:
// packed was 12-18% faster on an Intel Xeon (AVX-512 FMA at full width, 48 KiB 12-way L1) and
// 5-14% slower on AMD Zen 4, so it is timed at first use (autotune_flash_v_packing) and kept in
// the tune file; untuned, V stays in place. The backward packs its operands always.
struct FlashTiles {
  int64_t q = 64;
  int64_t k = 64;
  bool pack_v = false;  // forward only
  bool operator==(const FlashTiles&) const = default;
};
// The forward's and the backward's (they stream different operands and are swept apart).
struct FlashTileChoice {
  FlashTiles fwd, bwd;
  bool operator==(const FlashTileChoice&) const = default;
};

// The candidates, Br × Bc. Every one is a multiple of every target's lane count (16 / 8 / 1), so
// full tiles need no masked loads; scratch is sized per call for the tiles in use (per thread at
// head_dim 64: forward 24 KiB at 32×64 to 194 KiB at 128×256, backward 48 to 384 KiB).
inline constexpr int64_t kFlashTileQ[] = {32, 64, 128};
inline constexpr int64_t kFlashTileK[] = {64, 128, 256};
bool is_flash_tile_candidate(FlashTiles t);
std::string flash_tiles_name(FlashTiles t);  // "64x128" (Br x Bc), "64x128 packed V"

// The cache model (see attention_tiles.cpp for the reasoning and the machines it was checked on).
FlashTileChoice flash_tiles_from_caches(const CacheGeometry& caches, int64_t head_dim);
// flash_tiles_from_caches() for this CPU at head_dim 64.
FlashTileChoice default_flash_tiles();

// The tiles a batched call of q_len queries runs. Causal and windowed calls compute whole tiles
// on the diagonal, about max(Br, Bc) / q_len of the work in vain: Br and Bc are halved (not
// below 64 or the tuned size) while 8·size > q_len, so short sequences waste at most ~1/8.
// Measured at T = 256 (12 heads of 64, 1 thread, Xeon): backward 128×64 3.09 ms, 64×64 2.56;
// at T = 512 9.12 and 8.55; at T = 1024 even (31.2, 31.8), where the rule keeps 128. In W1a
// (T = 256, 1 thread) attention_backward went from 79 to 68 ms per step.
FlashTiles flash_tiles_for_length(FlashTiles tuned, int64_t q_len, bool masked);
FlashTileChoice flash_tiles_for_length(FlashTileChoice tuned, int64_t q_len, bool masked);  // both
// The tiles every flash call uses now: set_flash_tiles(), else KILN_FLASH_TILES (one BrxBc for
// both passes), else this CPU's tune-file entry (read once), else default_flash_tiles().
FlashTileChoice flash_tiles();
void set_flash_tiles(FlashTileChoice t);  // candidates only (checked)
// "set", "KILN_FLASH_TILES", "tune file (bench attention --tune)" or "cache model".
std::string flash_tiles_source();
// Writes flash_tiles() into this CPU's tune-file entry (its GEMM fields and the other CPUs'
// entries are kept).
Status save_flash_tuning(const std::string& source = "bench attention --tune");

// ---- the sweep ----------------------------------------------------------------------------------
struct FlashTuneOptions {
  int64_t seq_len = 1024;  // causal, batch 1, `heads` heads of head_dim 64: kiln's W5 shape
  int64_t heads = 12;
  int reps = 3;            // best of
  bool backward = true;    // sweep the backward's tiles too (about 3x the forward's time)
  std::function<void(const std::string&)> log;  // one line per candidate, when set
};
struct FlashTuneResult {
  FlashTileChoice best;
  double fwd_ms = 0, bwd_ms = 0;                // of the winners
  double fwd_default_ms = 0, bwd_default_ms = 0;  // of default_flash_tiles()
  double seconds = 0;
};
// Times every candidate on the current thread count (the forward's each with V in place and
// packed), the cache model's choice first (a candidate must beat the best by 4%, the VMs'
// run-to-run noise), sets the winners and leaves saving to the caller. 2.5-3 s at the default
// shape on the 2-core Zen 4 VM (~0.6 s of it the forward, before packing doubled its
// candidates): too long for the first-use autotune, which times only the packing
// (autotune_flash_v_packing); `kiln bench attention --tune` runs the sweep.
FlashTuneResult autotune_flash_tiles(const FlashTuneOptions& opt = {});

// The forward's V packing timed both ways on this CPU (the current forward tiles, causal, T =
// seq_len, 12 heads of 64, best of `reps`), the faster set (packing must win by 4%); ~0.1-0.2 s
// at T = 1024. Part of the first-use autotune (gemm_cpu.h) when this CPU's tune-file entry has
// no choice yet.
struct FlashPackResult {
  bool pack_v = false;
  double in_place_ms = 0, packed_ms = 0, seconds = 0;
};
FlashPackResult autotune_flash_v_packing(int reps = 3, int64_t seq_len = 1024);
// Whether this CPU's tune-file entry records the forward's V packing.
bool flash_v_packing_in_tune_file();

// ---- where a forward's time goes -----------------------------------------------------------------
// Thread-seconds of each part of the query-tile forward, summed over threads: Q·Kᵀ (qk), the
// causal/window mask of edge tiles, the online softmax (max, exp, sum, rescale factors), P·V
// with the rescale fused (pv), and the rest (packing Qᵀ, normalizing the output).
struct FlashProfile {
  double qk_s = 0, mask_s = 0, softmax_s = 0, pv_s = 0, other_s = 0;
  int64_t key_tiles = 0;    // (query tile, key tile) pairs visited
  int64_t score_elems = 0;  // scores computed (masked ones included): each costs 2·D FLOPs per product
  double total_s() const { return qk_s + mask_s + softmax_s + pv_s + other_s; }
  FlashProfile& operator+=(const FlashProfile& o) {
    qk_s += o.qk_s, mask_s += o.mask_s, softmax_s += o.softmax_s, pv_s += o.pv_s, other_s += o.other_s;
    key_tiles += o.key_tiles, score_elems += o.score_elems;
    return *this;
  }
};
// attention_forward_flash with each part of every tile timed (two clock reads per part per key
// tile); q_len > kSplitKvMaxQueries.
FlashProfile attention_forward_flash_profiled(float* out, float* lse, const float* q, const float* k, const float* v,
                                              const AttentionParams& p);

}  // namespace cpu
}  // namespace kiln
