// Rotary position embeddings (RoPE) on q or k laid out (B, T, n_heads, head_dim), forward and
// backward, as kiln::ref and kiln::cpu (SIMD, threaded over B·T), identical signatures.
//
// Pairing: the Llama / Hugging Face "rotate_half" convention — element i is rotated with
// element i + head_dim/2 (NOT the interleaved (2i, 2i+1) pairs of the original paper / GPT-J /
// Meta's complex-number code). For i in [0, head_dim/2) at position p:
//   out[i]          = x[i]·cos(p·f_i) - x[i + D/2]·sin(p·f_i)
//   out[i + D/2]    = x[i + D/2]·cos(p·f_i) + x[i]·sin(p·f_i),   f_i = theta^(-2i / D)
// which is HF's q·cos + rotate_half(q)·sin. Checkpoints converted from Meta's layout need HF's
// q/k weight permutation first. Position p = pos_offset + t (pos_offset > 0 for KV-cache decode).
// The backward applies the inverse rotation (sin negated). out may alias inp (in place).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/kernels/op_cost.h"

namespace kiln {

inline constexpr double kRopeThetaLlama = 10000.0;  // Llama 1/2; Llama 3 uses 500000

// The frequency scalings of Hugging Face's `rope_parameters` that current Llama checkpoints
// use (the formulas of transformers' modeling_rope_utils.py). Each rescales the per-pair
// frequencies f_i = theta^(-2i/D); yarn also multiplies cos and sin by an attention factor
// (so every q·k score is scaled by its square).
//   linear: f_i / factor.
//   llama3: wavelengths 2π/f_i longer than original_max_positions / low_freq_factor are
//           divided by factor, shorter than original_max_positions / high_freq_factor kept,
//           those between blended linearly in original_max_positions / wavelength.
//   yarn:   a ramp over the pair index between the dimensions that turn beta_fast and
//           beta_slow times in original_max_positions blends f_i (fast pairs) and
//           f_i / factor (slow ones); cos, sin · attention_factor.
enum class RopeType { kDefault, kLinear, kLlama3, kYarn };
std::string_view rope_type_name(RopeType t);  // HF's rope_type: "default", "linear", ...

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 1.0;                 // linear, llama3, yarn
  double low_freq_factor = 1.0;        // llama3
  double high_freq_factor = 4.0;       // llama3
  int64_t original_max_positions = 0;  // llama3, yarn: the pretraining context
  double beta_fast = 32.0;             // yarn
  double beta_slow = 1.0;              // yarn
  double mscale = 0.0;                 // yarn: 0 unset (with mscale_all_dim, sets the factor)
  double mscale_all_dim = 0.0;         // yarn: 0 unset
  double attention_factor = 0.0;       // yarn: 0 derives it from factor (and the mscales)
  bool truncate = true;                // yarn: round the ramp's ends outwards
};

// InvalidArgument naming the field of `s` that is out of range (factor <= 0, llama3's
// high_freq_factor <= low_freq_factor, beta_fast < beta_slow, ...).
Status check_rope_scaling(const RopeScaling& s);
// f_i for i < head_dim/2 under s (checked by the caller).
std::vector<double> rope_frequencies(int64_t head_dim, double theta, const RopeScaling& s);
// The cos/sin multiplier: yarn's attention factor, 1 for the others.
double rope_attention_factor(const RopeScaling& s);

// cos/sin of p·f_i for every position p < max_positions and pair i < head_dim/2, computed in
// double and rounded once to fp32 (HF computes the angle in fp32, which differs by a few ulp
// of the angle at large positions).
struct RopeTable {
  int64_t head_dim = 0;
  int64_t max_positions = 0;
  double theta = kRopeThetaLlama;
  RopeScaling scaling;
  double attention_factor = 1.0;  // cos and sin are multiplied by it (yarn)
  std::vector<float> cos;  // (max_positions, head_dim/2)
  std::vector<float> sin;  // (max_positions, head_dim/2)
};

// Fails (InvalidArgument) unless head_dim is even and > 0, max_positions > 0, theta > 1 and
// the scaling passes check_rope_scaling.
Expected<RopeTable> make_rope_table(int64_t head_dim, int64_t max_positions,
                                    double theta = kRopeThetaLlama, const RopeScaling& scaling = {});
// Whether x (B, T, n_heads, head_dim) at pos_offset fits `table`; the message names the shapes.
Status check_rope_args(const RopeTable& table, int64_t batch, int64_t seq_len, int64_t n_heads,
                       int64_t head_dim, int64_t pos_offset);

// 4 multiplies and 2 adds per pair (3 per element); reads x and the table rows, writes out.
constexpr OpCost rope_cost(int64_t batch, int64_t seq_len, int64_t n_heads, int64_t head_dim) {
  const double n = static_cast<double>(batch) * seq_len * n_heads * head_dim;
  return {3.0 * n, 8.0 * n + 4.0 * static_cast<double>(seq_len) * head_dim};
}

namespace ref {
// out, inp (B, T, n_heads, head_dim); table built for head_dim with at least pos_offset + T
// positions (checked).
void rope_forward(float* out, const float* inp, const RopeTable& table, int64_t batch,
                  int64_t seq_len, int64_t n_heads, int64_t head_dim, int64_t pos_offset);
// dinp (overwritten), dout (B, T, n_heads, head_dim).
void rope_backward(float* dinp, const float* dout, const RopeTable& table, int64_t batch,
                   int64_t seq_len, int64_t n_heads, int64_t head_dim, int64_t pos_offset);
}  // namespace ref

namespace cpu {  // same contracts as ref::
void rope_forward(float* out, const float* inp, const RopeTable& table, int64_t batch,
                  int64_t seq_len, int64_t n_heads, int64_t head_dim, int64_t pos_offset);
void rope_backward(float* dinp, const float* dout, const RopeTable& table, int64_t batch,
                   int64_t seq_len, int64_t n_heads, int64_t head_dim, int64_t pos_offset);
}  // namespace cpu

KILN_SAME_SIGNATURE(rope_forward);
KILN_SAME_SIGNATURE(rope_backward);

}  // namespace kiln
