// The CUDA catalog (kernels/cuda_catalog.h) on any machine: the launch configurations are plain
// host logic, and a CUDA build embeds a ptxas log naming every kernel it launches.
#include <gtest/gtest.h>

#include <set>

#include "kiln/kernels/cuda/launch.h"
#include "kiln/kernels/cuda_catalog.h"
#include "kiln/perf/gpu_model.h"

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

// The split-KV decode's chunking (launch.h's decode_split) is host logic: chunks are whole cache
// blocks, none lies entirely past the longest sequence, and the automatic count aims at
// kDecodeTargetBlocks blocks.
TEST(CudaCatalog, DecodeSplitFollowsCacheBlocks) {
  // Asked for 8 chunks of 20 blocks of 16: 3 blocks per chunk, so 7 chunks cover the 20.
  DecodeSplit d = decode_split(8, 3, 6, 2, 2, 16, 20);
  EXPECT_EQ(d.num_splits, 7);
  EXPECT_EQ(d.chunk_keys, 3 * 16);
  // Never more chunks than blocks, never fewer than one.
  d = decode_split(100, 1, 8, 8, 1, 16, 5);
  EXPECT_EQ(d.num_splits, 5);
  EXPECT_EQ(d.chunk_keys, 16);
  d = decode_split(1, 1, 8, 8, 1, 16, 5);
  EXPECT_EQ(d.num_splits, 1);
  EXPECT_EQ(d.chunk_keys, 5 * 16);
  EXPECT_EQ(decode_split(4, 1, 8, 8, 1, 16, 0).num_splits, 1);  // an empty table
  // Automatic: 4 sequences x 8 KV heads x 1 row group (4 query heads each, one query) = 32
  // blocks per chunk, so 8 chunks make the 256.
  EXPECT_EQ(decode_row_groups(32, 8, 1), 1);
  EXPECT_EQ(decode_row_groups(32, 8, 3), 2);  // 12 rows: two groups of 8 warps
  d = decode_split(0, 4, 32, 8, 1, 16, 256);
  EXPECT_EQ(d.num_splits, kDecodeTargetBlocks / 32);
  EXPECT_EQ(d.num_splits * d.chunk_keys, 256 * 16);
  const LaunchConfig c = attention_decode_launch(4, 32, 8, 1, 128, d.num_splits);
  EXPECT_EQ(c.blocks(), kDecodeTargetBlocks);
  EXPECT_EQ(c.smem_bytes, attention_smem_bytes(128));
  // The workspace: per chunk and query row, D outputs plus max and sum; none for one chunk.
  EXPECT_EQ(decode_workspace_floats(8, 4 * 32, 128), 8 * 4 * 32 * 130);
  EXPECT_EQ(decode_workspace_floats(1, 4 * 32, 128), 0);
  EXPECT_EQ(attention_decode_combine_launch(4 * 32).blocks(), 4 * 32 / kAttnWarps);
}

// The backward launches: dK/dV one block per 32 keys and KV head, dQ the forward's grid; the
// norms' weight gradients one block per 32 columns.
TEST(CudaCatalog, BackwardLaunches) {
  const LaunchConfig kv = attention_backward_dkdv_launch(2, 3, 65, 64);
  EXPECT_EQ(kv.blocks(), 3 * 3 * 2);
  EXPECT_EQ(kv.threads, 32 * kAttnWarps);
  EXPECT_EQ(kv.smem_bytes, 4 * (2 * 32 * 65 + 2 * 8 * 64 + 2 * 8 * 32));
  const LaunchConfig dq = attention_backward_dq_launch(2, 6, 33, 64);
  EXPECT_EQ(dq.blocks(), attention_launch(2, 6, 33, 64).blocks());
  EXPECT_EQ(dq.smem_bytes, 4 * (2 * 32 * 65 + 2 * 8 * 64));
  const LaunchConfig col = column_launch(1000);
  EXPECT_EQ(col.blocks(), ceil_div(1000, 32));
  EXPECT_EQ(col.threads, kColTile * kColRows);
  EXPECT_EQ(column_launch(1).blocks(), 1);
}

// The TMA rung's staged tiles: TMA writes each (rows, 32) bf16 box densely with the 64-byte
// swizzle, and the mma fragment loads (lane l: row g = l / 4, k pair 2t, t = l % 4, of an 8-row
// group) must stay conflict-free on it, where the same dense rows unswizzled conflict 4 ways.
// The swizzle is a permutation of each row's four chunks, and a stage is 1024-byte aligned.
TEST(CudaCatalog, TmaSwizzleKeepsFragmentLoadsConflictFree) {
  for (int row0 : {0, 8, 16, 120})
    for (int k0 : {0, 8, 16, 24}) {
      std::vector<uint64_t> swizzled, dense;
      for (int lane = 0; lane < 32; ++lane) {
        const int r = row0 + lane / 4, k = k0 + 2 * (lane % 4);
        swizzled.push_back(2 * static_cast<uint64_t>(gemm_tma_smem_index(r, k)));
        dense.push_back(2 * static_cast<uint64_t>(r * kGemmMmaBk + k));
      }
      EXPECT_EQ(perf::bank_conflicts(swizzled, 4).degree, 1) << "rows " << row0 << " k " << k0;
      EXPECT_EQ(perf::bank_conflicts(dense, 4).degree, 4) << "rows " << row0 << " k " << k0;
    }
  for (int r = 0; r < 16; ++r) {
    std::set<int> chunks;
    for (int k = 0; k < kGemmMmaBk; ++k) {
      const int at = gemm_tma_smem_index(r, k);
      EXPECT_EQ(at / kGemmMmaBk, r);              // stays in its row
      EXPECT_EQ(at % 8, k % 8);                   // a chunk moves whole
      chunks.insert(at % kGemmMmaBk / 8);
    }
    EXPECT_EQ(chunks.size(), 4u);
  }
  EXPECT_EQ(gemm_launch(GemmKernel::kMmaTma, 1000, 300).smem_bytes,
            kGemmTmaStages * 2 * (kGemmMmaBm + kGemmMmaBn) * kGemmMmaBk + 1024);
  EXPECT_EQ((2 * kGemmMmaBm * kGemmMmaBk) % 1024, 0);  // the B tile and the next stage stay aligned
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
