// FlashAttention backward on CUDA behind attention.h's contract (causal or not, sliding window,
// GQA/MQA), fp32: the probabilities are recomputed from Q, K and the forward's logsumexp, never
// stored. Two kernels, each owning what it writes, so no atomics and the same bits on every run:
//   dK/dV: a block per 32 keys of one (batch, KV head), walking every query row of the query
//          heads that share the KV head (GQA sums inside the block);
//   dQ:    the forward's layout, a warp per query row walking the keys it sees.
// Both use delta_t = rowsum(dO_t ∘ O_t) (ref::attention_backward's Dt), computed where needed.
#include "kiln/kernels/cuda/common.cuh"

namespace kiln::cuda {
namespace {
constexpr int kMaxPerLane = kAttnMaxHeadDim / 32;        // elements d = lane + 32·u per lane
constexpr int kKeysPerWarp = kAttnKeyTile / kAttnWarps;  // keys whose dK/dV a warp accumulates
static_assert(kAttnKeyTile % kAttnWarps == 0 && kAttnKeyTile == 32);

// Query row t of head h, batch b, for one warp: q_t and dO_t into the warp's shared rows, lse_t
// returned in row_lse, and this lane's part of delta_t = rowsum(dO_t ∘ O_t) returned (the
// caller sums it over the warp).
__device__ __forceinline__ float stage_backward_row(float* q_row, float* dout_row, float* row_lse,
                                                    const float* q, const float* dout,
                                                    const float* out, const float* lse,
                                                    const AttentionArgs& p, int64_t b, int64_t h,
                                                    int64_t t, int lane) {
  const int64_t D = p.head_dim, T = p.q_len;
  const float* qt = q + (b * T + t) * p.q_row_stride + h * D;
  const float* dot = dout + (b * T + t) * p.o_row_stride + h * D;
  const float* ot = out + (b * T + t) * p.o_row_stride + h * D;
  float delta = 0.0f;
  for (int64_t d = lane; d < D; d += 32) {
    const float gd = dot[d];
    q_row[d] = qt[d];
    dout_row[d] = gd;
    delta += gd * ot[d];
  }
  *row_lse = lse[(b * p.n_heads + h) * T + t];
  return delta;
}
}  // namespace

// Block (key tile x, KV head y, batch z): keys j0 .. j0 + 31, K and V staged once. For each
// query head h of the GQA group and each tile of kAttnWarps query rows that can see the keys:
//  1. warp w stages its row t = t0 + w: q_t and dO_t into shared memory, delta_t (a warp
//     shuffle sum of dO_t ∘ O_t) and lse_t in registers;
//  2. thread (warp w, lane c) forms the score of (row t, key j0 + c) and dP = dO_t · v_c from
//     shared memory (q_t, dO_t broadcast; rows of K/V padded to D + 1 floats, so the 32 lanes
//     read 32 distinct banks), P = exp(s·scale - lse_t) and dS = P·(dP - delta_t), and stores
//     P and dS (kAttnWarps x 32) in shared memory;
//  3. warp w accumulates keys c = w, w + 8, w + 16, w + 24 over the tile's rows, lane = the
//     head-dim elements d = lane + 32·u: dV_c += P[r][c]·dO_r, dK_c += dS[r][c]·q_r (P and dS
//     broadcast, dO_r and q_r read by consecutive lanes: conflict-free), in registers.
// At the end each warp writes its keys' rows: dK = scale·Σ dS·q, dV = Σ P·dO (zeros for keys no
// query sees, as the contract overwrites every row).
__global__ void __launch_bounds__(32 * kAttnWarps)
    attention_backward_dkdv_kernel(float* dk, float* dv, const float* dout, const float* q,
                                   const float* k, const float* v, const float* out,
                                   const float* lse, AttentionArgs p) {
  extern __shared__ float smem[];
  const int64_t D = p.head_dim, T = p.q_len, S = p.kv_len;
  const int64_t kv_row = D + 1;                 // padded shared row
  float* ks = smem;                             // (kAttnKeyTile, D + 1)
  float* vs = ks + kAttnKeyTile * kv_row;       // (kAttnKeyTile, D + 1)
  float* qs = vs + kAttnKeyTile * kv_row;       // (kAttnWarps, D)
  float* dos = qs + kAttnWarps * D;             // (kAttnWarps, D)
  float* ps = dos + kAttnWarps * D;             // (kAttnWarps, kAttnKeyTile): P
  float* dss = ps + kAttnWarps * kAttnKeyTile;  // (kAttnWarps, kAttnKeyTile): dS
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.z, g = blockIdx.y, rep = p.n_heads / p.n_kv_heads;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kAttnKeyTile;
  const int64_t j_last = min(j0 + kAttnKeyTile, S) - 1;

  stage_kv_tile(ks, vs, k, v, p, b, g, j0, j_last, kv_row);
  __syncthreads();

  float dk_acc[kKeysPerWarp][kMaxPerLane] = {};
  float dv_acc[kKeysPerWarp][kMaxPerLane] = {};
  for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
    for (int64_t t0 = 0; t0 < T; t0 += kAttnWarps) {
      // The tile's rows see keys inside [lo(t0), hi(last row)] (lo, hi never decrease with t):
      // skip the tile when that misses this block's keys. Uniform in the block.
      int64_t lo0, hi0, lo1, hi1;
      attention_key_range(t0, T, S, p.causal, p.window, &lo0, &hi0);
      attention_key_range(min(t0 + kAttnWarps, T) - 1, T, S, p.causal, p.window, &lo1, &hi1);
      if (hi1 < j0 || lo0 > j_last) continue;

      // 1. Row t of warp w: q_t, dO_t to shared memory, delta_t and lse_t to registers.
      const int64_t t = t0 + warp;
      const bool row_valid = t < T;  // uniform in the warp
      float delta = 0.0f, row_lse = 0.0f;
      if (row_valid) {
        delta = stage_backward_row(qs + warp * D, dos + warp * D, &row_lse, q, dout, out, lse, p, b,
                                   h, t, lane);
      } else {
        for (int64_t d = lane; d < D; d += 32) qs[warp * D + d] = dos[warp * D + d] = 0.0f;
      }
      delta = warp_sum(delta);
      __syncwarp();  // step 2 reads only this warp's own row

      // 2. P and dS of (row t, key j0 + lane).
      float pv = 0.0f, dsv = 0.0f;
      if (row_valid) {
        int64_t lo, hi;
        attention_key_range(t, T, S, p.causal, p.window, &lo, &hi);
        const int64_t key = j0 + lane;
        if (key >= lo && key <= hi) {  // hi <= S - 1, so the key exists
          float sc = 0.0f, dp = 0.0f;
          for (int64_t d = 0; d < D; ++d) {
            sc += qs[warp * D + d] * ks[lane * kv_row + d];
            dp += dos[warp * D + d] * vs[lane * kv_row + d];
          }
          pv = expf(sc * p.scale - row_lse);
          dsv = pv * (dp - delta);
        }
      }
      ps[warp * kAttnKeyTile + lane] = pv;
      dss[warp * kAttnKeyTile + lane] = dsv;
      __syncthreads();

      // 3. This warp's keys accumulate over the tile's rows.
      for (int r = 0; r < kAttnWarps; ++r) {
        float qd[kMaxPerLane], dod[kMaxPerLane];
#pragma unroll
        for (int u = 0; u < kMaxPerLane; ++u) {
          const int64_t d = lane + 32 * u;
          qd[u] = d < D ? qs[r * D + d] : 0.0f;
          dod[u] = d < D ? dos[r * D + d] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < kKeysPerWarp; ++i) {
          const int c = warp + kAttnWarps * i;
          const float pc = ps[r * kAttnKeyTile + c], dsc = dss[r * kAttnKeyTile + c];
          if (pc == 0.0f && dsc == 0.0f) continue;  // the same in every lane: no divergence
#pragma unroll
          for (int u = 0; u < kMaxPerLane; ++u) {
            dv_acc[i][u] += pc * dod[u];
            dk_acc[i][u] += dsc * qd[u];
          }
        }
      }
      __syncthreads();  // before the next tile overwrites qs, dos, ps, dss
    }
  }

#pragma unroll
  for (int i = 0; i < kKeysPerWarp; ++i) {
    const int64_t key = j0 + warp + kAttnWarps * i;
    if (key >= S) continue;
    float* dkj = dk + (b * S + key) * p.k_row_stride + g * D;
    float* dvj = dv + (b * S + key) * p.v_row_stride + g * D;
#pragma unroll
    for (int u = 0; u < kMaxPerLane; ++u) {
      const int64_t d = lane + 32 * u;
      if (d < D) {
        dkj[d] = dk_acc[i][u] * p.scale;
        dvj[d] = dv_acc[i][u];
      }
    }
  }
}

// Block (query tile x, query head y, batch z), warp w = query row t0 + w, as the forward: the
// block walks the keys its rows see in 32-key tiles of K and V staged in shared memory; lane j
// recomputes P and dS of key kt + j for its warp's row (q_t and dO_t broadcast from shared
// memory), then dQ_t += dS_j·k_j with dS_j broadcast by a shuffle and lane owning the elements
// d = lane + 32·u (consecutive lanes, consecutive banks). dQ = scale·Σ dS·k.
__global__ void __launch_bounds__(32 * kAttnWarps)
    attention_backward_dq_kernel(float* dq, const float* dout, const float* q, const float* k,
                                 const float* v, const float* out, const float* lse,
                                 AttentionArgs p) {
  extern __shared__ float smem[];
  const int64_t D = p.head_dim, T = p.q_len, S = p.kv_len;
  const int64_t kv_row = D + 1;
  float* ks = smem;                        // (kAttnKeyTile, D + 1)
  float* vs = ks + kAttnKeyTile * kv_row;  // (kAttnKeyTile, D + 1)
  float* qs = vs + kAttnKeyTile * kv_row;  // (kAttnWarps, D)
  float* dos = qs + kAttnWarps * D;        // (kAttnWarps, D)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (p.n_heads / p.n_kv_heads);
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kAttnWarps;
  const int64_t t = t0 + warp;
  const bool row_valid = t < T;  // uniform within the warp

  int64_t lo = 0, hi = -1;
  if (row_valid) attention_key_range(t, T, S, p.causal, p.window, &lo, &hi);
  int64_t block_lo, block_hi, unused;
  attention_key_range(t0, T, S, p.causal, p.window, &block_lo, &unused);
  attention_key_range(min(t0 + kAttnWarps, T) - 1, T, S, p.causal, p.window, &unused, &block_hi);

  float delta = 0.0f, row_lse = 0.0f;
  if (row_valid) {
    delta = stage_backward_row(qs + warp * D, dos + warp * D, &row_lse, q, dout, out, lse, p, b, h,
                               t, lane);
  }
  delta = warp_sum(delta);

  float acc[kMaxPerLane] = {};
  for (int64_t kt = block_lo; kt <= block_hi; kt += kAttnKeyTile) {
    stage_kv_tile(ks, vs, k, v, p, b, g, kt, block_hi, kv_row);
    __syncthreads();
    if (row_valid) {
      const int64_t key = kt + lane;
      float ds = 0.0f;
      if (key >= lo && key <= hi) {
        float sc = 0.0f, dp = 0.0f;
        for (int64_t d = 0; d < D; ++d) {
          sc += qs[warp * D + d] * ks[lane * kv_row + d];
          dp += dos[warp * D + d] * vs[lane * kv_row + d];
        }
        ds = expf(sc * p.scale - row_lse) * (dp - delta);
      }
      for (int j = 0; j < kAttnKeyTile; ++j) {
        const float dsj = __shfl_sync(0xffffffffu, ds, j);
        if (dsj == 0.0f) continue;  // the same value in every lane: no divergence
#pragma unroll
        for (int u = 0; u < kMaxPerLane; ++u) {
          const int64_t d = lane + 32 * u;
          if (d < D) acc[u] += dsj * ks[j * kv_row + d];
        }
      }
    }
    __syncthreads();
  }

  if (!row_valid) return;
  float* dqt = dq + (b * T + t) * p.q_row_stride + h * D;
#pragma unroll
  for (int u = 0; u < kMaxPerLane; ++u) {
    const int64_t d = lane + 32 * u;
    if (d < D) dqt[d] = acc[u] * p.scale;
  }
}

cudaError_t launch_attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                      const float* q, const float* k, const float* v,
                                      const float* out, const float* lse, const AttentionArgs& p) {
  if (p.batch > 0 && p.kv_len > 0) {  // every key row of dK/dV is written, seen or not
    const LaunchConfig c =
        attention_backward_dkdv_launch(p.batch, p.n_kv_heads, p.kv_len, p.head_dim);
    cudaError_t err = allow_dynamic_smem(attention_backward_dkdv_kernel, c.smem_bytes);
    if (err != cudaSuccess) return err;
    attention_backward_dkdv_kernel<<<grid_of(c), block_of(c), static_cast<size_t>(c.smem_bytes),
                                     launch_stream()>>>(dk, dv, dout, q, k, v, out, lse, p);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (p.batch > 0 && p.q_len > 0) {
    const LaunchConfig c = attention_backward_dq_launch(p.batch, p.n_heads, p.q_len, p.head_dim);
    const cudaError_t err = allow_dynamic_smem(attention_backward_dq_kernel, c.smem_bytes);
    if (err != cudaSuccess) return err;
    attention_backward_dq_kernel<<<grid_of(c), block_of(c), static_cast<size_t>(c.smem_bytes),
                                   launch_stream()>>>(dq, dout, q, k, v, out, lse, p);
  }
  return cudaGetLastError();
}

}  // namespace kiln::cuda
