// Grouped GEMM: G independent f32 GEMMs C_g = alpha·op(A_g)·op(B_g) + beta·C_g in one call, the
// experts of a dropless mixture-of-experts layer (ragged groups: expert e gets m_e rows, m_e may
// be 0). check_grouped_gemm() validates at the op boundary; ref::grouped_gemm loops ref::gemm
// (the ground truth); cpu::grouped_gemm runs every group's tiles in one parallel region.
//
// The three MoE uses, expert e with W_e (F, C) and its x_e (m_e, C), dy_e (m_e, F) rows:
//   forward      y_e (m_e, F)  = x_e · W_eᵀ      m = m_e, n = F, k = C, trans_b, ldb = C
//   input grad   dx_e (m_e, C) = dy_e · W_e      m = m_e, n = C, k = F, ldb = C
//   weight grad  dW_e (F, C)  += dy_eᵀ · x_e     m = F, n = C, k = m_e (ragged), trans_a, lda = F,
//                                                beta = 1 (k = 0 leaves dW_e as it was)
#pragma once

#include <cstdint>
#include <span>

#include "kiln/core/status.h"
#include "kiln/kernels/gemm.h"
#include "kiln/kernels/op_cost.h"

namespace kiln {

// One group: C (m, n) = alpha·op(A)·op(B) + beta·C, row-major f32; any of m, n, k may be 0.
struct GemmGroup {
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;  // (m, k), or (k, m) stored when trans_a; rows lda apart
  int64_t lda = 0;
  const float* b = nullptr;  // (k, n), or (n, k) stored when trans_b; rows ldb apart
  int64_t ldb = 0;
  float* c = nullptr;  // (m, n), rows ldc apart
  int64_t ldc = 0;
};

// G groups sharing the transposes and alpha, beta (f32 only; no bias/activation epilogue). Groups
// may share A or B memory (the experts' rows of one x), but a C element may belong to one group
// only and no C may overlap an A or B: the groups are computed concurrently.
struct GroupedGemmParams {
  std::span<const GemmGroup> groups;  // (G,)
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;  // beta = 0 never reads C (k = 0 then zeroes it)
};

// Group g as a plain GEMM (what ref::grouped_gemm and a per-group loop of cpu::gemm run).
GemmParams group_gemm_params(const GroupedGemmParams& p, size_t g);

// Op-level validation: names the op, the group, its shapes and what is wrong, e.g.
// "[grouped_gemm] group 3 of 8 (m=7 n=1024 k=384): ldb 300 must be >= 384 (...)".
Status check_grouped_gemm(const GroupedGemmParams& p);

// Work and traffic (STYLE rule 10): the sums over the groups of gemm_flops and gemm_bytes.
double grouped_gemm_flops(const GroupedGemmParams& p);
double grouped_gemm_bytes(const GroupedGemmParams& p);

namespace ref {
// ref::gemm on each group in turn.
void grouped_gemm(const GroupedGemmParams& p);
}  // namespace ref

namespace cpu {
// Fast grouped GEMM: the packed path and micro-kernels of cpu::gemm (gemm_driver.h), with the
// tiles of all groups as work items of one parallel region. Assumes valid params (KILN_CHECK).
//
// Why it beats a loop of cpu::gemm over the groups:
//  * one fork/join for the whole call instead of one or two per group (cpu::gemm's shared-panel
//    path packs B in one region and runs the tiles in another); each region costs a wake-up and a
//    barrier of a few µs, which a group of 64 or fewer rows does not amortize;
//  * no idle threads at the barrier of each small group: a group whose tiles are fewer than the
//    threads leaves the others idle, and a group split evenly in threads still waits for its
//    slowest tile. Here items are cut from all groups at once (about four per thread, sized by
//    FLOPs, so a large expert is cut finer and a tiny one stays whole), sorted largest first and
//    claimed dynamically: the pool balances skewed routing across the experts;
//  * little is done twice: an item packs its column chunk of B once (all of K) and runs its rows
//    against it, as cpu::gemm's column split does, and a group is cut into row blocks or column
//    chunks by which repeats less (a row block packs its columns of B again, a column chunk reads
//    its rows of A again: in place, or packed when A is transposed).
// Measured with `kiln bench grouped-gemm` (W1-MoE: C 384, F 1024, 4096 routed rows; 2-core Zen 5
// EPYC VM, 3 quiet runs): 1 thread 0.99-1.11x the loop. 2 free cores: 0.98-1.05x with 8 experts
// (each large enough for cpu::gemm to keep both cores busy) and for the 64-expert forward;
// 1.04-1.35x for the 64-expert gradients (each expert whole on one thread, where the loop's
// column split has both threads read all of its A). While another process holds one core:
// 1.3-2.3x (claimed items follow the free core; the loop's even split waits for the busy one).
// Groups with m <= kGemmSmallM take cpu::gemm's streaming small-M kernels; k = 0 groups only
// scale C (beta = 0: zeroed; beta = 1: untouched).
void grouped_gemm(const GroupedGemmParams& p);
}  // namespace cpu

KILN_SAME_SIGNATURE(grouped_gemm);

}  // namespace kiln
