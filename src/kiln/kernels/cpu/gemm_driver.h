// The pieces of the packed CPU GEMM driver (cpu/gemm.cpp) that other drivers run on one thread:
// the K blocking, "pack a column chunk of B and run rows of C against it", and the small-M path
// for a column range. cpu::gemm threads over them itself; cpu::grouped_gemm runs them as work
// items of many problems in one parallel region. Internal to kiln::cpu.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/cpu/gemm_kernels.h"

namespace kiln::cpu {

// The kernels of the active SIMD target (what cpu::gemm runs now).
const GemmTargetKernels& gemm_target_kernels();
// The packed path of bf16 products on `k` for a choice of bf16_gemm_kernel() (AMX falls back to
// the vdpbf16ps path where k has no AMX kernel).
const PackedPath& bf16_packed_path(const GemmTargetKernels& k, Bf16Kernel choice);

// A packed panel of B: K block after K block; within one, strip after strip of NR x steps
// elements (steps = k values / k_per_step).
struct PanelLayout {
  int64_t strips = 0, nr = 0, ks = 1, kc_block = 0, num_pc = 1, k = 0;
  int64_t steps_block() const { return kc_block / ks; }  // exact: kc_block is even
  int64_t offset(int64_t q) const { return strips * nr * steps_block() * q; }
  int64_t steps(int64_t q) const { return (std::min(kc_block, k - q * kc_block) + ks - 1) / ks; }
  int64_t elems() const { return offset(num_pc - 1) + strips * nr * steps(num_pc - 1) + 16; }
};

// p's K cut into blocks of equal, even size of at most blk.kc (an even size keeps bf16 pairs
// inside one block); strips is left 0 for the caller.
PanelLayout panel_layout(const GemmParams& p, const PackedPath& path, GemmBlocking blk);

// On the calling thread: packs op(B)'s columns [jc, jc + nc) over all K blocks into dst, K block
// q at lay.offset(q) (lay.strips covering nc).
void pack_b_panel(const GemmParams& p, const PackedPath& path, const PanelLayout& lay, int64_t jc, int64_t nc,
                  uint32_t* dst);

// A thread's packed part of B stays within this (a quarter of the 32 MiB L3 for both threads of
// the EPYC VM; see the column split in cpu/gemm.cpp, where it was measured).
inline constexpr int64_t kThreadPanelBytes = int64_t{4} << 20;

// On the calling thread: packs op(B)'s NR strips [s0, s1) over all K blocks into this thread's
// scratch, then runs C's MR strips [ms0, ms1) against them, mc_strips strips (one MC block) at a
// time, every K block per MC block (the C block stays in cache). p.m > 0, p.n > 0; p.k may be 0
// (then C = beta·C through the epilogue).
void run_column_chunk(const GemmParams& p, const PackedPath& path, PanelLayout lay, int64_t s0,
                      int64_t s1, int64_t ms0, int64_t ms1, int64_t mc_strips);

// The bias-gradient epilogue (GemmParams::bias_grad) over rows [r0, r0 + rows) of op(A) and k in
// [pc, pc + kc), added in k order: what the packed path runs per K block beside packing A (the
// task holding C's column 0 does it, A's block is in cache), and the other drivers run in one
// pass after the product. f32 A stored (k, m) adds whole stored rows at once (16 lanes); other
// layouts and bf16 go element by element.
void gemm_bias_grad(const GemmParams& p, int64_t r0, int64_t rows, int64_t pc, int64_t kc);

// The small-M (m <= kGemmSmallM) path in two steps: small_m_args copies A into the calling
// thread's scratch (f32, L1-friendly row stride; also bf16 when B is bf16); small_m_columns
// computes C's columns [j0, j1) (j0 a multiple of 16) from it on the calling thread, epilogue
// included. Both on the same thread, or args made before the threads start (as cpu::gemm does).
SmallMArgs small_m_args(const GemmParams& p);
void small_m_columns(const GemmParams& p, const GemmTargetKernels& kernels, const SmallMArgs& s,
                     int64_t j0, int64_t j1);

}  // namespace kiln::cpu
