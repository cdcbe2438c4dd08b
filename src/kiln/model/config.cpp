// Presets, parameter counts and FLOP estimates for ModelConfig.
#include "kiln/model/config.h"

namespace kiln {

std::string_view family_name(ModelFamily f) { return f == ModelFamily::kGpt2 ? "gpt2" : "llama"; }

int64_t ModelConfig::num_params() const {
  const int64_t C = d_model, D = head_dim(), L = n_layers;
  int64_t per_layer, other;
  if (family == ModelFamily::kGpt2) {
    per_layer = 2 * 2 * C                     // two LayerNorms (weight, bias)
                + C * 3 * C + 3 * C           // c_attn
                + C * C + C                   // attn c_proj
                + C * d_ff + d_ff             // c_fc
                + d_ff * C + C;               // mlp c_proj
    other = vocab_size * C + max_seq_len * C + 2 * C;  // wte, wpe, ln_f
  } else {
    per_layer = 2 * C                                  // two RMSNorms
                + C * (n_heads + 2 * n_kv_heads) * D   // q, k, v
                + n_heads * D * C                      // o
                + 3 * C * d_ff;                        // gate, up, down
    other = vocab_size * C + C;                        // embed_tokens, final norm
  }
  if (!tied_embeddings) other += vocab_size * C;
  return L * per_layer + other;
}

int64_t ModelConfig::num_non_embedding_params() const {
  int64_t emb = vocab_size * d_model + (family == ModelFamily::kGpt2 ? max_seq_len * d_model : 0);
  return num_params() - emb;
}

double ModelConfig::train_flops_per_token(int64_t seq_len) const {
  // Matmul parameters include the LM head (tied or not, it is a matmul every token).
  const double matmul_params = static_cast<double>(num_non_embedding_params()) +
                               (tied_embeddings ? static_cast<double>(vocab_size * d_model) : 0.0);
  return 6.0 * matmul_params + 12.0 * n_layers * seq_len * d_model;
}

std::string ModelConfig::describe() const {
  return fmt::format("{} vocab {} d {} layers {} heads {} kv_heads {} ffn {} ctx {} ({:.2f}M params)",
                     family_name(family), vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff,
                     max_seq_len, num_params() / 1e6);
}

Status check_config(const ModelConfig& c) {
  if (c.vocab_size <= 0 || c.d_model <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 ||
      c.d_ff <= 0 || c.max_seq_len <= 0)
    return invalid_argument("[model config] every size must be positive: {}", c.describe());
  if (c.d_model % c.n_heads != 0)
    return invalid_argument("[model config] d_model {} is not divisible by n_heads {}", c.d_model, c.n_heads);
  if (c.n_heads % c.n_kv_heads != 0)
    return invalid_argument("[model config] n_heads {} is not a multiple of n_kv_heads {}", c.n_heads, c.n_kv_heads);
  if (c.family == ModelFamily::kGpt2 && c.n_kv_heads != c.n_heads)
    return invalid_argument("[model config] GPT-2 has no grouped-query attention (n_kv_heads {} != n_heads {})",
                            c.n_kv_heads, c.n_heads);
  if (c.is_llama() && c.head_dim() % 2 != 0)
    return invalid_argument("[model config] RoPE needs an even head_dim, got {}", c.head_dim());
  return {};
}

namespace {
ModelConfig gpt2(int64_t vocab, int64_t d, int64_t layers, int64_t heads, int64_t ctx) {
  ModelConfig c;
  c.family = ModelFamily::kGpt2;
  c.vocab_size = vocab; c.d_model = d; c.n_layers = layers; c.n_heads = heads; c.n_kv_heads = heads;
  c.d_ff = 4 * d; c.max_seq_len = ctx; c.norm_eps = 1e-5f; c.tied_embeddings = true;
  return c;
}
ModelConfig llama(int64_t vocab, int64_t d, int64_t layers, int64_t heads, int64_t kv, int64_t ffn, int64_t ctx,
                  bool tied) {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.vocab_size = vocab; c.d_model = d; c.n_layers = layers; c.n_heads = heads; c.n_kv_heads = kv;
  c.d_ff = ffn; c.max_seq_len = ctx; c.norm_eps = 1e-5f; c.rope_theta = 10000.0; c.tied_embeddings = tied;
  return c;
}
}  // namespace

std::vector<std::string> preset_names() { return {"gpt2-124m", "w1a", "llama-tiny", "w2-s", "w2-l"}; }

Expected<ModelConfig> preset(std::string_view name) {
  if (name == "gpt2-124m") return gpt2(50257, 768, 12, 12, 1024);
  if (name == "w1a") return gpt2(65, 384, 6, 6, 256);                   // BENCH.md W1a
  if (name == "llama-tiny") return llama(4096, 384, 6, 6, 2, 1024, 256, true);  // ~10M params
  if (name == "w2-s") return llama(32000, 768, 12, 12, 4, 2048, 2048, false);
  if (name == "w2-l") return llama(32000, 2048, 22, 32, 4, 5632, 2048, false);  // TinyLlama-1.1B shape
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  return invalid_argument("unknown preset '{}' (known: {})", name, names);
}

}  // namespace kiln
