// Attention argument checks, cost formulas and the process-wide implementation setting, shared
// by every attention backend.
#include "kiln/kernels/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <tuple>
#include <utility>

#include "kiln/core/trace.h"

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
// Scores actually computed (the causal triangle and the sliding window cut whole rows short):
// query t at position pos = t + S - T sees keys [lo, hi] with hi = pos when causal, else S - 1
// (or pos + window - 1), and lo = pos - window + 1 with a window, else 0.
double visible_pairs(const AttentionParams& p) {
  const int64_t T = p.q_len, S = p.kv_len, off = p.kv_len - p.q_len;
  if (p.window <= 0) {
    const double t = static_cast<double>(T), s = static_cast<double>(S);
    return p.causal ? t * (s - t) + t * (t + 1) / 2 : t * s;
  }
  double n = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = t + off;
    const int64_t hi = std::min(S - 1, p.causal ? pos : pos + p.window - 1);
    const int64_t lo = std::max<int64_t>(0, pos - p.window + 1);
    n += static_cast<double>(std::max<int64_t>(0, hi - lo + 1));
  }
  return n;
}

// The costs of one sequence of `seq` (batch 1) summed over the sequences of a packed batch.
template <class Cost, class Lens>
OpCost sum_over_seqs(const AttentionParams& p, int64_t num_seqs, Lens&& lens, Cost&& cost) {
  OpCost total;
  AttentionParams one = p;
  one.batch = 1;
  for (int64_t i = 0; i < num_seqs; ++i) {
    std::tie(one.q_len, one.kv_len) = lens(i);
    const OpCost c = cost(one);
    total.flops += c.flops;
    total.bytes += c.bytes;
  }
  return total;
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

namespace {
auto varlen_lens(const AttentionVarlen& v) {
  return [&v](int64_t i) {
    return std::pair<int64_t, int64_t>{v.cu_seqlens_q[i + 1] - v.cu_seqlens_q[i], v.cu_seqlens_k[i + 1] - v.cu_seqlens_k[i]};
  };
}
}  // namespace

OpCost attention_forward_cost(const AttentionParams& p, const AttentionVarlen& v) {
  return sum_over_seqs(p, v.num_seqs, varlen_lens(v), [](const AttentionParams& a) { return attention_forward_cost(a); });
}

OpCost attention_backward_cost(const AttentionParams& p, const AttentionVarlen& v) {
  return sum_over_seqs(p, v.num_seqs, varlen_lens(v), [](const AttentionParams& a) { return attention_backward_cost(a); });
}

OpCost attention_decode_paged_cost(const AttentionParams& p, const PagedKv& kv) {
  auto lens = [&](int64_t i) { return std::pair<int64_t, int64_t>{p.q_len, kv.seq_lens[i]}; };
  return sum_over_seqs(p, kv.num_seqs, lens, [](const AttentionParams& a) { return attention_forward_cost(a); });
}

void describe_attention(trace::Event& e, const AttentionParams& p, OpCost c, const char* impl) {
  e.flops = c.flops;
  e.bytes = c.bytes;
  e.set_dims({p.batch, p.n_heads, p.q_len, p.kv_len});
  e.dtype = "f32";
  e.algo = impl;
  e.add_arg("head_dim", p.head_dim);
  if (p.causal) e.add_arg("causal", 1);
  if (p.window > 0) e.add_arg("window", p.window);
}

}  // namespace kiln
