// The grouped GEMM op boundary: a group as a plain GemmParams, argument validation (each group
// through check_gemm, named by its index and shape) and FLOP/byte accounting.
#include "kiln/kernels/grouped_gemm.h"

#include <string_view>

namespace kiln {

GemmParams group_gemm_params(const GroupedGemmParams& p, size_t g) {
  const GemmGroup& e = p.groups[g];
  return {.m = e.m, .n = e.n, .k = e.k,
          .a = e.a, .lda = e.lda, .trans_a = p.trans_a,
          .b = e.b, .ldb = e.ldb, .trans_b = p.trans_b,
          .c = e.c, .ldc = e.ldc,
          .alpha = p.alpha, .beta = p.beta};
}

Status check_grouped_gemm(const GroupedGemmParams& p) {
  if (p.groups.data() == nullptr && !p.groups.empty())
    return invalid_argument("[grouped_gemm] {} groups at a null pointer", p.groups.size());
  for (size_t g = 0; g < p.groups.size(); ++g) {
    const Status s = check_gemm(group_gemm_params(p, g));
    if (s.ok()) continue;
    // check_gemm names the problem as "[gemm] ...": keep what follows, name the group instead.
    std::string_view what = s.message();
    if (what.starts_with("[gemm] ")) what.remove_prefix(7);
    const GemmGroup& e = p.groups[g];
    return invalid_argument("[grouped_gemm] group {} of {} (m={} n={} k={}): {}", g,
                            p.groups.size(), e.m, e.n, e.k, what);
  }
  return Status::ok_status();
}

double grouped_gemm_flops(const GroupedGemmParams& p) {
  double flops = 0;
  for (const GemmGroup& e : p.groups) flops += gemm_flops(e.m, e.n, e.k);
  return flops;
}

double grouped_gemm_bytes(const GroupedGemmParams& p) {
  double bytes = 0;
  for (size_t g = 0; g < p.groups.size(); ++g) bytes += gemm_bytes(group_gemm_params(p, g));
  return bytes;
}

}  // namespace kiln
