// GPTQ (Frantar et al. 2022): quantize a Linear's weight column by column (input channels),
// pushing each column's rounding error onto the columns not yet quantized through the upper
// Cholesky factor of H⁻¹, H = 2XᵀX from calibration inputs; lazy batched updates in blocks.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/quant/scheme.h"

namespace kiln::quant {

struct GptqOptions {
  int64_t block = 128;     // columns per lazy-update block
  double damp = 0.01;      // λ = damp · mean(diag H) added to the diagonal
  bool act_order = false;  // columns by descending diag(H)
};

struct GptqResult {
  QTensor q;
  double loss = 0;          // Σ (w − q)² / [H⁻¹]_ii / 2 over all columns (the GPTQ objective)
  double damp_used = 0;     // the λ finally used (raised ×10 if H + λI was not positive definite)
};

// w (rows, cols) = (out, in); h (cols, cols). Group parameters are computed when a group's
// first column comes up (in act order: from that group's current, error-updated columns), so
// groups stay contiguous in the original column order (the kernels' layout).
Expected<GptqResult> gptq_quantize(const float* w, int64_t rows, int64_t cols, const float* h,
                                   const QuantScheme& s, const GptqOptions& o);

// Mean squared output error per calibration token of replacing w by wq, from H = 2XᵀX/n:
// (1/n) Σ_t ‖(W − Ŵ) x_t‖² = Σ_r Δw_r (H/2) Δw_rᵀ.
double layer_output_error(const float* w, const float* wq, int64_t rows, int64_t cols, const float* h);

// Cholesky of a symmetric positive definite (n, n) matrix in place: lower L with A = L Lᵀ
// (upper triangle zeroed). False when A is not positive definite.
bool cholesky_lower(std::vector<double>& a, int64_t n);
// U with H⁻¹ = Uᵀ U (upper Cholesky factor of the inverse); false when H is not PD.
bool inverse_upper_cholesky(const std::vector<double>& h, int64_t n, std::vector<double>& u);

}  // namespace kiln::quant
