// Attention argument checks and cost formulas, shared by every attention backend.
#include "kiln/kernels/attention.h"

#include <cmath>

namespace kiln {

float AttentionParams::softmax_scale() const {
  return scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

Expected<AttentionParams> check_attention(AttentionParams p) {
  if (p.batch < 0 || p.q_len < 0 || p.kv_len < 0 || p.head_dim <= 0 || p.n_heads <= 0 || p.n_kv_heads <= 0)
    return invalid_argument("[attention] sizes must be positive: batch {}, q_len {}, kv_len {}, heads {}/{}, head_dim {}",
                            p.batch, p.q_len, p.kv_len, p.n_heads, p.n_kv_heads, p.head_dim);
  if (p.n_heads % p.n_kv_heads != 0)
    return invalid_argument("[attention] n_heads {} is not a multiple of n_kv_heads {}", p.n_heads, p.n_kv_heads);
  if (p.causal && p.kv_len < p.q_len)
    return invalid_argument("[attention] causal attention needs kv_len ({}) >= q_len ({})", p.kv_len, p.q_len);
  if (p.window < 0) return invalid_argument("[attention] window {} is negative", p.window);
  if (p.q_row_stride == 0) p.q_row_stride = p.n_heads * p.head_dim;
  if (p.o_row_stride == 0) p.o_row_stride = p.n_heads * p.head_dim;
  if (p.k_row_stride == 0) p.k_row_stride = p.n_kv_heads * p.head_dim;
  if (p.v_row_stride == 0) p.v_row_stride = p.n_kv_heads * p.head_dim;
  if (p.q_row_stride < p.n_heads * p.head_dim || p.o_row_stride < p.n_heads * p.head_dim ||
      p.k_row_stride < p.n_kv_heads * p.head_dim || p.v_row_stride < p.n_kv_heads * p.head_dim)
    return invalid_argument("[attention] a row stride is shorter than heads × head_dim");
  return p;
}

namespace {
// Scores actually computed: all T·S, or about half when causal.
double visible_pairs(const AttentionParams& p) {
  const double T = static_cast<double>(p.q_len), S = static_cast<double>(p.kv_len);
  if (!p.causal) return T * S;
  return T * (S - T) + T * (T + 1) / 2;
}
}  // namespace

OpCost attention_forward_cost(const AttentionParams& p) {
  const double pairs = visible_pairs(p) * p.batch * p.n_heads;
  const double D = static_cast<double>(p.head_dim);
  const double io = 4.0 * p.batch * D * (2.0 * p.q_len * p.n_heads + 2.0 * p.kv_len * p.n_kv_heads);
  return {pairs * (4.0 * D + 3.0), io};
}

OpCost attention_backward_cost(const AttentionParams& p) {
  const double pairs = visible_pairs(p) * p.batch * p.n_heads;
  const double D = static_cast<double>(p.head_dim);
  const double io = 4.0 * p.batch * D * (4.0 * p.q_len * p.n_heads + 4.0 * p.kv_len * p.n_kv_heads);
  return {pairs * (10.0 * D + 6.0), io};
}

}  // namespace kiln
