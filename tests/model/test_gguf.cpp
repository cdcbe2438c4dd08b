// GGUF: Q8_0/Q4_0 blocks against hand-written reference quantizers (exact bytes and values),
// the container round trip (every metadata type, every tensor type, odd sizes), kiln Llama
// models and tokenizers through GGUF and back, the q/k RoPE permutation checked against
// llama.cpp's interleaved rotation, and corrupted files (truncated at every length, bad magic,
// absurd counts, unsupported types) as errors, never crashes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kiln/core/dtype.h"
#include "kiln/core/rng.h"
#include "kiln/kernels/rope.h"
#include "kiln/model/gguf.h"
#include "kiln/tokenizer/bpe.h"

namespace kiln {
namespace {

using gguf::TensorType;

// ---- reference quantizers, written from the ggml definitions ----------------------------------
std::vector<uint8_t> ref_q8_0(const std::vector<float>& x) {
  std::vector<uint8_t> out;
  for (size_t b = 0; b < x.size(); b += 32) {
    float amax = 0;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    const float d = amax / 127.0f, id = d == 0 ? 0.0f : 1.0f / d;
    const uint16_t h = f32_to_f16(d);
    out.push_back(static_cast<uint8_t>(h & 0xff));
    out.push_back(static_cast<uint8_t>(h >> 8));
    for (size_t j = 0; j < 32; ++j) {
      const float v = x[b + j] * id;  // round half away from zero
      const int q = static_cast<int>(v < 0 ? -std::floor(-v + 0.5f) : std::floor(v + 0.5f));
      out.push_back(static_cast<uint8_t>(static_cast<int8_t>(q)));
    }
  }
  return out;
}

std::vector<uint8_t> ref_q4_0(const std::vector<float>& x) {
  std::vector<uint8_t> out;
  for (size_t b = 0; b < x.size(); b += 32) {
    size_t imax = 0;
    for (size_t j = 1; j < 32; ++j)
      if (std::fabs(x[b + j]) > std::fabs(x[b + imax])) imax = j;
    const float d = x[b + imax] / -8.0f, id = d == 0 ? 0.0f : 1.0f / d;
    const uint16_t h = f32_to_f16(d);
    out.push_back(static_cast<uint8_t>(h & 0xff));
    out.push_back(static_cast<uint8_t>(h >> 8));
    for (size_t j = 0; j < 16; ++j) {
      const int lo = std::min(15, static_cast<int>(std::floor(x[b + j] * id + 8.5f)));
      const int hi = std::min(15, static_cast<int>(std::floor(x[b + j + 16] * id + 8.5f)));
      out.push_back(static_cast<uint8_t>(lo | (hi << 4)));
    }
  }
  return out;
}

std::vector<float> random_values(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = scale * rng.normal();
  return v;
}

TEST(Gguf, Q8_0MatchesReferenceAndHandValues) {
  std::vector<float> x = random_values(32 * 7, 1);
  for (int j = 0; j < 32; ++j) x[32 + j] = 0.0f;  // an all-zero block: d = 0, q = 0
  const std::string enc = gguf::encode_tensor(x.data(), static_cast<int64_t>(x.size()), TensorType::kQ8_0);
  const std::vector<uint8_t> want = ref_q8_0(x);
  ASSERT_EQ(enc.size(), want.size());
  EXPECT_EQ(0, std::memcmp(enc.data(), want.data(), want.size()));
  // Hand values: block [127, -63.5, 0.25, 0...]: d = 1 (exact in f16), q = 127, -64 (away from 0), 0.
  std::vector<float> h(32, 0.0f);
  h[0] = 127.0f; h[1] = -63.5f; h[2] = 0.25f;
  const std::string e2 = gguf::encode_tensor(h.data(), 32, TensorType::kQ8_0);
  EXPECT_EQ(static_cast<uint8_t>(e2[0]), 0x00);  // f16(1.0) = 0x3c00, little-endian
  EXPECT_EQ(static_cast<uint8_t>(e2[1]), 0x3c);
  EXPECT_EQ(static_cast<int8_t>(e2[2]), 127);
  EXPECT_EQ(static_cast<int8_t>(e2[3]), -64);
  EXPECT_EQ(static_cast<int8_t>(e2[4]), 0);
  std::vector<float> y(32);
  gguf::decode_tensor(e2, 32, TensorType::kQ8_0, y.data());
  EXPECT_EQ(y[0], 127.0f);
  EXPECT_EQ(y[1], -64.0f);
  EXPECT_EQ(y[2], 0.0f);
}

TEST(Gguf, Q4_0MatchesReferenceAndHandValues) {
  const std::vector<float> x = random_values(32 * 5, 2);
  const std::string enc = gguf::encode_tensor(x.data(), static_cast<int64_t>(x.size()), TensorType::kQ4_0);
  const std::vector<uint8_t> want = ref_q4_0(x);
  ASSERT_EQ(enc.size(), want.size());
  EXPECT_EQ(0, std::memcmp(enc.data(), want.data(), want.size()));
  // Hand values: largest magnitude -16 (first) -> d = 2; x/d + 8: -16 -> 0, 14 -> 15, 2 -> 9,
  // element 16 (high nibble of byte 0) = 4 -> 10.
  std::vector<float> h(32, 0.0f);
  h[0] = -16.0f; h[1] = 14.0f; h[2] = 2.0f; h[16] = 4.0f;
  const std::string e = gguf::encode_tensor(h.data(), 32, TensorType::kQ4_0);
  ASSERT_EQ(e.size(), 18u);
  EXPECT_EQ(static_cast<uint8_t>(e[0]), 0x00);  // f16(2.0) = 0x4000
  EXPECT_EQ(static_cast<uint8_t>(e[1]), 0x40);
  EXPECT_EQ(static_cast<uint8_t>(e[2]), 0x00 | (10 << 4));  // elements 0 and 16
  EXPECT_EQ(static_cast<uint8_t>(e[3]), 15 | (8 << 4));     // elements 1 and 17
  EXPECT_EQ(static_cast<uint8_t>(e[4]), 9 | (8 << 4));      // elements 2 and 18
  std::vector<float> y(32);
  gguf::decode_tensor(e, 32, TensorType::kQ4_0, y.data());
  EXPECT_EQ(y[0], -16.0f);
  EXPECT_EQ(y[1], 14.0f);
  EXPECT_EQ(y[2], 2.0f);
  EXPECT_EQ(y[16], 4.0f);
  EXPECT_EQ(y[17], 0.0f);
}

gguf::File sample_file() {
  gguf::File f;
  using gguf::Value;
  using gguf::ValueType;
  auto scalar = [](ValueType t, int64_t i, double d) {
    Value v;
    v.type = t;
    v.i = i;
    v.f = d;
    return v;
  };
  f.metadata = {{"general.architecture", Value::str("llama")},
                {"u8", scalar(ValueType::kU8, 200, 0)},
                {"i8", scalar(ValueType::kI8, -100, 0)},
                {"u16", scalar(ValueType::kU16, 60000, 0)},
                {"i16", scalar(ValueType::kI16, -30000, 0)},
                {"u32", Value::u32(4000000000u)},
                {"i32", Value::i32(-2000000000)},
                {"f32", Value::f32(0.1f)},
                {"bool", Value::boolean(true)},
                {"u64", scalar(ValueType::kU64, int64_t{1} << 50, 0)},
                {"i64", scalar(ValueType::kI64, -(int64_t{1} << 50), 0)},
                {"f64", scalar(ValueType::kF64, 0, 0.1)},
                {"strs", Value::str_array({"a", "", "Ġhello wörld"})},
                {"ints", Value::i32_array({1, -2, 3})},
                {"floats", Value::f32_array({0.5, -1.25})}};
  const std::pair<TensorType, std::vector<int64_t>> shapes[] = {
      {TensorType::kF32, {5}}, {TensorType::kF16, {7, 3}}, {TensorType::kQ8_0, {96, 3}}, {TensorType::kQ4_0, {224, 5}}};
  uint64_t seed = 10;
  for (const auto& [type, dims] : shapes) {
    gguf::TensorInfo t;
    t.name = fmt::format("t.{}", gguf::tensor_type_name(type));
    t.dims = dims;
    t.type = type;
    const std::vector<float> v = random_values(static_cast<size_t>(t.numel()), seed++);
    t.data = gguf::encode_tensor(v.data(), t.numel(), type);
    f.tensors.push_back(std::move(t));
  }
  return f;
}

TEST(Gguf, ContainerRoundTrip) {
  const gguf::File f = sample_file();
  const std::string bytes = gguf::serialize(f);
  EXPECT_EQ(bytes.substr(0, 4), "GGUF");
  auto g = gguf::parse(bytes);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_EQ(g->metadata.size(), f.metadata.size());
  for (size_t i = 0; i < f.metadata.size(); ++i) {
    const auto& [k, v] = f.metadata[i];
    const auto& [k2, v2] = g->metadata[i];
    EXPECT_EQ(k, k2);
    EXPECT_EQ(v.type, v2.type) << k;
    EXPECT_EQ(v.i, v2.i) << k;
    if (v.type == gguf::ValueType::kF32) {
      EXPECT_EQ(static_cast<float>(v.f), static_cast<float>(v2.f)) << k;
    } else {
      EXPECT_EQ(v.f, v2.f) << k;
    }
    EXPECT_EQ(v.s, v2.s) << k;
    EXPECT_EQ(v.strings, v2.strings) << k;
    EXPECT_EQ(v.ints, v2.ints) << k;
    EXPECT_EQ(v.floats, v2.floats) << k;
  }
  ASSERT_EQ(g->tensors.size(), f.tensors.size());
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    EXPECT_EQ(g->tensors[i].name, f.tensors[i].name);
    EXPECT_EQ(g->tensors[i].dims, f.tensors[i].dims);
    EXPECT_EQ(g->tensors[i].type, f.tensors[i].type);
    EXPECT_EQ(g->tensors[i].offset % 32, 0u);
    EXPECT_EQ(g->tensors[i].data, f.tensors[i].data);
  }
  // A non-default alignment is written as general.alignment and honoured.
  gguf::File f64 = f;
  f64.alignment = 64;
  auto h = gguf::parse(gguf::serialize(f64));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->alignment, 64u);
  for (const auto& t : h->tensors) EXPECT_EQ(t.offset % 64, 0u);
  EXPECT_EQ(h->tensors.back().data, f.tensors.back().data);
}

TEST(Gguf, CorruptFilesAreErrors) {
  const std::string good = gguf::serialize(sample_file());
  // Every truncation is an error (or, past the last tensor's bytes, still a valid file).
  for (size_t n = 0; n < good.size(); n += (n < 600 ? 1 : 7)) {
    auto r = gguf::parse(std::string_view(good).substr(0, n));
    if (n < good.size() - 64) {
      EXPECT_FALSE(r.ok()) << "prefix " << n;
    }
  }
  auto expect_error = [](std::string bytes, std::string_view needle) {
    auto r = gguf::parse(bytes);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  std::string b = good;
  b[0] = 'X';
  expect_error(b, "bad magic");
  b = good;
  b[4] = 7;
  expect_error(b, "version 7");
  b = good;
  const uint64_t huge = uint64_t{1} << 60;
  std::memcpy(b.data() + 8, &huge, 8);  // tensor count
  expect_error(b, "tensors cannot fit");
  b = good;
  std::memcpy(b.data() + 16, &huge, 8);  // metadata count
  expect_error(b, "metadata entries cannot fit");
  b = good;
  std::memcpy(b.data() + 24, &huge, 8);  // first key's length
  expect_error(b, "truncated");
  // Unsupported tensor type: rewrite the F32 tensor's type id (find its info by name).
  b = good;
  const size_t at = b.find("t.F32");
  ASSERT_NE(at, std::string::npos);
  const uint32_t q4k = 12;
  std::memcpy(b.data() + at + 5 + 4 + 8, &q4k, 4);  // name, n_dims (1), ne[0], then type
  expect_error(b, "ggml type 12");
  // Absurd dims.
  b = good;
  std::memcpy(b.data() + at + 5 + 4, &huge, 8);
  expect_error(b, "absurd");
  // A misaligned offset.
  b = good;
  const uint64_t odd = 3;
  std::memcpy(b.data() + at + 5 + 4 + 8 + 4, &odd, 8);
  expect_error(b, "not a multiple of the alignment");
  // Reading a missing file.
  EXPECT_EQ(gguf::read("/nonexistent/x.gguf").status().code(), StatusCode::kNotFound);
}

ModelConfig small_llama() {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.vocab_size = 300;
  c.d_model = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.d_ff = 96;
  c.max_seq_len = 32;
  c.rope_theta = 5000.0;
  c.norm_eps = 1e-6f;
  c.tied_embeddings = false;
  return c;
}

TEST(Gguf, LlamaModelRoundTripEveryType) {
  auto model = Transformer::create(small_llama(), 42).value();
  Rng rng(3);
  for (float& w : model->params()) w += 0.1f * rng.normal();
  for (TensorType type : {TensorType::kF32, TensorType::kF16, TensorType::kQ8_0, TensorType::kQ4_0}) {
    auto f = gguf::llama_to_gguf(*model, "", type, "test");
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    const gguf::TensorInfo* q = f->tensor("blk.1.attn_q.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->dims, (std::vector<int64_t>{64, 64}));  // fastest first
    EXPECT_EQ(q->type, type);
    EXPECT_EQ(f->tensor("blk.0.attn_norm.weight")->type, TensorType::kF32);
    EXPECT_EQ(f->tensor("blk.0.ffn_down.weight")->dims, (std::vector<int64_t>{96, 64}));
    EXPECT_EQ(f->find("llama.attention.head_count_kv")->i, 2);
    auto parsed = gguf::parse(gguf::serialize(*f));
    ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
    auto back = gguf::llama_from_gguf(*parsed);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    const ModelConfig& c = back->model->config();
    EXPECT_EQ(c.n_kv_heads, 2);
    EXPECT_EQ(c.d_ff, 96);
    EXPECT_FALSE(c.tied_embeddings);
    EXPECT_DOUBLE_EQ(c.rope_theta, 5000.0);
    // Each tensor comes back as decode(encode(w)): exact for f32; for the others, compare with
    // the same encoding applied to kiln's tensor (q/k in kiln's row order).
    for (const ParamEntry& e : model->param_entries()) {
      const float* a = model->params().data() + e.offset;
      const float* b = back->model->params().data() + e.offset;
      const int64_t n = e.shape.numel();
      TensorType t = e.shape.rank() == 1 ? TensorType::kF32 : type;
      std::vector<float> want(a, a + n);
      if (t != TensorType::kF32) {
        // Quantization works on rows of `in` values, and permuting whole rows commutes with it.
        gguf::decode_tensor(gguf::encode_tensor(a, n, t), n, t, want.data());
      }
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b[i], want[i]) << e.name << " " << i << " " << gguf::tensor_type_name(type);
    }
  }
}

// Mixtral in llama.cpp's layout: the router as ffn_gate_inp, each layer's experts stacked into
// ffn_{gate,down,up}_exps (dims {cols, rows, E}), expert_count / expert_used_count; back, every
// expert's slice is decode(encode(w)) as for a plain matrix. kiln's own MoE extensions that
// llama.cpp's llama architecture lacks are refused by name.
TEST(Gguf, MixtralModelRoundTrip) {
  ModelConfig cfg = small_llama();
  cfg.num_experts = 4;
  cfg.num_experts_per_tok = 2;
  cfg.moe_d_ff = 64;
  auto model = Transformer::create(cfg, 42).value();
  Rng rng(3);
  for (float& w : model->params()) w += 0.1f * rng.normal();
  for (TensorType type : {TensorType::kF32, TensorType::kQ4_0}) {
    auto f = gguf::llama_to_gguf(*model, "", type, "test");
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    EXPECT_EQ(f->tensor("blk.1.ffn_gate_exps.weight")->dims, (std::vector<int64_t>{64, 64, 4}));
    EXPECT_EQ(f->tensor("blk.1.ffn_down_exps.weight")->dims, (std::vector<int64_t>{64, 64, 4}));
    EXPECT_EQ(f->tensor("blk.0.ffn_gate_inp.weight")->dims, (std::vector<int64_t>{64, 4}));
    EXPECT_EQ(f->tensor("blk.0.ffn_gate.weight"), nullptr);
    EXPECT_EQ(f->find("llama.expert_count")->i, 4);
    EXPECT_EQ(f->find("llama.expert_used_count")->i, 2);
    EXPECT_EQ(f->find("llama.feed_forward_length")->i, 64);
    auto back = gguf::llama_from_gguf(gguf::parse(gguf::serialize(*f)).value());
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(back->model->config().num_experts, 4);
    EXPECT_EQ(back->model->num_params(), model->num_params());
    for (const ParamEntry& e : model->param_entries()) {
      const float* a = model->params().data() + e.offset;
      const float* b = back->model->param(e.name);
      ASSERT_NE(b, nullptr) << e.name;
      const int64_t n = e.shape.numel();
      const TensorType t = e.shape.rank() == 1 ? TensorType::kF32 : type;
      std::vector<float> want(a, a + n);
      if (t != TensorType::kF32) gguf::decode_tensor(gguf::encode_tensor(a, n, t), n, t, want.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b[i], want[i]) << e.name << " " << i;
    }
  }
  cfg.num_shared_experts = 1;
  auto shared = Transformer::create(cfg, 42).value();
  EXPECT_NE(gguf::llama_to_gguf(*shared, "", TensorType::kF32, "t").status().message().find("shared experts"),
            std::string::npos);
}

// llama.cpp's RoPE (adjacent pairs) on the permuted q rows must equal kiln's rotate-half RoPE on
// the original rows, up to the same row permutation: then attention scores agree.
TEST(Gguf, RopePermutationMatchesInterleavedRotation) {
  const int64_t heads = 2, D = 8, cols = 5, pos = 3;
  const std::vector<float> w = random_values(static_cast<size_t>(heads * D * cols), 4);
  const std::vector<float> x = random_values(static_cast<size_t>(cols), 5);
  std::vector<float> wg(w.size()), back(w.size());
  gguf::permute_rope_rows_to_gguf(w.data(), wg.data(), heads, D, cols);
  gguf::permute_rope_rows_from_gguf(wg.data(), back.data(), heads, D, cols);
  EXPECT_EQ(back, w);
  auto matvec = [&](const std::vector<float>& m) {
    std::vector<float> y(static_cast<size_t>(heads * D), 0.0f);
    for (int64_t r = 0; r < heads * D; ++r)
      for (int64_t k = 0; k < cols; ++k) y[r] += m[r * cols + k] * x[k];
    return y;
  };
  std::vector<float> q_hf = matvec(w), q_gg = matvec(wg);
  const RopeTable table = make_rope_table(D, pos + 1).value();
  std::vector<float> r_hf(q_hf.size());
  ref::rope_forward(r_hf.data(), q_hf.data(), table, 1, 1, heads, D, pos);
  // llama.cpp's normal (non-NeoX) rope: pairs (2i, 2i+1) rotated by pos·theta^(-2i/D).
  std::vector<float> r_gg(q_gg.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < D / 2; ++i) {
      const double ang = pos * std::pow(kRopeThetaLlama, -2.0 * i / D);
      const double c = std::cos(ang), s = std::sin(ang);
      const double a = q_gg[h * D + 2 * i], b = q_gg[h * D + 2 * i + 1];
      r_gg[h * D + 2 * i] = static_cast<float>(a * c - b * s);
      r_gg[h * D + 2 * i + 1] = static_cast<float>(b * c + a * s);
    }
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < D / 2; ++i)
      for (int64_t a = 0; a < 2; ++a)
        EXPECT_NEAR(r_gg[h * D + 2 * i + a], r_hf[h * D + a * D / 2 + i], 1e-5) << h << " " << i << " " << a;
}

TEST(Gguf, TokenizerRoundTrip) {
  tok::TrainOptions opt;
  opt.vocab_size = 290;
  const std::string corpus =
      "the quick brown fox jumps over the lazy dog. the dog sleeps; the fox runs! 123 456 the end.\n";
  std::string text;
  for (int i = 0; i < 20; ++i) text += corpus;
  auto tk = tok::Tokenizer::train(text, opt).value();
  auto model = Transformer::create(small_llama(), 1).value();  // vocab 300 > 290: padded
  auto f = gguf::llama_to_gguf(*model, tk.to_hf_json(), TensorType::kF16, "tok");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  const gguf::Value* tokens = f->find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->strings.size(), 300u);
  EXPECT_EQ(f->find("tokenizer.ggml.model")->s, "gpt2");
  EXPECT_EQ(f->find("tokenizer.ggml.eos_token_id")->i, tk.eot_id());
  auto back = gguf::llama_from_gguf(gguf::parse(gguf::serialize(*f)).value());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ASSERT_FALSE(back->tokenizer_json.empty()) << back->tokenizer_note;
  auto tk2 = tok::Tokenizer::parse_hf_json(back->tokenizer_json);
  ASSERT_TRUE(tk2.ok()) << tk2.status().to_string();
  const std::string probe = "the lazy fox<|endoftext|> jumps 42 times";
  EXPECT_EQ(tk2->encode(probe), tk.encode(probe));
  EXPECT_EQ(tk2->vocab_size(), tk.vocab_size());
}

TEST(Gguf, ModelErrors) {
  gguf::File f = sample_file();  // architecture llama, but no tensors of a model
  auto r = gguf::llama_from_gguf(f);
  EXPECT_FALSE(r.ok());
  f.metadata[0].second = gguf::Value::str("gpt2");
  r = gguf::llama_from_gguf(f);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("architecture 'gpt2'"), std::string::npos) << r.status().message();
  // A tensor with the wrong shape names both shapes.
  auto model = Transformer::create(small_llama(), 1).value();
  auto g = gguf::llama_to_gguf(*model, "", TensorType::kF32, "x").value();
  for (auto& t : g.tensors)
    if (t.name == "blk.0.ffn_up.weight") t.dims = {64, 95}, t.data.resize(64 * 95 * 4);
  r = gguf::llama_from_gguf(g);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("blk.0.ffn_up.weight has dims [64, 95]"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace kiln
