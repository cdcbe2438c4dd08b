// Presets, parameter counts and FLOP estimates for ModelConfig.
#include "kiln/model/config.h"

#include <unistd.h>

#include <cmath>
#include <limits>
#include <utility>

#include "kiln/core/checked_math.h"

namespace kiln {

std::string_view family_name(ModelFamily f) { return f == ModelFamily::kGpt2 ? "gpt2" : "llama"; }

namespace {
// An int64 size that turns empty on overflow, so a parameter count reads as the formula.
struct Size {
  std::optional<int64_t> v;
  Size(int64_t x) : v(x) {}  // NOLINT: sizes convert implicitly, as in the formulas
  Size(std::optional<int64_t> x) : v(x) {}
};
Size operator+(Size a, Size b) { return a.v && b.v ? Size(checked_add(*a.v, *b.v)) : Size(std::nullopt); }
Size operator*(Size a, Size b) { return a.v && b.v ? Size(checked_mul(*a.v, *b.v)) : Size(std::nullopt); }
}  // namespace

std::optional<int64_t> checked_num_params(const ModelConfig& c) {
  for (int64_t x : {c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_ff, c.max_seq_len,
                    c.num_experts, c.num_shared_experts, c.moe_d_ff, c.q_lora_rank, c.kv_lora_rank,
                    c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim})
    if (x < 0) return std::nullopt;
  if (c.n_heads == 0 || (c.is_moe() && c.moe_layer_freq <= 0)) return std::nullopt;
  const Size C = c.d_model, D = c.head_dim(), L = c.n_layers, F = c.d_ff, V = c.vocab_size;
  const Size H = c.n_heads, Hkv = c.n_kv_heads;
  Size per_layer = 0, other = 0;
  if (c.family == ModelFamily::kGpt2) {
    per_layer = Size(4) * C                  // two LayerNorms (weight, bias)
                + C * 3 * C + 3 * C          // c_attn
                + C * C + C                  // attn c_proj
                + C * F + F                  // c_fc
                + F * C + C;                 // mlp c_proj
    other = V * C + Size(c.max_seq_len) * C + Size(2) * C;  // wte, wpe, ln_f
  } else {
    if (c.is_mla()) {  // q (direct or through its latent), the KV latent and its norm, the up-projection, o
      const Size qr = c.q_lora_rank, r = c.kv_lora_rank, Dqk = c.qk_head_dim(), Dr = c.qk_rope_head_dim;
      const Size q = c.q_lora_rank > 0 ? C * qr + qr + qr * H * Dqk : C * H * Dqk;
      per_layer = Size(2) * C + q + C * (r + Dr) + r + r * H * (Size(c.qk_nope_head_dim) + c.v_head_dim) +
                  H * c.v_head_dim * C + Size(3) * C * F;
    } else {
      per_layer = Size(2) * C                  // two RMSNorms
                  + C * (H + Size(2) * Hkv) * D  // q, k, v
                  + H * D * C                  // o
                  + Size(3) * C * F;           // gate, up, down
    }
    if (c.attention_bias) per_layer = per_layer + (H + Size(2) * Hkv) * D + C;
    if (c.mlp_bias) per_layer = per_layer + Size(2) * F + C;
    other = V * C + C;                       // embed_tokens, final norm
  }
  if (!c.tied_embeddings) other = other + V * C;
  if (!c.is_moe()) return (L * per_layer + other).v;
  // MoE blocks: the dense MLP replaced by the router, the experts and the shared experts.
  const Size moe_layers = c.num_moe_layers(), Fe = c.expert_d_ff();
  const Size moe_mlp = Size(c.num_experts) * C + Size(c.num_experts + c.num_shared_experts) * 3 * C * Fe;
  const Size dense_mlp = Size(3) * C * F + (c.mlp_bias ? Size(2) * F + C : Size(0));
  return (L * per_layer + other + moe_layers * moe_mlp + Size(-1) * moe_layers * dense_mlp).v;
}

int64_t ModelConfig::num_active_params() const {
  const int64_t inactive = num_moe_layers() * (num_experts - num_experts_per_tok) * 3 * d_model * expert_d_ff();
  return num_params() - inactive;
}

std::optional<int64_t> model_bytes(const ModelConfig& c) {
  const Size params = checked_num_params(c);
  Size bytes = params * 8;  // fp32 weights and their gradients
  if (c.is_llama()) bytes = bytes + Size(c.max_seq_len) * c.rope_dim() * 4;  // cos, sin: (T, D/2) fp32 each
  return bytes.v;
}

int64_t ModelConfig::num_params() const {
  const std::optional<int64_t> n = checked_num_params(*this);
  KILN_CHECK_MSG(n.has_value(), "num_params() of a config check_config rejects");
  return *n;
}

int64_t ModelConfig::num_non_embedding_params() const {
  int64_t emb = vocab_size * d_model + (family == ModelFamily::kGpt2 ? max_seq_len * d_model : 0);
  return num_params() - emb;
}

double ModelConfig::train_flops_per_token(int64_t seq_len) const {
  // Matmul parameters include the LM head (tied or not, it is a matmul every token); a MoE
  // block's only the experts a token runs through.
  const double matmul_params = static_cast<double>(num_non_embedding_params() - (num_params() - num_active_params())) +
                               (tied_embeddings ? static_cast<double>(vocab_size * d_model) : 0.0);
  return 6.0 * matmul_params + 12.0 * n_layers * seq_len * d_model;
}

float ModelConfig::attention_scale(int64_t layer) const {
  double s = scale_attn_weights ? 1.0 / std::sqrt(static_cast<double>(head_dim())) : 1.0;
  if (scale_attn_by_inverse_layer_idx) s /= static_cast<double>(layer + 1);
  return static_cast<float>(s);
}

std::string ModelConfig::describe() const {
  const std::optional<int64_t> n = checked_num_params(*this);
  std::string extra;
  if (is_llama() && rope_scaling.type != RopeType::kDefault)
    extra += fmt::format(" rope {} x{:g}", rope_type_name(rope_scaling.type), rope_scaling.factor);
  if (attention_bias) extra += " attention_bias";
  if (mlp_bias) extra += " mlp_bias";
  if (!scale_attn_weights) extra += " unscaled-attention";
  if (scale_attn_by_inverse_layer_idx) extra += " attention/(layer+1)";
  if (is_mla())
    extra += fmt::format(" mla kv_lora {} q_lora {} qk {}+{} v {}", kv_lora_rank, q_lora_rank, qk_nope_head_dim,
                         qk_rope_head_dim, v_head_dim);
  if (is_moe()) {
    extra += fmt::format(" moe {} experts top-{} ffn {}", num_experts, num_experts_per_tok, expert_d_ff());
    if (num_shared_experts > 0) extra += fmt::format(" +{} shared", num_shared_experts);
    if (moe_layer_freq > 1) extra += fmt::format(" every {} blocks", moe_layer_freq);
    extra += capacity_factor > 0 ? fmt::format(" capacity {:g}", capacity_factor) : std::string(" dropless");
    if (n) extra += fmt::format(", {:.2f}M active", static_cast<double>(num_active_params()) / 1e6);
  }
  return fmt::format("{} vocab {} d {} layers {} heads {} kv_heads {} ffn {} ctx {}{} ({} params)",
                     family_name(family), vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff, max_seq_len,
                     extra, n ? fmt::format("{:.2f}M", static_cast<double>(*n) / 1e6) : std::string("overflowing"));
}

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return std::numeric_limits<int64_t>::max();
  return checked_mul<int64_t>(pages, page).value_or(std::numeric_limits<int64_t>::max());
}

namespace {
Status check_moe_config(const ModelConfig& c) {
  if (c.num_experts < 0) return invalid_argument("[model config] num_experts must be >= 0 (0: dense), got {}", c.num_experts);
  if (!c.is_moe()) {
    if (c.num_shared_experts != 0 || c.capacity_factor != 0 || c.router_aux_loss_coef != 0 || c.router_z_loss_coef != 0)
      return invalid_argument("[model config] num_shared_experts, capacity_factor and the router loss coefficients "
                              "need num_experts > 0");
    return {};
  }
  if (c.family != ModelFamily::kLlama)
    return invalid_argument("[model config] mixture of experts is a Llama-family option (HF Mixtral), not GPT-2");
  if (c.mlp_bias) return invalid_argument("[model config] MoE experts have no biases (mlp_bias with num_experts > 0)");
  if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts)
    return invalid_argument("[model config] num_experts_per_tok {} must be in [1, num_experts {}]", c.num_experts_per_tok,
                            c.num_experts);
  if (c.num_shared_experts < 0 || c.moe_d_ff < 0)
    return invalid_argument("[model config] num_shared_experts ({}) and moe_d_ff ({}) must be >= 0",
                            c.num_shared_experts, c.moe_d_ff);
  if (c.moe_layer_freq < 1 || c.moe_layer_freq > c.n_layers)
    return invalid_argument("[model config] moe_layer_freq {} must be in [1, n_layers {}] (every n-th block is MoE)",
                            c.moe_layer_freq, c.n_layers);
  for (const auto& [name, v] : {std::pair{"capacity_factor", c.capacity_factor},
                                std::pair{"router_aux_loss_coef", c.router_aux_loss_coef},
                                std::pair{"router_z_loss_coef", c.router_z_loss_coef}})
    if (!(v >= 0) || !std::isfinite(v))
      return invalid_argument("[model config] {} must be finite and >= 0, got {}", name, v);
  return {};
}
Status check_mla_config(const ModelConfig& c) {
  const bool any = c.q_lora_rank != 0 || c.qk_nope_head_dim != 0 || c.qk_rope_head_dim != 0 || c.v_head_dim != 0 ||
                   c.rope_interleave;
  if (!c.is_mla()) {
    if (c.kv_lora_rank < 0) return invalid_argument("[model config] kv_lora_rank must be >= 0, got {}", c.kv_lora_rank);
    if (any) return invalid_argument("[model config] q_lora_rank, qk_*_head_dim, v_head_dim and rope_interleave are "
                                     "multi-head latent attention's: they need kv_lora_rank > 0");
    return {};
  }
  if (c.family != ModelFamily::kLlama)
    return invalid_argument("[model config] multi-head latent attention is a Llama-family option (DeepSeek), not GPT-2");
  for (const auto& [name, v] : {std::pair{"qk_nope_head_dim", c.qk_nope_head_dim},
                                std::pair{"qk_rope_head_dim", c.qk_rope_head_dim}, std::pair{"v_head_dim", c.v_head_dim}})
    if (v <= 0) return invalid_argument("[model config] MLA's {} must be positive, got {}", name, v);
  if (c.qk_rope_head_dim % 2 != 0)
    return invalid_argument("[model config] RoPE needs an even qk_rope_head_dim, got {}", c.qk_rope_head_dim);
  if (c.q_lora_rank < 0) return invalid_argument("[model config] q_lora_rank must be >= 0, got {}", c.q_lora_rank);
  if (c.n_kv_heads != c.n_heads)
    return invalid_argument("[model config] MLA up-projects every head's K and V: n_kv_heads ({}) must equal n_heads ({})",
                            c.n_kv_heads, c.n_heads);
  if (c.attention_bias) return invalid_argument("[model config] MLA has no attention biases (attention_bias)");
  if (c.is_moe())
    return invalid_argument("[model config] MLA with MoE blocks is not implemented (DeepSeek's router is not kiln's); "
                            "use one or the other");
  return {};
}
}  // namespace

Status check_config(const ModelConfig& c, int64_t memory_limit_bytes) {
  const std::pair<const char*, int64_t> sizes[] = {{"vocab_size", c.vocab_size}, {"d_model", c.d_model},
                                                   {"n_layers", c.n_layers},     {"n_heads", c.n_heads},
                                                   {"n_kv_heads", c.n_kv_heads}, {"d_ff", c.d_ff},
                                                   {"max_seq_len", c.max_seq_len}};
  for (const auto& [name, v] : sizes)
    if (v <= 0) return invalid_argument("[model config] {} must be positive, got {}", name, v);
  // Token ids and positions are int32 everywhere (batches, the paged KV cache's tables).
  for (const auto& [name, v] : {sizes[0], sizes[6]})
    if (v > std::numeric_limits<int32_t>::max())
      return invalid_argument("[model config] {} {} exceeds the int32 range of token ids and positions", name, v);
  if (c.d_model % c.n_heads != 0)
    return invalid_argument("[model config] d_model {} is not divisible by n_heads {}", c.d_model, c.n_heads);
  if (c.n_heads % c.n_kv_heads != 0)
    return invalid_argument("[model config] n_heads {} is not a multiple of n_kv_heads {}", c.n_heads, c.n_kv_heads);
  if (!(c.norm_eps > 0.0f) || !std::isfinite(c.norm_eps))
    return invalid_argument("[model config] norm_eps must be finite and > 0, got {}", c.norm_eps);
  for (const auto& [name, id] : {std::pair{"bos_token_id", c.bos_token_id}, std::pair{"eos_token_id", c.eos_token_id}})
    // Not checked against vocab_size: transformers' GPT2Config() keeps 50256 at any vocabulary.
    if (id < -1 || id > std::numeric_limits<int32_t>::max())
      return invalid_argument("[model config] {} {} is not a token id (-1: none)", name, id);
  if (c.family == ModelFamily::kGpt2) {
    if (c.n_kv_heads != c.n_heads)
      return invalid_argument("[model config] GPT-2 has no grouped-query attention (n_kv_heads {} != n_heads {})",
                              c.n_kv_heads, c.n_heads);
    if (c.attention_bias || c.mlp_bias)
      return invalid_argument("[model config] attention_bias and mlp_bias are Llama options (GPT-2 always has biases)");
    if (c.rope_scaling.type != RopeType::kDefault)
      return invalid_argument("[model config] GPT-2 has no RoPE (rope scaling {})", rope_type_name(c.rope_scaling.type));
  } else {
    if (!c.is_mla() && c.head_dim() % 2 != 0)
      return invalid_argument("[model config] RoPE needs an even head_dim, got {}", c.head_dim());
    if (!(c.rope_theta > 1.0) || !std::isfinite(c.rope_theta))
      return invalid_argument("[model config] rope_theta must be finite and > 1, got {}", c.rope_theta);
    if (!c.scale_attn_weights || c.scale_attn_by_inverse_layer_idx)
      return invalid_argument("[model config] scale_attn_weights and scale_attn_by_inverse_layer_idx are GPT-2 options");
    if (Status s = check_rope_scaling(c.rope_scaling); !s.ok())
      return invalid_argument("[model config] {}", s.message());
  }
  if (Status s = check_moe_config(c); !s.ok()) return s;
  if (Status s = check_mla_config(c); !s.ok()) return s;
  // The memory the weights need, before anything is allocated.
  const std::optional<int64_t> bytes = model_bytes(c);
  const int64_t limit = memory_limit_bytes > 0 ? memory_limit_bytes : physical_memory_bytes();
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  if (!bytes)
    return resource_exhausted("[model config] the parameter count of {} layers × d_model {} × d_ff {}, vocab {} "
                              "overflows int64", c.n_layers, c.d_model, c.d_ff, c.vocab_size);
  if (*bytes > limit)
    return resource_exhausted("[model config] {} parameters need {:.1f} GiB (fp32 weights and gradients), more than "
                              "the {:.1f} GiB of memory here", *checked_num_params(c), static_cast<double>(*bytes) / kGiB,
                              static_cast<double>(limit) / kGiB);
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

std::vector<std::string> preset_names() {
  return {"gpt2-124m", "w1a", "llama-tiny", "w2-s", "w2-l", "llama-moe-tiny", "w1-moe", "llama-mla-tiny"};
}

Expected<ModelConfig> preset(std::string_view name) {
  if (name == "gpt2-124m") return gpt2(50257, 768, 12, 12, 1024);
  if (name == "w1a") return gpt2(65, 384, 6, 6, 256);                   // BENCH.md W1a
  if (name == "llama-tiny") return llama(4096, 384, 6, 6, 2, 1024, 256, true);  // ~10M params
  if (name == "llama-mla-tiny") {
    // llama-tiny with DeepSeek-V3's multi-head latent attention: per head a 48 + 16 qk head and a
    // 64 value head from a latent of 128 (cache rows of 144 floats instead of 2 · 2 · 64 = 256).
    ModelConfig c = llama(4096, 384, 6, 6, 6, 1024, 256, true);
    c.kv_lora_rank = 128;
    c.qk_nope_head_dim = 48;
    c.qk_rope_head_dim = 16;
    c.v_head_dim = 64;
    c.rope_interleave = true;
    return c;
  }
  if (name == "llama-moe-tiny" || name == "w1-moe") {
    // llama-tiny's width with 8 experts, top-2, every block MoE (d_ff is the experts' width, as
    // Mixtral's intermediate_size). llama-moe-tiny's experts are half as wide, so a token's
    // active FLOPs are llama-tiny's (the dense model to compare with); w1-moe (BENCH.md W1-MoE)
    // has experts as wide as llama-tiny's MLP.
    ModelConfig c = llama(4096, 384, 6, 6, 2, name == "w1-moe" ? 1024 : 512, 256, true);
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.router_aux_loss_coef = 0.01;
    c.router_z_loss_coef = 0.001;
    return c;
  }
  if (name == "w2-s") return llama(32000, 768, 12, 12, 4, 2048, 2048, false);
  if (name == "w2-l") return llama(32000, 2048, 22, 32, 4, 5632, 2048, false);  // TinyLlama-1.1B shape
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  return invalid_argument("unknown preset '{}' (known: {})", name, names);
}

}  // namespace kiln
