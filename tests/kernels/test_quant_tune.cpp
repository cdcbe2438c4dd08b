// The quantized GEMMs' tile choice in the tune file (kernels/cpu/quant_tiles.h): a saved choice
// is read back by the next process beside the GEMM blocking, a bad field is named in a warning
// and keeps its default (never a crash), the search sets candidates, and the first-use trigger
// of a quantized GEMM tunes only what this CPU's entry lacks. Cases that read the file run in a
// fresh child process (threadsafe death-test style), because it is read once per process.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kiln/core/cpu_features.h"
#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/cpu/quant_tiles.h"

namespace kiln {
namespace {

std::string temp_path(const char* name) { return (std::filesystem::temp_directory_path() / name).string(); }

// A version-2 file whose entry for this CPU holds `entry` (a JSON object).
std::string write_entry(const char* name, const nlohmann::json& entry) {
  nlohmann::json j;
  j["version"] = 2;
  j["cpus"]["some other CPU"] = {{"quant_tiles", {{"bq_decode", 8}}}};
  j["cpus"][cpu::tune_cpu_key()] = entry;
  const std::string path = temp_path(name);
  std::ofstream(path) << j.dump();
  return path;
}

const cpu::QuantTiles kOdd{8, {2, 4}, {8, 1}, 16, 2};  // every knob off its default

TEST(QuantTune, JsonRoundTripsEveryCandidate) {
  for (int d : cpu::kBqDecodeTiles)
    for (const cpu::BqShape& s : cpu::kBqShapes)
      for (int g : cpu::kWoGemvChannels)
        for (int r : cpu::kWoRowsChannels) {
          const cpu::QuantTiles t{d, s, cpu::kBqShapes[0], g, r};
          std::string warnings;
          EXPECT_EQ(cpu::quant_tiles_from_json(cpu::quant_tiles_to_json(t), &warnings), t) << cpu::quant_tiles_name(t);
          EXPECT_EQ(warnings, "");
        }
  EXPECT_EQ(cpu::parse_bq_shape("6x2"), (cpu::BqShape{6, 2}));
  for (const char* bad : {"", "x", "4x", "x2", "4x2x1", "4*2", "-4x2", " 4x2"})
    EXPECT_EQ(cpu::parse_bq_shape(bad), (cpu::BqShape{0, 0})) << bad;
}

TEST(QuantTune, MalformedValueIsRejectedByName) {
  std::string warnings;
  const nlohmann::json j = {{"bq_decode", 5}, {"bq_batch", "3x3"}, {"bq_prefill", 42}, {"wo_gemv", "8"}, {"wo_rows", 4}};
  const cpu::QuantTiles t = cpu::quant_tiles_from_json(j, &warnings);
  EXPECT_EQ(t, cpu::QuantTiles{});  // every bad field keeps its default (wo_rows 4 is the default too)
  for (const char* field : {"quant_tiles.bq_decode: 5 is not a candidate (2, 4, 8)", "quant_tiles.bq_batch: \"3x3\"",
                            "quant_tiles.bq_prefill: 42", "quant_tiles.wo_gemv: \"8\""})
    EXPECT_NE(warnings.find(field), std::string::npos) << field << " in: " << warnings;
  EXPECT_EQ(warnings.find("wo_rows"), std::string::npos) << warnings;
  warnings.clear();
  EXPECT_EQ(cpu::quant_tiles_from_json(nlohmann::json::array({1, 2}), &warnings), cpu::QuantTiles{});
  EXPECT_NE(warnings.find("not an object"), std::string::npos);
}

TEST(QuantTune, BadFieldInTheFileWarnsAndKeepsTheRest) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  nlohmann::json q = cpu::quant_tiles_to_json(kOdd);
  q["bq_prefill"] = "16x16";
  const std::string path = write_entry("kiln_qtune_bad.json", {{"quant_tiles", q}});
  EXPECT_EXIT(
      {
        setenv("KILN_TUNE_FILE", path.c_str(), 1);
        cpu::QuantTiles want = kOdd;
        want.bq_prefill = cpu::QuantTiles{}.bq_prefill;
        // A bad member does not count as tuned: the first-use search runs again.
        std::exit(cpu::quant_tiles() == want && !cpu::quant_tiles_in_tune_file() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "quant_tiles.bq_prefill: \"16x16\" is not a candidate");
  // A file that is not JSON: defaults, a warning.
  const std::string junk = temp_path("kiln_qtune_junk.json");
  std::ofstream(junk) << "{not json";
  EXPECT_EXIT(
      {
        setenv("KILN_TUNE_FILE", junk.c_str(), 1);
        std::exit(cpu::quant_tiles() == cpu::QuantTiles{} ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "ignoring the quantized GEMM tiles");
}

TEST(QuantTune, SavedTilesAreReadBackBesideTheGemmBlocking) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Each child re-runs the body up to its own statement: the file is written in the saving child.
  const std::string path = temp_path("kiln_qtune_save.json");
  EXPECT_EXIT(
      {
        write_entry("kiln_qtune_save.json", {{"f32", {{"mc", 98}, {"kc", 336}, {"nc", 1024}}}});
        setenv("KILN_TUNE_FILE", path.c_str(), 1);
        cpu::set_quant_tiles(kOdd);
        std::exit(cpu::save_quant_tuning("test").ok() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  const nlohmann::json& mine = j.at("cpus").at(cpu::tune_cpu_key());
  EXPECT_EQ(mine.at("f32").at("mc"), 98);  // the GEMM fields are kept
  EXPECT_EQ(mine.at("quant_tiles").at("bq_batch"), "2x4");
  EXPECT_EQ(mine.at("quant_tiles").at("source"), "test");
  EXPECT_EQ(j.at("cpus").at("some other CPU").at("quant_tiles").at("bq_decode"), 8);  // other CPUs kept
  EXPECT_EXIT(
      {
        setenv("KILN_TUNE_FILE", path.c_str(), 1);
        std::exit(cpu::quant_tiles() == kOdd && cpu::quant_tiles_source() == "tune file (test)" &&
                          cpu::quant_tiles_in_tune_file() && cpu::gemm_blocking(cpu::GemmPath::kF32).mc == 98
                      ? 0
                      : 1);
      },
      ::testing::ExitedWithCode(0), "");
  std::filesystem::remove(path);
}

TEST(QuantTune, AbsentFileMeansDefaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("KILN_TUNE_FILE", "/nonexistent/kiln_tune.json", 1);
        std::exit(cpu::quant_tiles() == cpu::QuantTiles{} && cpu::quant_tiles_source() == "default" ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// The search, shortened: it sets candidates, and where it cannot vary (AVX2, scalar) says so.
TEST(QuantAutotune, SearchSetsCandidates) {
  const cpu::QuantTiles saved = cpu::quant_tiles();
  cpu::QuantTuneOptions opt;
  opt.size = 256;
  opt.reps = 1;
  opt.min_seconds = 0.0005;
  int lines = 0;
  opt.log = [&](const std::string&) { ++lines; };
  const cpu::QuantTuneResult r = cpu::autotune_quant_tiles(opt);
  EXPECT_TRUE(cpu::is_quant_tiles_candidate(r.best));
  EXPECT_EQ(cpu::quant_tiles(), r.best);
  if (r.searched) {
    EXPECT_EQ(lines, 3 + 4 + 4 + 3 + 2);  // one line per candidate of each knob
    for (double ratio : {r.bq_decode_ratio, r.bq_batch_ratio, r.bq_prefill_ratio, r.wo_gemv_ratio, r.wo_rows_ratio})
      EXPECT_LE(ratio, 1.0);
  }
  cpu::set_quant_tiles(saved);
}

// The first-use trigger of a quantized GEMM: armed, with a GEMM entry but no quant_tiles, a
// large weight tunes the tiles only and saves them; small weights and an unarmed library never do.
TEST(QuantAutotune, FirstQuantizedGemmTunesWhatTheEntryLacks) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = temp_path("kiln_qtune_first_use.json");
  auto run = [&](bool arm, int64_t size) {
    write_entry("kiln_qtune_first_use.json", {{"f32", {{"mc", 98}, {"kc", 336}, {"nc", 1024}}}, {"source", "test"}});
    setenv("KILN_TUNE_FILE", path.c_str(), 1);
    cpu::AutotuneOptions small;
    small.size = 128;
    small.reps = 1;
    small.quant_size = 256;
    cpu::set_first_use_autotune(arm, small);
    cpu::maybe_autotune_first_use_quant(size, size);
    std::ifstream in(path);
    const nlohmann::json j = nlohmann::json::parse(in);
    const nlohmann::json& mine = j.at("cpus").at(cpu::tune_cpu_key());
    const bool tuned = mine.contains("quant_tiles") && mine.at("quant_tiles").at("source") == "autotune";
    std::exit(tuned && mine.at("f32").at("mc") == 98 && mine.at("source") == "test" ? 0 : 1);  // GEMM part untouched
  };
  EXPECT_EXIT(run(true, 512), ::testing::ExitedWithCode(0), "quantized GEMM tiles (tuned|fixed on this target) in");
  EXPECT_EXIT(run(true, 256), ::testing::ExitedWithCode(1), "");
  EXPECT_EXIT(run(false, 2048), ::testing::ExitedWithCode(1), "");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln
