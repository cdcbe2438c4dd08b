// Per-input-channel scaling folded exactly into the preceding op: (X diag(s)⁻¹)(diag(s) W).
// AWQ picks s = mean|X_j|^α with α grid-searched on the layer's output error after group-wise
// quantization; SmoothQuant picks s_j = max|X_j|^α / max|W_j|^(1−α) to move activation outliers
// into the weights before W8A8. Folds (Llama): RMSNorm weight for q/k/v and gate/up, v_proj
// rows for o_proj (scales tied across the query heads sharing a KV head), up_proj rows for
// down_proj (the SwiGLU product is linear in up).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/model/transformer.h"
#include "kiln/quant/calibrate.h"
#include "kiln/quant/scheme.h"

namespace kiln::quant {

// Linears that read the same input, and where that input's scale can be folded.
struct SmoothGroup {
  std::vector<std::string> consumers;  // Linear weight names
  std::string norm;                    // RMSNorm weight to divide by s (or empty)
  std::string prev_linear;             // Linear whose output rows to divide by s (or empty)
  int64_t tie = 1;                     // o_proj: query heads per KV head (s tied across them)
  int64_t head_dim = 0;                // o_proj: channels per head
};

// The four groups of every Llama block; Unimplemented for GPT-2 (LayerNorm bias, GELU).
Expected<std::vector<SmoothGroup>> smooth_groups(Transformer& model);

// Multiplies the consumers' columns by s and divides the fold target by s (s has the
// consumers' input width; for o_proj, s must already be tied). fp32 outputs are unchanged.
Status apply_smoothing(Transformer& model, const SmoothGroup& g, const std::vector<float>& s);

// SmoothQuant scales for a group: s_j = max|X_j|^α / max_i |W_ij|^(1−α) (max over all consumers).
std::vector<float> smoothquant_scales(Transformer& model, const SmoothGroup& g, const LinearStats& x, double alpha);

struct AwqChoice {
  double alpha = 0;
  double error = 0, error_rtn = 0;  // output MSE on the calibration sample at best α and at α = 0
  std::vector<float> s;
};
// AWQ: α over {0, 0.05, …, 1} (or only `alpha` when >= 0) minimizing Σ_consumers ‖X Ŵᵀ − X Wᵀ‖²
// on the captured sample X, Ŵ = Q(W diag(s)) diag(s)⁻¹ under `scheme`.
AwqChoice awq_search(Transformer& model, const SmoothGroup& g, const LinearStats& x, const QuantScheme& scheme,
                     double alpha);

}  // namespace kiln::quant
