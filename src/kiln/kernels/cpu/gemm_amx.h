// Intel AMX (Advanced Matrix Extensions, Sapphire Rapids and later) for the bf16 GEMM: eight tile
// registers of up to 16 rows x 64 bytes and one instruction, TDPBF16PS, that multiplies a 16 x 32
// bf16 tile of A by a 32 x 16 bf16 tile of B (stored as 16 rows of pairs of k) into a 16 x 16
// f32 tile: 8,192 multiply-adds where a 512-bit VDPBF16PS does 32. The packed path here uses
// four accumulator tiles (a 32 x 32 block of C), two A tiles and two B tiles per 32 k: MR = NR =
// 32, k in pairs like the vdpbf16ps path, so B is packed by that path's pack_b unchanged (a step
// of a strip is 32 words, 128 bytes: the two B tiles are its halves, 128 bytes apart per row).
// Internal to kiln::cpu: cpu::gemm picks it (Bf16Kernel::kAmx, gemm_cpu.h).
#pragma once

#include <cstdint>

#include "kiln/kernels/cpu/gemm_kernels.h"

namespace kiln::cpu {

inline constexpr int kAmxMr = 32, kAmxNr = 32;
inline constexpr int kAmxStepsPerTile = 16;  // pairs of k in one A tile row (64 bytes)

// CPUID says AMX-TILE and AMX-BF16, XCR0 says the OS saves the tile state, and Linux granted this
// process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM; asked once, for every thread).
bool amx_bf16_usable();

// The AMX packed path of the AVX-512 target (gemm_avx512.cpp completes it with its pair-packing
// pack_b); kernel is null where !amx_bf16_usable().
PackedPath amx_bf16_path();

// ---- the tile code (gemm_tile_amx.cpp, compiled with -mamx-tile -mamx-bf16) -----------------
// Where A's 32 rows are: chunk after chunk of 16 k pairs; within a full chunk, row r at
// a + r * row_bytes (64 bytes of pairs each); chunks chunk_bytes apart; in the last, partial
// chunk of w pairs, rows tail_row_bytes apart (the packed layout keeps that chunk dense).
struct AmxA {
  const char* a = nullptr;
  int64_t row_bytes = 0, chunk_bytes = 0, tail_row_bytes = 0;
};
// c (32 x 32 f32, rows ldc floats apart) = A (32 rows x `steps` pairs of k) x B (`steps` rows of
// 32 pairs, as pack_b_pairs writes a strip), plus c's own values when load_c (the sums start
// from them in the accumulator tiles). Loads this thread's tile configuration first.
void amx_bf16_tile_32x32(int64_t steps, const AmxA& a, const uint32_t* b, float* c, int64_t ldc, bool load_c);
// `reps` rounds of four TDPBF16PS on tiles already in registers: the AMX bf16 peak of one core
// (perf/peak.h). Returns the FLOPs done.
double amx_bf16_peak_loop(int64_t reps);

}  // namespace kiln::cpu
