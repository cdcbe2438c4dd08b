// HF config.json handling: every key read with its type and range checked (one error naming the
// key, never a crash or an exception), unimplemented settings refused by name, unknown keys
// refused, the harmless ones accepted; RoPE scalings against transformers' frequencies; the
// memory a config implies checked before anything is allocated; configs round-trip.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "kiln/core/rng.h"
#include "kiln/model/gguf.h"
#include "kiln/model/hf_config.h"
#include "kiln/model/transformer.h"
#include "kiln/model/weights.h"

namespace kiln {
namespace {

using nlohmann::json;

json llama_json() {
  return {{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 97},
          {"hidden_size", 32},     {"num_hidden_layers", 2},                  {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"intermediate_size", 48},             {"max_position_embeddings", 64}};
}
json gpt2_json() {
  return {{"model_type", "gpt2"}, {"vocab_size", 97}, {"n_embd", 32}, {"n_layer", 2}, {"n_head", 4},
          {"n_positions", 64}};
}

// The config's error: its code and message (which must name `key`), or a test failure.
Status error_of(const json& j) {
  auto r = config_from_hf_json(j.dump());
  EXPECT_FALSE(r.ok()) << j.dump();
  return r.ok() ? Status() : r.status();
}
void expect_error(const json& j, const std::string& key, StatusCode code) {
  const Status s = error_of(j);
  if (s.ok()) return;
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_NE(s.message().find(key), std::string::npos) << "'" << key << "' not named in: " << s.message();
}
json with(json j, const std::string& key, json v) {
  j[key] = std::move(v);
  return j;
}

TEST(HfConfig, TypeAndRangeErrorsNameTheKey) {
  const StatusCode kBad = StatusCode::kInvalidArgument;
  // A zero head count: a clear error, not SIGFPE in head_dim().
  expect_error(with(llama_json(), "num_attention_heads", 0), "num_attention_heads", kBad);
  expect_error(with(gpt2_json(), "n_head", 0), "n_head", kBad);
  expect_error(with(llama_json(), "num_key_value_heads", 0), "num_key_value_heads", kBad);
  // A string, a float, a bool where an integer belongs; negative sizes.
  expect_error(with(llama_json(), "hidden_size", "32"), "hidden_size", kBad);
  expect_error(with(llama_json(), "hidden_size", 32.0), "hidden_size", kBad);
  expect_error(with(llama_json(), "intermediate_size", true), "intermediate_size", kBad);
  expect_error(with(llama_json(), "num_hidden_layers", -2), "num_hidden_layers", kBad);
  expect_error(with(gpt2_json(), "n_embd", json::array({32})), "n_embd", kBad);
  expect_error(with(llama_json(), "vocab_size", uint64_t{18446744073709551615ull}), "vocab_size", kBad);
  expect_error(with(llama_json(), "vocab_size", int64_t{1} << 31), "vocab_size", kBad);  // token ids are int32
  expect_error(with(gpt2_json(), "n_positions", 1e9), "n_positions", kBad);
  // Missing required sizes.
  json no_layers = llama_json();
  no_layers.erase("num_hidden_layers");
  expect_error(no_layers, "num_hidden_layers", kBad);
  // Floats and booleans.
  expect_error(with(llama_json(), "rms_norm_eps", 0.0), "rms_norm_eps", kBad);
  expect_error(with(llama_json(), "rms_norm_eps", -1e-6), "rms_norm_eps", kBad);
  expect_error(with(llama_json(), "rms_norm_eps", "1e-6"), "rms_norm_eps", kBad);
  expect_error(with(llama_json(), "rms_norm_eps", 1e-50), "rms_norm_eps", kBad);  // 0 as float32
  expect_error(with(gpt2_json(), "layer_norm_epsilon", 1e300), "layer_norm_epsilon", kBad);
  expect_error(with(llama_json(), "rope_theta", 0.5), "rope_theta", kBad);
  expect_error(with(llama_json(), "tie_word_embeddings", 1), "tie_word_embeddings", kBad);
  expect_error(with(llama_json(), "attention_bias", "yes"), "attention_bias", kBad);
  expect_error(with(gpt2_json(), "scale_attn_weights", 0), "scale_attn_weights", kBad);
  expect_error(with(llama_json(), "hidden_act", 3), "hidden_act", kBad);
  expect_error(with(gpt2_json(), "n_inner", "big"), "n_inner", kBad);
  expect_error(with(gpt2_json(), "n_inner", 0), "n_inner", kBad);
  expect_error(with(llama_json(), "bos_token_id", "<s>"), "bos_token_id", kBad);
  expect_error(with(llama_json(), "eos_token_id", -5), "eos_token_id", kBad);
  expect_error(with(llama_json(), "eos_token_id", json::array({2, "x"})), "eos_token_id", kBad);
  expect_error(with(llama_json(), "pretraining_tp", 0), "pretraining_tp", kBad);
  expect_error(with(llama_json(), "architectures", "LlamaForCausalLM"), "architectures", kBad);
  // Cross-field (check_config): heads that do not divide.
  expect_error(with(llama_json(), "num_attention_heads", 5), "n_heads", kBad);
  expect_error(with(llama_json(), "num_key_value_heads", 3), "n_kv_heads", kBad);
  // Not JSON, not an object, no model_type.
  EXPECT_FALSE(config_from_hf_json("{\"model_type\": ").ok());
  EXPECT_FALSE(config_from_hf_json("[1, 2]").ok());
  json no_type = llama_json();
  no_type.erase("model_type");
  expect_error(no_type, "model_type", StatusCode::kUnimplemented);
  expect_error(with(llama_json(), "model_type", 7), "model_type", kBad);
}

TEST(HfConfig, HugeSizesAreRefusedBeforeAllocating) {
  // Each fits int64 but the weights would not fit in memory (or overflow the count): the error
  // says how much they need, nothing is allocated (no bad_alloc, no allocator abort).
  for (const auto& [key, v] : {std::pair{"hidden_size", int64_t{1} << 40}, std::pair{"intermediate_size", int64_t{1} << 50},
                               std::pair{"num_hidden_layers", int64_t{1} << 62}}) {
    const Status s = error_of(with(llama_json(), key, v));
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << key << ": " << s.message();
    EXPECT_TRUE(s.message().find("GiB") != std::string::npos || s.message().find("overflows") != std::string::npos)
        << s.message();
  }
  const Status ctx = error_of(with(llama_json(), "max_position_embeddings", int64_t{2'000'000'000}));  // RoPE table
  EXPECT_EQ(ctx.code(), StatusCode::kResourceExhausted) << ctx.message();
  const Status g = error_of(with(gpt2_json(), "n_positions", int64_t{2'000'000'000}));  // wpe
  EXPECT_EQ(g.code(), StatusCode::kResourceExhausted) << g.message();
}

TEST(HfConfig, UnimplementedSettingsAreRefusedByName) {
  const StatusCode kNo = StatusCode::kUnimplemented;
  expect_error(with(llama_json(), "hidden_act", "gelu"), "hidden_act", kNo);
  expect_error(with(gpt2_json(), "activation_function", "relu"), "activation_function", kNo);
  expect_error(with(llama_json(), "head_dim", 16), "head_dim", kNo);
  expect_error(with(llama_json(), "sliding_window", 4096), "sliding_window", kNo);
  expect_error(with(llama_json(), "partial_rotary_factor", 0.5), "partial_rotary_factor", kNo);
  expect_error(with(gpt2_json(), "add_cross_attention", true), "add_cross_attention", kNo);
  expect_error(with(llama_json(), "is_encoder_decoder", true), "is_encoder_decoder", kNo);
  expect_error(with(gpt2_json(), "pruned_heads", json{{"0", {1}}}), "pruned_heads", kNo);
  expect_error(with(llama_json(), "quantization_config", json{{"quant_method", "gptq"}}), "quantization_config", kNo);
  expect_error(with(llama_json(), "architectures", {"LlamaForSequenceClassification"}), "architectures", kNo);
  expect_error(with(llama_json(), "model_type", "mistral"), "mistral", kNo);
  // Keys kiln does not know: refused by name (also RoPE keys on GPT-2, which has no RoPE).
  expect_error(with(llama_json(), "use_magic_attention", true), "use_magic_attention", kNo);
  expect_error(with(gpt2_json(), "rope_theta", 10000.0), "rope_theta", kNo);
  expect_error(with(gpt2_json(), "attention_bias", true), "attention_bias", kNo);
  // RoPE types kiln does not implement, in both spellings.
  for (const char* type : {"dynamic", "longrope", "proportional", "su"}) {
    expect_error(with(llama_json(), "rope_parameters", {{"rope_type", type}, {"factor", 2.0}}), type, kNo);
    expect_error(with(llama_json(), "rope_scaling", {{"type", type}, {"factor", 2.0}}), type, kNo);
  }
  expect_error(with(llama_json(), "rope_parameters", {{"rope_type", "linear"}, {"factor", 2.0}, {"warp", 1}}), "warp", kNo);
}

TEST(HfConfig, RopeParametersAreValidated) {
  const StatusCode kBad = StatusCode::kInvalidArgument;
  auto rope = [](json p) { return with(llama_json(), "rope_parameters", std::move(p)); };
  expect_error(with(llama_json(), "rope_parameters", "linear"), "rope_parameters", kBad);
  expect_error(rope({{"rope_type", "linear"}}), "factor", kBad);  // required, as in transformers
  expect_error(rope({{"rope_type", "linear"}, {"factor", 0}}), "factor", kBad);
  expect_error(rope({{"rope_type", "linear"}, {"factor", "2"}}), "factor", kBad);
  expect_error(rope({{"rope_type", 3}}), "rope_type", kBad);
  expect_error(rope({{"rope_type", "default"}, {"rope_theta", -1.0}}), "rope_theta", kBad);
  expect_error(rope({{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}}), "high_freq_factor", kBad);
  expect_error(rope({{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0}, {"high_freq_factor", 4.0}}),
               "high_freq_factor", kBad);
  expect_error(rope({{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                     {"original_max_position_embeddings", 0}}), "original_max_position_embeddings", kBad);
  expect_error(rope({{"rope_type", "yarn"}, {"factor", -4.0}}), "factor", kBad);
  expect_error(rope({{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 0}}), "attention_factor", kBad);
  expect_error(rope({{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", -1}}), "beta_fast", kBad);
  expect_error(rope({{"rope_type", "yarn"}, {"factor", 4.0}, {"truncate", "no"}}), "truncate", kBad);
}

TEST(HfConfig, TransformersDefaultKeysLoad) {
  // The keys transformers 5.x writes for LlamaConfig() and GPT2Config() (small sizes).
  json l = llama_json();
  l.update(json::parse(R"({"attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "head_dim": 8, "hidden_act": "silu", "initializer_range": 0.02, "mlp_bias": false, "pad_token_id": null,
    "pretraining_tp": 1, "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "tie_word_embeddings": false, "transformers_version": "5.24.0", "use_cache": true, "dtype": "float32",
    "_name_or_path": "tiny", "output_attentions": false})"));
  auto lc = config_from_hf_json(l.dump());
  ASSERT_TRUE(lc.ok()) << lc.status().message();
  EXPECT_EQ(lc->bos_token_id, 1);
  EXPECT_EQ(lc->eos_token_id, 2);
  EXPECT_EQ(lc->norm_eps, 1e-6f);
  EXPECT_EQ(lc->rope_scaling.type, RopeType::kDefault);
  json g = gpt2_json();
  g.update(json::parse(R"({"activation_function": "gelu_new", "add_cross_attention": false, "attn_pdrop": 0.1,
    "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "n_inner": null, "pad_token_id": null, "reorder_and_upcast_attn": false,
    "resid_pdrop": 0.1, "scale_attn_by_inverse_layer_idx": false, "scale_attn_weights": true,
    "summary_activation": null, "summary_first_dropout": 0.1, "summary_proj_to_labels": true,
    "summary_type": "cls_index", "summary_use_proj": true, "tie_word_embeddings": true,
    "transformers_version": "5.24.0", "use_cache": true, "n_ctx": 64, "architectures": ["GPT2LMHeadModel"]})"));
  auto gc = config_from_hf_json(g.dump());
  ASSERT_TRUE(gc.ok()) << gc.status().message();
  EXPECT_EQ(gc->d_ff, 4 * 32);  // n_inner null
  EXPECT_EQ(gc->eos_token_id, 50256);
  EXPECT_TRUE(gc->scale_attn_weights);
  // pretraining_tp > 1 is the same function (transformers 4.x sliced and summed, 5.x ignores it).
  EXPECT_TRUE(config_from_hf_json(with(llama_json(), "pretraining_tp", 4).dump()).ok());
  // The pretraining context beside a linear scaling means nothing to it (transformers ignores it).
  EXPECT_TRUE(config_from_hf_json(with(llama_json(), "rope_scaling", {{"type", "linear"}, {"factor", 2.0},
                                                                      {"original_max_position_embeddings", 32}})
                                      .dump())
                  .ok());
  EXPECT_TRUE(config_from_hf_json(with(gpt2_json(), "add_cross_attention", nullptr).dump()).ok());
  // A list of eos ids (Llama 3 instruct): the first is kept.
  auto list = config_from_hf_json(with(llama_json(), "eos_token_id", {7, 8, 9}).dump());
  ASSERT_TRUE(list.ok()) << list.status().message();
  EXPECT_EQ(list->eos_token_id, 7);
}

TEST(HfConfig, RopeKeysOldAndNewSpellings) {
  // transformers 4.x: top-level rope_theta and rope_scaling with "type".
  json old = with(with(llama_json(), "rope_theta", 500000.0), "rope_scaling", {{"type", "linear"}, {"factor", 2.0}});
  auto a = config_from_hf_json(old.dump());
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->rope_theta, 500000.0);
  EXPECT_EQ(a->rope_scaling.type, RopeType::kLinear);
  EXPECT_EQ(a->rope_scaling.factor, 2.0);
  // transformers 5: rope_parameters only; rope_theta there wins over a top-level one.
  json v5 = with(with(llama_json(), "rope_theta", 1e4), "rope_parameters",
                 {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                  {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}});
  auto b = config_from_hf_json(v5.dump());
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->rope_theta, 500000.0);
  EXPECT_EQ(b->rope_scaling.type, RopeType::kLlama3);
  EXPECT_EQ(b->rope_scaling.original_max_positions, 8192);
  // rope_scaling null (4.x default) and rope_parameters default: no scaling.
  auto c = config_from_hf_json(with(llama_json(), "rope_scaling", nullptr).dump());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rope_scaling.type, RopeType::kDefault);
  // yarn defaults as transformers: original_max_position_embeddings = max_position_embeddings,
  // betas 32 and 1, truncation on, a null factor is the context ratio.
  auto y = config_from_hf_json(with(llama_json(), "rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}}).dump());
  ASSERT_TRUE(y.ok()) << y.status().message();
  EXPECT_EQ(y->rope_scaling.original_max_positions, 64);
  EXPECT_EQ(y->rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(y->rope_scaling.beta_slow, 1.0);
  EXPECT_TRUE(y->rope_scaling.truncate);
  auto r = config_from_hf_json(with(with(llama_json(), "max_position_embeddings", 128), "rope_parameters",
                                    {{"rope_type", "yarn"}, {"factor", nullptr}, {"original_max_position_embeddings", 32}})
                                   .dump());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->rope_scaling.factor, 4.0);
}

// Frequencies f_i and the attention factor as transformers 5.24 computes them
// (ROPE_INIT_FUNCTIONS, head_dim 16), to fp32 precision.
TEST(HfConfig, RopeFrequenciesMatchTransformers) {
  struct Case {
    RopeScaling s;
    double theta;
    std::vector<double> want;
    double attention_factor;
  };
  RopeScaling lin{RopeType::kLinear, 4.0};
  RopeScaling l3{RopeType::kLlama3, 8.0, 1.0, 4.0, 64};
  RopeScaling y1{RopeType::kYarn, 4.0};
  y1.original_max_positions = 32;
  RopeScaling y2 = y1;
  y2.mscale = 1.0; y2.mscale_all_dim = 0.5; y2.truncate = false; y2.beta_fast = 16.0; y2.beta_slow = 2.0;
  const Case cases[] = {
      {lin, 1e4, {0.25, 0.07905694097280502, 0.02500000037252903, 0.007905694656074047, 0.0024999999441206455,
                  0.0007905694656074047, 0.0002500000118743628, 7.905694656074047e-05}, 1.0},
      {l3, 5e5, {1.0, 0.07940301299095154, 0.004700753837823868, 0.0009115831344388425, 0.00017677668074611574,
                 3.428102354519069e-05, 6.647869668086059e-06, 1.289173155782919e-06}, 1.0},
      {y1, 1e4, {1.0, 0.19764235615730286, 0.02500000037252903, 0.007905694656074047, 0.0024999999441206455,
                 0.0007905694656074047, 0.0002500000118743628, 7.905694656074047e-05}, 1.138629436111989},
      {y2, 1e4, {1.0, 0.07905694097280502, 0.02500000037252903, 0.007905694656074047, 0.0024999999441206455,
                 0.0007905694656074047, 0.0002500000118743628, 7.905694656074047e-05}, 1.0648216253695715},
  };
  for (const Case& c : cases) {
    ASSERT_TRUE(check_rope_scaling(c.s).ok()) << rope_type_name(c.s.type);
    const std::vector<double> f = rope_frequencies(16, c.theta, c.s);
    ASSERT_EQ(f.size(), 8u);
    for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(f[i], c.want[i], 1e-6 * c.want[i]) << rope_type_name(c.s.type) << " " << i;
    EXPECT_NEAR(rope_attention_factor(c.s), c.attention_factor, 1e-12);
    // The table carries the factor on cos and sin: cos² + sin² = factor².
    const RopeTable t = make_rope_table(16, 8, c.theta, c.s).value();
    for (size_t k = 0; k < t.cos.size(); ++k)
      EXPECT_NEAR(t.cos[k] * t.cos[k] + t.sin[k] * t.sin[k], c.attention_factor * c.attention_factor, 1e-5);
  }
  RopeScaling bad{RopeType::kLlama3, 8.0, 4.0, 1.0, 64};  // high <= low: division by zero
  EXPECT_FALSE(make_rope_table(16, 8, 1e4, bad).ok());
}

TEST(HfConfig, CheckConfigIsTheOnePlaceForCrossFieldRules) {
  ModelConfig c = preset("llama-tiny").value();
  c.n_heads = 0;
  EXPECT_FALSE(check_config(c).ok());  // no SIGFPE in head_dim() or describe()
  EXPECT_FALSE(c.describe().empty());
  EXPECT_FALSE(Transformer::create(c, 1).ok());
  c = preset("llama-tiny").value();
  c.scale_attn_weights = false;  // a GPT-2 option on Llama
  EXPECT_FALSE(check_config(c).ok());
  c = preset("w1a").value();
  c.attention_bias = true;  // a Llama option on GPT-2
  EXPECT_FALSE(check_config(c).ok());
  c = preset("w1a").value();
  c.rope_scaling.type = RopeType::kLinear;
  c.rope_scaling.factor = 2.0;
  EXPECT_FALSE(check_config(c).ok());
  c = preset("llama-tiny").value();
  c.norm_eps = NAN;
  EXPECT_FALSE(check_config(c).ok());
  // The memory bound: the same config passes or fails by the limit, and the error says how much.
  c = preset("llama-tiny").value();
  const int64_t need = model_bytes(c).value();
  EXPECT_EQ(need, 8 * c.num_params() + 4 * c.max_seq_len * c.head_dim());
  EXPECT_TRUE(check_config(c, need).ok());
  const Status s = check_config(c, need - 1);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("GiB"), std::string::npos) << s.message();
  c.vocab_size = int64_t{1} << 30;
  c.d_model = int64_t{1} << 40;
  c.n_heads = 1;
  c.n_kv_heads = 1;
  EXPECT_FALSE(checked_num_params(c).has_value());  // overflows int64
  EXPECT_EQ(check_config(c).code(), StatusCode::kResourceExhausted);
  for (const auto& name : preset_names()) EXPECT_TRUE(check_config(preset(name).value()).ok()) << name;
  EXPECT_GT(physical_memory_bytes(), int64_t{1} << 28);
}

TEST(HfConfig, ConfigsRoundTrip) {
  std::vector<ModelConfig> configs;
  ModelConfig l = preset("llama-tiny").value();
  l.attention_bias = true;
  l.mlp_bias = true;
  l.rope_theta = 500000.0;
  l.bos_token_id = 1;
  l.eos_token_id = 4095;
  for (RopeType t : {RopeType::kDefault, RopeType::kLinear, RopeType::kLlama3, RopeType::kYarn}) {
    ModelConfig c = l;
    c.rope_scaling = RopeScaling{t, 4.0, 1.0, 4.0, 128, 24.0, 2.0, 0.0, 0.0, 0.0, false};
    if (t == RopeType::kDefault) c.rope_scaling = RopeScaling{};
    configs.push_back(c);
  }
  ModelConfig y = configs.back();
  y.rope_scaling.mscale = 0.7; y.rope_scaling.mscale_all_dim = 0.3; y.rope_scaling.attention_factor = 1.2;
  configs.push_back(y);
  ModelConfig g = preset("w1a").value();
  g.scale_attn_weights = false;
  g.scale_attn_by_inverse_layer_idx = true;
  g.eos_token_id = 0;
  configs.push_back(g);
  for (const ModelConfig& c : configs) {
    auto back = config_from_hf_json(config_to_hf_json(c));
    ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << config_to_hf_json(c);
    EXPECT_EQ(config_to_hf_json(*back), config_to_hf_json(c));
    EXPECT_EQ(back->attention_bias, c.attention_bias);
    EXPECT_EQ(back->scale_attn_by_inverse_layer_idx, c.scale_attn_by_inverse_layer_idx);
    EXPECT_EQ(back->rope_scaling.type, c.rope_scaling.type);
    EXPECT_EQ(back->rope_scaling.factor, c.rope_scaling.factor);
    EXPECT_EQ(back->rope_scaling.attention_factor, c.rope_scaling.attention_factor);
    if (c.rope_scaling.type == RopeType::kYarn) {
      EXPECT_EQ(back->rope_scaling.truncate, c.rope_scaling.truncate);
    }
    EXPECT_EQ(back->bos_token_id, c.bos_token_id);
    EXPECT_EQ(back->eos_token_id, c.eos_token_id);
  }
  // Unknown ids are written as null, so transformers does not assume its defaults (1, 2, 50256).
  const json j = json::parse(config_to_hf_json(preset("llama-tiny").value()));
  ASSERT_TRUE(j.contains("eos_token_id"));
  EXPECT_TRUE(j["eos_token_id"].is_null());
}

// A model with every option saves (config.json + HF tensor names) and loads back to the same
// logits: the biases load by their names through the unchanged loader.
TEST(HfConfig, ModelsWithOptionsSaveAndLoad) {
  ModelConfig l = preset("llama-tiny").value();
  l.vocab_size = 50; l.d_model = 32; l.n_layers = 2; l.n_heads = 4; l.n_kv_heads = 2; l.d_ff = 48; l.max_seq_len = 32;
  l.attention_bias = true;
  l.mlp_bias = true;
  l.rope_scaling = RopeScaling{RopeType::kYarn, 4.0};
  l.rope_scaling.original_max_positions = 8;
  l.eos_token_id = 3;
  ModelConfig g = preset("w1a").value();
  g.vocab_size = 50; g.d_model = 32; g.n_layers = 3; g.n_heads = 4; g.n_kv_heads = 4; g.d_ff = 64; g.max_seq_len = 32;
  g.scale_attn_weights = false;
  g.scale_attn_by_inverse_layer_idx = true;
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("kiln_hf_config_" + std::to_string(getpid()))).string();
  for (const ModelConfig& c : {l, g}) {
    auto model = Transformer::create(c, 2).value();
    Rng rng(3);
    for (float& w : model->params()) w += 0.1f * rng.normal();
    ASSERT_TRUE(save_model(dir, *model).ok());
    auto back = load_model(dir);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(config_to_hf_json((*back)->config()), config_to_hf_json(c));
    const std::vector<int32_t> tokens = {1, 4, 9, 16, 25, 36, 49, 3, 7, 11, 13, 17};
    ASSERT_TRUE(model->forward(tokens.data(), nullptr, 1, 12).ok());
    ASSERT_TRUE((*back)->forward(tokens.data(), nullptr, 1, 12).ok());
    for (int64_t i = 0; i < 12 * c.vocab_size; ++i) ASSERT_EQ(model->logits()[i], (*back)->logits()[i]) << i;
  }
  // GGUF has no place for the biases or the RoPE scaling: export refuses rather than drops them.
  auto model = Transformer::create(l, 2).value();
  auto file = gguf::llama_to_gguf(*model, "", gguf::TensorType::kF32, "x");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kUnimplemented);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln
