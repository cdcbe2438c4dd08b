// Tokenizer: GPT-2 pre-tokenization pieces, encode→decode identity on any bytes, training,
// tokenizer.json round trips, clear errors on bad files, and exact agreement with Hugging Face
// `tokenizers` in both directions (ids committed by tests/reference/tokenizer_hf.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kiln/core/rng.h"
#include "kiln/tokenizer/bpe.h"
#include "kiln/tokenizer/pretokenize.h"

namespace kiln::tok {
namespace {

const std::filesystem::path kRef = std::filesystem::path(KILN_SOURCE_DIR) / "tests/reference";

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> pieces(std::string_view s) {
  std::vector<std::string> out;
  for (auto p : pretokenize(s)) out.emplace_back(p);
  return out;
}

TEST(Pretokenize, MatchesGpt2Pattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces("it's don't we'll"), (V{"it", "'s", " don", "'t", " we", "'ll"}));
  EXPECT_EQ(pieces("a  b"), (V{"a", " ", " b"}));           // \s+(?!\S) leaves one space
  EXPECT_EQ(pieces("a   \n b"), (V{"a", "   \n", " b"}));
  EXPECT_EQ(pieces("x\ny"), (V{"x", "\n", "y"}));
  EXPECT_EQ(pieces("end  "), (V{"end", "  "}));             // trailing run kept whole
  EXPECT_EQ(pieces("12ab 34!?"), (V{"12", "ab", " 34", "!?"}));
  EXPECT_EQ(pieces("Größe über"), (V{"Größe", " über"}));
  EXPECT_EQ(pieces("你好，世界"), (V{"你好", "，", "世界"}));
  EXPECT_EQ(pieces("'S"), (V{"'", "S"}));                   // contractions are case-sensitive
  EXPECT_EQ(pieces("\xff\xfe a"), (V{"\xff\xfe", " a"}));  // invalid UTF-8 is "other"
  EXPECT_TRUE(pieces("").empty());
}

Tokenizer trained(int vocab = 600) {
  TrainOptions opt;
  opt.vocab_size = vocab;
  return Tokenizer::train(read(kRef / "data/tokenizer_corpus.txt"), opt).value();
}

TEST(Tokenizer, TrainsAndRoundTripsAnyBytes) {
  const Tokenizer t = trained();
  EXPECT_GT(t.num_merges(), 100);
  EXPECT_LE(t.vocab_size(), 600);
  EXPECT_EQ(t.eot_id(), t.vocab_size() - 1);
  const std::string corpus = read(kRef / "data/tokenizer_corpus.txt");
  const auto ids = t.encode(corpus);
  EXPECT_LT(ids.size() * 2, corpus.size()) << "merges should compress the training text";
  EXPECT_EQ(t.decode(ids), corpus);
  Rng rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(rng.below(64), '\0');
    for (char& c : s) c = static_cast<char>(rng.below(256));
    ASSERT_EQ(t.decode(t.encode(s, false)), s);
  }
}

TEST(Tokenizer, SpecialTokens) {
  const Tokenizer t = trained();
  const auto ids = t.encode("a<|endoftext|>b");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], t.eot_id());
  const auto plain = t.encode("a<|endoftext|>b", /*allow_special=*/false);
  EXPECT_GT(plain.size(), 3u);
  EXPECT_EQ(t.decode(plain), "a<|endoftext|>b");
}

TEST(Tokenizer, TrainingIsDeterministicAndMatchesCommittedFile) {
  // kiln_tokenizer.json was written by `kiln tokenizer train` on the same corpus: training
  // again must give the very same file (so the HF ids below stay valid).
  EXPECT_EQ(trained().to_hf_json(), read(kRef / "kiln_tokenizer.json"));
}

TEST(Tokenizer, HfJsonRoundTrip) {
  const Tokenizer t = trained();
  const auto path = std::filesystem::temp_directory_path() / "kiln_tok_roundtrip.json";
  ASSERT_TRUE(t.save_hf_json(path.string()).ok());
  const Tokenizer u = Tokenizer::load_hf_json(path.string()).value();
  const std::string text = read(kRef / "data/multilingual.txt");
  EXPECT_EQ(u.encode(text), t.encode(text));
  EXPECT_EQ(u.vocab_size(), t.vocab_size());
  std::filesystem::remove(path);
}

TEST(Tokenizer, AgreesWithHuggingFaceTokenizers) {
  const auto expected = nlohmann::json::parse(read(kRef / "tokenizer_expected.json"));
  const std::string text = read(kRef / "data/multilingual.txt");
  // (a) a BPE trained by HF `tokenizers`, loaded in kiln, gives HF's ids.
  const Tokenizer hf = Tokenizer::load_hf_json((kRef / "hf_trained_tokenizer.json").string()).value();
  EXPECT_EQ(hf.encode(text), expected["hf_trained_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(hf.decode(hf.encode(text)), text);
  // (b) the tokenizer.json kiln writes, loaded in HF `tokenizers`, gave exactly kiln's ids.
  const Tokenizer k = Tokenizer::load_hf_json((kRef / "kiln_tokenizer.json").string()).value();
  EXPECT_EQ(k.encode(text), expected["kiln_trained_ids_by_hf"].get<std::vector<int32_t>>());
  EXPECT_TRUE(expected["kiln_decoded_by_hf_roundtrip"].get<bool>());
}

TEST(Tokenizer, BadFilesGiveClearErrors) {
  auto missing = Tokenizer::load_hf_json("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(Tokenizer::parse_hf_json("{").ok());
  EXPECT_FALSE(Tokenizer::parse_hf_json("[]").ok());
  EXPECT_EQ(Tokenizer::parse_hf_json(R"({"model":{"type":"WordPiece"},"pre_tokenizer":{"type":"ByteLevel"}})")
                .status().code(), StatusCode::kUnimplemented);
  // Truncations of a valid file never crash and always fail.
  const std::string good = trained(300).to_hf_json();
  for (size_t cut : {size_t{10}, good.size() / 3, good.size() / 2, good.size() - 2})
    EXPECT_FALSE(Tokenizer::parse_hf_json(good.substr(0, cut)).ok()) << cut;
  // A merge naming an unknown token, and a vocab missing a byte.
  auto j = nlohmann::json::parse(good);
  j["model"]["merges"][0] = "zzzq qqqz";
  auto bad_merge = Tokenizer::parse_hf_json(j.dump());
  ASSERT_FALSE(bad_merge.ok());
  EXPECT_NE(bad_merge.status().message().find("not in the vocab"), std::string::npos);
  auto j2 = nlohmann::json::parse(good);
  j2["model"]["vocab"].erase("A");
  EXPECT_FALSE(Tokenizer::parse_hf_json(j2.dump()).ok());
}

TEST(Tokenizer, WrongJsonTypesAreErrorsNotExceptions) {  // found by fuzz/fuzz_tokenizer
  const std::string good = trained(300).to_hf_json();
  const std::pair<const char*, nlohmann::json> cases[] = {
      {"/pre_tokenizer/use_regex", "-1"}, {"/pre_tokenizer/add_prefix_space", 1},
      {"/pre_tokenizer/type", 7},         {"/model/type", nlohmann::json::array()}};
  for (const auto& [pointer, value] : cases) {
    auto j = nlohmann::json::parse(good);
    j[nlohmann::json::json_pointer(pointer)] = value;
    auto t = Tokenizer::parse_hf_json(j.dump());  // threw nlohmann type_error before
    ASSERT_FALSE(t.ok()) << pointer;
    EXPECT_EQ(t.status().code(), StatusCode::kDataLoss) << pointer << ": " << t.status().message();
  }
}

TEST(Tokenizer, LoadsGpt2StyleFiles) {
  const Tokenizer t = trained(300);
  const auto j = nlohmann::json::parse(t.to_hf_json());
  const auto dir = std::filesystem::temp_directory_path();
  {
    std::ofstream enc(dir / "kiln_encoder.json");
    enc << j["model"]["vocab"].dump();
    std::ofstream bpe(dir / "kiln_vocab.bpe");
    bpe << "#version: 0.2\n";
    for (const auto& m : j["model"]["merges"]) bpe << m.get<std::string>() << "\n";
  }
  const Tokenizer g = Tokenizer::load_gpt2((dir / "kiln_encoder.json").string(), (dir / "kiln_vocab.bpe").string()).value();
  const std::string text = read(kRef / "data/multilingual.txt");
  EXPECT_EQ(g.encode(text), t.encode(text));
}

}  // namespace
}  // namespace kiln::tok
