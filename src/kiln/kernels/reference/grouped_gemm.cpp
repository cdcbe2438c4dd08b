// Reference grouped GEMM: ref::gemm on each group in turn, the ground truth cpu::grouped_gemm is
// checked against.
#include "kiln/kernels/grouped_gemm.h"

namespace kiln::ref {

void grouped_gemm(const GroupedGemmParams& p) {
  for (size_t g = 0; g < p.groups.size(); ++g) gemm(group_gemm_params(p, g));
}

}  // namespace kiln::ref
