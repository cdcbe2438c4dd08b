// The FlashAttention tile choice in the tune file (attention_tiles.h): a saved choice is read back
// by the next process, it shares this CPU's entry with the GEMM blocking without either save
// losing the other's fields or other CPUs' entries, a bad entry falls back to the cache model
// with a warning, KILN_FLASH_TILES overrides; and the cache model's bounds on several CPUs.
// Like test_gemm_tune.cpp, each case that reads the file runs in a fresh child process.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kiln/kernels/cpu/attention_tiles.h"
#include "kiln/kernels/cpu/gemm_cpu.h"

namespace kiln {
namespace {

std::string temp_path(const char* name) { return (std::filesystem::temp_directory_path() / name).string(); }

// Exits 0 when the tiles read from `path` equal `want`.
[[noreturn]] void check_tiles_in_child(const std::string& path, cpu::FlashTileChoice want) {
  setenv("KILN_TUNE_FILE", path.c_str(), 1);
  std::exit(cpu::flash_tiles() == want ? 0 : 1);
}

// Exits 0 when the f32 blocking and its source read from `path` are `want` and `source`.
[[noreturn]] void check_gemm_in_child(const std::string& path, cpu::GemmBlocking want, const std::string& source) {
  setenv("KILN_TUNE_FILE", path.c_str(), 1);
  const cpu::GemmBlocking b = cpu::gemm_blocking(cpu::GemmPath::kF32);
  std::exit(b.mc == want.mc && b.kc == want.kc && b.nc == want.nc && cpu::gemm_blocking_source() == source ? 0 : 1);
}

// A version-2 file with this CPU's entry `entry` and another CPU's.
std::string write_entry(const char* name, const nlohmann::json& entry) {
  nlohmann::json j;
  j["version"] = 2;
  j["cpus"]["another CPU"] = {{"flash_attention", {{"fwd", {{"q", 32}, {"k", 64}}}, {"bwd", {{"q", 32}, {"k", 64}}}}}};
  j["cpus"][cpu::tune_cpu_key()] = entry;
  const std::string path = temp_path(name);
  std::ofstream(path) << j.dump();
  return path;
}

nlohmann::json flash_entry(cpu::FlashTiles fwd, cpu::FlashTiles bwd) {
  return {{"fwd", {{"q", fwd.q}, {"k", fwd.k}}}, {"bwd", {{"q", bwd.q}, {"k", bwd.k}}}};
}

TEST(FlashTune, EntrySetsTheTilesAndOtherCpusAreNotUsed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const cpu::FlashTileChoice want{{128, 256}, {32, 128}};
  const std::string path = write_entry("kiln_flash_tune.json", {{"flash_attention", flash_entry(want.fwd, want.bwd)}});
  EXPECT_EXIT(check_tiles_in_child(path, want), ::testing::ExitedWithCode(0), "");
  const std::string other = temp_path("kiln_flash_tune_other.json");
  std::ofstream(other) << R"({"version": 2, "cpus": {"another CPU": {"flash_attention": {"fwd": {"q": 128, "k": 256}, "bwd": {"q": 128, "k": 256}}}}})";
  EXPECT_EXIT(check_tiles_in_child(other, cpu::default_flash_tiles()), ::testing::ExitedWithCode(0), "");
}

TEST(FlashTune, BadEntryFallsBackToTheCacheModelWithAWarning) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const nlohmann::json bad[] = {
      {{"flash_attention", flash_entry({48, 64}, {64, 64})}},  // not a candidate
      {{"flash_attention", {{"fwd", {{"q", "big"}}}}}},
      {{"flash_attention", 7}},
  };
  for (const nlohmann::json& e : bad) {
    const std::string path = write_entry("kiln_flash_tune_bad.json", e);
    EXPECT_EXIT(check_tiles_in_child(path, cpu::default_flash_tiles()), ::testing::ExitedWithCode(0),
                "ignoring the flash-attention tiles")
        << e.dump();
  }
}

TEST(FlashTune, EnvironmentOverridesTheTuneFile) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = write_entry("kiln_flash_tune_env.json", {{"flash_attention", flash_entry({128, 256}, {128, 256})}});
  EXPECT_EXIT(
      {
        setenv("KILN_FLASH_TILES", "32x128", 1);
        check_tiles_in_child(path, {{32, 128}, {32, 128}});
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(
      {
        setenv("KILN_FLASH_TILES", "auto", 1);
        check_tiles_in_child(path, {{128, 256}, {128, 256}});
      },
      ::testing::ExitedWithCode(0), "");
}

// Saving the tiles keeps the GEMM's fields of the entry and the other CPUs' entries; saving the
// GEMM blocking afterwards keeps the tiles; the next process reads both.
TEST(FlashTune, SavedTilesAndGemmBlockingShareTheEntry) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto dir = std::filesystem::temp_directory_path() / "kiln_flash_tune_save";
  const std::string path = (dir / "nested" / "gemm_tune.json").string();  // directories are created
  const cpu::FlashTileChoice want{{64, 256, /*pack_v=*/true}, {128, 64}};
  EXPECT_EXIT(
      {
        std::filesystem::remove_all(dir);
        std::filesystem::create_directories(dir / "nested");
        std::ofstream(path) << R"({"version": 2, "cpus": {"another CPU": {"f32": {"mc": 8, "kc": 16, "nc": 32}}}})";
        setenv("KILN_TUNE_FILE", path.c_str(), 1);
        cpu::set_gemm_blocking(cpu::GemmPath::kF32, {96, 320, 768});
        if (!cpu::save_gemm_tuning("test").ok()) std::exit(1);
        cpu::set_flash_tiles(want);
        if (!cpu::save_flash_tuning("flash test").ok()) std::exit(2);
        cpu::set_gemm_blocking(cpu::GemmPath::kF32, {98, 336, 1024});
        std::exit(cpu::save_gemm_tuning("test 2").ok() ? 0 : 3);
      },
      ::testing::ExitedWithCode(0), "");
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_TRUE(j.at("cpus").contains("another CPU"));
  EXPECT_EQ(j.at("cpus").at(cpu::tune_cpu_key()).at("flash_attention").at("source"), "flash test");
  EXPECT_EXIT(check_tiles_in_child(path, want), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(check_gemm_in_child(path, {98, 336, 1024}, "tune file (test 2)"), ::testing::ExitedWithCode(0), "");
  std::filesystem::remove_all(dir);
}

// An entry that holds only the tiles leaves the GEMM on its cache model (and its first-use
// autotune armed): it is no GEMM tuning.
TEST(FlashTune, TilesAloneAreNoGemmEntry) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = write_entry("kiln_flash_tune_alone.json", {{"flash_attention", flash_entry({64, 64}, {64, 64})}});
  EXPECT_EXIT(check_gemm_in_child(path, cpu::default_gemm_blocking(cpu::GemmPath::kF32), "cache model"),
              ::testing::ExitedWithCode(0), "");
}

// The cache model picks candidates and meets its bounds (attention_tiles.cpp) on the caches of
// several CPU families: V_j in half of L1d, each pass's tile working set in half of L2.
TEST(FlashTileCacheModel, ChoiceMeetsItsCacheBounds) {
  const cpu::CacheGeometry machines[] = {
      {32 << 10, 1 << 20, 32 << 20, 8, 8},    // Zen 4
      {48 << 10, 1 << 20, 32 << 20, 12, 16},  // Zen 5
      {48 << 10, 2 << 20, 60 << 20, 12, 16},  // Sapphire / Emerald Rapids
      {32 << 10, 256 << 10, 8 << 20, 8, 4},   // Skylake client
      {64 << 10, 512 << 10, 16 << 20, 4, 8},  // larger L1, small L2
  };
  for (const cpu::CacheGeometry& c : machines) {
    for (int64_t d : {32, 64, 128}) {
      const cpu::FlashTileChoice t = cpu::flash_tiles_from_caches(c, d);
      EXPECT_TRUE(cpu::is_flash_tile_candidate(t.fwd) && cpu::is_flash_tile_candidate(t.bwd));
      if (t.fwd.k > cpu::kFlashTileK[0]) {
        EXPECT_LE(t.fwd.k * d * 4, c.l1d_bytes / 2);
      }
      if (t.fwd.q > cpu::kFlashTileQ[0]) {
        EXPECT_LE((t.fwd.q * (2 * d + t.fwd.k) + 2 * t.fwd.k * d) * 4, c.l2_bytes / 2);
      }
      EXPECT_LE(t.fwd.q, 64);  // the causal diagonal's waste
      EXPECT_EQ(t.bwd.k, t.fwd.k);
      if (t.bwd.q > cpu::kFlashTileQ[0]) {
        EXPECT_LE((t.bwd.q * (4 * d + 2 * t.bwd.k) + 2 * t.bwd.k * d) * 4, c.l2_bytes / 2);
      }
    }
  }
  // What the sweep chose on the Zen 4 VM (docs/results/attention-tiles-2026-12-06.md).
  EXPECT_EQ(cpu::flash_tiles_from_caches(machines[0], 64), (cpu::FlashTileChoice{{64, 64}, {128, 64}}));
}

// Causal and windowed calls shorter than 8 tiles get halved tiles (not below 64 or the tuned
// size); unmasked calls and long ones keep the tuned tiles, and every result is a candidate.
TEST(FlashTileLength, ShortMaskedCallsHalveTheirTiles) {
  for (int64_t tq : cpu::kFlashTileQ) {
    for (int64_t tk : cpu::kFlashTileK) {
      const cpu::FlashTiles tuned{tq, tk, true};
      for (int64_t T : {1, 16, 100, 256, 512, 1000, 1024, 2048, 4096}) {
        EXPECT_EQ(cpu::flash_tiles_for_length(tuned, T, false), tuned);
        const cpu::FlashTiles t = cpu::flash_tiles_for_length(tuned, T, true);
        EXPECT_TRUE(cpu::is_flash_tile_candidate(t)) << cpu::flash_tiles_name(t);
        EXPECT_TRUE(t.pack_v);
        for (auto [got, want] : {std::pair{t.q, tq}, std::pair{t.k, tk}}) {
          EXPECT_LE(got, want);
          EXPECT_TRUE(got == std::min<int64_t>(64, want) || 8 * got <= T)
              << T << " " << got;  // short: at most 1/8
          EXPECT_TRUE(got == want || 16 * got > T)
              << T << " " << got;  // halved no further than needed
        }
      }
    }
  }
  EXPECT_EQ(cpu::flash_tiles_for_length(cpu::FlashTiles{128, 64}, 256, true),
            (cpu::FlashTiles{64, 64}));
  EXPECT_EQ(cpu::flash_tiles_for_length(cpu::FlashTiles{128, 256}, 1024, true),
            (cpu::FlashTiles{128, 128}));
  EXPECT_EQ(cpu::flash_tiles_for_length(cpu::FlashTileChoice{{64, 64, true}, {128, 64}}, 256, true),
            (cpu::FlashTileChoice{{64, 64, true}, {64, 64}}));
}

}  // namespace
}  // namespace kiln
