// Fast elementwise helpers and exp / tanh arrays (elementwise.h): SIMD kernels of
// ops_impl.inc over aligned element ranges spread over threads.
#include "kiln/kernels/elementwise.h"

#include "kiln/core/graph.h"
#include "kiln/core/trace.h"
#include "kiln/kernels/cpu/ops_targets.h"
#include "kiln/kernels/cpu/parallel.h"

namespace kiln::cpu {

void add(float* out, const float* a, const float* b, int64_t n) {
  KILN_GRAPH_NODE("add", [=](const graph::Access* io) { add(io[0].mut<float>(), io[1].as<float>(), io[2].as<float>(), n); },
                  graph::writes(out, n), graph::reads(a, n), graph::reads(b, n));
  KILN_TRACE_KERNEL("add", add_cost(n), n);
  const auto fn = KILN_OPS_DISPATCH(add_n).pick();
  parallel_elems(n, [&](int64_t i0, int64_t i1) { fn(out + i0, a + i0, b + i0, i1 - i0); });
}

void scale(float* out, const float* inp, float s, int64_t n) {
  KILN_GRAPH_NODE_SCALAR("scale", s, [=](const graph::Access* io) { scale(io[0].mut<float>(), io[1].as<float>(), s, n); },
                         graph::writes(out, n), graph::reads(inp, n));
  KILN_TRACE_KERNEL("scale", scale_cost(n), n);
  const auto fn = KILN_OPS_DISPATCH(scale_n).pick();
  parallel_elems(n, [&](int64_t b, int64_t e) { fn(out + b, inp + b, s, e - b); });
}

void accumulate(float* y, const float* x, int64_t n) {
  KILN_GRAPH_NODE("accumulate", [=](const graph::Access* io) { accumulate(io[0].mut<float>(), io[2].as<float>(), n); },
                  graph::writes(y, n), graph::reads(y, n), graph::reads(x, n));
  KILN_TRACE_KERNEL("accumulate", accumulate_cost(n), n);
  const auto fn = KILN_OPS_DISPATCH(accumulate_n).pick();
  parallel_elems(n, [&](int64_t b, int64_t e) { fn(y + b, x + b, e - b); });
}

void add_bias(float* out, const float* x, const float* bias, int64_t rows, int64_t cols) {
  KILN_GRAPH_NODE("add_bias",
                  [=](const graph::Access* io) {
                    add_bias(io[0].mut<float>(), io[1].as<float>(), io[2].as<float>(), rows, cols);
                  },
                  graph::writes(out, rows * cols), graph::reads(x, rows * cols), graph::reads(bias, cols));
  KILN_TRACE_KERNEL("add_bias", add_bias_cost(rows, cols), rows, cols);
  const auto fn = KILN_OPS_DISPATCH(add_n).pick();
  parallel_for(rows, grain_for(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) fn(out + r * cols, x + r * cols, bias, cols);
  });
}

void bias_backward(float* dbias, const float* dy, int64_t rows, int64_t cols) {
  KILN_GRAPH_NODE("bias_backward",
                  [=](const graph::Access* io) {
                    bias_backward(io[0].mut<float>(), io[2].as<float>(), rows, cols);
                  },
                  graph::writes(dbias, cols), graph::reads(dbias, cols), graph::reads(dy, rows * cols));
  KILN_TRACE_KERNEL("bias_backward", bias_backward_cost(rows, cols), rows, cols);
  const auto fn = KILN_OPS_DISPATCH(accumulate_n).pick();
  // Each task owns a column range and adds the rows into it in order (ref's order per column).
  // A task takes at least kMinCols columns (16 KiB of every row): two threads reading alternate
  // halves of 4.5-6 KiB rows moved 16 GB/s together, one thread reading whole rows 27 GB/s
  // (Xeon, 2048 x 1152 and 2048 x 1536): each one's prefetchers fetch the other's half too.
  constexpr int64_t kMinCols = 4096;
  parallel_cols(
      rows, cols,
      [&](int64_t c0, int64_t c1) {
        for (int64_t r = 0; r < rows; ++r) fn(dbias + c0, dy + r * cols + c0, c1 - c0);
      },
      kMinCols);
}

void exp_array(float* out, const float* inp, int64_t n) {
  KILN_TRACE_KERNEL("exp_array", exp_array_cost(n), n);
  const auto fn = KILN_OPS_DISPATCH(exp_n).pick();
  parallel_elems(n, [&](int64_t b, int64_t e) { fn(out + b, inp + b, e - b); });
}

void exp2_array(float* out, const float* inp, int64_t n) {
  KILN_TRACE_KERNEL("exp2_array", exp_array_cost(n), n);
  const auto fn = KILN_OPS_DISPATCH(exp2_n).pick();
  parallel_elems(n, [&](int64_t b, int64_t e) { fn(out + b, inp + b, e - b); });
}

void tanh_array(float* out, const float* inp, int64_t n) {
  KILN_TRACE_KERNEL("tanh_array", exp_array_cost(n), n);
  const auto fn = KILN_OPS_DISPATCH(tanh_n).pick();
  parallel_elems(n, [&](int64_t b, int64_t e) { fn(out + b, inp + b, e - b); });
}

}  // namespace kiln::cpu
