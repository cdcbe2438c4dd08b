// Internal interface between the quantized-GEMM driver (quant_gemm.cpp: path choice, threading,
// zero-point sums, the prefill panel path) and the per-target kernels (quant_gemm.cpp scalar,
// quant_gemm_avx2.cpp, quant_gemm_avx512.cpp). Each target fills one table; Dispatch picks one.
#pragma once

#include <cstdint>

#include "kiln/kernels/cpu/quant_tiles.h"
#include "kiln/kernels/quant_gemm.h"

namespace kiln::cpu {

struct QuantTargetKernels {
  const char* name = "";
  // Weight-only group sizes that are a multiple of this run the target's kernels; others run
  // the scalar table (a vector never straddles two groups).
  int lanes = 1;
  // y rows [0, p.n), output channels [j0, j1): decode each weight vector once per block of
  // rows, dot with x, then the epilogue. xsums (n, num_groups) = Σ of x over each group, given
  // when the weight has zero-points (the kernel subtracts scale·zero·xsum per group). q: the
  // tile shapes (quant_tiles.h) on targets that compile variants; others ignore it.
  void (*wo_rows)(const QuantGemmParams& p, const float* xsums, int64_t j0, int64_t j1,
                  const QuantTiles& q) = nullptr;
  // dst (j1 - j0, in) f32 = the dequantized rows j0..j1 of w (the prefill packing step).
  void (*dequant_rows)(const QuantWeight& w, int64_t j0, int64_t j1, float* dst) = nullptr;
  // W8A8 rows [0, p.n), channels [j0, j1), epilogue included.
  void (*w8a8_rows)(const W8A8Params& p, int64_t j0, int64_t j1) = nullptr;
  const char* (*w8a8_name)() = nullptr;
  // Same contract as ref::quantize_rows_int8 on rows [0, n).
  void (*quantize_rows)(const float* x, int64_t n, int64_t in, int64_t ldx, int8_t* q, int64_t ldq,
                        float* scales) = nullptr;
};

const QuantTargetKernels& quant_kernels_scalar();
const QuantTargetKernels& quant_kernels_avx2();
const QuantTargetKernels& quant_kernels_avx512();

// Tests switch the AVX-512 VNNI W8A8 kernel off to cover the 16-bit multiply-add fallback that
// AVX-512 CPUs without VNNI (Skylake-X) run. Default on (used when the CPU has VNNI).
void set_w8a8_vnni_allowed(bool allowed);
bool w8a8_vnni_allowed();

}  // namespace kiln::cpu
