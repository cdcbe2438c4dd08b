// The GEMM tuning cache (`kiln bench gemm --tune` writes it, every later run reads it once):
// a valid file sets the blocking, a corrupt one is ignored with a warning, never a crash.
// Each case runs in a fresh child process (threadsafe death-test style re-executes the binary),
// because the file is read once per process.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "kiln/kernels/cpu/gemm_cpu.h"

namespace kiln {
namespace {

std::string write_tune_file(const char* name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path.string();
}

// Exits 0 when the f32 blocking read from `path` equals `want`.
[[noreturn]] void check_blocking_in_child(const std::string& path, cpu::GemmBlocking want) {
  setenv("KILN_TUNE_FILE", path.c_str(), 1);
  const cpu::GemmBlocking b = cpu::gemm_blocking(cpu::GemmPath::kF32);
  std::exit(b.mc == want.mc && b.kc == want.kc && b.nc == want.nc ? 0 : 1);
}

TEST(GemmTune, ValidFileSetsTheBlocking) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path =
      write_tune_file("kiln_tune_valid.json", R"({"version": 1, "f32": {"mc": 112, "kc": 256, "nc": 512}})");
  EXPECT_EXIT(check_blocking_in_child(path, {112, 256, 512}), ::testing::ExitedWithCode(0), "");
}

TEST(GemmTune, CorruptFileFallsBackToDefaultsWithAWarning) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const cpu::GemmBlocking defaults = cpu::default_gemm_blocking(cpu::GemmPath::kF32);
  for (const char* text : {"{not json", R"({"f32": {"mc": "big"}})", R"({"f32": 7})"}) {
    const std::string path = write_tune_file("kiln_tune_corrupt.json", text);
    EXPECT_EXIT(check_blocking_in_child(path, defaults), ::testing::ExitedWithCode(0),
                "ignoring unreadable GEMM tuning file")
        << text;
  }
}

TEST(GemmTune, SavedFileIsReadBackByTheNextProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Each child re-runs this body up to its own statement, so the directory is cleared inside the
  // saving child only.
  const auto dir = std::filesystem::temp_directory_path() / "kiln_tune_save";
  const std::string path = (dir / "nested" / "gemm_tune.json").string();  // directories are created
  EXPECT_EXIT(
      {
        std::filesystem::remove_all(dir);
        setenv("KILN_TUNE_FILE", path.c_str(), 1);
        cpu::set_gemm_blocking(cpu::GemmPath::kF32, {96, 320, 768});
        std::exit(cpu::save_gemm_tuning().ok() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(check_blocking_in_child(path, {96, 320, 768}), ::testing::ExitedWithCode(0), "");
  std::filesystem::remove_all(dir);
}

TEST(GemmTune, AbsentFileMeansDefaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(check_blocking_in_child("/nonexistent/kiln_tune.json", cpu::default_gemm_blocking(cpu::GemmPath::kF32)),
              ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace kiln
