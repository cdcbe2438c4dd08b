// Block-quantized GEMM, llama.cpp's Q8_0 / Q4_0 recipe: int8 or int4 weights with one scale per
// block of 32 inputs, activations quantized at run time to int8 with one scale per block of 32
// (Q8_0 activations), each block's dot product exact in int32, then scaled and summed in f32:
//
//     y[i][j] = Σ_b (dw[j][b] · da[i][b]) · Σ_{k in block b} qa[i][k] · qw[j][k]  (+ bias + residual)
//
// The integer dots are what VNNI's vpdpbusd (u8 × s8 → 4-way sums into int32) computes: 64 MACs
// per instruction against 16 for an f32 FMA, and the int4 codes are unpacked in registers with
// one AND or shift. kernels/quant_gemm.h's weight-only W4A16 / W8A16 path keeps the accuracy
// role (f32 activations); this is the speed path for decode and prefill.
//
// The weight is repacked once at load into the layout the kernel streams (BlockQuantWeight).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/kernels/op_cost.h"
#include "kiln/kernels/quant_gemm.h"

namespace kiln {

inline constexpr int64_t kQuantBlock = 32;   // inputs per scale block, as Q8_0 / Q4_0
inline constexpr int64_t kQuantTile = 16;    // output channels per packed tile (one zmm of int32)

enum class BlockQuantFormat { kQ8, kQ4 };
std::string_view block_quant_format_name(BlockQuantFormat f);

// The packed weight (out, in), in % 32 == 0. Channels are grouped in tiles of 16 (the last
// tile padded with zero codes and zero scales); a tile's blocks b = 0 .. in/32 − 1 follow one
// another, so a thread streams one contiguous run per tile. One block of a tile is
//
//   codes, in 4-input "quads" (vpdpbusd's unit): byte [4·c + r] of quad u is channel c's code
//   for input 32·b + 4·u + r, stored unsigned:
//     Q8: 8 quads of 64 bytes, each byte q + 128 (q in [-128, 127]);
//     Q4: 4 chunks of 64 bytes; chunk h holds quad 2h in its low nibbles and quad 2h + 1 in
//         its high nibbles, each nibble q + 8 (q in [-8, 7]);
//   scales: 16 IEEE halves, channel c's dw for block b (GGUF's own f16 scale, value for value;
//         a kiln f32 scale is rounded to the nearest half at packing).
//
// Unsigned weight codes make the dot vpdpbusd's u8 × s8 form; the offset o (128 or 8) is
// taken back out through the activations' block sums: Σ (q + o)·a = Σ q·a + o·Σ a.
struct BlockQuantWeight {
  BlockQuantFormat format = BlockQuantFormat::kQ4;
  int64_t out = 0, in = 0;
  const uint8_t* data = nullptr;

  int64_t blocks() const { return in / kQuantBlock; }
  int64_t tiles() const { return (out + kQuantTile - 1) / kQuantTile; }
  int64_t code_bytes() const { return format == BlockQuantFormat::kQ8 ? 512 : 256; }  // per block of a tile
  int64_t block_bytes() const { return code_bytes() + 2 * kQuantTile; }
  int64_t tile_bytes() const { return blocks() * block_bytes(); }
  int64_t bytes() const { return tiles() * tile_bytes(); }
  int offset() const { return format == BlockQuantFormat::kQ8 ? 128 : 8; }
};

// Exact accessors (references and tests): the signed code q and the block scale of channel j.
int block_quant_code(const BlockQuantWeight& w, int64_t j, int64_t k);
float block_quant_scale(const BlockQuantWeight& w, int64_t j, int64_t b);

// A packed weight with its bytes.
struct PackedBlockWeight {
  BlockQuantWeight w;
  std::vector<uint8_t> bytes;
};
// Packs a kiln QuantWeight that fits the recipe: int8 or int4, symmetric (no zeros), group 32.
// InvalidArgument naming what does not fit otherwise.
Status pack_block_quant(const QuantWeight& src, PackedBlockWeight* dst);
// Whether pack_block_quant takes src (the same test, no message).
bool block_quant_packable(const QuantWeight& src);

// Activations quantized per block: q (n, in) int8 rows ldq apart, scales and sums (n, in/32)
// row-major: da = amax / 127, q = round_half_even(x · (127 / amax)) with the reciprocal
// computed once per block in f32 (every backend rounds identically), Σ q per block; an all-zero
// block gets da = 0 and q = 0. Codes stay in [-127, 127].
struct BlockQuantActs {
  int64_t n = 0, in = 0;
  const int8_t* q = nullptr;
  int64_t ldq = 0;
  const float* scales = nullptr;
  const int32_t* sums = nullptr;
};

// y (n, out) = x (n, in) · Wᵀ + bias (+ residual), x quantized per block first (inside the op).
struct BlockQuantGemmParams {
  const BlockQuantWeight* w = nullptr;
  int64_t n = 0;
  const float* x = nullptr;         // (n, in), rows ldx apart
  int64_t ldx = 0;
  float* y = nullptr;               // (n, out), rows ldy apart; written, never read
  int64_t ldy = 0;
  const float* bias = nullptr;      // (out,) or null
  const float* residual = nullptr;  // (n, out), rows ldr apart, or null; added last
  int64_t ldr = 0;
};
Status check_block_quant_gemm(const BlockQuantGemmParams& p);

// 2·n·out·in operations; the packed weight once, x (f32) and y.
inline OpCost block_quant_gemm_cost(const BlockQuantWeight& w, int64_t n) {
  return {2.0 * n * w.out * w.in, static_cast<double>(w.bytes()) + 4.0 * n * w.in + 4.0 * n * w.out};
}

namespace ref {
// The activation quantization of BlockQuantActs, scalar. q rows ldq apart; scales, sums (n, in/32).
void quantize_blocks_int8(const float* x, int64_t n, int64_t in, int64_t ldx, int8_t* q, int64_t ldq, float* scales,
                          int32_t* sums);
// Each block's int32 dot exact, its scale the f32 product dw · da, the sum over blocks in
// double, rounded once; then + bias + residual in that order.
void block_quant_gemm(const BlockQuantGemmParams& p);
}  // namespace ref

namespace cpu {
// Same contracts. Threads take tiles of 16 channels; each tile streams its blocks once per 4
// rows (decode: once). AVX-512 with VNNI: vpdpbusd; AVX-512BW or AVX2 without it: vpmaddubsw +
// vpmaddwd (Q8's codes made signed and the sign moved onto the activations, so no 16-bit sum
// saturates).
void quantize_blocks_int8(const float* x, int64_t n, int64_t in, int64_t ldx, int8_t* q, int64_t ldq, float* scales,
                          int32_t* sums);
void block_quant_gemm(const BlockQuantGemmParams& p);
std::string block_quant_path_name();
// Tests switch VNNI off to cover the 16-bit multiply-add path AVX-512 CPUs without VNNI run.
void set_block_quant_vnni_allowed(bool allowed);
}  // namespace cpu

KILN_SAME_SIGNATURE(block_quant_gemm);
KILN_SAME_SIGNATURE(quantize_blocks_int8);

}  // namespace kiln
