// The f32 micro-kernel's register tilings: the one cpu::gemm uses and the others that
// `kiln bench gemm --tiles` times beside it (GemmTargetKernels::f32_other_tiles). Each must compute
// the product, partial tiles included, or its rate would mean nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kiln/core/cpu_features.h"
#include "kiln/core/rng.h"
#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/cpu/gemm_kernels.h"
#include "kiln/kernels/gemm.h"

namespace kiln {
namespace {

// C (m, n) = A (m, k) B (k, n) through `path`'s packing and its kernel, tile by tile, one K block.
std::vector<float> product_through(const cpu::PackedPath& path, const std::vector<float>& a, const std::vector<float>& b,
                                   int64_t m, int64_t n, int64_t k) {
  GemmParams p;
  p.m = m; p.n = n; p.k = k;
  p.a = a.data(); p.lda = k;
  p.b = b.data(); p.ldb = n;
  const int64_t mstrips = (m + path.mr - 1) / path.mr, nstrips = (n + path.nr - 1) / path.nr;
  std::vector<float> ap(static_cast<size_t>(mstrips * path.mr * k + 16)), bp(static_cast<size_t>(nstrips * path.nr * k + 16));
  path.pack_a(p, 0, m, 0, k, ap.data());
  path.pack_b(p, 0, n, 0, k, bp.data());
  std::vector<float> c(static_cast<size_t>(m * n), -7.0f);  // beta 0: overwritten
  const cpu::TileEpilogue ep;
  for (int64_t ms = 0; ms < mstrips; ++ms)
    for (int64_t ns = 0; ns < nstrips; ++ns) {
      const int mv = static_cast<int>(std::min<int64_t>(path.mr, m - ms * path.mr));
      const int nv = static_cast<int>(std::min<int64_t>(path.nr, n - ns * path.nr));
      path.kernel(k, ap.data() + ms * path.mr * k, bp.data() + ns * path.nr * k, c.data() + ms * path.mr * n + ns * path.nr,
                  n, mv, nv, ep);
    }
  return c;
}

std::vector<const cpu::GemmTargetKernels*> targets_here() {
  std::vector<const cpu::GemmTargetKernels*> t;
  if (active_simd_target() >= SimdTarget::kAvx2) t.push_back(&cpu::gemm_kernels_avx2());
  if (active_simd_target() >= SimdTarget::kAvx512) t.push_back(&cpu::gemm_kernels_avx512());
  return t;
}

TEST(GemmTiles, EveryRegisterTilingComputesTheProduct) {
  if (targets_here().empty()) GTEST_SKIP() << "no AVX2 or AVX-512 on this CPU";
  for (const cpu::GemmTargetKernels* kernels : targets_here()) {
    EXPECT_FALSE(kernels->f32_other_tiles.empty());
    std::vector<const cpu::PackedPath*> paths = {&kernels->f32};
    for (const cpu::PackedPath& p : kernels->f32_other_tiles) paths.push_back(&p);
    for (const cpu::PackedPath* path : paths) {
      // One element; one whole tile plus a row and a partial vector; several tiles, odd k.
      const int64_t shapes[3][3] = {{1, 1, 1}, {path->mr + 1, path->nr + 3, 7}, {2 * path->mr + 3, 2 * path->nr + 5, 37}};
      for (const auto& s : shapes) {
        const int64_t m = s[0], n = s[1], k = s[2];
        std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), want(static_cast<size_t>(m * n));
        Rng(m * 131 + n).fill_uniform(a);
        Rng(k * 17 + n).fill_uniform(b);
        GemmParams p;
        p.m = m; p.n = n; p.k = k;
        p.a = a.data(); p.lda = k;
        p.b = b.data(); p.ldb = n;
        p.c = want.data(); p.ldc = n;
        ref::gemm(p);
        const std::vector<float> got = product_through(*path, a, b, m, n, k);
        // Uniform [-1, 1) inputs: a sum of k products of magnitude <= 1, each FMA rounding once.
        const float tol = 4e-7f * static_cast<float>(k) + 1e-6f;
        for (int64_t i = 0; i < m * n; ++i)
          ASSERT_NEAR(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)], tol)
              << path->name << " m=" << m << " n=" << n << " k=" << k << " at " << i;
      }
    }
  }
}

// The bench's table: the tiling cpu::gemm uses first and marked, then each other one, all timed.
TEST(GemmTiles, RatesListTheUsedTilingFirst) {
  if (targets_here().empty()) GTEST_SKIP() << "no AVX2 or AVX-512 on this CPU";
  const std::vector<cpu::TileRate> rates = cpu::f32_tile_rates(0.001, 1);
  const cpu::GemmTargetKernels& k = *targets_here().back();
  ASSERT_EQ(rates.size(), k.f32_other_tiles.size() + 1);
  EXPECT_TRUE(rates[0].used);
  EXPECT_EQ(rates[0].name, k.f32.name);
  for (size_t i = 1; i < rates.size(); ++i) {
    EXPECT_FALSE(rates[i].used);
    EXPECT_EQ(rates[i].name, k.f32_other_tiles[i - 1].name);
    EXPECT_EQ(rates[i].mr, k.f32_other_tiles[i - 1].mr);
    EXPECT_EQ(rates[i].nr, k.f32_other_tiles[i - 1].nr);
  }
  for (const cpu::TileRate& r : rates) EXPECT_GT(r.gflops, 0.0) << r.name;
}

}  // namespace
}  // namespace kiln
