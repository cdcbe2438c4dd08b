// Token embedding lookup (ids → rows of a (V, C) table) and the GPT-2 learned positional add,
// forward and backward, as kiln::ref and kiln::cpu (threaded), identical signatures.
// Backward: parameter gradients ACCUMULATE (+=, llm.c convention). The cpu scatter-add is
// deterministic and race-free with repeated ids: threads split the C columns, and each adds
// the tokens in order, so results are the same bits for any thread count.
#pragma once

#include <cstdint>
#include <span>

#include "kiln/core/status.h"
#include "kiln/kernels/op_cost.h"

namespace kiln {

// InvalidArgument naming the first id outside [0, vocab_size) and its position.
Status check_token_ids(std::span<const int32_t> ids, int64_t vocab_size);

// Copies N rows of C floats; reads N ids.
constexpr OpCost embedding_forward_cost(int64_t num_tokens, int64_t cols) {
  const double n = static_cast<double>(num_tokens) * cols;
  return {0.0, 8.0 * n + 4.0 * num_tokens};
}
// Reads dout, reads and writes the touched dweight rows.
constexpr OpCost embedding_backward_cost(int64_t num_tokens, int64_t cols) {
  const double n = static_cast<double>(num_tokens) * cols;
  return {n, 12.0 * n + 4.0 * num_tokens};
}
constexpr OpCost positional_cost(int64_t batch, int64_t seq_len, int64_t cols) {
  const double n = static_cast<double>(batch) * seq_len * cols;
  return {n, 8.0 * n + 4.0 * static_cast<double>(seq_len) * cols};
}

namespace ref {
// out (N, C) = weight[ids]; ids (N,) in [0, V) (checked); weight (V, C).
void embedding_forward(float* out, const int32_t* ids, const float* weight, int64_t num_tokens,
                       int64_t vocab_size, int64_t cols);
// dweight (V, C) += scatter of dout (N, C) by ids (N,).
void embedding_backward(float* dweight, const float* dout, const int32_t* ids, int64_t num_tokens,
                        int64_t vocab_size, int64_t cols);
// x (B, T, C) += wpe (T, C) for every batch row (pass wpe + pos_offset·C when decoding).
void positional_forward(float* x, const float* wpe, int64_t batch, int64_t seq_len, int64_t cols);
// dwpe (T, C) += sum over the batch of dx (B, T, C).
void positional_backward(float* dwpe, const float* dx, int64_t batch, int64_t seq_len,
                         int64_t cols);
}  // namespace ref

namespace cpu {  // same contracts as ref::
void embedding_forward(float* out, const int32_t* ids, const float* weight, int64_t num_tokens,
                       int64_t vocab_size, int64_t cols);
void embedding_backward(float* dweight, const float* dout, const int32_t* ids, int64_t num_tokens,
                        int64_t vocab_size, int64_t cols);
void positional_forward(float* x, const float* wpe, int64_t batch, int64_t seq_len, int64_t cols);
void positional_backward(float* dwpe, const float* dx, int64_t batch, int64_t seq_len,
                         int64_t cols);
}  // namespace cpu

KILN_SAME_SIGNATURE(embedding_forward);
KILN_SAME_SIGNATURE(embedding_backward);
KILN_SAME_SIGNATURE(positional_forward);
KILN_SAME_SIGNATURE(positional_backward);

}  // namespace kiln
