// HF config.json <-> ModelConfig: the keys of LlamaForCausalLM and GPT2LMHeadModel, as
// transformers 4.x and 5.x write them. Every key of a file is one of three kinds:
//   read      kiln implements what it says; its type and range are checked here (an error names
//             the key), values kiln does not implement are Unimplemented errors naming the key;
//   harmless  it cannot change what the causal LM computes in fp32 (metadata, special token ids
//             other than bos/eos, dropout rates — kiln has no dropout —, generation defaults,
//             output switches, initialization), listed in kHarmless below;
//   unknown   anything else, and keys starting with "_" are HF's own bookkeeping (harmless).
// An unknown key is an error (Unimplemented) naming it: a setting kiln does not know may change
// the model, and loading it silently could compute another one. Cross-field rules and the
// memory bound are check_config's (config.h).
#include "kiln/model/hf_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kiln/core/checked_math.h"
#include "kiln/core/json.h"

namespace kiln {
namespace {

using nlohmann::json;

// Keys that do not change the computation of a causal LM in fp32, for both families.
constexpr std::string_view kHarmless[] = {
    // metadata
    "architectures", "transformers_version", "torch_dtype", "dtype", "id2label", "label2id", "num_labels",
    "problem_type", "finetuning_task", "tokenizer_class", "prefix", "task_specific_params",
    // special token ids other than bos/eos (kiln reads those)
    "pad_token_id", "sep_token_id", "decoder_start_token_id",
    // runtime switches of the HF implementation, the same math either way
    "use_cache", "output_attentions", "output_hidden_states", "return_dict", "torchscript", "output_scores",
    "return_dict_in_generate", "chunk_size_feed_forward", "use_bfloat16", "tf_legacy_loss", "is_decoder",
    "tie_encoder_decoder", "cross_attention_hidden_size",
    // initialization only
    "initializer_range",
    // dropout (only while training; kiln trains without dropout)
    "attention_dropout", "attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_first_dropout",
    // generation defaults of transformers 4.x (kiln's sampler takes its own)
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens",
};
// GPT-2 only: the sequence-summary head of GPT2DoubleHeadsModel (not part of the LM), the
// legacy context key (n_positions is read) and the fp32 upcast of attention (kiln is fp32).
constexpr std::string_view kHarmlessGpt2[] = {"summary_type", "summary_use_proj", "summary_activation",
                                              "summary_proj_to_labels", "n_ctx", "reorder_and_upcast_attn"};

// A JSON value for an error message, cut short.
std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

// Reads the keys of one JSON object, recording which were read; every error names the key
// (`where` is the object's path, e.g. "config.json" or "config.json rope_parameters").
class Keys {
 public:
  Keys(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  bool has(const char* key) { used_.insert(key); return j_.contains(key) && !j_[key].is_null(); }
  const json& at(const char* key) const { return j_[key]; }

  // An integer in [lo, hi]; `fallback` when absent or null (an error when there is none).
  Expected<int64_t> integer(const char* key, std::optional<int64_t> fallback, int64_t lo = 1,
                            int64_t hi = std::numeric_limits<int64_t>::max()) {
    if (!has(key)) {
      if (fallback) return *fallback;
      return invalid_argument("{} lacks \"{}\"", where_, key);
    }
    const json& v = j_[key];
    if (!v.is_number_integer())
      return invalid_argument("{} \"{}\" must be an integer, got {}", where_, key, shown(v));
    const std::string range = hi == std::numeric_limits<int64_t>::max() ? fmt::format("must be at least {}", lo)
                                                                        : fmt::format("must be in [{}, {}]", lo, hi);
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return invalid_argument("{} \"{}\" {} {}", where_, key, shown(v), range);
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) return invalid_argument("{} \"{}\" {} {}", where_, key, x, range);
    return x;
  }
  // A finite number (integer or float) > lo (or >= lo when inclusive).
  Expected<double> number(const char* key, std::optional<double> fallback, double lo, bool inclusive = false) {
    if (!has(key)) {
      if (fallback) return *fallback;
      return invalid_argument("{} lacks \"{}\"", where_, key);
    }
    const json& v = j_[key];
    if (!v.is_number()) return invalid_argument("{} \"{}\" must be a number, got {}", where_, key, shown(v));
    const double x = v.get<double>();
    if (!std::isfinite(x) || (inclusive ? x < lo : x <= lo))
      return invalid_argument("{} \"{}\" must be finite and {} {}, got {}", where_, key, inclusive ? ">=" : ">", lo, x);
    return x;
  }
  Expected<bool> boolean(const char* key, bool fallback) {
    if (!has(key)) return fallback;
    if (!j_[key].is_boolean())
      return invalid_argument("{} \"{}\" must be true or false, got {}", where_, key, shown(j_[key]));
    return j_[key].get<bool>();
  }
  Expected<std::string> string(const char* key, const char* fallback) {
    if (!has(key)) return std::string(fallback);
    if (!j_[key].is_string()) return invalid_argument("{} \"{}\" must be a string, got {}", where_, key, shown(j_[key]));
    return j_[key].get<std::string>();
  }
  // A key kiln implements only at one value: `ok` says whether v is that value.
  template <class Ok>
  Status only(const char* key, Ok ok, const char* what) {
    if (!j_.contains(key)) { used_.insert(key); return {}; }
    used_.insert(key);
    if (!ok(j_[key])) return unimplemented("{} \"{}\" is {}: kiln implements only {}", where_, key, shown(j_[key]), what);
    return {};
  }
  // The first key that was neither read nor listed harmless (nor starts with "_").
  Status no_unknown(std::span<const std::string_view> harmless1, std::span<const std::string_view> harmless2) const {
    for (const auto& item : j_.items()) {
      const std::string& key = item.key();  // not a structured binding: clang 14 cannot capture one
      if (used_.count(key) || key.starts_with("_")) continue;
      const auto listed = [&](std::span<const std::string_view> t) { return std::find(t.begin(), t.end(), key) != t.end(); };
      if (listed(harmless1) || listed(harmless2)) continue;
      return unimplemented("{} has key \"{}\" that kiln does not know; it may change the model, so kiln refuses to "
                           "guess (known harmless keys are listed in src/kiln/model/hf_config.cpp)", where_, key);
    }
    return {};
  }

 private:
  const json& j_;
  std::string where_;
  std::set<std::string, std::less<>> used_;
};

// bos_token_id / eos_token_id: an id, null, or a list of ids (the first is kept).
Expected<int64_t> token_id(Keys& k, const char* key) {
  if (!k.has(key)) return int64_t{-1};
  const json& v = k.at(key);
  const auto is_id = [](const json& e) {
    return e.is_number_integer() && e >= 0 && e <= std::numeric_limits<int32_t>::max();
  };
  if (is_id(v)) return v.get<int64_t>();
  if (v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), is_id)) return v[0].get<int64_t>();
  return invalid_argument("config.json \"{}\" must be a token id (0 to 2^31 - 1), a list of them or null, got {}", key,
                          shown(v));
}

// A float32 from a double the reader checked: zero or infinite after rounding is an error.
Expected<float> to_f32(double x, const char* key) {
  const float f = static_cast<float>(x);
  if (!(f > 0.0f) || !std::isfinite(f))
    return invalid_argument("config.json \"{}\" {} does not fit a positive float32", key, x);
  return f;
}

// Llama's RoPE: transformers 5 keeps rope_theta and the scaling in "rope_parameters"; 4.x has
// top-level "rope_theta" and "rope_scaling" (with "type" or "rope_type"). As transformers does,
// a non-empty rope_scaling wins over rope_parameters, and rope_theta inside the dict over the
// top-level one.
Status read_rope(Keys& top, const json& j, int64_t max_positions, ModelConfig& c) {
  KILN_ASSIGN_OR_RETURN(c.rope_theta, top.number("rope_theta", 10000.0, 1.0));
  const bool has_scaling = top.has("rope_scaling"), has_params = top.has("rope_parameters");
  const char* name = has_scaling && !(j["rope_scaling"].is_object() && j["rope_scaling"].empty()) ? "rope_scaling"
                     : has_params                                                                 ? "rope_parameters"
                                                                                                  : nullptr;
  // Phi-3 style: a top-level original_max_position_embeddings wins (as in transformers).
  KILN_ASSIGN_OR_RETURN(const int64_t top_original,
                        top.integer("original_max_position_embeddings", int64_t{0}, 1, std::numeric_limits<int32_t>::max()));
  if (name == nullptr) return {};
  const json& d = j[name];
  if (!d.is_object()) return invalid_argument("config.json \"{}\" must be an object, got {}", name, shown(d));
  Keys k(d, fmt::format("config.json \"{}\"", name));
  KILN_ASSIGN_OR_RETURN(const std::string type_old, k.string("type", "default"));
  KILN_ASSIGN_OR_RETURN(const std::string type, k.string("rope_type", type_old.c_str()));
  KILN_ASSIGN_OR_RETURN(c.rope_theta, k.number("rope_theta", c.rope_theta, 1.0));
  KILN_RETURN_IF_ERROR(k.only("partial_rotary_factor", [](const json& v) { return v.is_null() || v == 1 || v == 1.0; },
                              "1 (the whole head rotated)"));
  RopeScaling& s = c.rope_scaling;
  auto original = [&]() -> Expected<int64_t> {
    KILN_ASSIGN_OR_RETURN(const int64_t o, k.integer("original_max_position_embeddings", max_positions, 1,
                                                     std::numeric_limits<int32_t>::max()));
    return top_original > 0 ? top_original : o;
  };
  if (type == "default") {
    s.type = RopeType::kDefault;
  } else if (type == "linear") {
    s.type = RopeType::kLinear;
    KILN_ASSIGN_OR_RETURN(s.factor, k.number("factor", std::nullopt, 0.0));
  } else if (type == "llama3") {
    s.type = RopeType::kLlama3;
    KILN_ASSIGN_OR_RETURN(s.factor, k.number("factor", std::nullopt, 0.0));
    KILN_ASSIGN_OR_RETURN(s.low_freq_factor, k.number("low_freq_factor", std::nullopt, 0.0));
    KILN_ASSIGN_OR_RETURN(s.high_freq_factor, k.number("high_freq_factor", std::nullopt, 0.0));
    KILN_ASSIGN_OR_RETURN(s.original_max_positions, original());
  } else if (type == "yarn") {
    s.type = RopeType::kYarn;
    KILN_ASSIGN_OR_RETURN(s.original_max_positions, original());
    // A null factor is the context ratio (as transformers does for DeepSeek-V3).
    KILN_ASSIGN_OR_RETURN(s.factor, k.number("factor", static_cast<double>(max_positions) /
                                                           static_cast<double>(s.original_max_positions), 0.0));
    KILN_ASSIGN_OR_RETURN(s.attention_factor, k.number("attention_factor", 0.0, 0.0));  // absent: derived
    // transformers takes 0 or null as the defaults 32 and 1.
    KILN_ASSIGN_OR_RETURN(s.beta_fast, k.number("beta_fast", 32.0, 0.0, true));
    KILN_ASSIGN_OR_RETURN(s.beta_slow, k.number("beta_slow", 1.0, 0.0, true));
    if (s.beta_fast == 0) s.beta_fast = 32.0;
    if (s.beta_slow == 0) s.beta_slow = 1.0;
    KILN_ASSIGN_OR_RETURN(s.mscale, k.number("mscale", 0.0, 0.0, true));
    KILN_ASSIGN_OR_RETURN(s.mscale_all_dim, k.number("mscale_all_dim", 0.0, 0.0, true));
    KILN_ASSIGN_OR_RETURN(s.truncate, k.boolean("truncate", true));
  } else {
    return unimplemented("config.json \"{}\" rope_type '{}' (kiln implements default, linear, llama3 and yarn)", name,
                         type);
  }
  if (Status st = check_rope_scaling(s); !st.ok()) return invalid_argument("config.json \"{}\": {}", name, st.message());
  // The pretraining context means nothing to default and linear RoPE (transformers ignores it).
  static constexpr std::string_view kUnused[] = {"original_max_position_embeddings"};
  return k.no_unknown(kUnused, {});
}

Expected<ModelConfig> read_gpt2(Keys& k) {
  ModelConfig c;
  c.family = ModelFamily::kGpt2;
  constexpr int64_t kI32 = std::numeric_limits<int32_t>::max();
  KILN_ASSIGN_OR_RETURN(c.vocab_size, k.integer("vocab_size", std::nullopt, 1, kI32));
  KILN_ASSIGN_OR_RETURN(c.d_model, k.integer("n_embd", std::nullopt));
  KILN_ASSIGN_OR_RETURN(c.n_layers, k.integer("n_layer", std::nullopt));
  KILN_ASSIGN_OR_RETURN(c.n_heads, k.integer("n_head", std::nullopt));
  c.n_kv_heads = c.n_heads;
  KILN_ASSIGN_OR_RETURN(c.max_seq_len, k.integer("n_positions", int64_t{1024}, 1, kI32));
  // n_inner null (or absent) is 4 · n_embd, as in transformers.
  KILN_ASSIGN_OR_RETURN(c.d_ff, k.integer("n_inner", checked_mul<int64_t>(4, c.d_model).value_or(-1)));
  KILN_ASSIGN_OR_RETURN(const double eps, k.number("layer_norm_epsilon", 1e-5, 0.0));
  KILN_ASSIGN_OR_RETURN(c.norm_eps, to_f32(eps, "layer_norm_epsilon"));
  KILN_ASSIGN_OR_RETURN(c.tied_embeddings, k.boolean("tie_word_embeddings", true));
  KILN_ASSIGN_OR_RETURN(c.scale_attn_weights, k.boolean("scale_attn_weights", true));
  KILN_ASSIGN_OR_RETURN(c.scale_attn_by_inverse_layer_idx, k.boolean("scale_attn_by_inverse_layer_idx", false));
  KILN_ASSIGN_OR_RETURN(const std::string act, k.string("activation_function", "gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    return unimplemented("config.json \"activation_function\" '{}' (kiln implements the tanh GELU: gelu_new, "
                         "gelu_pytorch_tanh)", act);
  KILN_RETURN_IF_ERROR(k.only("add_cross_attention", [](const json& v) { return v.is_null() || v == false; }, "false"));
  return c;
}

// check_head_dim: head_dim, when present, must be hidden_size / num_attention_heads (DeepSeek-V3
// writes the rope dims there instead: its reader checks it).
Expected<ModelConfig> read_llama(Keys& k, const json& j, bool check_head_dim = true) {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  constexpr int64_t kI32 = std::numeric_limits<int32_t>::max();
  KILN_ASSIGN_OR_RETURN(c.vocab_size, k.integer("vocab_size", std::nullopt, 1, kI32));
  KILN_ASSIGN_OR_RETURN(c.d_model, k.integer("hidden_size", std::nullopt));
  KILN_ASSIGN_OR_RETURN(c.n_layers, k.integer("num_hidden_layers", std::nullopt));
  KILN_ASSIGN_OR_RETURN(c.n_heads, k.integer("num_attention_heads", std::nullopt));
  KILN_ASSIGN_OR_RETURN(c.n_kv_heads, k.integer("num_key_value_heads", c.n_heads));
  KILN_ASSIGN_OR_RETURN(c.d_ff, k.integer("intermediate_size", std::nullopt));
  KILN_ASSIGN_OR_RETURN(c.max_seq_len, k.integer("max_position_embeddings", int64_t{2048}, 1, kI32));
  KILN_ASSIGN_OR_RETURN(const double eps, k.number("rms_norm_eps", 1e-6, 0.0));
  KILN_ASSIGN_OR_RETURN(c.norm_eps, to_f32(eps, "rms_norm_eps"));
  KILN_ASSIGN_OR_RETURN(c.tied_embeddings, k.boolean("tie_word_embeddings", false));
  KILN_ASSIGN_OR_RETURN(c.attention_bias, k.boolean("attention_bias", false));
  KILN_ASSIGN_OR_RETURN(c.mlp_bias, k.boolean("mlp_bias", false));
  KILN_ASSIGN_OR_RETURN(const std::string act, k.string("hidden_act", "silu"));
  if (act != "silu" && act != "swish")  // transformers maps both to SiLU
    return unimplemented("config.json \"hidden_act\" '{}' (kiln implements silu)", act);
  // head_dim decoupled from hidden_size / heads changes the projections' shapes.
  const int64_t derived = c.d_model % c.n_heads == 0 ? c.d_model / c.n_heads : -1;
  if (check_head_dim)
    KILN_RETURN_IF_ERROR(k.only("head_dim", [&](const json& v) {
      return v.is_null() || (derived > 0 && v.is_number_integer() && v == derived);
    }, fmt::format("hidden_size / num_attention_heads = {}", derived).c_str()));
  KILN_RETURN_IF_ERROR(k.only("sliding_window", [](const json& v) { return v.is_null(); }, "null (full attention)"));
  KILN_RETURN_IF_ERROR(k.only("partial_rotary_factor", [](const json& v) { return v.is_null() || v == 1 || v == 1.0; },
                              "1 (the whole head rotated)"));
  // pretraining_tp > 1 made transformers 4.x split each projection into that many slices
  // and sum them: the same function (transformers 5 ignores it). A positive integer is fine.
  KILN_RETURN_IF_ERROR(k.integer("pretraining_tp", int64_t{1}).status());
  KILN_RETURN_IF_ERROR(read_rope(k, j, c.max_seq_len, c));
  return c;
}

// DeepSeek-V3 with every block dense (first_k_dense_replace >= num_hidden_layers): Llama plus
// multi-head latent attention. Its MoE blocks (sigmoid-scored, group-limited routing with a
// bias correction) are not kiln's router: refused by name. head_dim is the rope width there.
Expected<ModelConfig> read_deepseek_v3(Keys& k, const json& j) {
  KILN_ASSIGN_OR_RETURN(ModelConfig c, read_llama(k, j, false));
  auto nullable = [&](const char* key) -> Expected<int64_t> {
    if (!k.has(key) || j[key].is_null()) {
      KILN_RETURN_IF_ERROR(k.only(key, [](const json& v) { return v.is_null(); }, "null"));
      return int64_t{0};
    }
    return k.integer(key, std::nullopt, 1);
  };
  KILN_ASSIGN_OR_RETURN(c.q_lora_rank, nullable("q_lora_rank"));
  KILN_ASSIGN_OR_RETURN(c.kv_lora_rank, k.integer("kv_lora_rank", std::nullopt, 1));
  KILN_ASSIGN_OR_RETURN(c.qk_nope_head_dim, k.integer("qk_nope_head_dim", std::nullopt, 1));
  KILN_ASSIGN_OR_RETURN(c.qk_rope_head_dim, k.integer("qk_rope_head_dim", std::nullopt, 1));
  KILN_ASSIGN_OR_RETURN(c.v_head_dim, k.integer("v_head_dim", std::nullopt, 1));
  KILN_ASSIGN_OR_RETURN(c.rope_interleave, k.boolean("rope_interleave", true));
  const int64_t rope = c.qk_rope_head_dim, qk = c.qk_head_dim();
  KILN_RETURN_IF_ERROR(k.only("head_dim", [&](const json& v) { return v.is_null() || v == rope; },
                              fmt::format("qk_rope_head_dim = {}", rope).c_str()));
  KILN_RETURN_IF_ERROR(k.only("qk_head_dim", [&](const json& v) { return v.is_null() || v == qk; },
                              fmt::format("qk_nope_head_dim + qk_rope_head_dim = {}", qk).c_str()));
  KILN_ASSIGN_OR_RETURN(const int64_t dense, k.integer("first_k_dense_replace", int64_t{0}, 0));
  if (dense < c.n_layers)
    return unimplemented("config.json \"first_k_dense_replace\" {} < num_hidden_layers {}: DeepSeek-V3's MoE blocks "
                         "(sigmoid-scored, group-limited routing) are not implemented; kiln loads its dense blocks with "
                         "multi-head latent attention", dense, c.n_layers);
  // The MoE and multi-token-prediction settings of blocks this model does not have.
  for (const char* key : {"n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                          "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor", "topk_method",
                          "scoring_func", "moe_layer_freq", "ep_size", "aux_loss_alpha", "seq_aux",
                          "num_nextn_predict_layers", "output_router_logits"})
    KILN_RETURN_IF_ERROR(k.only(key, [](const json&) { return true; }, "any (no MoE block)"));
  return c;
}

// Mixtral: Llama plus the MoE keys (intermediate_size is the experts' width). kiln's own
// extensions (shared experts, dense blocks between MoE ones, capacity, the z-loss) have keys
// transformers' Mixtral ignores; they are written only when not at their Mixtral defaults.
Expected<ModelConfig> read_mixtral(Keys& k, const json& j) {
  KILN_ASSIGN_OR_RETURN(ModelConfig c, read_llama(k, j));
  KILN_ASSIGN_OR_RETURN(c.num_experts, k.integer("num_local_experts", int64_t{8}, 1));
  KILN_ASSIGN_OR_RETURN(c.num_experts_per_tok, k.integer("num_experts_per_tok", int64_t{2}, 1));
  KILN_ASSIGN_OR_RETURN(c.router_aux_loss_coef, k.number("router_aux_loss_coef", 0.001, 0.0, true));
  KILN_ASSIGN_OR_RETURN(c.router_z_loss_coef, k.number("router_z_loss_coef", 0.0, 0.0, true));
  KILN_ASSIGN_OR_RETURN(c.num_shared_experts, k.integer("num_shared_experts", int64_t{0}, 0));
  KILN_ASSIGN_OR_RETURN(c.moe_layer_freq, k.integer("moe_layer_freq", int64_t{1}, 1));
  KILN_ASSIGN_OR_RETURN(c.moe_d_ff, k.integer("moe_intermediate_size", int64_t{0}, 0));
  KILN_ASSIGN_OR_RETURN(c.capacity_factor, k.number("capacity_factor", 0.0, 0.0, true));
  // Training-time noise on the router's input; kiln trains without it.
  KILN_RETURN_IF_ERROR(k.only("router_jitter_noise", [](const json& v) { return v.is_null() || v == 0 || v == 0.0; },
                              "0 (kiln has no router jitter)"));
  KILN_RETURN_IF_ERROR(k.boolean("output_router_logits", false).status());  // what HF returns, not the math
  return c;
}

}  // namespace

std::string config_to_hf_json(const ModelConfig& c) {
  nlohmann::ordered_json j;
  auto id = [](int64_t v) { return v >= 0 ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr); };
  // The float32 epsilon as its shortest decimal (1e-06, not 9.999999974752427e-07).
  const double eps = std::stod(fmt::format("{}", c.norm_eps));
  if (c.family == ModelFamily::kGpt2) {
    j = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", c.vocab_size},
         {"n_embd", c.d_model}, {"n_layer", c.n_layers}, {"n_head", c.n_heads}, {"n_inner", c.d_ff},
         {"n_positions", c.max_seq_len}, {"n_ctx", c.max_seq_len}, {"layer_norm_epsilon", eps},
         {"activation_function", "gelu_new"}, {"tie_word_embeddings", c.tied_embeddings},
         {"scale_attn_weights", c.scale_attn_weights},
         {"scale_attn_by_inverse_layer_idx", c.scale_attn_by_inverse_layer_idx}, {"torch_dtype", "float32"}};
  } else {
    // transformers 5 reads rope_parameters; 4.x reads rope_theta and rope_scaling: both are written.
    nlohmann::ordered_json rope = {{"rope_type", rope_type_name(c.rope_scaling.type)}, {"rope_theta", c.rope_theta}};
    const RopeScaling& s = c.rope_scaling;
    if (s.type != RopeType::kDefault) rope["factor"] = s.factor;
    if (s.type == RopeType::kLlama3) {
      rope["low_freq_factor"] = s.low_freq_factor;
      rope["high_freq_factor"] = s.high_freq_factor;
    }
    if (s.type == RopeType::kLlama3 || s.type == RopeType::kYarn)
      rope["original_max_position_embeddings"] = s.original_max_positions;
    if (s.type == RopeType::kYarn) {
      rope["beta_fast"] = s.beta_fast;
      rope["beta_slow"] = s.beta_slow;
      if (s.attention_factor > 0) rope["attention_factor"] = s.attention_factor;
      if (s.mscale > 0) rope["mscale"] = s.mscale;
      if (s.mscale_all_dim > 0) rope["mscale_all_dim"] = s.mscale_all_dim;
      rope["truncate"] = s.truncate;
    }
    j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", c.vocab_size},
         {"hidden_size", c.d_model}, {"num_hidden_layers", c.n_layers}, {"num_attention_heads", c.n_heads},
         {"num_key_value_heads", c.n_kv_heads}, {"head_dim", c.head_dim()}, {"intermediate_size", c.d_ff},
         {"max_position_embeddings", c.max_seq_len}, {"rms_norm_eps", eps}, {"rope_theta", c.rope_theta},
         {"rope_scaling", s.type == RopeType::kDefault ? nlohmann::ordered_json(nullptr) : rope},
         {"rope_parameters", rope}, {"hidden_act", "silu"}, {"tie_word_embeddings", c.tied_embeddings},
         {"attention_bias", c.attention_bias}, {"mlp_bias", c.mlp_bias}, {"torch_dtype", "float32"}};
    if (c.is_mla()) {  // DeepSeek-V3 with every block dense
      j["architectures"] = {"DeepseekV3ForCausalLM"};
      j["model_type"] = "deepseek_v3";
      j.erase("mlp_bias");
      j["head_dim"] = c.qk_rope_head_dim;  // transformers' convention for DeepSeek-V3
      j["qk_head_dim"] = c.qk_head_dim();
      j["q_lora_rank"] = c.q_lora_rank > 0 ? nlohmann::ordered_json(c.q_lora_rank) : nlohmann::ordered_json(nullptr);
      j["kv_lora_rank"] = c.kv_lora_rank;
      j["qk_nope_head_dim"] = c.qk_nope_head_dim;
      j["qk_rope_head_dim"] = c.qk_rope_head_dim;
      j["v_head_dim"] = c.v_head_dim;
      j["rope_interleave"] = c.rope_interleave;
      j["first_k_dense_replace"] = c.n_layers;
      j["num_nextn_predict_layers"] = 0;
    }
    if (c.is_moe()) {
      j["architectures"] = {"MixtralForCausalLM"};
      j["model_type"] = "mixtral";
      j.erase("mlp_bias");  // Mixtral's experts have none (check_config)
      // Every block MoE (Mixtral): intermediate_size is the experts' width (a moe_d_ff there
      // reads back as d_ff: the dense width no block uses is not kept).
      const bool all_moe = c.moe_layer_freq == 1;
      j["intermediate_size"] = all_moe ? c.expert_d_ff() : c.d_ff;
      j["num_local_experts"] = c.num_experts;
      j["num_experts_per_tok"] = c.num_experts_per_tok;
      j["router_aux_loss_coef"] = c.router_aux_loss_coef;
      j["router_jitter_noise"] = 0.0;
      j["sliding_window"] = nullptr;
      if (c.router_z_loss_coef != 0) j["router_z_loss_coef"] = c.router_z_loss_coef;
      if (c.num_shared_experts != 0) j["num_shared_experts"] = c.num_shared_experts;
      if (!all_moe) {
        j["moe_layer_freq"] = c.moe_layer_freq;
        j["moe_intermediate_size"] = c.expert_d_ff();
      }
      if (c.capacity_factor != 0) j["capacity_factor"] = c.capacity_factor;
    }
  }
  // Always written, null when unknown: transformers would otherwise assume its defaults
  // (Llama: 1 and 2, GPT-2: 50256).
  j["bos_token_id"] = id(c.bos_token_id);
  j["eos_token_id"] = id(c.eos_token_id);
  return j.dump(2);
}

Expected<ModelConfig> config_from_hf_json(const std::string& text) {
  auto parsed = parse_json(text, "config.json");
  if (!parsed.ok()) return data_loss("{}", parsed.status().message());
  const json j = std::move(*parsed);
  if (!j.is_object()) return data_loss("config.json is not a JSON object");
  Keys k(j, "config.json");
  KILN_ASSIGN_OR_RETURN(const std::string type, k.string("model_type", ""));
  Expected<ModelConfig> read = type == "gpt2"      ? read_gpt2(k)
                               : type == "llama"   ? read_llama(k, j)
                               : type == "mixtral" ? read_mixtral(k, j)
                               : type == "deepseek_v3" ? read_deepseek_v3(k, j)
                                                   : Expected<ModelConfig>(unimplemented(
                                                         "config.json \"model_type\" '{}' (kiln loads 'llama', 'mixtral', "
                                                         "'deepseek_v3' and 'gpt2')", type));
  if (!read.ok()) return read.status();
  ModelConfig c = *read;
  KILN_ASSIGN_OR_RETURN(c.bos_token_id, token_id(k, "bos_token_id"));
  KILN_ASSIGN_OR_RETURN(c.eos_token_id, token_id(k, "eos_token_id"));
  // Other models behind these configs (GPT2ForSequenceClassification, an encoder-decoder).
  KILN_RETURN_IF_ERROR(k.only("is_encoder_decoder", [](const json& v) { return v.is_null() || v == false; }, "false"));
  KILN_RETURN_IF_ERROR(k.only("pruned_heads", [](const json& v) { return v.is_null() || v.empty(); }, "no pruned heads"));
  KILN_RETURN_IF_ERROR(k.only("quantization_config", [](const json& v) { return v.is_null(); },
                              "unquantized checkpoints here (kiln quantize makes its own)"));
  if (j.contains("architectures") && !j["architectures"].is_null()) {
    const json& a = j["architectures"];
    const char* want = type == "gpt2"            ? "GPT2LMHeadModel"
                       : type == "mixtral"     ? "MixtralForCausalLM"
                       : type == "deepseek_v3" ? "DeepseekV3ForCausalLM"
                                               : "LlamaForCausalLM";
    if (!a.is_array() || !std::all_of(a.begin(), a.end(), [](const json& e) { return e.is_string(); }))
      return invalid_argument("config.json \"architectures\" must be a list of class names, got {}", shown(a));
    for (const json& e : a) {
      const std::string& name = e.get_ref<const std::string&>();
      if (!name.ends_with("ForCausalLM") && !name.ends_with("LMHeadModel"))
        return unimplemented("config.json \"architectures\" names {}: kiln runs the causal LM ({})", name, want);
    }
  }
  const std::span<const std::string_view> extra =
      type == "gpt2" ? std::span<const std::string_view>(kHarmlessGpt2) : std::span<const std::string_view>();
  KILN_RETURN_IF_ERROR(k.no_unknown(kHarmless, extra));
  KILN_RETURN_IF_ERROR(check_config(c));
  return c;
}

}  // namespace kiln
