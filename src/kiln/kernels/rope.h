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
#include <vector>

#include "kiln/core/status.h"
#include "kiln/kernels/op_cost.h"

namespace kiln {

inline constexpr double kRopeThetaLlama = 10000.0;  // Llama 1/2; Llama 3 uses 500000

// cos/sin of p·f_i for every position p < max_positions and pair i < head_dim/2, computed in
// double and rounded once to fp32 (HF computes the angle in fp32, which differs by a few ulp
// of the angle at large positions).
struct RopeTable {
  int64_t head_dim = 0;
  int64_t max_positions = 0;
  double theta = kRopeThetaLlama;
  std::vector<float> cos;  // (max_positions, head_dim/2)
  std::vector<float> sin;  // (max_positions, head_dim/2)
};

// Fails (InvalidArgument) unless head_dim is even and > 0, max_positions > 0 and theta > 1.
Expected<RopeTable> make_rope_table(int64_t head_dim, int64_t max_positions,
                                    double theta = kRopeThetaLlama);
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
