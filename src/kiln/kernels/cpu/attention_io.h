// The buffers one attention call touches, as graph capture records them (core/graph.h): each
// operand's rows at its row stride (zero strides: the packed defaults check_attention fills).
#pragma once

#include "kiln/core/graph.h"
#include "kiln/kernels/attention.h"

namespace kiln::cpu {

inline graph::Access attention_rows(const float* x, int64_t rows, int64_t width, int64_t stride, bool write) {
  const int64_t s = stride != 0 ? stride : width;
  return write ? graph::writes_rows(const_cast<float*>(x), rows, width, s) : graph::reads_rows(x, rows, width, s);
}
// q or dq (B·T rows of Hq·D), k/v or dk/dv (B·S rows of Hkv·D), out or dout (B·T rows of Hq·D).
inline graph::Access attention_q(const float* q, const AttentionParams& p, bool write = false) {
  return attention_rows(q, p.batch * p.q_len, p.n_heads * p.head_dim, p.q_row_stride, write);
}
inline graph::Access attention_k(const float* k, const AttentionParams& p, bool write = false) {
  return attention_rows(k, p.batch * p.kv_len, p.n_kv_heads * p.head_dim, p.k_row_stride, write);
}
inline graph::Access attention_v(const float* v, const AttentionParams& p, bool write = false) {
  return attention_rows(v, p.batch * p.kv_len, p.n_kv_heads * p.head_dim, p.v_row_stride, write);
}
inline graph::Access attention_out(const float* out, const AttentionParams& p, bool write = true) {
  return attention_rows(out, p.batch * p.q_len, p.n_heads * p.head_dim, p.o_row_stride, write);
}

}  // namespace kiln::cpu
