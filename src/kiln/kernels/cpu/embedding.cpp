// Fast token embedding and positional add (embedding.h). Forward: row copies spread over
// threads. Backward: threads split the columns and each scatter-adds all tokens in order, so
// repeated ids never race and the result is the same for any thread count.
#include "kiln/kernels/embedding.h"

#include <cstring>

#include "kiln/core/graph.h"
#include "kiln/core/trace.h"
#include "kiln/kernels/cpu/ops_targets.h"
#include "kiln/kernels/cpu/parallel.h"

namespace kiln::cpu {

void embedding_forward(float* out, const int32_t* ids, const float* weight, int64_t num_tokens,
                       int64_t vocab_size, int64_t cols) {
  KILN_GRAPH_NODE("embedding_forward", [=](const graph::Access* io) {
    embedding_forward(io[0].mut<float>(), io[1].as<int32_t>(), io[2].as<float>(), num_tokens, vocab_size, cols);
  }, graph::writes(out, num_tokens * cols), graph::reads(ids, num_tokens), graph::reads(weight, vocab_size * cols));
  KILN_TRACE_KERNEL("embedding_forward", embedding_forward_cost(num_tokens, cols), num_tokens, cols);
  check_token_ids({ids, static_cast<size_t>(num_tokens)}, vocab_size).check_ok(__FILE__, __LINE__);
  parallel_for(num_tokens, grain_for(cols), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      std::memcpy(out + t * cols, weight + static_cast<int64_t>(ids[t]) * cols,
                  sizeof(float) * static_cast<size_t>(cols));
    }
  });
}

void embedding_backward(float* dweight, const float* dout, const int32_t* ids, int64_t num_tokens,
                        int64_t vocab_size, int64_t cols) {
  KILN_GRAPH_NODE("embedding_backward", [=](const graph::Access* io) {
    embedding_backward(io[0].mut<float>(), io[2].as<float>(), io[3].as<int32_t>(), num_tokens, vocab_size, cols);
  }, graph::writes(dweight, vocab_size * cols), graph::reads(dweight, vocab_size * cols),
     graph::reads(dout, num_tokens * cols), graph::reads(ids, num_tokens));
  KILN_TRACE_KERNEL("embedding_backward", embedding_backward_cost(num_tokens, cols), num_tokens, cols);
  check_token_ids({ids, static_cast<size_t>(num_tokens)}, vocab_size).check_ok(__FILE__, __LINE__);
  const auto fn = KILN_OPS_DISPATCH(embedding_backward_cols).pick();
  parallel_cols(num_tokens, cols,
                [&](int64_t c0, int64_t c1) { fn(dweight, dout, ids, num_tokens, cols, c0, c1); });
}

void positional_forward(float* x, const float* wpe, int64_t batch, int64_t seq_len, int64_t cols) {
  KILN_GRAPH_NODE("positional_forward", [=](const graph::Access* io) {
    positional_forward(io[0].mut<float>(), io[2].as<float>(), batch, seq_len, cols);
  }, graph::writes(x, batch * seq_len * cols), graph::reads(x, batch * seq_len * cols), graph::reads(wpe, seq_len * cols));
  KILN_TRACE_KERNEL("positional_forward", positional_cost(batch, seq_len, cols), batch, seq_len, cols);
  const auto fn = KILN_OPS_DISPATCH(accumulate_n).pick();
  parallel_for(batch * seq_len, grain_for(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) fn(x + r * cols, wpe + (r % seq_len) * cols, cols);
  });
}

void positional_backward(float* dwpe, const float* dx, int64_t batch, int64_t seq_len,
                         int64_t cols) {
  KILN_GRAPH_NODE("positional_backward", [=](const graph::Access* io) {
    positional_backward(io[0].mut<float>(), io[2].as<float>(), batch, seq_len, cols);
  }, graph::writes(dwpe, seq_len * cols), graph::reads(dwpe, seq_len * cols), graph::reads(dx, batch * seq_len * cols));
  KILN_TRACE_KERNEL("positional_backward", positional_cost(batch, seq_len, cols), batch, seq_len, cols);
  const auto fn = KILN_OPS_DISPATCH(accumulate_n).pick();
  parallel_for(seq_len, grain_for(batch * cols), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t b = 0; b < batch; ++b) fn(dwpe + t * cols, dx + (b * seq_len + t) * cols, cols);
    }
  });
}

}  // namespace kiln::cpu
