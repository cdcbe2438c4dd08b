// The CUDA catalog (kernels/cuda_catalog.h) on any machine: the launch configurations are plain
// host logic, and a CUDA build embeds a ptxas log naming every kernel it launches.
#include <gtest/gtest.h>

#include <set>

#include "kiln/kernels/cuda/launch.h"
#include "kiln/kernels/cuda_catalog.h"

namespace kiln::cuda {
namespace {

TEST(CudaCatalog, LaunchesCoverTheProblem) {
  ProblemShape s;
  s.m = 1000, s.n = 300, s.k = 77;
  s.rows = 5, s.cols = 4000;
  s.batch = 2, s.heads = 6, s.kv_heads = 2, s.seq = 33, s.head_dim = 64;
  const auto launches = kernel_launches(s);
  ASSERT_FALSE(launches.empty());
  std::set<std::string> names;
  for (const KernelLaunch& k : launches) {
    EXPECT_TRUE(names.insert(k.kernel).second) << "twice: " << k.kernel;
    EXPECT_EQ(k.kernel.rfind("kiln::cuda::", 0), 0u) << k.kernel;
    EXPECT_EQ(k.kernel.find('('), std::string::npos) << k.kernel;  // no parameter list
    EXPECT_GT(k.grid_blocks, 0) << k.kernel;
    EXPECT_GT(k.threads_per_block, 0) << k.kernel;
    EXPECT_LE(k.threads_per_block, 1024) << k.kernel;
    EXPECT_EQ(k.threads_per_block % 32, 0) << k.kernel;
    EXPECT_GE(k.dynamic_smem_bytes, 0) << k.kernel;
    EXPECT_FALSE(k.family.empty());
  }
  // The GEMM rungs cover C (1000, 300) with whole tiles.
  for (GemmKernel g : kGemmLadder) EXPECT_EQ(gemm_launch(g, s.m, s.n).threads % 32, 0);
  EXPECT_EQ(gemm_launch(GemmKernel::kNaive, s.m, s.n).blocks(),
            ceil_div(1000, 16) * ceil_div(300, 16));
  EXPECT_EQ(gemm_launch(GemmKernel::kMma, s.m, s.n).blocks(),
            ceil_div(1000, 128) * ceil_div(300, 128));
  EXPECT_EQ(gemm_launch(GemmKernel::kMmaCpAsync, s.m, s.n).smem_bytes,
            2 * gemm_launch(GemmKernel::kMma, s.m, s.n).smem_bytes);
  EXPECT_TRUE(names.count("kiln::cuda::gemm_register_tiled<128, 128, 8, 8, 8, 4>"));
  EXPECT_TRUE(names.count("kiln::cuda::gemm_mma_bf16<128, 128, 32, 2>"));
  // One block per row; attention: ceil(33 / 8) query tiles x 6 heads x 2 sequences.
  const LaunchConfig rows = row_launch(s.rows, s.cols);
  EXPECT_EQ(rows.blocks(), 5);
  EXPECT_EQ(rows.threads, kRowMaxThreads);
  EXPECT_EQ(row_launch(3, 5).threads, 32);
  EXPECT_EQ(attention_launch(2, 6, 33, 64).blocks(), 5 * 6 * 2);
  EXPECT_EQ(attention_launch(2, 6, 33, 64).smem_bytes, 4 * (2 * 32 * 65 + 8 * 64));
}

TEST(CudaCatalog, PtxasLogNamesEveryKernel) {
  if (!built()) {
    EXPECT_TRUE(ptxas_log().empty());
    EXPECT_TRUE(archs().empty());
    GTEST_SKIP() << "built without CUDA: no ptxas log";
  }
  EXPECT_EQ(archs(), "sm_80;sm_90");
  const std::string_view log = ptxas_log();
  ASSERT_FALSE(log.empty());
  EXPECT_NE(log.find("ptxas info"), std::string_view::npos);
  EXPECT_NE(log.find("for 'sm_80'"), std::string_view::npos);
  EXPECT_NE(log.find("for 'sm_90'"), std::string_view::npos);
  // Each kernel's mangled name holds its unqualified name (e.g. 19gemm_register_tiled).
  for (const KernelLaunch& k : kernel_launches(ProblemShape{})) {
    std::string base = k.kernel.substr(std::string("kiln::cuda::").size());
    base = base.substr(0, base.find('<'));
    const std::string mangled = std::to_string(base.size()) + base;
    EXPECT_NE(log.find(mangled), std::string_view::npos) << k.kernel << " not in the ptxas log";
  }
}

}  // namespace
}  // namespace kiln::cuda
