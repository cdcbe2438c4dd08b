// Model configuration for the two families behind one config: GPT-2 (learned positions,
// LayerNorm, GELU MLP, tied embeddings, biases) and Llama (RMSNorm, RoPE, SwiGLU, GQA/MQA via
// n_kv_heads, no biases), plus the named presets of BENCH.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/status.h"

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
  float norm_eps = 1e-5f;
  bool tied_embeddings = true;

  int64_t head_dim() const { return d_model / n_heads; }
  bool is_llama() const { return family == ModelFamily::kLlama; }
  // Parameter count; non-embedding excludes token (and position) embeddings.
  int64_t num_params() const;
  int64_t num_non_embedding_params() const;
  // Training FLOPs per token: 6·N (matmuls, forward + backward) + 12·L·T·d attention scores
  // (the PaLM / llm.c estimate), at sequence length seq_len.
  double train_flops_per_token(int64_t seq_len) const;
  std::string describe() const;
};

// InvalidArgument naming the field that is inconsistent (e.g. d_model not divisible by n_heads).
Status check_config(const ModelConfig& c);

// Named presets: gpt2-124m, w1a, llama-tiny (default), w2-s, w2-l.
Expected<ModelConfig> preset(std::string_view name);
std::vector<std::string> preset_names();

}  // namespace kiln
