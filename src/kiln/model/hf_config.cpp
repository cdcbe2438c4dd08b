// HF config.json <-> ModelConfig: the keys of LlamaForCausalLM and GPT2LMHeadModel.
#include "kiln/model/hf_config.h"
#include "kiln/core/json.h"

#include <nlohmann/json.hpp>

namespace kiln {

std::string config_to_hf_json(const ModelConfig& c) {
  nlohmann::ordered_json j;
  if (c.family == ModelFamily::kGpt2) {
    j = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", c.vocab_size},
         {"n_embd", c.d_model}, {"n_layer", c.n_layers}, {"n_head", c.n_heads}, {"n_inner", c.d_ff},
         {"n_positions", c.max_seq_len}, {"n_ctx", c.max_seq_len}, {"layer_norm_epsilon", c.norm_eps},
         {"activation_function", "gelu_new"}, {"tie_word_embeddings", c.tied_embeddings},
         {"torch_dtype", "float32"}};
  } else {
    j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", c.vocab_size},
         {"hidden_size", c.d_model}, {"num_hidden_layers", c.n_layers}, {"num_attention_heads", c.n_heads},
         {"num_key_value_heads", c.n_kv_heads}, {"intermediate_size", c.d_ff},
         {"max_position_embeddings", c.max_seq_len}, {"rms_norm_eps", c.norm_eps}, {"rope_theta", c.rope_theta},
         {"hidden_act", "silu"}, {"tie_word_embeddings", c.tied_embeddings}, {"attention_bias", false},
         {"mlp_bias", false}, {"torch_dtype", "float32"}};
  }
  return j.dump(2);
}

Expected<ModelConfig> config_from_hf_json(const std::string& text) {
  auto parsed = parse_json(text, "config.json");
  if (!parsed.ok()) return data_loss("{}", parsed.status().message());
  const nlohmann::json j = std::move(*parsed);
  if (!j.is_object()) return data_loss("config.json is not a JSON object");
  const std::string type = j.value("model_type", std::string());
  auto get = [&](const char* key, int64_t fallback) -> Expected<int64_t> {
    if (!j.contains(key)) {
      if (fallback >= 0) return fallback;
      return data_loss("config.json lacks \"{}\"", key);
    }
    if (!j[key].is_number_integer()) return data_loss("config.json \"{}\" is not an integer", key);
    return j[key].get<int64_t>();
  };
  ModelConfig c;
  if (type == "gpt2") {
    c.family = ModelFamily::kGpt2;
    KILN_ASSIGN_OR_RETURN(c.vocab_size, get("vocab_size", -1));
    KILN_ASSIGN_OR_RETURN(c.d_model, get("n_embd", -1));
    KILN_ASSIGN_OR_RETURN(c.n_layers, get("n_layer", -1));
    KILN_ASSIGN_OR_RETURN(c.n_heads, get("n_head", -1));
    c.n_kv_heads = c.n_heads;
    KILN_ASSIGN_OR_RETURN(c.max_seq_len, get("n_positions", 1024));
    c.d_ff = (j.contains("n_inner") && j["n_inner"].is_number_integer()) ? j["n_inner"].get<int64_t>() : 4 * c.d_model;
    c.norm_eps = j.value("layer_norm_epsilon", 1e-5f);
    c.tied_embeddings = j.value("tie_word_embeddings", true);
    const std::string act = j.value("activation_function", std::string("gelu_new"));
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      return unimplemented("GPT-2 activation_function '{}' (kiln implements the tanh GELU, gelu_new)", act);
  } else if (type == "llama") {
    c.family = ModelFamily::kLlama;
    KILN_ASSIGN_OR_RETURN(c.vocab_size, get("vocab_size", -1));
    KILN_ASSIGN_OR_RETURN(c.d_model, get("hidden_size", -1));
    KILN_ASSIGN_OR_RETURN(c.n_layers, get("num_hidden_layers", -1));
    KILN_ASSIGN_OR_RETURN(c.n_heads, get("num_attention_heads", -1));
    KILN_ASSIGN_OR_RETURN(c.n_kv_heads, get("num_key_value_heads", c.n_heads));
    KILN_ASSIGN_OR_RETURN(c.d_ff, get("intermediate_size", -1));
    KILN_ASSIGN_OR_RETURN(c.max_seq_len, get("max_position_embeddings", 2048));
    c.norm_eps = j.value("rms_norm_eps", 1e-6f);
    c.rope_theta = j.value("rope_theta", 10000.0);
    c.tied_embeddings = j.value("tie_word_embeddings", false);
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
      return unimplemented("Llama rope_scaling is not supported");
    if (j.value("hidden_act", std::string("silu")) != "silu")
      return unimplemented("Llama hidden_act '{}' (kiln implements silu)", j.value("hidden_act", std::string()));
  } else {
    return unimplemented("model_type '{}' (kiln loads 'llama' and 'gpt2')", type);
  }
  KILN_RETURN_IF_ERROR(check_config(c));
  return c;
}

}  // namespace kiln
