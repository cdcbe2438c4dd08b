// Fast fused softmax + cross-entropy (cross_entropy.h): SIMD row kernels of ops_impl.inc
// (one streaming max/sum pass per row, one gradient pass), rows spread over threads.
#include "kiln/kernels/cross_entropy.h"

#include "kiln/core/graph.h"
#include "kiln/core/trace.h"
#include "kiln/kernels/cpu/ops_targets.h"
#include "kiln/kernels/cpu/parallel.h"

namespace kiln::cpu {

void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t rows,
                           int64_t vocab) {
  KILN_GRAPH_NODE("cross_entropy_forward", [=](const graph::Access* io) {
    cross_entropy_forward(io[0].mut<float>(), io[1].as<float>(), io[2].as<int32_t>(), rows, vocab);
  }, graph::writes(losses, rows), graph::reads(logits, rows * vocab), graph::reads(targets, rows));
  KILN_TRACE_KERNEL("cross_entropy_forward", cross_entropy_forward_cost(rows, vocab), rows, vocab);
  check_targets({targets, static_cast<size_t>(rows)}, vocab).check_ok(__FILE__, __LINE__);
  KILN_CHECK(vocab > 0);
  const auto fn = KILN_OPS_DISPATCH(cross_entropy_forward_rows).pick();
  parallel_for(rows, grain_for(vocab),
               [&](int64_t r0, int64_t r1) { fn(losses, logits, targets, r0, r1, vocab); });
}

void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            const float* dlosses, int64_t rows, int64_t vocab) {
  KILN_GRAPH_NODE("cross_entropy_backward", [=](const graph::Access* io) {
    cross_entropy_backward(io[0].mut<float>(), io[1].as<float>(), io[2].as<int32_t>(), io[3].as<float>(), rows, vocab);
  }, graph::writes(dlogits, rows * vocab), graph::reads(logits, rows * vocab), graph::reads(targets, rows),
     graph::reads(dlosses, rows));
  KILN_TRACE_KERNEL("cross_entropy_backward", cross_entropy_backward_cost(rows, vocab), rows, vocab);
  check_targets({targets, static_cast<size_t>(rows)}, vocab).check_ok(__FILE__, __LINE__);
  KILN_CHECK(vocab > 0);
  const auto fn = KILN_OPS_DISPATCH(cross_entropy_backward_rows).pick();
  parallel_for(rows, grain_for(vocab), [&](int64_t r0, int64_t r1) {
    fn(dlogits, logits, targets, dlosses, r0, r1, vocab);
  });
}

}  // namespace kiln::cpu
