// Multi-head latent attention (DeepSeek-V2/V3; HF DeepseekV3's math and names), the attention
// of a Llama-family block whose config has kv_lora_rank > 0 (model/config.h):
//
//   queries  q = q_b(norm(q_a(x))) or q_proj(x), per head [q_nope (Dn), q_pe (Dr)];
//   latent   [c, k_pe] = kv_a_proj_with_mqa(x): c (r = kv_lora_rank) normalized by
//            kv_a_layernorm, k_pe (Dr) one RoPE key shared by every head;
//   keys     per head [k_nope (Dn), k_pe], values v (Dv), with [k_nope, v] = kv_b_proj(c);
//   output   softmax(q·k / sqrt(Dn + Dr)) v per head, o_proj outside (the block's).
//
// Training and full-sequence forwards run the expanded form: Q, K and V of every head padded
// to one head dimension max(Dn + Dr, Dv) with zeros (zero columns add nothing to a score and
// their outputs are dropped), through the one attention kernel. Decoding reads a compressed
// cache that holds only [c, k_pe] (r + Dr floats per token, for all heads): the up-projections
// are absorbed into the query and the output, q̃_h = [W_uk_hᵀ q_nope_h, q_pe_h] and
// out_h = W_uv_h · (Σ_s p_s c_s), so the heads attend to the latent rows as multi-query
// attention of head dimension r + Dr (the values are the same rows; their k_pe part is dropped).
// RoPE is rotate-half on the rope dims; with rope_interleave they are de-interleaved first (even
// indices, then odd), which is what DeepSeek-V3's checkpoints are trained with.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/kernels/attention.h"
#include "kiln/kernels/rope.h"
#include "kiln/model/transformer.h"

namespace kiln {

// What the expanded form's backward reads (saved by its forward).
struct MlaActivations {
  std::vector<float> qa, qan, rstd_qa;  // (N, q_lora_rank) ×2, (N,): the query latent, normalized
  std::vector<float> c, cn, rstd_c;     // (N, r) ×2, (N,): the KV latent, normalized
  std::vector<float> q, k, v, o, lse;   // (N, H, Dp) ×4 padded, (B, H, T)
  int64_t batch = 0, seq_len = 0;
  int64_t bytes() const;
};

struct MlaAttention {
  int64_t d_model = 0, heads = 0, q_rank = 0, kv_rank = 0, nope = 0, rope_dim = 0, v_dim = 0;
  bool interleave = false;
  float eps = 1e-5f;
  const RopeTable* rope = nullptr;
  Linear q, q_a, q_b, kv_a, kv_b;  // q, or q_a and q_b (q_rank > 0)
  float *q_a_norm_w = nullptr, *dq_a_norm_w = nullptr, *kv_a_norm_w = nullptr, *dkv_a_norm_w = nullptr;

  int64_t qk_dim() const { return nope + rope_dim; }
  int64_t padded_dim() const { return std::max(qk_dim(), v_dim); }
  int64_t latent_width() const { return kv_rank + rope_dim; }  // a compressed cache row
  float scale() const;  // 1 / sqrt(Dn + Dr)

  // att (N, H·Dv) from the block's normed input n1 (N, C) of B sequences of T tokens at positions
  // [0, T); saves into `a`. backward: dn1 (N, C) overwritten from datt; weight gradients +=.
  void forward(float* att, const float* n1, int64_t B, int64_t T, MlaActivations& a) const;
  void backward(float* dn1, const float* datt, const float* n1, MlaActivations& a) const;
  // Decoding, n tokens of one sequence at positions [pos, pos + n): their compressed cache rows
  // (n, r + Dr) and absorbed queries (n, H, r + Dr).
  void latent(float* rows, float* qabs, const float* n1, int64_t n, int64_t pos) const;
  // The attention over the latent rows of a sequence with `kv_len` cached rows (the new ones
  // last): multi-query, head dimension r + Dr, values the same rows.
  AttentionParams absorbed_params(int64_t n, int64_t kv_len) const;
  // att (n, H·Dv) from the absorbed attention's output (n, H, r + Dr).
  void absorbed_output(float* att, const float* out, int64_t n) const;
};

}  // namespace kiln
