// Model configuration for the two families behind one config: GPT-2 (learned positions,
// LayerNorm, GELU MLP, tied embeddings, biases) and Llama (RMSNorm, RoPE with HF's scalings,
// SwiGLU, GQA/MQA via n_kv_heads, optional biases), plus the named presets of BENCH.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/kernels/rope.h"

namespace kiln {

enum class ModelFamily { kGpt2, kLlama };
std::string_view family_name(ModelFamily f);

struct ModelConfig {
  ModelFamily family = ModelFamily::kLlama;
  int64_t vocab_size = 4096;
  int64_t d_model = 384;
  int64_t n_layers = 6;
  int64_t n_heads = 6;
  int64_t n_kv_heads = 6;   // GPT-2: = n_heads
  int64_t d_ff = 1536;      // GPT-2: 4·d_model; Llama: SwiGLU hidden size
  int64_t max_seq_len = 256;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;  // Llama: HF rope_parameters' rope_type and its fields
  float norm_eps = 1e-5f;
  bool tied_embeddings = true;
  // Llama (HF attention_bias, mlp_bias): q, k, v, o and gate, up, down get biases.
  bool attention_bias = false;
  bool mlp_bias = false;
  // GPT-2 (HF scale_attn_weights, scale_attn_by_inverse_layer_idx): scores are scaled by
  // 1/sqrt(head_dim) (or not), and also divided by layer index + 1.
  bool scale_attn_weights = true;
  bool scale_attn_by_inverse_layer_idx = false;
  // Special token ids written to config.json (generation stops at eos); -1: none.
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  // Mixture of experts (Llama family; HF Mixtral's layout, model/moe.h). num_experts > 0 makes
  // the MLP of every moe_layer_freq-th block (blocks i with (i + 1) % moe_layer_freq == 0; the
  // others stay dense) a router over num_experts SwiGLU experts of width moe_d_ff (0: d_ff):
  // each token goes to its top num_experts_per_tok experts, weighted by their renormalized
  // router probabilities, plus num_shared_experts always-on experts (DeepSeek) fused into one
  // MLP of num_shared_experts · moe_d_ff columns. capacity_factor > 0: an expert takes at most
  // ceil(CF · k · N / E) of a batch's N tokens' assignments, in token order, and the overflow
  // passes through the residual; 0: dropless. The objective adds router_aux_loss_coef times the
  // Switch load-balancing loss and router_z_loss_coef times the router z-loss, each averaged
  // over the MoE blocks.
  // Multi-head latent attention (DeepSeek-V2/V3, HF DeepseekV3's names; Llama family):
  // kv_lora_rank > 0 replaces K and V by a latent c = norm(x W_dkv) of kv_lora_rank per token,
  // up-projected per head to k_nope (qk_nope_head_dim) and v (v_head_dim), beside one RoPE key
  // k_pe (qk_rope_head_dim) shared by all heads; queries are [q_nope, q_pe] per head, from x
  // directly or (q_lora_rank > 0) through a compressed, normalized q latent. The KV cache holds
  // [c, k_pe] per token only. rope_interleave: RoPE on the rope dims de-interleaved first (even
  // indices, then odd), as DeepSeek-V3's checkpoints expect. n_kv_heads must equal n_heads.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = false;
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 2;
  int64_t num_shared_experts = 0;
  int64_t moe_layer_freq = 1;
  int64_t moe_d_ff = 0;
  double capacity_factor = 0.0;
  double router_aux_loss_coef = 0.0;
  double router_z_loss_coef = 0.0;

  int64_t head_dim() const { return d_model / n_heads; }
  bool is_llama() const { return family == ModelFamily::kLlama; }
  bool is_mla() const { return kv_lora_rank > 0; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // The dimension RoPE rotates: the rope part of an MLA head, else the whole head.
  int64_t rope_dim() const { return is_mla() ? qk_rope_head_dim : head_dim(); }
  bool is_moe() const { return num_experts > 0; }
  bool is_moe_layer(int64_t layer) const { return is_moe() && moe_layer_freq > 0 && (layer + 1) % moe_layer_freq == 0; }
  int64_t num_moe_layers() const { return is_moe() && moe_layer_freq > 0 ? n_layers / moe_layer_freq : 0; }
  int64_t expert_d_ff() const { return moe_d_ff > 0 ? moe_d_ff : d_ff; }
  // The attention scores' multiplier in layer `layer` (0-based).
  float attention_scale(int64_t layer) const;
  // Parameter count (call on a config check_config accepted: it does not check overflow);
  // non-embedding excludes token (and position) embeddings.
  int64_t num_params() const;
  int64_t num_non_embedding_params() const;
  // The parameters one token runs through: a MoE block counts its router, k of its experts and
  // the shared ones (num_params() for a dense model).
  int64_t num_active_params() const;
  // Training FLOPs per token: 6·N (matmuls, forward + backward; N the active parameters) +
  // 12·L·T·d attention scores (the PaLM / llm.c estimate), at sequence length seq_len.
  double train_flops_per_token(int64_t seq_len) const;
  std::string describe() const;
};

// Parameters, or nothing when a size is negative or the count overflows int64.
std::optional<int64_t> checked_num_params(const ModelConfig& c);
// Bytes Transformer::create allocates for c (fp32 weights and gradients, the RoPE table), or
// nothing on overflow.
std::optional<int64_t> model_bytes(const ModelConfig& c);

// Every rule on a config, for configs from files, presets and flags alike: InvalidArgument
// naming the field that is out of range or inconsistent (a size <= 0, d_model not divisible by
// n_heads, an option of the other family, a bad RoPE scaling), ResourceExhausted when the
// weights would not fit in `memory_limit_bytes` (0: the machine's physical memory), saying
// how much they need. Nothing is allocated.
Status check_config(const ModelConfig& c, int64_t memory_limit_bytes = 0);
// The machine's physical memory (sysconf), or int64 max when it cannot be read.
int64_t physical_memory_bytes();

// Named presets: gpt2-124m, w1a, llama-tiny (default), w2-s, w2-l, llama-moe-tiny, w1-moe,
// llama-mla-tiny.
Expected<ModelConfig> preset(std::string_view name);
std::vector<std::string> preset_names();

}  // namespace kiln
