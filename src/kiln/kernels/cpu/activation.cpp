// Fast GELU, SiLU and SwiGLU (activation.h): SIMD kernels of ops_impl.inc over aligned element
// ranges spread over threads.
#include "kiln/kernels/activation.h"

#include "kiln/core/graph.h"
#include "kiln/core/trace.h"
#include "kiln/kernels/cpu/ops_targets.h"
#include "kiln/kernels/cpu/parallel.h"

namespace kiln::cpu {

void gelu_forward(float* out, const float* inp, int64_t n) {
  KILN_GRAPH_NODE("gelu_forward", [=](const graph::Access* io) { gelu_forward(io[0].mut<float>(), io[1].as<float>(), n); },
                  graph::writes(out, n), graph::reads(inp, n));
  KILN_TRACE_KERNEL("gelu_forward", gelu_forward_cost(n), n);
  const auto fn = KILN_OPS_DISPATCH(gelu_forward_n).pick();
  parallel_elems(n, [&](int64_t b, int64_t e) { fn(out + b, inp + b, e - b); });
}

void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  KILN_GRAPH_NODE("gelu_backward", [=](const graph::Access* io) {
    gelu_backward(io[0].mut<float>(), io[1].as<float>(), io[2].as<float>(), n);
  }, graph::writes(dinp, n), graph::reads(dout, n), graph::reads(inp, n));
  KILN_TRACE_KERNEL("gelu_backward", gelu_backward_cost(n), n);
  const auto fn = KILN_OPS_DISPATCH(gelu_backward_n).pick();
  parallel_elems(n, [&](int64_t b, int64_t e) { fn(dinp + b, dout + b, inp + b, e - b); });
}

void silu_forward(float* out, const float* inp, int64_t n) {
  KILN_GRAPH_NODE("silu_forward", [=](const graph::Access* io) { silu_forward(io[0].mut<float>(), io[1].as<float>(), n); },
                  graph::writes(out, n), graph::reads(inp, n));
  KILN_TRACE_KERNEL("silu_forward", silu_forward_cost(n), n);
  const auto fn = KILN_OPS_DISPATCH(silu_forward_n).pick();
  parallel_elems(n, [&](int64_t b, int64_t e) { fn(out + b, inp + b, e - b); });
}

void silu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  KILN_GRAPH_NODE("silu_backward", [=](const graph::Access* io) {
    silu_backward(io[0].mut<float>(), io[1].as<float>(), io[2].as<float>(), n);
  }, graph::writes(dinp, n), graph::reads(dout, n), graph::reads(inp, n));
  KILN_TRACE_KERNEL("silu_backward", silu_backward_cost(n), n);
  const auto fn = KILN_OPS_DISPATCH(silu_backward_n).pick();
  parallel_elems(n, [&](int64_t b, int64_t e) { fn(dinp + b, dout + b, inp + b, e - b); });
}

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  KILN_GRAPH_NODE("swiglu_forward", [=](const graph::Access* io) {
    swiglu_forward(io[0].mut<float>(), io[1].as<float>(), io[2].as<float>(), n);
  }, graph::writes(out, n), graph::reads(gate, n), graph::reads(up, n));
  KILN_TRACE_KERNEL("swiglu_forward", swiglu_forward_cost(n), n);
  const auto fn = KILN_OPS_DISPATCH(swiglu_forward_n).pick();
  parallel_elems(n, [&](int64_t b, int64_t e) { fn(out + b, gate + b, up + b, e - b); });
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n) {
  KILN_GRAPH_NODE("swiglu_backward", [=](const graph::Access* io) {
    swiglu_backward(io[0].mut<float>(), io[1].mut<float>(), io[2].as<float>(), io[3].as<float>(), io[4].as<float>(), n);
  }, graph::writes(dgate, n), graph::writes(dup, n), graph::reads(dout, n), graph::reads(gate, n), graph::reads(up, n));
  KILN_TRACE_KERNEL("swiglu_backward", swiglu_backward_cost(n), n);
  const auto fn = KILN_OPS_DISPATCH(swiglu_backward_n).pick();
  parallel_elems(
      n, [&](int64_t b, int64_t e) { fn(dgate + b, dup + b, dout + b, gate + b, up + b, e - b); });
}

}  // namespace kiln::cpu
