// The AMX tile code of the bf16 GEMM (gemm_amx.h). Compiled with -mamx-tile -mamx-bf16 (the
// file-name suffix) and nothing but these functions in it, like the other ISA-suffixed kernels.
#include <immintrin.h>

#include <cstring>

#include "kiln/kernels/cpu/gemm_amx.h"

namespace kiln::cpu {
namespace {

// LDTILECFG's 64-byte operand: palette 1, then the bytes per row and rows of each tile.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: C (rows 0-15 / 16-31 x columns 0-15 / 16-31); 4-5: A's two row halves; 6-7: B's
// two column halves. All eight 16 rows x 64 bytes, so one configuration serves every call. The
// configuration is per thread and survives context switches, but any other code on the thread
// may release or replace it (oneDNN's AMX kernels end with TILERELEASE, which left a
// configured-once flag stale and the next TILEZERO raised SIGILL), so each call reads it back
// (STTILECFG) and loads ours when it differs.
void configure_tiles() {
  static const TileConfig ours = [] {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
      cfg.colsb[t] = 64;
      cfg.rows[t] = 16;
    }
    return cfg;
  }();
  TileConfig now;
  _tile_storeconfig(&now);
  if (std::memcmp(&now, &ours, sizeof ours) != 0) _tile_loadconfig(&ours);
}

// One chunk of 16 pairs of k: A's two row halves (16 rows of 64 bytes, a_stride apart) and a B
// step block (16 rows of 32 pairs, 128 bytes each: its two column halves) into C's four tiles.
inline __attribute__((always_inline)) void multiply_chunk(const void* a_top, const void* a_bottom, int64_t a_stride,
                                                          const uint32_t* b) {
  _tile_loadd(4, a_top, a_stride);
  _tile_loadd(5, a_bottom, a_stride);
  _tile_loadd(6, b, 4 * kAmxNr);
  _tile_loadd(7, b + 16, 4 * kAmxNr);
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

}  // namespace

void amx_bf16_tile_32x32(int64_t steps, const AmxA& a, const uint32_t* b, float* c, int64_t ldc, bool load_c) {
  configure_tiles();
  const int64_t c_stride = 4 * ldc;
  float* const c_low = c + 16 * ldc;  // rows 16-31
  if (load_c) {
    _tile_loadd(0, c, c_stride);
    _tile_loadd(1, c + 16, c_stride);
    _tile_loadd(2, c_low, c_stride);
    _tile_loadd(3, c_low + 16, c_stride);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  const char* ap = a.a;
  const int64_t full = steps / kAmxStepsPerTile;
  const int64_t a_half = 16 * a.row_bytes;
  for (int64_t c = 0; c < full; ++c, ap += a.chunk_bytes, b += kAmxStepsPerTile * kAmxNr)
    multiply_chunk(ap, ap + a_half, a.row_bytes, b);
  if (const int64_t w = steps - full * kAmxStepsPerTile; w > 0) {
    // The last w < 16 pairs: copied into zeroed tiles, so the rows past them add 0 x 0.
    alignas(64) uint32_t at[kAmxMr * kAmxStepsPerTile] = {};
    alignas(64) uint32_t bt[kAmxStepsPerTile * kAmxNr] = {};
    for (int r = 0; r < kAmxMr; ++r)
      std::memcpy(at + r * kAmxStepsPerTile, ap + r * a.tail_row_bytes, static_cast<size_t>(w) * 4);
    std::memcpy(bt, b, static_cast<size_t>(w) * kAmxNr * 4);
    multiply_chunk(at, at + 16 * kAmxStepsPerTile, 64, bt);
  }
  _tile_stored(0, c, c_stride);
  _tile_stored(1, c + 16, c_stride);
  _tile_stored(2, c_low, c_stride);
  _tile_stored(3, c_low + 16, c_stride);
}

double amx_bf16_peak_loop(int64_t reps) {
  configure_tiles();
  alignas(64) uint16_t ones[16 * 32];
  for (uint16_t& v : ones) v = 0x3a83;  // bf16 0.001: the sums stay small and normal
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t r = 0; r < reps; ++r) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float sink[16 * 16];
  _tile_stored(0, sink, 64);
  _tile_stored(1, sink, 64);
  _tile_stored(2, sink, 64);
  _tile_stored(3, sink, 64);
  return static_cast<double>(reps) * 4 * 16 * 16 * 32 * 2;
}

}  // namespace kiln::cpu
