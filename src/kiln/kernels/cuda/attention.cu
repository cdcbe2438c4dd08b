// FlashAttention forward on CUDA behind attention.h's contract (causal or not, sliding window,
// GQA/MQA, logsumexp out), fp32. A block is kAttnWarps query rows of one (batch, query head),
// one warp per row; it walks the keys its rows can see in tiles of 32 staged in shared memory
// (launch.h: rows padded to head_dim + 1 floats), each lane scoring one key of the tile, and
// keeps the online softmax (running max m, sum l, unnormalised output o) in registers.
#include "kiln/kernels/cuda/common.cuh"

namespace kiln::cuda {
namespace {
constexpr int kMaxPerLane = kAttnMaxHeadDim / 32;  // output elements d = lane + 32·i per lane

// Keys [lo, hi] that query t may see (attention.h); hi < lo when none.
__device__ __forceinline__ void key_range(const AttentionArgs& p, int64_t t, int64_t* lo,
                                          int64_t* hi) {
  attention_key_range(t, p.q_len, p.kv_len, p.causal, p.window, lo, hi);
}
}  // namespace

__global__ void __launch_bounds__(32 * kAttnWarps)
    attention_forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v,
                             AttentionArgs p) {
  extern __shared__ float smem[];
  const int64_t D = p.head_dim, T = p.q_len;
  const int64_t kv_row = D + 1;            // padded shared row
  float* ks = smem;                        // (kAttnKeyTile, D + 1)
  float* vs = ks + kAttnKeyTile * kv_row;  // (kAttnKeyTile, D + 1)
  float* qs = vs + kAttnKeyTile * kv_row;  // (kAttnWarps, D)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (p.n_heads / p.n_kv_heads);
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kAttnWarps;
  const int64_t t = t0 + warp;
  const bool row_valid = t < T;  // uniform within the warp

  int64_t lo = 0, hi = -1;
  if (row_valid) key_range(p, t, &lo, &hi);
  // lo and hi never decrease with t, so the block's keys run from its first row's lo to its
  // last row's hi.
  int64_t block_lo, block_hi, unused;
  key_range(p, t0, &block_lo, &unused);
  key_range(p, min(t0 + kAttnWarps, T) - 1, &unused, &block_hi);

  if (row_valid) {
    const float* qt = q + (b * T + t) * p.q_row_stride + h * D;
    for (int64_t d = lane; d < D; d += 32) qs[warp * D + d] = qt[d];
  }
  float o[kMaxPerLane] = {};
  float m = -INFINITY, l = 0.0f;

  for (int64_t kt = block_lo; kt <= block_hi; kt += kAttnKeyTile) {
    stage_kv_tile(ks, vs, k, v, p, b, g, kt, block_hi, kv_row);
    __syncthreads();
    if (row_valid) {
      const int64_t key = kt + lane;
      online_softmax_key_tile(qs + warp * D, ks, vs, kv_row, D, p.scale, key >= lo && key <= hi, lane,
                              m, l, o);
    }
    __syncthreads();
  }

  if (!row_valid) return;
  float* ot = out + (b * T + t) * p.o_row_stride + h * D;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < D) ot[d] = o[i] * inv;
  }
  if (lane == 0) lse[(b * p.n_heads + h) * T + t] = l > 0.0f ? m + logf(l) : -INFINITY;
}

cudaError_t launch_attention_forward(float* out, float* lse, const float* q, const float* k,
                                     const float* v, const AttentionArgs& p) {
  const LaunchConfig c = attention_launch(p.batch, p.n_heads, p.q_len, p.head_dim);
  const cudaError_t err = allow_dynamic_smem(attention_forward_kernel, c.smem_bytes);
  if (err != cudaSuccess) return err;
  attention_forward_kernel<<<grid_of(c), block_of(c), static_cast<size_t>(c.smem_bytes),
                             launch_stream()>>>(out, lse, q, k, v, p);
  return cudaGetLastError();
}

}  // namespace kiln::cuda
