// Internal interface between the CPU GEMM driver (gemm.cpp: blocking, packing order,
// threading) and the per-target kernels (gemm.cpp scalar, gemm_avx2.cpp, gemm_avx512.cpp).
// Each target fills one GemmTargetKernels table; the driver picks one with Dispatch.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/kernels/gemm.h"

namespace kiln::cpu {

// What the micro-kernel does when it writes its tile: v = alpha*acc + beta*C + bias, saved to
// save_pre, times act_grad'(pre); C = act(v) + res. bias, act, residual, save_pre and act_grad are
// set only on the last K block; beta is the caller's on the first K block and 1 afterwards. bias
// points at the tile's first column; residual, save_pre and pre at the tile's (0, 0).
struct TileEpilogue {
  float alpha = 1.0f, beta = 0.0f;
  const float* bias = nullptr;
  Activation act = Activation::kNone;
  const float* residual = nullptr;
  int64_t ldr = 0;
  float* save_pre = nullptr;
  Activation act_grad = Activation::kNone;
  const float* pre = nullptr;
  int64_t ldpre = 0;
  // Nothing past alpha and beta (the AMX path's in-place tiles need that).
  bool scales_only() const {
    return !bias && act == Activation::kNone && !residual && !save_pre &&
           act_grad == Activation::kNone;
  }
  // The same epilogue `col` columns further right.
  TileEpilogue at_col(int64_t col) const {
    TileEpilogue e = *this;
    if (e.bias) e.bias += col;
    if (e.residual) e.residual += col;
    if (e.save_pre) e.save_pre += col;
    if (e.pre) e.pre += col;
    return e;
  }
  // The last K block's parts of `p` at C's element (row, col); the caller sets alpha and beta.
  void set_last(const GemmParams& p, int64_t row, int64_t col) {
    bias = p.bias ? p.bias + col : nullptr;
    act = p.act;
    residual = p.residual ? p.residual + row * p.ldr + col : nullptr;
    ldr = p.ldr;
    save_pre = p.save_pre ? p.save_pre + row * p.ldpre + col : nullptr;
    act_grad = p.act_grad;
    pre = p.pre ? p.pre + row * p.ldpre + col : nullptr;
    ldpre = p.ldpre;
  }
};

// One packed (BLIS-style) path. Packed panels are strips of MR rows of A / NR columns of B;
// within a strip, k steps are outermost. An element is 4 bytes: one f32, or (k_per_step == 2)
// a pair of bf16 values for consecutive k (the low half holds the even k) — except B on the
// half-weight path (b_elem_bytes == 2): one IEEE half per element, widened in the micro-kernel.
struct PackedPath {
  const char* name = "";
  int mr = 0, nr = 0;
  int k_per_step = 1;
  // Packs rows [i0, i0+rows) of op(A), k in [k0, k0+kc), into ceil(rows/MR) strips (zero-padded).
  void (*pack_a)(const GemmParams& p, int64_t i0, int64_t rows, int64_t k0, int64_t kc,
                 void* dst) = nullptr;
  // Packs columns [j0, j0+cols) of op(B), k in [k0, k0+kc), into ceil(cols/NR) strips.
  void (*pack_b)(const GemmParams& p, int64_t j0, int64_t cols, int64_t k0, int64_t kc,
                 void* dst) = nullptr;
  // One MR x NR tile over `steps` k steps; writes the m x n valid corner of C through the epilogue.
  void (*kernel)(int64_t steps, const void* a, const void* b, float* c, int64_t ldc, int m, int n,
                 const TileEpilogue& ep) = nullptr;
  // Optional: the same full MR-row tile reading A straight from the caller's memory instead of a
  // packed strip: op(A) not transposed, elements of direct_a_dtype, `a` at row 0 / the block's
  // first k, rows lda elements apart (bf16: pairs of k, so the block's k count must be even).
  // Saves packing A, which each thread would otherwise do for all of A in the column split.
  void (*kernel_direct_a)(int64_t steps, const void* a, int64_t lda, const void* b, float* c,
                          int64_t ldc, int n, const TileEpilogue& ep) = nullptr;
  DType direct_a_dtype = DType::kF32;
  int b_elem_bytes = 4;  // bytes of one packed B element: 4, or 2 for IEEE-half weights
};

// The decode-like path: A is small and converted to a contiguous f32 (m, k) buffer; B is read
// straight from the caller's memory (f32 or bf16, either layout).
struct SmallMArgs {
  const float* a = nullptr;  // (m, k), rows lda apart (padded so rows fall in different L1 sets)
  int64_t m = 0, k = 0, lda = 0;
  // When B is bf16: A rounded to bf16, (m, k) rows lda16 apart, zero-padded to a multiple of 32
  // k (for the vdpbf16ps kernel, which multiplies bf16 by bf16 like the packed bf16 path).
  const uint16_t* a16 = nullptr;
  int64_t lda16 = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  DType b_dtype = DType::kF32;
  bool trans_b = false;
};

struct GemmTargetKernels {
  PackedPath f32, bf16;
  // bf16 inputs widened to f32 while packing, then the f32 micro-kernel: where bf16 is already
  // that (no vdpbf16ps), the same as bf16. cpu::gemm picks between the two (bf16_gemm_kernel()).
  PackedPath bf16_f32;
  // Intel AMX tiles (gemm_amx.h), AVX-512 target only; kernel null where the CPU or the OS has none.
  PackedPath bf16_amx;
  const char* small_m_name = "";
  // acc (m, j1 - j0) = A[:, :] x op(B)[:, j0:j1]
  void (*small_m)(const SmallMArgs& s, int64_t j0, int64_t j1, float* acc) = nullptr;
  // Decode-like over a weight W pre-packed in strips (gemm_prepacked): C (m <= kGemmSmallM rows,
  // the n columns of W) = epilogue(A x W) for the strips [s0, s1) only; A interleaved (steps, m):
  // a[l * m + i]; c, ep.bias and ep.residual at column 0. small_m_packed: f32 strips (steps = k,
  // f32.nr columns); small_m_packed_pairs (AVX512_BF16 only, else null): strips of bf16 pairs of
  // k as bf16.pack_b writes them, A in the same pairs (steps = ceil(k / 2), bf16.nr columns).
  using SmallMPackedFn = void (*)(int m, int64_t steps, const void* a, const void* w, int64_t s0, int64_t s1,
                                  float* c, int64_t ldc, int64_t n, const TileEpilogue& ep);
  SmallMPackedFn small_m_packed = nullptr;
  SmallMPackedFn small_m_packed_pairs = nullptr;
  // IEEE-half weights (gemm_prepacked only): strips of (k, f16.nr) halves as f16.pack_b writes
  // them, widened to f32 in registers (vcvtph2ps); A and the sums f32 — the f32 path's products
  // and order, so the result equals the f32 path on the widened weight bit for bit.
  PackedPath f16;
  SmallMPackedFn small_m_packed_half = nullptr;
  // Other register tilings of the f32 micro-kernel (MR x NR, with the generic packing), which
  // cpu::gemm never runs: `kiln bench gemm --tiles` times each in L1 beside f32, so a reader sees
  // how the chosen one compares with its neighbours on the CPU at hand.
  std::vector<PackedPath> f32_other_tiles;
  // C rows (rows, cols) = epilogue(acc) with ep.beta read from C.
  void (*epilogue_rows)(float* c, int64_t ldc, const float* acc, int64_t ld_acc, int64_t rows,
                        int64_t cols, const TileEpilogue& ep) = nullptr;
};

const GemmTargetKernels& gemm_kernels_scalar();
const GemmTargetKernels& gemm_kernels_avx2();
const GemmTargetKernels& gemm_kernels_avx512();

}  // namespace kiln::cpu
