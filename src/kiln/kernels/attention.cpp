// Attention argument checks, cost formulas and the process-wide implementation setting, shared
// by every attention backend.
#include "kiln/kernels/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>

namespace kiln {

namespace {
std::atomic<AttentionImpl> g_attention_impl{AttentionImpl::kFlash};
}  // namespace

void set_attention_impl(AttentionImpl impl) {
  g_attention_impl.store(impl == AttentionImpl::kDefault ? AttentionImpl::kFlash : impl);
}
AttentionImpl attention_impl() { return g_attention_impl.load(); }

std::string_view attention_impl_name(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::kNaive: return "naive";
    case AttentionImpl::kFlash: return "flash";
    default: return "default";
  }
}

Expected<AttentionImpl> parse_attention_impl(std::string_view name) {
  if (name == "naive") return AttentionImpl::kNaive;
  if (name == "flash") return AttentionImpl::kFlash;
  return invalid_argument("[attention] unknown implementation '{}' (naive | flash)", name);
}

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

Expected<AttentionParams> check_attention_varlen(AttentionParams p, const AttentionVarlen& v) {
  if (v.num_seqs < 0 || (v.num_seqs > 0 && (!v.cu_seqlens_q || !v.cu_seqlens_k)))
    return invalid_argument("[attention varlen] num_seqs {} needs cu_seqlens_q and cu_seqlens_k", v.num_seqs);
  int64_t max_q = 0, max_k = 0;
  for (int64_t i = 0; i < v.num_seqs; ++i) {
    const int64_t tq = v.cu_seqlens_q[i + 1] - v.cu_seqlens_q[i], tk = v.cu_seqlens_k[i + 1] - v.cu_seqlens_k[i];
    if (tq < 0 || tk < 0 || (i == 0 && (v.cu_seqlens_q[0] != 0 || v.cu_seqlens_k[0] != 0)))
      return invalid_argument("[attention varlen] cu_seqlens must start at 0 and not decrease (sequence {})", i);
    if (p.causal && tk < tq)
      return invalid_argument("[attention varlen] causal sequence {} has kv_len {} < q_len {}", i, tk, tq);
    max_q = std::max(max_q, tq);
    max_k = std::max(max_k, tk);
  }
  p.batch = v.num_seqs;
  p.q_len = max_q;
  p.kv_len = max_k;
  return check_attention(p);
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
