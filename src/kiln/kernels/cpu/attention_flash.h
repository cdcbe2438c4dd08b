// Internal to kiln::cpu: the per-target FlashAttention tile kernels (attention_flash_impl.inc,
// compiled once per SIMD target) and the plain structs that describe one sequence's buffers to
// them. The threading, split-KV merge, varlen and paged-cache plumbing is in attention_flash.cpp.
#pragma once

#include <cstdint>

#include "kiln/kernels/cpu/attention_tiles.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::cpu {

// Tile sizes (queries per tile Br, keys per tile Bc) are a run-time choice per call, forward
// and backward each: see attention_tiles.h for the candidates, the cache model and the sweep.
// Keys per block of the few-query (decode) row kernel: 64 scores on the stack; the block's
// rows for all KV heads (192 KiB at 12 × 64) stay in L2 while each head reads its columns.
inline constexpr int64_t kRowsBlock = 64;

// The sizes and strides shared by every sequence of a call.
struct FlashShape {
  int64_t n_heads, n_kv_heads, head_dim;
  bool causal;
  int64_t window;  // 0: none
  float scale;
  int64_t q_rs, k_rs, v_rs, o_rs;  // row strides (elements)
  // Elements between KV heads in k / v (and dk / dv): head_dim in the row layout; 0 when the
  // driver hands a tile kernel one KV head's rows staged contiguously (attention_flash.cpp).
  int64_t k_hs, v_hs;
  int64_t lse_hs;                  // lse elements between heads (T, or total_q when packed)
  FlashTiles tiles;                // this call's tiles (forward or backward): Br = tiles.q, Bc = tiles.k
};

// One sequence: pointers to its row 0 (head 0). q_offset = kv_len - q_len places the queries
// at the end of the keys (causal alignment). Gradient pointers only for backward.
struct FlashSeq {
  const float* q;
  const float* k;
  const float* v;
  float* o;    // forward output; backward: the saved output
  float* lse;  // (Hq, ·) with FlashShape::lse_hs between heads
  int64_t q_len, kv_len;
  const float* dout;       // like o
  float* dq;               // like q
  float* dk;               // like k
  float* dv;               // like v
};

// Scratch floats one forward / backward tile call needs (padded to 64 B per buffer).
int64_t flash_forward_scratch_floats(int64_t head_dim, FlashTiles tiles);
int64_t flash_backward_scratch_floats(int64_t head_dim, FlashTiles tiles);

}  // namespace kiln::cpu

#define KILN_FLASH_DECLS                                                                          \
  /* Rows [t0, t0+br) of head h over keys [kbeg, kend), br <= sh.tiles.q: normalized output   \
     rows to o (ldo apart) and their logsumexp to lse[0..br) (-inf and zero rows when no key   \
     is visible). prof (nullptr but in profiled runs) gets the seconds of each part added. */   \
  void flash_forward_tile(const ::kiln::cpu::FlashShape& sh, const ::kiln::cpu::FlashSeq& sq,   \
                          int64_t h, int64_t t0, int64_t br, int64_t kbeg, int64_t kend,        \
                          float* o, int64_t ldo, float* lse, float* scratch,                    \
                          ::kiln::cpu::FlashProfile* prof);                                     \
  /* Keys [kbeg, kend) of KV head g: overwrites those rows of dk, dv with the sum over the     \
     group's heads and adds this key range's share to dq, which points at row 0, head g·rep  \
     (rows ldq apart, heads head_dim apart; zeroed by the caller). dvec (rep, q_len):         \
     rowsum(dO ∘ O) of the group's heads. */                                                     \
  void flash_backward_keys(const ::kiln::cpu::FlashShape& sh, const ::kiln::cpu::FlashSeq& sq,  \
                           int64_t g, int64_t kbeg, int64_t kend, float* dq, int64_t ldq,       \
                           const float* dvec, float* scratch);                                   \
  /* Few-query row kernel, one contiguous run of keys: queries rows [0, nq) of the group's rep \
     heads (q at row t0 head g·rep, q_rs apart, heads head_dim apart) at positions q_pos0 + t, \
     keys n_keys rows of k/v (strides k_rs, v_rs) at positions key_pos0 + j. Updates the      \
     online-softmax state m, l (rep·nq, index hh·nq + t) and unnormalized o (rep·nq, D).      \
     Prefetches n_next rows (D floats each) of k_next / v_next, the run the caller does next. */ \
  void attention_rows_update(const ::kiln::cpu::FlashShape& sh, const float* q, int64_t nq,     \
                             int64_t q_pos0, const float* k, const float* v, int64_t n_keys,    \
                             int64_t key_pos0, float* m, float* l, float* o,                    \
                             const float* k_next, const float* v_next, int64_t n_next);         \
  /* out = Σ_c exp(lse_c − lse) · part_c over D values, weights already computed. */           \
  void weighted_sum_rows(float* out, const float* parts, int64_t part_stride,                   \
                         const float* weights, int64_t num_parts, int64_t d);                   \
  /* out[t] = sum over i < d of a[t*rs + i] * b[t*rs + i], t < rows: the backward's             \
     D = rowsum(dO o O). */                                                                     \
  void row_dots(float* out, const float* a, const float* b, int64_t rs, int64_t rows,           \
                int64_t d);

namespace kiln::cpu {
namespace scalar {
KILN_FLASH_DECLS
}  // namespace scalar
namespace avx2 {
KILN_FLASH_DECLS
}  // namespace avx2
namespace avx512 {
KILN_FLASH_DECLS
}  // namespace avx512
}  // namespace kiln::cpu

#define KILN_FLASH_DISPATCH(fn)                          \
  (::kiln::Dispatch<decltype(&::kiln::cpu::scalar::fn)>{ \
      &::kiln::cpu::scalar::fn, &::kiln::cpu::avx2::fn, &::kiln::cpu::avx512::fn})
