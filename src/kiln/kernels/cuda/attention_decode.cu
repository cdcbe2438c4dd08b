// Split-KV decode attention over the paged KV cache on CUDA, behind cpu::attention_decode_paged's
// contract (attention.h: PagedKv's block table and block size, GQA, causal and window per
// sequence, fp32). Decode has few query rows and long key runs, so the keys of each (sequence,
// KV head) are cut into chunks processed by separate blocks (launch.h's decode_split), each
// writing a partial (max m_c, sum l_c, unnormalised output o_c) per query row; a combine kernel
// merges the chunks exactly: with M = max_c m_c and L = Σ_c e^(m_c - M)·l_c,
// out = Σ_c e^(m_c - M)·o_c / L and lse = M + log L.
#include "kiln/kernels/cuda/common.cuh"

namespace kiln::cuda {
namespace {
constexpr int kMaxPerLane = kAttnMaxHeadDim / 32;  // output elements d = lane + 32·i per lane
}  // namespace

// Block (chunk x, KV head g · row groups + row group y, sequence z); warp w is row
// r = group·kAttnWarps + w of the GQA group, i.e. query head g·rep + r / q_len and query
// t = r % q_len (the last q_len positions of the sequence). The block walks its chunk's keys
// (those its rows may see) in tiles of 32: threads 0..31 first translate the tile's keys through
// the block table into pool rows (key j of the sequence is row j % block_size of block
// block_table[j / block_size]), then all threads stage K and V rows (consecutive threads,
// consecutive head-dim elements of one row: coalesced) into shared rows padded to D + 1 floats.
// From there on it is the forward's online softmax (attention.cu): lane j scores key j, the
// running max m, sum l and output o (lane = elements lane + 32·i) stay in registers.
__global__ void __launch_bounds__(32 * kAttnWarps)
    attention_decode_split_kernel(float* out, float* lse, float* workspace, const float* q,
                                  PagedDecodeArgs a) {
  extern __shared__ float smem[];
  __shared__ int64_t key_rows[kAttnKeyTile];  // the tile's keys as pool rows, -1 past the range
  const AttentionArgs& p = a.attn;
  const int64_t D = p.head_dim, nq = p.q_len, kv_row = D + 1;
  float* ks = smem;                        // (kAttnKeyTile, D + 1)
  float* vs = ks + kAttnKeyTile * kv_row;  // (kAttnKeyTile, D + 1)
  float* qs = vs + kAttnKeyTile * kv_row;  // (kAttnWarps, D)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t seq = blockIdx.z, chunk = blockIdx.x;
  const int64_t rep = p.n_heads / p.n_kv_heads, group_rows = rep * nq;
  const int64_t row_groups = (group_rows + kAttnWarps - 1) / kAttnWarps;
  const int64_t g = blockIdx.y / row_groups;
  const int64_t r = (blockIdx.y % row_groups) * kAttnWarps + warp;
  const bool row_valid = r < group_rows;  // uniform within the warp
  const int64_t h = g * rep + (row_valid ? r / nq : 0), t = row_valid ? r % nq : 0;

  // The sequence's keys (never past its table), this chunk's part of them, each row's visible
  // part and the block's union (queries 0 .. nq - 1 of the sequence; lo and hi grow with t).
  const int64_t S =
      min(static_cast<int64_t>(max(a.seq_lens[seq], 0)), a.max_blocks_per_seq * a.block_size);
  const int64_t c0 = chunk * a.chunk_keys, c1 = min(c0 + a.chunk_keys, S);
  int64_t lo = 0, hi = -1;
  if (row_valid) {
    attention_key_range(t, nq, S, p.causal, p.window, &lo, &hi);
    lo = max(lo, c0), hi = min(hi, c1 - 1);
  }
  int64_t block_lo, block_hi, unused;
  attention_key_range(0, nq, S, p.causal, p.window, &block_lo, &unused);
  attention_key_range(nq - 1, nq, S, p.causal, p.window, &unused, &block_hi);
  block_lo = max(block_lo, c0), block_hi = min(block_hi, c1 - 1);

  if (row_valid) {
    const float* qt = q + (seq * nq + t) * p.q_row_stride + h * D;
    for (int64_t d = lane; d < D; d += 32) qs[warp * D + d] = qt[d];
  }
  const int32_t* table = a.block_table + seq * a.max_blocks_per_seq;
  float o[kMaxPerLane] = {};
  float m = -INFINITY, l = 0.0f;

  for (int64_t kt = block_lo; kt <= block_hi; kt += kAttnKeyTile) {
    if (threadIdx.x < kAttnKeyTile) {
      const int64_t key = kt + threadIdx.x;  // <= block_hi < S: inside the table
      key_rows[threadIdx.x] =
          key <= block_hi
              ? static_cast<int64_t>(table[key / a.block_size]) * a.block_size + key % a.block_size
              : -1;
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < kAttnKeyTile * D; e += blockDim.x) {
      const int64_t j = e / D, d = e % D, row = key_rows[j];
      ks[j * kv_row + d] = row >= 0 ? a.k_pool[row * p.k_row_stride + g * D + d] : 0.0f;
      vs[j * kv_row + d] = row >= 0 ? a.v_pool[row * p.v_row_stride + g * D + d] : 0.0f;
    }
    __syncthreads();
    if (row_valid) {
      const int64_t key = kt + lane;
      online_softmax_key_tile(qs + warp * D, ks, vs, kv_row, D, p.scale, key >= lo && key <= hi, lane,
                              m, l, o);
    }
    __syncthreads();  // before the next tile overwrites key_rows, ks, vs
  }

  if (!row_valid) return;
  const int64_t lse_row = (seq * p.n_heads + h) * nq + t;  // lse is (num_seqs, Hq, q_len)
  if (a.num_splits == 1) {  // the only chunk: normalise in place of the combine
    float* ot = out + (seq * nq + t) * p.o_row_stride + h * D;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < D) ot[d] = o[i] * inv;
    }
    if (lane == 0) lse[lse_row] = l > 0.0f ? m + logf(l) : -INFINITY;
    return;
  }
  // Workspace: o (num_splits, rows, D), then m (num_splits, rows), then l (num_splits, rows).
  const int64_t rows = static_cast<int64_t>(gridDim.z) * p.n_heads * nq;
  float* part_o = workspace + (chunk * rows + lse_row) * D;
  float* part_m = workspace + a.num_splits * rows * D;
  float* part_l = part_m + a.num_splits * rows;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < D) part_o[d] = o[i];
  }
  if (lane == 0) {
    part_m[chunk * rows + lse_row] = m;  // -inf and l = 0 for a chunk the row saw nothing of
    part_l[chunk * rows + lse_row] = l;
  }
}

// A warp per query row r = (seq · Hq + h) · q_len + t (lse's order), kAttnWarps rows per block:
// lanes stride over the chunks for the global max M (warp_max) and the rescaled sum
// L = Σ_c e^(m_c - M)·l_c (warp_sum), then each lane merges its head-dim elements over the
// chunks. A row no chunk saw anything of gets zeros and -inf, as the CPU's.
__global__ void __launch_bounds__(32 * kAttnWarps)
    attention_decode_combine_kernel(float* out, float* lse, const float* workspace,
                                    PagedDecodeArgs a, int64_t rows) {
  const AttentionArgs& p = a.attn;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kAttnWarps + warp;
  if (r >= rows) return;  // the whole warp; the kernel has no block barrier
  const int64_t D = p.head_dim, nq = p.q_len, nc = a.num_splits;
  const int64_t t = r % nq, h = (r / nq) % p.n_heads, seq = r / (nq * p.n_heads);
  const float* part_o = workspace;
  const float* part_m = workspace + nc * rows * D;
  const float* part_l = part_m + nc * rows;
  float* ot = out + (seq * nq + t) * p.o_row_stride + h * D;

  float mx = -INFINITY;
  for (int64_t c = lane; c < nc; c += 32) mx = fmaxf(mx, part_m[c * rows + r]);
  mx = warp_max(mx);
  if (mx == -INFINITY) {  // uniform in the warp
    for (int64_t d = lane; d < D; d += 32) ot[d] = 0.0f;
    if (lane == 0) lse[r] = -INFINITY;
    return;
  }
  float sum = 0.0f;
  for (int64_t c = lane; c < nc; c += 32)
    sum += part_l[c * rows + r] * expf(part_m[c * rows + r] - mx);
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  for (int64_t d = lane; d < D; d += 32) {
    float acc = 0.0f;
    for (int64_t c = 0; c < nc; ++c)  // part_m of chunk c: one address for the whole warp
      acc += expf(part_m[c * rows + r] - mx) * part_o[(c * rows + r) * D + d];
    ot[d] = acc * inv;
  }
  if (lane == 0) lse[r] = mx + logf(sum);
}

cudaError_t launch_attention_decode_paged(float* out, float* lse, const float* q,
                                          const PagedDecodeArgs& a, float* workspace) {
  const AttentionArgs& p = a.attn;
  const LaunchConfig c =
      attention_decode_launch(p.batch, p.n_heads, p.n_kv_heads, p.q_len, p.head_dim, a.num_splits);
  cudaError_t err = allow_dynamic_smem(attention_decode_split_kernel, c.smem_bytes);
  if (err != cudaSuccess) return err;
  attention_decode_split_kernel<<<grid_of(c), block_of(c), static_cast<size_t>(c.smem_bytes),
                                  launch_stream()>>>(out, lse, workspace, q, a);
  err = cudaGetLastError();
  if (err != cudaSuccess || a.num_splits == 1) return err;
  const int64_t rows = p.batch * p.n_heads * p.q_len;
  const LaunchConfig m = attention_decode_combine_launch(rows);
  attention_decode_combine_kernel<<<grid_of(m), block_of(m), 0, launch_stream()>>>(
      out, lse, workspace, a, rows);
  return cudaGetLastError();
}

}  // namespace kiln::cuda
