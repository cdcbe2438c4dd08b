// Quantized GEMM/GEMV, the contract every backend implements: weight-only int8 / int4 / fp8
// (activations stay f32, weights are dequantized group-wise inside the kernel, never copied out
// in full) and W8A8 (int8 activations with per-row scales x int8 weights, int32 accumulation,
// fused dequantization). ref:: is the scalar ground truth; cpu:: the SIMD path picked at run time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/core/status.h"
#include "kiln/kernels/op_cost.h"

namespace kiln {

// How the codes q of a quantized weight are stored; one row per enumerator (see
// quant_format_name and quant_row_bytes).
enum class QuantFormat {
  kInt8,      // one signed byte per element, q in [-128, 127] (two's complement)
  kInt4,      // two elements per byte, q in [-8, 7] (two's complement nibbles)
  kFp8E4M3,   // one OCP E4M3 byte per element (kiln/core/fp8.h); q is the decoded fp8 value
  kFp8E5M2,   // one OCP E5M2 byte per element
  kF16,       // one IEEE half per element (2 bytes, little-endian); q is its value — GGUF's F16
  kCount
};
std::string_view quant_format_name(QuantFormat f);

// A quantized (out, in) weight matrix, as nn.Linear stores it (y = x Wᵀ), plain pointers that
// the caller owns. Element (j, k) — output channel j, input k — is
//
//     w[j][k] = scale(j, k / group) · (q[j][k] − zero(j, k / group))
//
// Layouts (all row-major, no padding between rows):
//  * data, kInt8 / kFp8*: out·in bytes; the byte of (j, k) is data[j·in + k].
//  * data, kF16: out·in halves (2·out·in bytes); the half of (j, k) is at byte 2·(j·in + k).
//  * data, kInt4: out·(in/2) bytes, packed along the input dimension: byte data[j·(in/2) + k/2]
//    holds element k = 2m in its LOW nibble (bits 0-3) and k = 2m+1 in its HIGH nibble
//    (bits 4-7); each nibble is a two's-complement value in [-8, 7]. (in must be even.)
//    An unsigned [0, 15] grid with zero-point z_u (GPTQ/AWQ style) is stored as q_u − 8 with
//    zero z_u − 8; 3- and 2-bit grids are stored as kInt4 with q in [-4, 3] / [-2, 1].
//  * scales: (out, in / group) f32, row-major: scale(j, g) = scales[j·(in/group) + g]; or a
//    single value for the whole tensor when per_tensor_scale (then group is ignored).
//  * zeros: same layout as scales (never per-tensor), in units of q (may be fractional), or
//    null for symmetric quantization (zero = 0). Integer formats only; fp8 and f16 are symmetric.
// group divides in (in % group != 0 is an error); group == in means per-output-channel scales.
struct QuantWeight {
  QuantFormat format = QuantFormat::kInt8;
  int64_t out = 0, in = 0;
  int64_t group = 128;
  const uint8_t* data = nullptr;
  const float* scales = nullptr;
  const float* zeros = nullptr;
  bool per_tensor_scale = false;

  int64_t num_groups() const { return per_tensor_scale ? 1 : in / group; }
};

// Bytes of one stored row of codes (in elements) and of the whole weight (codes + scales + zeros).
int64_t quant_row_bytes(QuantFormat f, int64_t in);
int64_t quant_weight_bytes(const QuantWeight& w);
// Decodes one element (scalar, exact): used by the references and by tests.
float quant_weight_element(const QuantWeight& w, int64_t j, int64_t k);
// InvalidArgument naming the op, the shapes and the field that is wrong.
Status check_quant_weight(const QuantWeight& w, std::string_view op = "quant_gemm");

// Weight-only GEMM/GEMV: y (n, out) = x (n, in) · Wᵀ + bias (+ residual), f32 activations.
struct QuantGemmParams {
  const QuantWeight* w = nullptr;
  int64_t n = 0;                   // rows of x and y (tokens)
  const float* x = nullptr;        // (n, in), rows ldx apart
  int64_t ldx = 0;
  float* y = nullptr;              // (n, out), rows ldy apart; written, never read
  int64_t ldy = 0;
  const float* bias = nullptr;     // (out,) or null
  const float* residual = nullptr; // (n, out), rows ldr apart, or null; added last
  int64_t ldr = 0;
};
Status check_quant_gemm(const QuantGemmParams& p);

// W8A8: y (n, out) = (a_scale[i] · w_scale[j]) · Σ_k a[i,k]·w[j,k] + bias[j] (+ residual),
// the sum exact in int32. The weight is a kInt8 QuantWeight with per-channel scales (group ==
// in), symmetric; w_row_sums[j] = Σ_k w[j,k] (w8a8_row_sums) lets the AVX512-VNNI path use its
// unsigned×signed dot product on a + 128 and subtract 128·Σ_k w[j,k] afterwards.
struct W8A8Params {
  const QuantWeight* w = nullptr;
  const int32_t* w_row_sums = nullptr;  // (out,)
  int64_t n = 0;
  const int8_t* a = nullptr;            // (n, in) int8 activations, rows lda apart
  int64_t lda = 0;
  const float* a_scales = nullptr;      // (n,) per-token scales
  float* y = nullptr;                   // (n, out), rows ldy apart
  int64_t ldy = 0;
  const float* bias = nullptr;          // (out,) or null
  const float* residual = nullptr;      // (n, out), rows ldr apart, or null
  int64_t ldr = 0;
};
Status check_w8a8(const W8A8Params& p);
// sums (out,) = Σ_k w[j, k] over a kInt8 weight's codes.
void w8a8_row_sums(const QuantWeight& w, int32_t* sums);

// Work and traffic (STYLE rule 10): 2·n·out·in operations; the weight's stored bytes, x (f32
// or int8) and y once.
constexpr OpCost quant_gemm_cost(int64_t n, int64_t out, int64_t in, double weight_bytes) {
  return {2.0 * n * out * in, weight_bytes + 4.0 * n * in + 4.0 * n * out};
}
constexpr OpCost w8a8_cost(int64_t n, int64_t out, int64_t in) {
  return {2.0 * n * out * in, 1.0 * out * in + 4.0 * out + 1.0 * n * in + 4.0 * n + 4.0 * n * out};
}

namespace ref {
// Weight-only: each element decoded exactly, products summed in double, rounded once.
void quant_gemm(const QuantGemmParams& p);
// Exact int32 sums; y = (a_scale·w_scale)·float(sum) + bias + residual in that order.
void w8a8_gemm(const W8A8Params& p);
// Per-token symmetric int8: scales[i] = amax_i / 127, q = round_half_even(x · (127 / amax_i))
// (the reciprocal computed once in f32, so every backend rounds identically); an all-zero row
// gets scale 0 and q = 0. x (n, in) rows ldx apart; q (n, in) rows ldq apart.
void quantize_rows_int8(const float* x, int64_t n, int64_t in, int64_t ldx, int8_t* q, int64_t ldq,
                        float* scales);
}  // namespace ref

namespace cpu {
// Same contracts. Decode (n <= 15): a register-tiled kernel that decodes each weight vector
// once for a block of rows, threaded over output channels. Prefill (n >= 16): 64-channel
// panels dequantized to f32 in a per-thread buffer (the packing step), then the f32 GEMM.
// Groups whose size is not a multiple of the target's vector width run the scalar kernel.
void quant_gemm(const QuantGemmParams& p);
void w8a8_gemm(const W8A8Params& p);
void quantize_rows_int8(const float* x, int64_t n, int64_t in, int64_t ldx, int8_t* q, int64_t ldq,
                        float* scales);
// The paths picked now, for `kiln info` and benchmarks.
std::string quant_gemm_path_name();
std::string w8a8_path_name();
}  // namespace cpu

KILN_SAME_SIGNATURE(quant_gemm);
KILN_SAME_SIGNATURE(w8a8_gemm);
KILN_SAME_SIGNATURE(quantize_rows_int8);

}  // namespace kiln
