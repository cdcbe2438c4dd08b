// gemm_f16 cases for the kernel harness: the fp16-arithmetic GEMM (gemm_f16.h) against
// ref::gemm_f16 (f32 products and sums of the same halves) over odd m, n, k (partial 12 x 64
// tiles, several K blocks), padded leading dims and chunks from 1 to 4096.
//
// Tolerance. Under the AVX-512 target on a CPU with AVX512-FP16 the products and the sums within
// a chunk of L k steps are fp16 (unit roundoff u = 2^-11). With inputs uniform in [-1, 1] a
// product has variance 1/9 and a running sum of l products variance l/9; each fp16 add rounds
// with an error of variance about u^2 s^2 / 3 on a sum s, so a chunk's sum carries
// sum_l u^2 (l/9) / 3 ~ u^2 L^2 / 54 against its variance L/9: a relative squared error of
// u^2 L / 6, plus u^2 / 3 from rounding each product. The chunks' errors and values add
// independently, so the nmse over K is about u^2 (L/6 + 1/3); the bound is ten times that
// (L = min(chunk, K)). Everywhere else the halves are widened and the f32 GEMM runs: fp32 nmse
// 1e-10. A wrong index or a lost chunk gives an nmse of order 1.
#include <algorithm>
#include <cmath>

#include "kiln/core/dtype.h"
#include "kiln/kernels/gemm_f16.h"
#include "tests/kernels/harness.h"

namespace kiln::testing {
namespace {

struct F16Case {
  int64_t m, n, k;
  int chunk = 64;
  int64_t pad = 0;  // extra elements per stored row of A, B and C

  std::string name() const {
    return fmt::format("m={} n={} k={} chunk={} pad={}", m, n, k, chunk, pad);
  }
};

double max_nmse(const F16Case& g) {
  if (!cpu::gemm_f16_native()) return 1e-10;
  const double u = std::ldexp(1.0, -11);
  const double l = static_cast<double>(std::max<int64_t>(1, std::min<int64_t>(g.chunk, g.k)));
  return 10.0 * u * u * (l / 6.0 + 1.0 / 3.0) + 1e-10;
}

KernelCase make_case(const F16Case& g, uint64_t seed) {
  return {g.name(), [g, seed]() {
            Rng rng(seed);
            const int64_t lda = g.k + g.pad, ldb = g.k + g.pad, ldc = g.n + g.pad;
            std::vector<uint16_t> a(static_cast<size_t>(std::max<int64_t>(1, g.m * lda)));
            std::vector<uint16_t> b(static_cast<size_t>(std::max<int64_t>(1, g.n * ldb)));
            for (uint16_t& x : a) x = f32_to_f16(rng.uniform(-1.0f, 1.0f));
            for (uint16_t& x : b) x = f32_to_f16(rng.uniform(-1.0f, 1.0f));
            std::vector<float> expected(static_cast<size_t>(g.m * ldc), kPaddingSentinel);
            std::vector<float> actual = expected;
            for (int64_t i = 0; i < g.m; ++i)
              for (int64_t j = 0; j < g.n; ++j) actual[i * ldc + j] = NAN;  // C is overwritten
            GemmF16Params p;
            p.m = g.m, p.n = g.n, p.k = g.k, p.chunk = g.chunk;
            p.a = a.data(), p.lda = lda, p.b = b.data(), p.ldb = ldb, p.ldc = ldc;
            p.c = expected.data();
            ref::gemm_f16(p);
            p.c = actual.data();
            cpu::gemm_f16(p);
            return compare_strided("C", expected, actual, g.m, g.n, ldc, max_nmse(g));
          }};
}

}  // namespace

KILN_KERNEL_CASES(gemm_f16) {
  std::vector<KernelCase> cases;
  uint64_t seed = 1601;
  for (int64_t m : {1, 11, 12, 13, 50})
    for (int64_t n : {1, 63, 64, 65, 130})
      for (int64_t k : {0, 1, 31, 200})
        cases.push_back(make_case({m, n, k, 64, (m + n) % 3}, seed++));
  // Several K blocks (512 steps at chunk 64; a chunk above 512 is its own block), chunk lengths
  // that do and do not divide K, and a padded layout.
  for (int chunk : {1, 16, 64, 100, 512, 4096})
    for (int64_t k : {513, 1100}) cases.push_back(make_case({29, 70, k, chunk, 3}, seed++));
  cases.push_back(make_case({250, 140, 1030, 64, 5}, seed++));  // two M blocks of 240 rows
  return cases;
}

}  // namespace kiln::testing
