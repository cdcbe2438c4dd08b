// Scaled dot-product attention, the contract every attention kernel implements: forward gives
// the output and one logsumexp per (query row, head); backward recomputes probabilities from
// Q, K and the logsumexp (so no T×T matrix is kept between the passes).
// GQA/MQA: query head h reads KV head h / (n_heads / n_kv_heads). Causal masking lets query t
// see keys s <= t + q_offset (q_offset = S - T when T new queries follow S - T cached keys);
// a sliding window keeps only keys s > t + q_offset - window.
// ref:: is the naive scalar ground truth (it forms each score row in full). The naive cpu::
// path threads over (batch, KV head); FlashAttention arrives with the attention issue.
#pragma once

#include <cstdint>

#include "kiln/core/status.h"
#include "kiln/kernels/op_cost.h"

namespace kiln {

struct AttentionParams {
  int64_t batch = 1;
  int64_t q_len = 0;       // T: query rows per sequence
  int64_t kv_len = 0;      // S: key/value rows per sequence (S >= T when causal)
  int64_t n_heads = 1;     // query heads
  int64_t n_kv_heads = 1;  // divides n_heads
  int64_t head_dim = 0;
  bool causal = true;
  int64_t window = 0;      // 0: no sliding window
  float scale = 0.0f;      // 0: 1/sqrt(head_dim)
  // Elements between consecutive rows (tokens) of each buffer; heads are contiguous inside a
  // row (head h at h·head_dim). Lets q, k, v be read straight out of a fused QKV projection.
  int64_t q_row_stride = 0, k_row_stride = 0, v_row_stride = 0, o_row_stride = 0;

  int64_t q_offset() const { return kv_len - q_len; }
  float softmax_scale() const;
};

// Fills zero strides with the packed defaults; InvalidArgument naming the fields when shapes
// are inconsistent.
Expected<AttentionParams> check_attention(AttentionParams p);

// Causal attention does about half the work of the full T×S score matrix.
OpCost attention_forward_cost(const AttentionParams& p);
OpCost attention_backward_cost(const AttentionParams& p);

namespace ref {
// out (B, T, Hq, D) rows of o_row_stride; lse (B, Hq, T); q (B, T, Hq, D); k, v (B, S, Hkv, D).
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionParams& p);
// dq like q, dk/dv like k/v (all overwritten; dq/dk/dv packed with the same row strides as
// q/k/v); dout and out like out; lse from the forward.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionParams& p);
}  // namespace ref

namespace cpu {
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionParams& p);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionParams& p);
}  // namespace cpu

KILN_SAME_SIGNATURE(attention_forward);
KILN_SAME_SIGNATURE(attention_backward);

}  // namespace kiln
