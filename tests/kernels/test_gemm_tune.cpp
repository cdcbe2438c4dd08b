// The GEMM tuning cache (the first-use autotune and `kiln bench gemm --tune` write it, every later
// run reads it once): this CPU's entry sets the blocking, other CPUs' entries are kept and not
// used, a corrupt file is ignored with a warning, never a crash; the cache model's constraints;
// the bf16 kernel choice; the autotune's search.
// Each case runs in a fresh child process (threadsafe death-test style re-executes the binary),
// because the file is read once per process.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>

#include <nlohmann/json.hpp>

#include "kiln/core/cpu_features.h"
#include "kiln/kernels/cpu/attention_tiles.h"
#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/cpu/gemm_kernels.h"
#include "kiln/kernels/gemm.h"

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

// This CPU's entry in a version-2 file, around `entry` (a JSON object's members).
std::string this_cpu_file(const std::string& entry) {
  nlohmann::json j;
  j["version"] = 2;
  j["cpus"]["some other CPU | L1d 32 KiB 8-way, L2 1024 KiB 8-way, L3 32768 KiB"] = {{"f32", {{"mc", 8}, {"kc", 16}, {"nc", 32}}}};
  j["cpus"][cpu::tune_cpu_key()] = nlohmann::json::parse("{" + entry + "}");
  return j.dump();
}

TEST(GemmTune, ValidFileSetsTheBlocking) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = write_tune_file("kiln_tune_valid.json", this_cpu_file(R"("f32": {"mc": 112, "kc": 256, "nc": 512})"));
  EXPECT_EXIT(check_blocking_in_child(path, {112, 256, 512}), ::testing::ExitedWithCode(0), "");
  // A version-1 file counts when it names this CPU's brand, not otherwise.
  const std::string v1 = nlohmann::json{{"version", 1}, {"cpu", cpu_features().brand}, {"f32", {{"mc", 96}, {"kc", 128}, {"nc", 640}}}}.dump();
  EXPECT_EXIT(check_blocking_in_child(write_tune_file("kiln_tune_v1.json", v1), {96, 128, 640}), ::testing::ExitedWithCode(0), "");
  const std::string v1_other = R"({"version": 1, "cpu": "another CPU", "f32": {"mc": 96, "kc": 128, "nc": 640}})";
  EXPECT_EXIT(check_blocking_in_child(write_tune_file("kiln_tune_v1o.json", v1_other), cpu::default_gemm_blocking(cpu::GemmPath::kF32)),
              ::testing::ExitedWithCode(0), "");
}

TEST(GemmTune, OtherCpusEntriesAreNotUsed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string text = R"({"version": 2, "cpus": {"some other CPU": {"f32": {"mc": 112, "kc": 256, "nc": 512}}}})";
  EXPECT_EXIT(check_blocking_in_child(write_tune_file("kiln_tune_other.json", text), cpu::default_gemm_blocking(cpu::GemmPath::kF32)),
              ::testing::ExitedWithCode(0), "");
}

TEST(GemmTune, CorruptFileFallsBackToDefaultsWithAWarning) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const cpu::GemmBlocking defaults = cpu::default_gemm_blocking(cpu::GemmPath::kF32);
  for (const std::string& text : {std::string("{not json"), this_cpu_file(R"("f32": {"mc": "big"})"), this_cpu_file(R"("f32": 7)")}) {
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

TEST(GemmTune, SavingKeepsOtherCpusEntries) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Each child re-runs the body up to its own statement: the file is written in the saving child.
  const std::string path = (std::filesystem::temp_directory_path() / "kiln_tune_keep.json").string();
  EXPECT_EXIT(
      {
        write_tune_file("kiln_tune_keep.json", R"({"version": 2, "cpus": {"another CPU": {"f32": {"mc": 8, "kc": 16, "nc": 32}}}})");
        setenv("KILN_TUNE_FILE", path.c_str(), 1);
        cpu::set_gemm_blocking(cpu::GemmPath::kF32, {98, 336, 1024});
        std::exit(cpu::save_gemm_tuning("test").ok() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("cpus").at("another CPU").at("f32").at("kc"), 16);
  const auto& mine = j.at("cpus").at(cpu::tune_cpu_key());
  EXPECT_EQ(mine.at("f32").at("mc"), 98);
  EXPECT_EQ(mine.at("source"), "test");
  EXPECT_TRUE(mine.at("bf16_kernel") == "dot" || mine.at("bf16_kernel") == "widen" || mine.at("bf16_kernel") == "amx");
  EXPECT_EXIT(check_blocking_in_child(path, {98, 336, 1024}), ::testing::ExitedWithCode(0), "");
}

// The cache model's constraints (gemm_cpu.h), on the caches of several CPU families: the A
// strip fits all but one way of L1, the M block and a group of B micro-panels fit all but one
// way of L2, the K x NC panel an eighth of L3 (where the bounds allow), and the multiples hold.
TEST(GemmCacheModel, BlockingMeetsItsCacheConstraints) {
  const cpu::CacheGeometry machines[] = {
      {32 << 10, 1 << 20, 32 << 20, 8, 8},      // Zen 4
      {48 << 10, 1 << 20, 32 << 20, 12, 16},    // Zen 5
      {48 << 10, 2 << 20, 260 << 20, 12, 16},   // Sapphire / Emerald Rapids VM
      {32 << 10, 256 << 10, 8 << 20, 8, 4},     // an older, small-L2 core
  };
  for (const cpu::CacheGeometry& c : machines) {
    for (auto [mr, nr, ks] : {std::tuple{14, 32, 1}, std::tuple{14, 32, 2}, std::tuple{6, 16, 1}}) {
      const cpu::GemmBlocking b = cpu::blocking_from_caches(c, mr, nr, ks);
      const int64_t steps = b.kc / ks;
      SCOPED_TRACE(::testing::Message() << "L1 " << c.l1d_bytes << " L2 " << c.l2_bytes << " mr " << mr << " ks " << ks);
      EXPECT_EQ(b.kc % ks, 0);
      EXPECT_EQ(steps % 16, 0);
      EXPECT_LE(int64_t{mr} * steps * 4, c.l1d_bytes * (c.l1d_ways - 1) / c.l1d_ways);
      EXPECT_GT(int64_t{mr} * (steps + 16) * 4, c.l1d_bytes * (c.l1d_ways - 1) / c.l1d_ways);  // the largest such
      EXPECT_EQ(b.mc % mr, 0);
      EXPECT_GE(b.mc, 2 * mr);
      if (b.mc > 2 * mr) EXPECT_LE((b.mc + cpu::kStripGroup * nr) * steps * 4, c.l2_bytes * (c.l2_ways - 1) / c.l2_ways);
      EXPECT_EQ(b.nc % 256, 0);
      EXPECT_GE(b.nc, 1024);
      EXPECT_LE(b.nc, 4096);
      if (b.nc > 1024) EXPECT_LE(steps * b.nc * 4, c.l3_bytes / 8);
    }
  }
  // Larger caches never give smaller blocks.
  const cpu::GemmBlocking small = cpu::blocking_from_caches(machines[0], 14, 32, 1);
  const cpu::GemmBlocking large = cpu::blocking_from_caches(machines[2], 14, 32, 1);
  EXPECT_GE(large.kc, small.kc);
  EXPECT_GE(large.nc, small.nc);
}

// The AMX path's model (gemm_cpu.h): one long K block, the M block's A in twice L2, NC from L3.
TEST(GemmTune, AmxBlockingFollowsItsModel) {
  for (int64_t l2 : {int64_t{1} << 20, int64_t{2} << 20, int64_t{4} << 20}) {
    cpu::CacheGeometry c;
    c.l2_bytes = l2;
    c.l3_bytes = int64_t{480} << 20;
    const cpu::GemmBlocking b = cpu::amx_blocking_from_caches(c);
    EXPECT_EQ(b.kc, cpu::kAmxKc);
    EXPECT_EQ(b.mc % 32, 0);
    EXPECT_LE(int64_t{b.mc} * b.kc * 2, 2 * l2);
    EXPECT_GT(int64_t{b.mc + 32} * b.kc * 2, 2 * l2);  // the largest such
    EXPECT_EQ(b.nc, 4096);
  }
  // Where the bf16 GEMM runs on AMX, that is its default blocking, and a tune-file entry timed on
  // another bf16 kernel (written before the AMX path existed) does not override it.
  if (!cpu::bf16_amx_available()) GTEST_SKIP() << "no usable AMX here: the rest needs it";
  const cpu::GemmBlocking amx = cpu::amx_blocking_from_caches(cpu::this_cpu_caches());
  const cpu::GemmBlocking def = cpu::default_gemm_blocking(cpu::GemmPath::kBF16);
  EXPECT_EQ(def.kc, amx.kc);
  EXPECT_EQ(def.mc, amx.mc);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const char* kernel : {"dot", "amx"}) {
    const std::string path = write_tune_file(
        "kiln_tune_amx.json", this_cpu_file(std::string(R"("f32": {"mc": 112, "kc": 256, "nc": 512}, "bf16": {"mc": 84, "kc": 512, "nc": 1024}, "bf16_kernel": ")") + kernel + "\""));
    const bool from_file = std::string(kernel) == "amx";
    EXPECT_EXIT(
        {
          setenv("KILN_TUNE_FILE", path.c_str(), 1);
          const cpu::GemmBlocking b = cpu::gemm_blocking(cpu::GemmPath::kBF16);
          std::exit((from_file ? b.mc == 84 && b.kc == 512 : b.mc == amx.mc && b.kc == amx.kc) ? 0 : 1);
        },
        ::testing::ExitedWithCode(0), "")
        << kernel;
  }
}

// A CPU without AMX never gets the AMX path. Its PackedPath is built with no kernel there, so
// every function pointer of a path must start null: one left uninitialized read as a kernel, and
// on AMD Zen 4 the bf16 GEMM and `kiln bench gemm` died on their first tile instruction (SIGILL).
TEST(GemmBf16Kernel, AmxOnlyWhereTheCpuHasIt) {
  const CpuFeatures& f = cpu_features();
  if (!(f.amx_tile && f.amx_bf16 && f.avx512_bf16)) {
    EXPECT_FALSE(cpu::bf16_amx_available());
    EXPECT_NE(cpu::bf16_gemm_kernel(), cpu::Bf16Kernel::kAmx);
  }
  // Built over memory that is not zero, as a path on the stack may be.
  alignas(cpu::GemmTargetKernels) unsigned char raw[sizeof(cpu::GemmTargetKernels)];
  std::memset(raw, 0xa5, sizeof raw);
  auto* k = new (raw) cpu::GemmTargetKernels;
  for (const cpu::PackedPath* p : {&k->f32, &k->bf16, &k->bf16_f32, &k->bf16_amx, &k->f16}) {
    EXPECT_EQ(p->pack_a, nullptr);
    EXPECT_EQ(p->pack_b, nullptr);
    EXPECT_EQ(p->kernel, nullptr);
    EXPECT_EQ(p->kernel_direct_a, nullptr);
  }
  EXPECT_EQ(k->small_m, nullptr);
  EXPECT_EQ(k->small_m_packed, nullptr);
  EXPECT_EQ(k->epilogue_rows, nullptr);
  k->~GemmTargetKernels();
}

// The bf16 product choice: KILN_BF16_GEMM forces it (children: it is decided once per process),
// and both kernels give the reference's numbers.
TEST(GemmBf16Kernel, EnvironmentForcesTheChoice) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("KILN_BF16_GEMM", "widen", 1);
        std::exit(cpu::bf16_gemm_kernel() == cpu::Bf16Kernel::kWiden ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  if (cpu_features().avx512_bf16 && active_simd_target() == SimdTarget::kAvx512) {
    EXPECT_EXIT(
        {
          setenv("KILN_BF16_GEMM", "dot", 1);
          std::exit(cpu::bf16_gemm_kernel() == cpu::Bf16Kernel::kDot ? 0 : 1);
        },
        ::testing::ExitedWithCode(0), "");
  }
  // AMX: the default where this process may use it; asked for where it may not, a warning and
  // another kernel (never the AMX path, whose first tile instruction would die). Targets without
  // bf16 products widen before reading the variable, so they print no warning.
  const bool amx = cpu::bf16_amx_available();
  const bool has_dot = cpu_features().avx512_bf16 && active_simd_target() == SimdTarget::kAvx512;
  EXPECT_EXIT(
      {
        unsetenv("KILN_BF16_GEMM");
        std::exit((cpu::bf16_gemm_kernel() == cpu::Bf16Kernel::kAmx) == amx ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(
      {
        setenv("KILN_BF16_GEMM", "amx", 1);
        std::exit((cpu::bf16_gemm_kernel() == cpu::Bf16Kernel::kAmx) == amx ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), amx || !has_dot ? "" : "no usable AMX-BF16");
  EXPECT_FALSE(cpu::bf16_gemm_choice().empty());
}

// The first-use autotune's search, shortened: it sets blockings within the clamps and the GEMM
// still matches the reference under them.
TEST(GemmAutotune, SearchSetsUsableBlockings) {
  const cpu::GemmBlocking saved_f32 = cpu::gemm_blocking(cpu::GemmPath::kF32);
  const cpu::GemmBlocking saved_bf16 = cpu::gemm_blocking(cpu::GemmPath::kBF16);
  cpu::AutotuneOptions opt;
  opt.size = 192;
  opt.reps = 1;
  int lines = 0;
  opt.log = [&](const std::string&) { ++lines; };
  const cpu::AutotuneResult r = cpu::autotune_gemm(opt);
  EXPECT_GT(lines, 5);
  EXPECT_GT(r.f32_gflops, 0.0);
  const cpu::GemmBlocking now = cpu::gemm_blocking(cpu::GemmPath::kF32);
  EXPECT_EQ(now.mc, r.f32.mc);
  EXPECT_EQ(now.kc, r.f32.kc);
  EXPECT_EQ(now.nc, r.f32.nc);
  EXPECT_GE(now.mc, 8);
  EXPECT_GE(now.kc, 16);
  const int64_t m = 77, n = 90, k = 333;
  std::vector<float> a(m * k), b(k * n), c(m * n), c_ref(m * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int>(i % 17) - 8) / 8;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int>(i % 13) - 6) / 8;
  GemmParams p;
  p.m = m, p.n = n, p.k = k, p.a = a.data(), p.b = b.data(), p.lda = k, p.ldb = n, p.ldc = n;
  p.c = c.data();
  cpu::gemm(p);
  p.c = c_ref.data();
  ref::gemm(p);
  for (size_t i = 0; i < c.size(); ++i) ASSERT_NEAR(c[i], c_ref[i], 1e-4) << i;  // small integers / 64: near exact
  cpu::set_gemm_blocking(cpu::GemmPath::kF32, saved_f32);
  cpu::set_gemm_blocking(cpu::GemmPath::kBF16, saved_bf16);
}

TEST(GemmTune, AbsentFileMeansDefaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(check_blocking_in_child("/nonexistent/kiln_tune.json", cpu::default_gemm_blocking(cpu::GemmPath::kF32)),
              ::testing::ExitedWithCode(0), "");
}

// What the first-use tests search: the trigger is the call's size; the search itself stays quick.
cpu::AutotuneOptions small_search() {
  cpu::AutotuneOptions small;
  small.size = 128;
  small.reps = 1;
  small.quant_size = 256;
  small.flash_seq = 128;
  return small;
}

// The first-use trigger: armed and without an entry for this CPU, a large GEMM runs the search
// once and saves it; small GEMMs, an unarmed library and several MPI ranks never do.
TEST(GemmAutotune, FirstLargeGemmTunesOnceAndSaves) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = (std::filesystem::temp_directory_path() / "kiln_tune_first_use.json").string();
  auto run = [&](bool arm, int64_t size, const char* ranks) {
    std::filesystem::remove(path);
    setenv("KILN_TUNE_FILE", path.c_str(), 1);
    if (ranks) setenv("OMPI_COMM_WORLD_LOCAL_SIZE", ranks, 1);
    cpu::set_first_use_autotune(arm, small_search());
    cpu::maybe_autotune_first_use(size, size, size);
    std::exit(std::filesystem::exists(path) && cpu::gemm_blocking_source() == "tune file (autotune)" &&
                      cpu::flash_v_packing_in_tune_file()
                  ? 0
                  : 1);
  };
  EXPECT_EXIT(run(true, 512, nullptr), ::testing::ExitedWithCode(0), "flash attention forward");
  EXPECT_EXIT(run(true, 256, nullptr), ::testing::ExitedWithCode(1), "");
  EXPECT_EXIT(run(false, 512, nullptr), ::testing::ExitedWithCode(1), "");
  EXPECT_EXIT(run(true, 512, "2"), ::testing::ExitedWithCode(1), "");
  std::filesystem::remove(path);
}

// A large enough flash forward is a trigger too, and the V-packing choice it times is saved with
// the tiles and read back as the forward's; a small one is not.
TEST(GemmAutotune, FirstFlashForwardDecidesTheVPacking) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = (std::filesystem::temp_directory_path() / "kiln_tune_first_flash.json").string();
  auto run = [&](int64_t seq) {
    std::filesystem::remove(path);
    setenv("KILN_TUNE_FILE", path.c_str(), 1);
    cpu::set_first_use_autotune(true, small_search());
    cpu::maybe_autotune_first_use_flash(seq, seq, 4);
    if (!cpu::flash_v_packing_in_tune_file()) std::exit(1);
    std::ifstream in(path);
    const bool saved = nlohmann::json::parse(in).at("cpus").at(cpu::tune_cpu_key()).at("flash_attention").at("fwd").at("pack_v");
    std::exit(saved == cpu::flash_tiles().fwd.pack_v && cpu::flash_tiles_source() == "tune file (autotune: V packing)" ? 0 : 2);
  };
  EXPECT_EXIT(run(512), ::testing::ExitedWithCode(0), "flash attention forward");
  EXPECT_EXIT(run(256), ::testing::ExitedWithCode(1), "");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln
