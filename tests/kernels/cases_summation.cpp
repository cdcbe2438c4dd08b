// Summation cases for the kernel harness: cpu::sum (f32 accumulator, every SIMD target and
// thread count) against ref::sum, same method. The orders differ (lanes, blocks), so the
// tolerance is the sum of both bounds from summation.h, relative to the exact sum, squared.
#include <cmath>

#include "kiln/kernels/summation.h"
#include "tests/kernels/ops_cases_util.h"

namespace kiln::testing {

KILN_KERNEL_CASES(summation) {
  std::vector<KernelCase> cases;
  for (int64_t n : {1, 7, 33, 257, 1000, 65536, 65537, 200003}) {
    cases.push_back({fmt::format("n={}", n), [n] {
                       Rng rng(700 + n);
                       const std::vector<float> x = random_vector(rng, n, -1.0f, 2.0f);
                       const double exact = ref::sum_exact(x.data(), n);
                       double s1 = 0;
                       for (float v : x) s1 += std::fabs(v);
                       const double u = std::ldexp(1.0, -24), dn = static_cast<double>(n);
                       std::vector<Compare> out;
                       for (SumMethod m : kSumMethods) {
                         const double b = m == SumMethod::kNaive      ? 2 * dn * u
                                          : m == SumMethod::kPairwise ? 2 * (std::log2(dn) + 40) * u
                                                                      : 6 * u + 8 * dn * u * u;
                         const double rel = b * s1 / std::max(std::fabs(exact), 1e-30);
                         out.push_back({std::string(sum_method_name(m)),
                                        {ref::sum(x.data(), n, m, DType::kF32)},
                                        {cpu::sum(x.data(), n, m, DType::kF32)},
                                        rel * rel});
                       }
                       return out;
                     }});
  }
  return cases;
}

}  // namespace kiln::testing
