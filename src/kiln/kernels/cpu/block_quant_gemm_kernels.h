// Internal interface between the block-quantized GEMM driver (block_quant_gemm.cpp: activation
// quantization, threading over channel tiles, the scalar table) and the per-target kernels
// (block_quant_gemm_avx2.cpp, block_quant_gemm_avx512.cpp).
#pragma once

#include <cstdint>
#include <cstring>

#include "kiln/kernels/block_quant_gemm.h"
#include "kiln/kernels/cpu/quant_tiles.h"

namespace kiln::cpu {

struct BlockQuantTargetKernels {
  // y rows [0, p.n), channel tiles [t0, t1) of p.w, epilogue included; the activations are
  // already quantized (a). vnni: use VNNI's vpdpbusd where the target has it. shape: the
  // register tiles (quant_tiles.h) on targets that compile variants; others ignore it.
  void (*tiles)(const BlockQuantGemmParams& p, const BlockQuantActs& a, int64_t t0, int64_t t1, bool vnni,
                const QuantTiles& shape);
  // Same contract as ref::quantize_blocks_int8 on rows [0, n).
  void (*quantize)(const float* x, int64_t n, int64_t in, int64_t ldx, int8_t* q, int64_t ldq, float* scales,
                   int32_t* sums);
  // The kernel's name for `kiln info` and benchmarks, given whether VNNI is used.
  const char* (*name)(bool vnni);
  // Whether this CPU runs the target's VNNI form.
  bool (*has_vnni)();
};

// Four activation codes as one 32-bit word (the broadcast operand of a quad's dot).
inline int32_t load_quad(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

const BlockQuantTargetKernels& block_quant_kernels_avx2();
const BlockQuantTargetKernels& block_quant_kernels_avx512();

}  // namespace kiln::cpu
