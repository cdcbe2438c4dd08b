// Reference RoPE (rope.h): the rotate_half pairing (i, i + head_dim/2), rotations in double.
#include "kiln/kernels/rope.h"

namespace kiln::ref {
namespace {

// sign +1: forward rotation by the position's angle; -1: its inverse (the backward).
void rope_apply(float* out, const float* inp, const RopeTable& table, int64_t batch,
                int64_t seq_len, int64_t n_heads, int64_t head_dim, int64_t pos_offset,
                double sign) {
  check_rope_args(table, batch, seq_len, n_heads, head_dim, pos_offset)
      .check_ok(__FILE__, __LINE__);
  const int64_t half = head_dim / 2;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq_len; ++t) {
      const int64_t pos = pos_offset + t;
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t base = ((b * seq_len + t) * n_heads + h) * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const double c = table.cos[pos * half + i], s = sign * table.sin[pos * half + i];
          const double x1 = inp[base + i], x2 = inp[base + half + i];
          out[base + i] = static_cast<float>(x1 * c - x2 * s);
          out[base + half + i] = static_cast<float>(x2 * c + x1 * s);
        }
      }
    }
  }
}

}  // namespace

void rope_forward(float* out, const float* inp, const RopeTable& table, int64_t batch,
                  int64_t seq_len, int64_t n_heads, int64_t head_dim, int64_t pos_offset) {
  rope_apply(out, inp, table, batch, seq_len, n_heads, head_dim, pos_offset, 1.0);
}

void rope_backward(float* dinp, const float* dout, const RopeTable& table, int64_t batch,
                   int64_t seq_len, int64_t n_heads, int64_t head_dim, int64_t pos_offset) {
  rope_apply(dinp, dout, table, batch, seq_len, n_heads, head_dim, pos_offset, -1.0);
}

}  // namespace kiln::ref
