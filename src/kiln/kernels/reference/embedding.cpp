// Reference token embedding and positional add (embedding.h): plain loops in token order.
#include "kiln/kernels/embedding.h"

#include <cstring>

namespace kiln::ref {

void embedding_forward(float* out, const int32_t* ids, const float* weight, int64_t num_tokens,
                       int64_t vocab_size, int64_t cols) {
  check_token_ids({ids, static_cast<size_t>(num_tokens)}, vocab_size).check_ok(__FILE__, __LINE__);
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::memcpy(out + t * cols, weight + static_cast<int64_t>(ids[t]) * cols,
                sizeof(float) * static_cast<size_t>(cols));
  }
}

void embedding_backward(float* dweight, const float* dout, const int32_t* ids, int64_t num_tokens,
                        int64_t vocab_size, int64_t cols) {
  check_token_ids({ids, static_cast<size_t>(num_tokens)}, vocab_size).check_ok(__FILE__, __LINE__);
  for (int64_t t = 0; t < num_tokens; ++t) {
    float* dw = dweight + static_cast<int64_t>(ids[t]) * cols;
    for (int64_t c = 0; c < cols; ++c) dw[c] += dout[t * cols + c];
  }
}

void positional_forward(float* x, const float* wpe, int64_t batch, int64_t seq_len, int64_t cols) {
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq_len; ++t) {
      for (int64_t c = 0; c < cols; ++c) x[(b * seq_len + t) * cols + c] += wpe[t * cols + c];
    }
  }
}

void positional_backward(float* dwpe, const float* dx, int64_t batch, int64_t seq_len,
                         int64_t cols) {
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq_len; ++t) {
      for (int64_t c = 0; c < cols; ++c) dwpe[t * cols + c] += dx[(b * seq_len + t) * cols + c];
    }
  }
}

}  // namespace kiln::ref
