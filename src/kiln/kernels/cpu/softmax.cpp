// Fast softmax (softmax.h): SIMD row kernels of ops_impl.inc, rows spread over threads.
#include "kiln/kernels/softmax.h"

#include "kiln/core/status.h"
#include "kiln/core/trace.h"
#include "kiln/kernels/cpu/ops_targets.h"
#include "kiln/kernels/cpu/parallel.h"

namespace kiln::cpu {

void softmax_forward(float* out, const float* inp, int64_t rows, int64_t cols) {
  KILN_TRACE_KERNEL("softmax_forward", softmax_forward_cost(rows, cols), rows, cols);
  KILN_CHECK(rows >= 0 && cols > 0);
  const auto fn = KILN_OPS_DISPATCH(softmax_forward_rows).pick();
  parallel_for(rows, grain_for(cols), [&](int64_t r0, int64_t r1) { fn(out, inp, r0, r1, cols); });
}

void softmax_backward(float* dinp, const float* dout, const float* out, int64_t rows,
                      int64_t cols) {
  KILN_TRACE_KERNEL("softmax_backward", softmax_backward_cost(rows, cols), rows, cols);
  KILN_CHECK(rows >= 0 && cols > 0);
  const auto fn = KILN_OPS_DISPATCH(softmax_backward_rows).pick();
  parallel_for(rows, grain_for(cols),
               [&](int64_t r0, int64_t r1) { fn(dinp, dout, out, r0, r1, cols); });
}

}  // namespace kiln::cpu
