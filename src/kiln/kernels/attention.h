// Scaled dot-product attention, the contract every attention kernel implements: forward gives
// the output and one logsumexp per (query row, head); backward recomputes probabilities from
// Q, K and the logsumexp (so no T×T matrix is kept between the passes).
// GQA/MQA: query head h reads KV head h / (n_heads / n_kv_heads). Causal masking lets query t
// see keys s <= t + q_offset (q_offset = S - T when T new queries follow S - T cached keys);
// a sliding window keeps only keys s > t + q_offset - window (and, when not causal, also
// s < t + q_offset + window).
// ref:: is the naive scalar ground truth (it forms each score row in full). cpu:: has two
// implementations behind one entry point (AttentionImpl): the naive GEMM path (a T×S score
// block per task) and FlashAttention (tiles, online softmax, O(T) extra memory), the default.
// Few-query forwards (decode) take the split-KV path: the keys are cut into chunks processed in
// parallel and merged exactly through their logsumexps.
//
// KV-cache layout (what the serving issue's paged cache reuses, see PagedKv below): K and V each
// live in a pool of blocks of block_size token rows; a row holds n_kv_heads × head_dim floats
// (head g at g·head_dim), rows k_row_stride / v_row_stride apart exactly as for k and v here, so
// one block is a (block_size, Hkv, D) slab. Sequence i's token j is row j % block_size of block
// block_table[i·max_blocks_per_seq + j / block_size]. A contiguous cache is the special case of
// one block per sequence.
#pragma once

#include <cstdint>
#include <string_view>

#include "kiln/core/status.h"
#include "kiln/kernels/op_cost.h"

namespace kiln {
namespace trace {
struct Event;
}

// Which cpu:: implementation runs. kDefault follows the process-wide setting
// (set_attention_impl, `kiln train --attention`), which starts as kFlash.
enum class AttentionImpl { kDefault, kNaive, kFlash };
void set_attention_impl(AttentionImpl impl);  // kDefault restores kFlash
AttentionImpl attention_impl();               // never kDefault
std::string_view attention_impl_name(AttentionImpl impl);
Expected<AttentionImpl> parse_attention_impl(std::string_view name);  // "naive" | "flash"

struct AttentionParams {
  int64_t batch = 1;
  int64_t q_len = 0;       // T: query rows per sequence
  int64_t kv_len = 0;      // S: key/value rows per sequence (S >= T when causal)
  int64_t n_heads = 1;     // query heads
  int64_t n_kv_heads = 1;  // divides n_heads
  int64_t head_dim = 0;
  bool causal = true;
  int64_t window = 0;      // 0: no sliding window
  float scale = 0.0f;      // 0: 1/sqrt(head_dim)
  // Elements between consecutive rows (tokens) of each buffer; heads are contiguous inside a
  // row (head h at h·head_dim). Lets q, k, v be read straight out of a fused QKV projection.
  int64_t q_row_stride = 0, k_row_stride = 0, v_row_stride = 0, o_row_stride = 0;

  AttentionImpl impl = AttentionImpl::kDefault;
  // Flash forward with few queries (q_len <= kSplitKvMaxQueries): key chunks per (batch, KV
  // head); 0 picks from the thread count and kv_len.
  int64_t num_splits = 0;

  int64_t q_offset() const { return kv_len - q_len; }
  float softmax_scale() const;
};

// Fills zero strides with the packed defaults; InvalidArgument naming the fields when shapes
// are inconsistent.
Expected<AttentionParams> check_attention(AttentionParams p);

// What one call computes: the (query, key) pairs inside the causal triangle and the sliding
// window only (causal attention does about half the work of the full T×S score matrix).
OpCost attention_forward_cost(const AttentionParams& p);
OpCost attention_backward_cost(const AttentionParams& p);

namespace ref {
// out (B, T, Hq, D) rows of o_row_stride; lse (B, Hq, T); q (B, T, Hq, D); k, v (B, S, Hkv, D).
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionParams& p);
// dq like q, dk/dv like k/v (all overwritten; dq/dk/dv packed with the same row strides as
// q/k/v); dout and out like out; lse from the forward.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionParams& p);
}  // namespace ref

namespace cpu {
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionParams& p);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionParams& p);
}  // namespace cpu

// ---- FlashAttention family extras -------------------------------------------------------------

// Forwards with at most this many query rows use the split-KV row kernel (decode).
inline constexpr int64_t kSplitKvMaxQueries = 8;

// Packed variable-length batch (like cu_seqlens): sequence i owns query rows
// [cu_seqlens_q[i], cu_seqlens_q[i+1]) of q / out and key rows [cu_seqlens_k[i], cu_seqlens_k[i+1])
// of k / v; rows use the strides of AttentionParams; lse is (Hq, total_q). Causal alignment is
// per sequence (its queries are its last q_len positions). AttentionParams::batch, q_len and
// kv_len are ignored (check_attention_varlen sets them to num_seqs and the longest lengths).
struct AttentionVarlen {
  const int32_t* cu_seqlens_q = nullptr;  // (num_seqs + 1,), starts at 0, non-decreasing
  const int32_t* cu_seqlens_k = nullptr;  // (num_seqs + 1,)
  int64_t num_seqs = 0;
};
Expected<AttentionParams> check_attention_varlen(AttentionParams p, const AttentionVarlen& v);

// The paged KV cache (layout in the file comment). seq_lens[i] keys are valid for sequence i.
struct PagedKv {
  const float* k_pool = nullptr;          // (num_blocks, block_size, ·) rows of k_row_stride
  const float* v_pool = nullptr;          // rows of v_row_stride
  const int32_t* block_table = nullptr;   // (num_seqs, max_blocks_per_seq) block ids
  const int32_t* seq_lens = nullptr;      // (num_seqs,) kv length of each sequence
  int64_t block_size = 0;
  int64_t max_blocks_per_seq = 0;
  int64_t num_seqs = 0;
};

// Costs summed over the sequences of a packed batch (p from check_attention_varlen) and of a
// paged decode (p.q_len queries per sequence against its seq_lens[i] keys).
OpCost attention_forward_cost(const AttentionParams& p, const AttentionVarlen& v);
OpCost attention_backward_cost(const AttentionParams& p, const AttentionVarlen& v);
OpCost attention_decode_paged_cost(const AttentionParams& p, const PagedKv& kv);
// The profiler's arguments of one call (core/trace.h): the cost, (B, Hq, T, S), the head dim,
// the causal and window settings, and the implementation ("flash", "naive", "split-kv", ...).
void describe_attention(trace::Event& e, const AttentionParams& p, OpCost c, const char* impl);

namespace cpu {
// The two implementations, callable directly (benchmarks, tests); attention_forward/backward
// pick one from AttentionParams::impl / the process-wide setting.
void attention_forward_naive(float* out, float* lse, const float* q, const float* k, const float* v,
                             const AttentionParams& p);
void attention_backward_naive(float* dq, float* dk, float* dv, const float* dout, const float* q,
                              const float* k, const float* v, const float* out, const float* lse,
                              const AttentionParams& p);
void attention_forward_flash(float* out, float* lse, const float* q, const float* k, const float* v,
                             const AttentionParams& p);
void attention_backward_flash(float* dq, float* dk, float* dv, const float* dout, const float* q,
                              const float* k, const float* v, const float* out, const float* lse,
                              const AttentionParams& p);

// Split-KV forward for few queries: each (batch, KV head) cuts its keys into `num_splits`
// chunks (0: from the thread count and kv_len; 1: one sequential scan), computes each chunk's
// normalized output and logsumexp in parallel, then merges them exactly. Any q_len works;
// it pays off for q_len <= kSplitKvMaxQueries.
void attention_forward_split_kv(float* out, float* lse, const float* q, const float* k, const float* v,
                                const AttentionParams& p, int64_t num_splits);
// The split-KV chunk count that attention_forward_split_kv uses for num_splits = 0.
int64_t split_kv_chunks(const AttentionParams& p);

// Exact merge of attention over disjoint key sets: parts (P, rows, D) with logsumexps (P, rows)
// give out (rows, D) = Σ_p exp(lse_p − lse) · part_p and lse (rows,) = log Σ_p exp(lse_p).
// Rows with every lse_p = -inf give zeros and -inf.
void attention_merge(float* out, float* lse, const float* parts, const float* part_lse, int64_t num_parts,
                     int64_t rows, int64_t head_dim);

// Packed variable-length batches (AttentionVarlen), flash kernels; p from check_attention_varlen.
void attention_forward_varlen(float* out, float* lse, const float* q, const float* k, const float* v,
                              const AttentionParams& p, const AttentionVarlen& varlen);
void attention_backward_varlen(float* dq, float* dk, float* dv, const float* dout, const float* q,
                               const float* k, const float* v, const float* out, const float* lse,
                               const AttentionParams& p, const AttentionVarlen& varlen);

// Decode against the paged cache: q (num_seqs, q_len, Hq, D) rows of q_row_stride are the last
// q_len positions of each sequence; out like q (o_row_stride); lse (num_seqs, Hq, q_len).
// p.q_len, heads, head_dim, causal, window, scale, strides and num_splits are used; split-KV
// chunks follow block boundaries.
void attention_decode_paged(float* out, float* lse, const float* q, const PagedKv& kv, const AttentionParams& p);

// Bytes of scratch one call allocates beyond its inputs and outputs (from the same formulas the
// kernels size their buffers with), for the benchmark's memory column.
int64_t attention_forward_scratch_bytes(const AttentionParams& p, AttentionImpl impl);
int64_t attention_backward_scratch_bytes(const AttentionParams& p, AttentionImpl impl);
}  // namespace cpu

KILN_SAME_SIGNATURE(attention_forward);
KILN_SAME_SIGNATURE(attention_backward);

}  // namespace kiln
