// Fast RoPE (rope.h): the SIMD rotation of ops_impl.inc over (B·T) rows spread over threads.
#include "kiln/kernels/rope.h"

#include "kiln/core/graph.h"
#include "kiln/core/trace.h"
#include "kiln/kernels/cpu/ops_targets.h"
#include "kiln/kernels/cpu/parallel.h"

namespace kiln::cpu {
namespace {

void rope_apply(float* out, const float* inp, const RopeTable& table, int64_t batch,
                int64_t seq_len, int64_t n_heads, int64_t head_dim, int64_t pos_offset,
                float sin_sign) {
  check_rope_args(table, batch, seq_len, n_heads, head_dim, pos_offset)
      .check_ok(__FILE__, __LINE__);
  const auto fn = KILN_OPS_DISPATCH(rope_rows).pick();
  parallel_for(batch * seq_len, grain_for(n_heads * head_dim), [&](int64_t r0, int64_t r1) {
    fn(out, inp, table.cos.data(), table.sin.data(), sin_sign, r0, r1, seq_len, n_heads, head_dim,
       pos_offset);
  });
}

}  // namespace

void rope_forward(float* out, const float* inp, const RopeTable& table, int64_t batch,
                  int64_t seq_len, int64_t n_heads, int64_t head_dim, int64_t pos_offset) {
  KILN_GRAPH_NODE("rope_forward", ([=, &table](const graph::Access* io) {
    rope_forward(io[0].mut<float>(), io[1].as<float>(), table, batch, seq_len, n_heads, head_dim, pos_offset);
  }), graph::writes(out, batch * seq_len * n_heads * head_dim), graph::reads(inp, batch * seq_len * n_heads * head_dim));
  KILN_TRACE_KERNEL("rope_forward", rope_cost(batch, seq_len, n_heads, head_dim), batch, seq_len, n_heads, head_dim);
  rope_apply(out, inp, table, batch, seq_len, n_heads, head_dim, pos_offset, 1.0f);
}

void rope_backward(float* dinp, const float* dout, const RopeTable& table, int64_t batch,
                   int64_t seq_len, int64_t n_heads, int64_t head_dim, int64_t pos_offset) {
  KILN_GRAPH_NODE("rope_backward", ([=, &table](const graph::Access* io) {
    rope_backward(io[0].mut<float>(), io[1].as<float>(), table, batch, seq_len, n_heads, head_dim, pos_offset);
  }), graph::writes(dinp, batch * seq_len * n_heads * head_dim), graph::reads(dout, batch * seq_len * n_heads * head_dim));
  KILN_TRACE_KERNEL("rope_backward", rope_cost(batch, seq_len, n_heads, head_dim), batch, seq_len, n_heads, head_dim);
  rope_apply(dinp, dout, table, batch, seq_len, n_heads, head_dim, pos_offset, -1.0f);
}

}  // namespace kiln::cpu
