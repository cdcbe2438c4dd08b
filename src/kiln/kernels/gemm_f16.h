// A GEMM in IEEE half-precision arithmetic: C (m, n) f32 = A (m, k) · B (n, k)^T, A and B fp16
// (B stored like a weight, (out, in)). Where the CPU has AVX512-FP16 (Sapphire Rapids and later),
// products and sums run in fp16 with vfmadd231ph: 32 lanes a vector, twice the f32 FMA's FLOPs per
// instruction. fp16 sums lose bits as they grow (10-bit mantissa: a partial sum of L products has
// a rounding error of order sqrt(L) · 2^-11 of its size), so the sum runs in fp16 over `chunk` k
// steps only; each chunk's partial is widened and added into f32, and the error is set by the
// chunk, not by K. Elsewhere (no AVX512-FP16, or another SIMD target active) the halves are
// widened to f32 and the f32 GEMM runs: f32 products and sums, the reference's accuracy.
// ref::gemm_f16 is that reference; `kiln bench gemm --dtype f16` prints both rates and the
// normalized error of the fp16 arithmetic against it.
#pragma once

#include <cstdint>

#include "kiln/core/status.h"

namespace kiln {

struct GemmF16Params {
  int64_t m = 0, n = 0, k = 0;
  const uint16_t* a = nullptr;  // (m, k) halves, rows lda apart
  int64_t lda = 0;
  const uint16_t* b = nullptr;  // (n, k) halves, rows ldb apart
  int64_t ldb = 0;
  float* c = nullptr;  // (m, n), rows ldc apart: overwritten
  int64_t ldc = 0;
  int chunk = 64;  // k steps summed in fp16 before the f32 add (fp16 arithmetic only), 1..4096
};

// Names what is wrong: negative sizes, leading dimensions below the row lengths, null operands,
// a chunk outside 1..4096.
Status check_gemm_f16(const GemmF16Params& p);

namespace ref {
// f32 products and sums of the widened halves, in k order: the accuracy reference.
void gemm_f16(const GemmF16Params& p);
}  // namespace ref

namespace cpu {
// True when gemm_f16 multiplies in fp16 here (AVX512-FP16 and the AVX-512 target active).
bool gemm_f16_native();
// "avx512fp16 vfmadd231ph 12x64, fp16 sums of 64 k steps" or "widened to f32 (...)".
const char* gemm_f16_path_name();
// Assumes valid params (KILN_CHECK only). Threads over the kiln pool. The fp16 path packs all of
// B once per call (about n x k halves of scratch) and each task's A block per K block.
void gemm_f16(const GemmF16Params& p);
}  // namespace cpu

}  // namespace kiln
