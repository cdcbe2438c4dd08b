// Fast LayerNorm and RMSNorm (norm.h): the SIMD row kernels of ops_impl.inc picked for this CPU,
// rows spread over threads. The backward makes one pass over the rows: each fixed block of
// kRowBlock rows writes dinp and its own partial parameter gradients, then the partials are
// summed per column in block order — the same bits for any thread count.
#include "kiln/kernels/norm.h"

#include <vector>

#include "kiln/core/status.h"
#include "kiln/core/graph.h"
#include "kiln/core/trace.h"
#include "kiln/kernels/cpu/ops_targets.h"
#include "kiln/kernels/cpu/parallel.h"

namespace kiln::cpu {
namespace {

// Rows per partial-gradient block: fixed (not per thread) so the summation order is fixed;
// 32 rows keep the partials at 1/32 of the activations' size.
constexpr int64_t kRowBlock = 32;

// Scratch for the partial sums, kept per calling thread and grown, never shrunk: no allocation
// per step once the largest shape has been seen.
float* partials(int64_t floats) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(static_cast<size_t>(floats));
  return buf.data();
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t rows, int64_t cols, float eps) {
  KILN_GRAPH_NODE("layernorm_forward", [=](const graph::Access* io) {
    layernorm_forward(io[0].mut<float>(), io[1].mut<float>(), io[2].mut<float>(), io[3].as<float>(), io[4].as<float>(),
                      io[5].as<float>(), rows, cols, eps);
  }, graph::writes(out, rows * cols), graph::writes(mean, rows), graph::writes(rstd, rows), graph::reads(inp, rows * cols),
     graph::reads(weight, cols), graph::reads(bias, cols));
  KILN_TRACE_KERNEL("layernorm_forward", layernorm_forward_cost(rows, cols), rows, cols);
  KILN_CHECK(rows >= 0 && cols > 0);
  const auto fn = KILN_OPS_DISPATCH(layernorm_forward_rows).pick();
  parallel_for(rows, grain_for(cols), [&](int64_t r0, int64_t r1) {
    fn(out, mean, rstd, inp, weight, bias, r0, r1, cols, eps);
  });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int64_t rows, int64_t cols, bool accumulate_dx) {
  KILN_GRAPH_NODE("layernorm_backward", [=](const graph::Access* io) {
    layernorm_backward(io[0].mut<float>(), io[1].mut<float>(), io[2].mut<float>(), io[5].as<float>(), io[6].as<float>(),
                       io[7].as<float>(), io[8].as<float>(), io[9].as<float>(), rows, cols, accumulate_dx);
  }, graph::writes(dinp, rows * cols), graph::writes(dweight, cols), graph::writes(dbias, cols), graph::reads(dweight, cols),
     graph::reads(dbias, cols), graph::reads(dout, rows * cols), graph::reads(inp, rows * cols), graph::reads(weight, cols),
     graph::reads(mean, rows), graph::reads(rstd, rows), graph::reads(accumulate_dx ? dinp : nullptr, rows * cols));
  KILN_TRACE_KERNEL("layernorm_backward", layernorm_backward_cost(rows, cols, accumulate_dx), rows, cols);
  KILN_CHECK(rows >= 0 && cols > 0);
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  float* dw_part = partials(2 * blocks * cols);  // (blocks, cols)
  float* db_part = dw_part + blocks * cols;      // (blocks, cols)
  const auto fn = KILN_OPS_DISPATCH(layernorm_backward_rows).pick();
  parallel_for(blocks, grain_for(kRowBlock * cols), [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      fn(dinp, dw_part + blk * cols, db_part + blk * cols, dout, inp, weight, mean, rstd,
         blk * kRowBlock, std::min(rows, (blk + 1) * kRowBlock), cols, accumulate_dx);
    }
  });
  const auto sum = KILN_OPS_DISPATCH(sum_parts_cols).pick();
  parallel_cols(blocks, cols, [&](int64_t c0, int64_t c1) {
    sum(dweight, dw_part, blocks, cols, c0, c1);
    sum(dbias, db_part, blocks, cols, c0, c1);
  });
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t rows,
                     int64_t cols, float eps) {
  KILN_GRAPH_NODE("rmsnorm_forward", [=](const graph::Access* io) {
    rmsnorm_forward(io[0].mut<float>(), io[1].mut<float>(), io[2].as<float>(), io[3].as<float>(), rows, cols, eps);
  }, graph::writes(out, rows * cols), graph::writes(rstd, rows), graph::reads(inp, rows * cols), graph::reads(weight, cols));
  KILN_TRACE_KERNEL("rmsnorm_forward", rmsnorm_forward_cost(rows, cols), rows, cols);
  KILN_CHECK(rows >= 0 && cols > 0);
  const auto fn = KILN_OPS_DISPATCH(rmsnorm_forward_rows).pick();
  parallel_for(rows, grain_for(cols),
               [&](int64_t r0, int64_t r1) { fn(out, rstd, inp, weight, r0, r1, cols, eps); });
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t rows, int64_t cols,
                      bool accumulate_dx) {
  KILN_GRAPH_NODE("rmsnorm_backward", [=](const graph::Access* io) {
    rmsnorm_backward(io[0].mut<float>(), io[1].mut<float>(), io[3].as<float>(), io[4].as<float>(), io[5].as<float>(),
                     io[6].as<float>(), rows, cols, accumulate_dx);
  }, graph::writes(dinp, rows * cols), graph::writes(dweight, cols), graph::reads(dweight, cols), graph::reads(dout, rows * cols),
     graph::reads(inp, rows * cols), graph::reads(weight, cols), graph::reads(rstd, rows),
     graph::reads(accumulate_dx ? dinp : nullptr, rows * cols));
  KILN_TRACE_KERNEL("rmsnorm_backward", rmsnorm_backward_cost(rows, cols, accumulate_dx), rows, cols);
  KILN_CHECK(rows >= 0 && cols > 0);
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  float* dw_part = partials(blocks * cols);  // (blocks, cols)
  const auto fn = KILN_OPS_DISPATCH(rmsnorm_backward_rows).pick();
  parallel_for(blocks, grain_for(kRowBlock * cols), [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      fn(dinp, dw_part + blk * cols, dout, inp, weight, rstd, blk * kRowBlock,
         std::min(rows, (blk + 1) * kRowBlock), cols, accumulate_dx);
    }
  });
  const auto sum = KILN_OPS_DISPATCH(sum_parts_cols).pick();
  parallel_cols(blocks, cols,
                [&](int64_t c0, int64_t c1) { sum(dweight, dw_part, blocks, cols, c0, c1); });
}

}  // namespace kiln::cpu
