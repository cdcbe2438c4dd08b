// Checkpoint integrity: a byte flipped in any section (header, params, m, v) is refused naming
// that section, and the trainer's state is left as it was; header fields of the wrong JSON type
// are errors, never exceptions; format-1 files are refused saying they carry no checksum.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "kiln/core/crc32c.h"
#include "kiln/core/file_io.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/trainer.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

ModelConfig tiny() {
  ModelConfig c;
  c.family = ModelFamily::kGpt2;
  c.vocab_size = 13; c.d_model = 8; c.n_layers = 2; c.n_heads = 2; c.n_kv_heads = 2;
  c.d_ff = 16; c.max_seq_len = 8; c.tied_embeddings = true;
  return c;
}

struct Fixture {
  TokenShard data;
  TrainOptions o;
  std::unique_ptr<Transformer> model;
  std::string path;
  std::string bytes;  // the good checkpoint

  Fixture() {
    data.vocab_size = 13;
    Rng rng(4);
    for (int i = 0; i < 600; ++i) data.tokens.push_back(static_cast<int32_t>(rng.below(13)));
    o.batch = 2; o.seq_len = 8; o.max_steps = 10; o.warmup_steps = 3;
    model = Transformer::create(tiny(), 8).value();
    // One folder per test: CTest runs this file's tests as parallel processes.
    const fs::path dir = fs::temp_directory_path() /
                         (std::string("kiln_ckpt_integrity_") +
                          ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir);
    path = (dir / "checkpoint.bin").string();
    Trainer t(*model, data, nullptr, o);
    for (int i = 0; i < 3; ++i) t.step();
    KILN_CHECK(t.save_checkpoint(path).ok());
    bytes = read_file(path).value();
  }
  // Loads `b` into a fresh trainer; the error, or "" when it loaded.
  std::string load(const std::string& b) {
    KILN_CHECK(write_file_atomic(path, {b}).ok());
    auto m = Transformer::create(tiny(), 99).value();
    const std::vector<float> before(m->params().begin(), m->params().end());
    Trainer t(*m, data, nullptr, o);
    const Status s = t.load_checkpoint(path);
    if (s.ok()) return "";
    // Refused: nothing was overwritten.
    EXPECT_EQ(t.steps_done(), 0);
    EXPECT_TRUE(std::equal(before.begin(), before.end(), m->params().begin())) << s.message();
    return s.message();
  }
};

TEST(CheckpointIntegrity, FlippedByteInEachSectionIsRefusedNamingIt) {
  Fixture f;
  ASSERT_EQ(f.load(f.bytes), "");
  auto h = parse_checkpoint_header(f.bytes, f.bytes.size());
  ASSERT_TRUE(h.ok()) << h.status().message();
  ASSERT_EQ(h->sections.size(), 3u);
  // (first byte, one past the last) of each section; the header section runs from the magic
  // through its CRC.
  std::vector<std::tuple<std::string, uint64_t, uint64_t>> spans = {{"header", 0, h->sections[0].offset}};
  for (const CheckpointSection& s : h->sections) spans.emplace_back(s.name, s.offset, s.offset + s.bytes);
  for (const auto& [name, begin, end] : spans) {
    // The first, last and a middle byte of the section, each bit pattern changed differently.
    for (const uint64_t at : {begin, begin + (end - begin) / 2, end - 1}) {
      std::string bad = f.bytes;
      bad[at] = static_cast<char>(bad[at] ^ (at % 2 ? 0x01 : 0x80));
      const std::string err = f.load(bad);
      ASSERT_FALSE(err.empty()) << "byte " << at << " of section " << name << " flipped, and it loaded";
      if (name != "header" || at >= 16) {  // a flipped magic reads "not a kiln checkpoint"
        EXPECT_NE(err.find("section " + name), std::string::npos) << "byte " << at << ": " << err;
      }
    }
  }
}

TEST(CheckpointIntegrity, EveryByteOfTheHeaderIsCovered) {
  Fixture f;
  auto h = parse_checkpoint_header(f.bytes, f.bytes.size());
  ASSERT_TRUE(h.ok());
  for (uint64_t at = 0; at < h->sections[0].offset; ++at) {
    std::string bad = f.bytes;
    bad[at] = static_cast<char>(bad[at] ^ 0x20);
    EXPECT_FALSE(parse_checkpoint_header(bad, bad.size()).ok()) << "byte " << at;
  }
}

// Re-signs a header after editing its JSON, so the type checks (not the CRC) are what refuse it.
std::string with_header(const std::string& good, const std::function<void(nlohmann::json&)>& edit) {
  uint64_t n = 0;
  std::memcpy(&n, good.data() + 8, 8);
  nlohmann::json j = nlohmann::json::parse(good.substr(16, n));
  edit(j);
  const std::string text = j.dump();
  const uint64_t len = text.size();
  std::string out = good.substr(0, 8);
  out.append(reinterpret_cast<const char*>(&len), 8);
  out += text;
  const uint32_t crc = crc32c(out);
  out.append(reinterpret_cast<const char*>(&crc), 4);
  out += good.substr(16 + n + 4);
  return out;
}

TEST(CheckpointIntegrity, WrongJsonTypesAreErrorsNotExceptions) {
  Fixture f;
  ASSERT_EQ(f.load(with_header(f.bytes, [](nlohmann::json&) {})), "");  // re-signing alone is fine
  const std::vector<std::pair<const char*, nlohmann::json>> edits = {
      {"step", "4"},          {"step", -1},           {"step", 1.5},          {"num_params", "x"},
      {"num_params", nullptr}, {"options", "{}"},     {"model", 3},           {"loss_scale", "1"},
      {"loss_scale", -1.0},   {"loss_scale_good_steps", true},                {"time_budget_steps", "9"},
      {"sections", "x"},      {"sections", nlohmann::json::array({1, 2, 3})}, {"format", 2},
  };
  for (const auto& edit : edits) {
    const auto& key = edit.first;  // not a structured binding: clang 14 cannot capture one
    const auto& value = edit.second;
    const std::string bad = with_header(f.bytes, [&](nlohmann::json& j) { j[key] = value; });
    std::string err;
    EXPECT_NO_THROW(err = f.load(bad)) << key;
    EXPECT_FALSE(err.empty()) << key << " = " << value.dump() << " loaded";
  }
  for (const char* key : {"step", "num_params", "options", "loss_scale", "sections", "format"}) {
    const std::string bad = with_header(f.bytes, [&](nlohmann::json& j) { j.erase(key); });
    EXPECT_FALSE(f.load(bad).empty()) << key << " missing, and it loaded";
  }
  auto bad_crc = with_header(f.bytes, [](nlohmann::json& j) { j["sections"][1]["crc32c"] = "12"; });
  EXPECT_NE(f.load(bad_crc).find("crc32c"), std::string::npos);
}

TEST(CheckpointIntegrity, FormatOneIsRefusedSayingItHasNoChecksum) {
  Fixture f;
  // A format-1 file: magic, length, JSON header, then the three sections, no CRCs.
  auto h = parse_checkpoint_header(f.bytes, f.bytes.size()).value();
  nlohmann::json j = {{"format", "kiln-checkpoint-1"}, {"step", h.step}, {"num_params", h.num_params},
                      {"model", h.model}, {"options", h.options}};
  const std::string text = j.dump();
  const uint64_t len = text.size();
  std::string old = f.bytes.substr(0, 8);
  old.append(reinterpret_cast<const char*>(&len), 8);
  old += text;
  old += f.bytes.substr(h.sections[0].offset);
  const std::string err = f.load(old);
  EXPECT_NE(err.find("no checksum"), std::string::npos) << err;
}

TEST(CheckpointIntegrity, TruncatedOrExtendedIsRefused) {
  Fixture f;
  EXPECT_FALSE(f.load(f.bytes.substr(0, f.bytes.size() - 1)).empty());
  EXPECT_FALSE(f.load(f.bytes + std::string(1, '\0')).empty());
  EXPECT_FALSE(f.load(f.bytes.substr(0, 20)).empty());
  EXPECT_FALSE(f.load("").empty());
}

}  // namespace
}  // namespace kiln
