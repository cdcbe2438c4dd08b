// The safetensors reader: each rule of the reference (huggingface/safetensors) broken once, the
// verdicts the Python package gives for the same bytes (tests/reference/safetensors_check.py
// compares the two on files), and load_model's check of a file against its config.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/core/allocator.h"
#include "kiln/core/file_io.h"
#include "kiln/model/safetensors.h"
#include "kiln/model/weights.h"
#include "tests/temp_dir.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::string st_bytes(std::string_view header, size_t data_bytes = 0, int64_t header_len = -1) {
  const uint64_t n = header_len < 0 ? header.size() : static_cast<uint64_t>(header_len);
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  out += header;
  out.append(data_bytes, '\0');
  return out;
}

Expected<SafetensorsHeader> parse(const std::string& bytes) { return parse_safetensors_header(bytes, bytes.size()); }

struct Case {
  const char* name;
  std::string bytes;
  bool accept;  // the Python safetensors package's verdict (0.8.0) on the same bytes
};

std::vector<Case> cases() {
  const std::string a4 = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  return {
      {"valid", st_bytes(a4, 4), true},
      {"empty header object", st_bytes("{}"), true},
      {"metadata null", st_bytes(R"({"__metadata__":null})"), true},
      {"metadata strings", st_bytes(R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4), true},
      {"metadata repeated key: last wins", st_bytes(R"({"__metadata__":{"k":"1","k":"2"}})"), true},
      {"metadata value an integer", st_bytes(R"({"__metadata__":{"a":1}})"), false},
      {"metadata value null", st_bytes(R"({"__metadata__":{"a":null}})"), false},
      {"metadata a list", st_bytes(R"({"__metadata__":[]})"), false},
      {"metadata a string", st_bytes(R"({"__metadata__":"x"})"), false},
      {"metadata twice", st_bytes(R"({"__metadata__":{"a":"b"},"__metadata__":{"c":"d"}})"), false},
      {"header length 0", st_bytes(""), false},
      {"header length past the file", st_bytes("{}", 0, 3), false},
      {"header length above 100e6", st_bytes("{}", 0, 100'000'001), false},
      {"file shorter than 8 bytes", std::string(5, '\0'), false},
      {"header an array", st_bytes("[]"), false},
      {"trailing spaces", st_bytes("{}   "), true},
      {"leading whitespace", st_bytes(" \t\r\n{}"), true},
      {"trailing NULs", st_bytes(std::string("{}\0\0", 4)), false},
      {"form feed", st_bytes("{}\f"), false},
      {"byte-order mark", st_bytes("\xEF\xBB\xBF{}"), false},
      {"invalid UTF-8", st_bytes("{\"\xff\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}"), false},
      {"UTF-8 surrogate", st_bytes("{\"\xed\xa0\x80\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}"), false},
      {"data not fully covered", st_bytes(a4, 5), false},
      {"data too short", st_bytes(a4, 3), false},
      {"hole before the first tensor", st_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), false},
      {"overlap", st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), false},
      {"end before begin", st_bytes(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4), false},
      {"size != shape x dtype", st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4), false},
      {"unsorted but tiling", st_bytes(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8), true},
      {"two empty tensors at 0", st_bytes(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})"), true},
      {"scalar (shape [])", st_bytes(R"({"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})", 4), true},
      {"unknown dtype", st_bytes(R"({"a":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", 4), false},
      {"lower-case dtype", st_bytes(R"({"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4), false},
      {"dtype an integer", st_bytes(R"({"a":{"dtype":3,"shape":[1],"data_offsets":[0,4]}})", 4), false},
      {"F4 half a byte", st_bytes(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2), false},
      {"F4 whole bytes", st_bytes(R"({"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}})", 2), true},
      {"F6_E2M3", st_bytes(R"({"a":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}})", 3), true},
      {"F8_E8M0", st_bytes(R"({"a":{"dtype":"F8_E8M0","shape":[1],"data_offsets":[0,1]}})", 1), true},
      {"C64", st_bytes(R"({"a":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", 8), true},
      {"missing data_offsets", st_bytes(R"({"a":{"dtype":"F32","shape":[1]}})", 4), false},
      {"three data_offsets", st_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}})", 4), false},
      {"one data_offset", st_bytes(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0]}})"), false},
      {"negative data_offsets", st_bytes(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[-1,-1]}})"), false},
      {"data_offsets an object", st_bytes(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":{"0":0,"1":0}}})"), false},
      {"dtype twice", st_bytes(R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4), false},
      {"unknown field (ignored)", st_bytes(R"({"a":{"x":[1,{"y":2}],"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4), true},
      {"unknown field twice", st_bytes(R"({"a":{"x":1,"x":2,"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4), true},
      {"unknown field 1e400", st_bytes(R"({"a":{"x":1e400,"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4), false},
      {"tensor twice: the last wins", st_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8), true},
      {"tensor twice: the first invalid", st_bytes(R"({"a":3,"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4), false},
      {"tensor an integer", st_bytes(R"({"a":3})"), false},
      {"shape -0", st_bytes(R"({"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}})"), false},
      {"shape 1.0", st_bytes(R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", 4), false},
      {"shape true", st_bytes(R"({"a":{"dtype":"F32","shape":[true],"data_offsets":[0,0]}})"), false},
      {"shape null", st_bytes(R"({"a":{"dtype":"F32","shape":null,"data_offsets":[0,0]}})"), false},
      {"shape 2^64", st_bytes(R"({"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,0]}})"), false},
      {"shape overflows u64", st_bytes(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})"), false},
      {"zero dim first: no overflow", st_bytes(R"({"a":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})"), true},
      {"zero dim last: overflow first", st_bytes(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})"), false},
      {"2^63 elements of 0", st_bytes(R"({"a":{"dtype":"BOOL","shape":[9223372036854775808,0],"data_offsets":[0,0]}})"), true},
      {"offsets at u64 max", st_bytes(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615]}})"), false},
      {"empty name", st_bytes(R"({"":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})"), true},
      {"nested 127 deep (ignored field)",
       st_bytes(R"({"a":{"x":)" + std::string(125, '[') + std::string(125, ']') +
                R"(,"dtype":"F32","shape":[0],"data_offsets":[0,0]}})"),
       true},
      {"nested 128 deep (ignored field)",
       st_bytes(R"({"a":{"x":)" + std::string(126, '[') + std::string(126, ']') +
                R"(,"dtype":"F32","shape":[0],"data_offsets":[0,0]}})"),
       false},
  };
}

TEST(Safetensors, AcceptsExactlyWhatTheReferenceAccepts) {
  for (const Case& c : cases()) {
    auto h = parse(c.bytes);
    EXPECT_EQ(h.ok(), c.accept) << c.name << ": " << (h.ok() ? "accepted" : h.status().message());
    if (!h.ok()) {
      EXPECT_EQ(h.status().code(), StatusCode::kDataLoss) << c.name;
    }
  }
}

TEST(Safetensors, HeaderFieldsAndOrder) {
  const std::string bytes = st_bytes(
      R"({"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[4,16]},"__metadata__":{"k":"v"},)"
      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
      16);
  auto h = parse(bytes);
  ASSERT_TRUE(h.ok()) << h.status().message();
  ASSERT_EQ(h->tensors.size(), 2u);
  EXPECT_EQ(h->tensors[0].name, "a");  // by offset, not by name or file order
  EXPECT_EQ(h->tensors[1].name, "b");
  EXPECT_EQ(h->tensors[1].dtype_bits, 16);
  EXPECT_TRUE(h->tensors[1].shape_is(std::vector<int64_t>{2, 3}));
  EXPECT_FALSE(h->tensors[1].shape_is(std::vector<int64_t>{3, 2}));
  EXPECT_EQ(h->find("b")->begin, 4u);
  EXPECT_EQ(h->find("zz"), nullptr);
  EXPECT_EQ(h->metadata_value("k"), "v");
  EXPECT_EQ(h->data_start, bytes.size() - 16);
  // The header alone is enough when the caller gives the file size (the file-backed reader).
  auto prefix = parse_safetensors_header(std::string_view(bytes).substr(0, h->data_start), bytes.size());
  EXPECT_TRUE(prefix.ok()) << prefix.status().message();
  EXPECT_FALSE(parse_safetensors_header(std::string_view(bytes).substr(0, h->data_start - 1), bytes.size()).ok());
}

TEST(Safetensors, ErrorsNameTheRuleAndTheTensor) {
  auto overlap = parse(st_bytes(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      8));
  ASSERT_FALSE(overlap.ok());
  EXPECT_NE(overlap.status().message().find("'b'"), std::string::npos) << overlap.status().message();
  auto meta = parse(st_bytes(R"({"__metadata__":{"a":1}})"));
  ASSERT_FALSE(meta.ok());
  EXPECT_NE(meta.status().message().find("__metadata__"), std::string::npos) << meta.status().message();
}

// ---- the file-backed reader and load_model ---------------------------------------------------

ModelConfig tiny_llama(int64_t layers = 2) {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.vocab_size = 13; c.d_model = 8; c.n_layers = layers; c.n_heads = 2; c.n_kv_heads = 1;
  c.d_ff = 16; c.max_seq_len = 8; c.tied_embeddings = false;
  return c;
}

TEST(Safetensors, FileReadsTheTensorsAskedFor) {
  const fs::path dir = tmp_dir("kiln_st_file");
  auto model = Transformer::create(tiny_llama(), 3).value();
  ASSERT_TRUE(save_model(dir.string(), *model).ok());
  auto f = SafetensorsFile::open((dir / "model.safetensors").string());
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->header().tensors.size(), model->param_entries().size());
  auto t = f->tensor("model.norm.weight");
  ASSERT_TRUE(t.ok());
  auto bytes = f->read(**t);
  ASSERT_TRUE(bytes.ok());
  ASSERT_EQ(bytes->size(), 8u * 4);
  EXPECT_EQ(std::memcmp(bytes->data(), model->param("model.norm.weight"), 32), 0);
  EXPECT_FALSE(f->tensor("nope").ok());
  // A file cut short fails at open, naming the file.
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") - 1);
  auto cut = SafetensorsFile::open((dir / "model.safetensors").string());
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("model.safetensors"), std::string::npos);
}

// Rewrites dir/config.json for config c (the safetensors file stays).
void write_config(const fs::path& dir, const ModelConfig& c) {
  ASSERT_TRUE(write_file_atomic((dir / "config.json").string(), {config_to_hf_json(c)}).ok());
}

TEST(LoadModel, MoreLayersThanTheFileFailsBeforeAllocating) {
  const fs::path dir = tmp_dir("kiln_st_layers");
  auto model = Transformer::create(tiny_llama(2), 3).value();
  ASSERT_TRUE(save_model(dir.string(), *model).ok());
  // A config that claims 20000 layers: ~45 MB of parameters (and as much again for gradients)
  // if the model were allocated before the file is checked.
  const ModelConfig deep = tiny_llama(20000);
  write_config(dir, deep);
  int64_t claimed = 0;
  for (const ParamEntry& e : Transformer::param_entries_for(deep)) claimed += e.shape.numel() * 4;
  ASSERT_GT(claimed, 32 << 20);
  default_allocator().reset_peak();
  const int64_t before = default_allocator().stats().bytes_in_use;
  auto loaded = load_model(dir.string());
  const int64_t peak = default_allocator().stats().peak_bytes_in_use;
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("model.layers.2.input_layernorm.weight is missing"), std::string::npos)
      << loaded.status().message();  // the first missing tensor
  EXPECT_LT(peak - before, claimed / 4) << "the model was allocated before the file was checked";

  // A wider config: the first tensor whose shape differs is named.
  ModelConfig wide = tiny_llama(2);
  wide.d_model = 16;
  write_config(dir, wide);
  auto bad_shape = load_model(dir.string());
  ASSERT_FALSE(bad_shape.ok());
  EXPECT_NE(bad_shape.status().message().find("model.embed_tokens.weight has shape [13, 8]"), std::string::npos)
      << bad_shape.status().message();
}

TEST(LoadModel, TensorsTheConfigDoesNotUseAreAnError) {
  const fs::path dir = tmp_dir("kiln_st_extra");
  auto model = Transformer::create(tiny_llama(2), 3).value();
  ASSERT_TRUE(save_model(dir.string(), *model).ok());
  write_config(dir, tiny_llama(1));  // the file holds layer 1 too
  auto fewer = load_model(dir.string());
  ASSERT_FALSE(fewer.ok());
  EXPECT_NE(fewer.status().message().find("model.layers.1."), std::string::npos) << fewer.status().message();
  EXPECT_NE(fewer.status().message().find("does not use"), std::string::npos) << fewer.status().message();

  // Untied head in the file, tied in the config: only an lm_head equal to the embedding is fine.
  ModelConfig tied = tiny_llama(2);
  tied.tied_embeddings = true;
  write_config(dir, tied);
  auto differs = load_model(dir.string());
  ASSERT_FALSE(differs.ok());
  EXPECT_NE(differs.status().message().find("lm_head.weight"), std::string::npos) << differs.status().message();
  std::memcpy(model->param("lm_head.weight"), model->param("model.embed_tokens.weight"), 13 * 8 * 4);
  ASSERT_TRUE(save_model(dir.string(), *model).ok());
  write_config(dir, tied);
  auto same = load_model(dir.string());
  ASSERT_TRUE(same.ok()) << same.status().message();
  EXPECT_EQ(std::memcmp((*same)->param("model.embed_tokens.weight"), model->param("model.embed_tokens.weight"), 13 * 8 * 4), 0);
}

}  // namespace
}  // namespace kiln
