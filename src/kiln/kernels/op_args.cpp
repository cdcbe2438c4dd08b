// Argument validation and setup for the non-GEMM op families (rope.h, embedding.h,
// cross_entropy.h, adamw.h): what a user can get wrong, reported as a Status that names the op
// and the shapes (STYLE.md rule 2). Kernels themselves only assert.
#include <cmath>

#include "kiln/kernels/adamw.h"
#include "kiln/kernels/cross_entropy.h"
#include "kiln/kernels/embedding.h"
#include "kiln/kernels/rope.h"

namespace kiln {

Expected<RopeTable> make_rope_table(int64_t head_dim, int64_t max_positions, double theta,
                                    const RopeScaling& scaling) {
  if (head_dim <= 0 || head_dim % 2 != 0) {
    return invalid_argument("[rope] head_dim must be even and positive, got {}", head_dim);
  }
  if (max_positions <= 0) {
    return invalid_argument("[rope] max_positions must be positive, got {}", max_positions);
  }
  if (!(theta > 1.0) || !std::isfinite(theta)) {
    return invalid_argument("[rope] theta must be finite and > 1, got {}", theta);
  }
  KILN_RETURN_IF_ERROR(check_rope_scaling(scaling));
  RopeTable t;
  t.head_dim = head_dim;
  t.max_positions = max_positions;
  t.theta = theta;
  t.scaling = scaling;
  t.attention_factor = rope_attention_factor(scaling);
  const int64_t half = head_dim / 2;
  t.cos.resize(static_cast<size_t>(max_positions * half));
  t.sin.resize(static_cast<size_t>(max_positions * half));
  const std::vector<double> freqs = rope_frequencies(head_dim, theta, scaling);
  for (int64_t i = 0; i < half; ++i) {
    for (int64_t p = 0; p < max_positions; ++p) {
      const double angle = static_cast<double>(p) * freqs[static_cast<size_t>(i)];
      t.cos[p * half + i] = static_cast<float>(t.attention_factor * std::cos(angle));
      t.sin[p * half + i] = static_cast<float>(t.attention_factor * std::sin(angle));
    }
  }
  return t;
}

Status check_rope_args(const RopeTable& table, int64_t batch, int64_t seq_len, int64_t n_heads,
                       int64_t head_dim, int64_t pos_offset) {
  if (batch < 0 || seq_len < 0 || n_heads < 0 || pos_offset < 0) {
    return invalid_argument("[rope] negative size in x ({}, {}, {}, {}) at pos_offset {}", batch,
                            seq_len, n_heads, head_dim, pos_offset);
  }
  if (head_dim != table.head_dim) {
    return invalid_argument(
        "[rope] x (B={}, T={}, H={}, D={}) has head_dim {} but the table "
        "was built for head_dim {}",
        batch, seq_len, n_heads, head_dim, head_dim, table.head_dim);
  }
  if (pos_offset + seq_len > table.max_positions) {
    return invalid_argument(
        "[rope] positions {}..{} of x (B={}, T={}, H={}, D={}) exceed the "
        "table's {} positions",
        pos_offset, pos_offset + seq_len - 1, batch, seq_len, n_heads, head_dim,
        table.max_positions);
  }
  return {};
}

Status check_token_ids(std::span<const int32_t> ids, int64_t vocab_size) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return invalid_argument(
          "[embedding] token id {} at position {} of ids ({},) is outside "
          "the vocabulary [0, {})",
          ids[i], i, ids.size(), vocab_size);
    }
  }
  return {};
}

Status check_targets(std::span<const int32_t> targets, int64_t vocab_size) {
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] != kIgnoreTarget && (targets[i] < 0 || targets[i] >= vocab_size)) {
      return invalid_argument(
          "[cross_entropy] target {} in row {} of targets ({},) is neither "
          "-1 (ignore) nor in [0, {}) for logits ({}, {})",
          targets[i], i, targets.size(), vocab_size, targets.size(), vocab_size);
    }
  }
  return {};
}

Status check_adamw_config(const AdamWConfig& c) {
  if (!(c.lr >= 0.0)) return invalid_argument("[adamw] invalid learning rate {}", c.lr);
  if (!(c.eps >= 0.0)) return invalid_argument("[adamw] invalid epsilon {}", c.eps);
  if (!(c.beta1 >= 0.0 && c.beta1 < 1.0)) {
    return invalid_argument("[adamw] invalid beta1 {} (need 0 <= beta1 < 1)", c.beta1);
  }
  if (!(c.beta2 >= 0.0 && c.beta2 < 1.0)) {
    return invalid_argument("[adamw] invalid beta2 {} (need 0 <= beta2 < 1)", c.beta2);
  }
  if (!(c.weight_decay >= 0.0)) {
    return invalid_argument("[adamw] invalid weight_decay {}", c.weight_decay);
  }
  return {};
}

}  // namespace kiln
