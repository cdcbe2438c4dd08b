// Device helpers shared by the .cu files: bf16/f32 operand loads, warp and block reductions,
// the GEMM epilogue (gemm.h's contract) and LaunchConfig -> dim3. The .cu files build no
// Status (fmt's compile-time format checks do not pass nvcc's front end): they launch and
// return the cudaError_t, and kernels_cuda.cpp turns it into kernels.h's Status.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/kernels/cuda/launch.h"
#include "kiln/kernels/cuda/launchers.h"

namespace kiln::cuda {

// A bf16 (raw bits) or f32 operand element as f32.
__device__ __forceinline__ float load_operand(const void* base, bool is_bf16, int64_t i) {
  if (is_bf16)
    return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(base)[i]) << 16);
  return static_cast<const float*>(base)[i];
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Sum / max over the whole block (blockDim.x a multiple of 32, at most 1024): every thread
// gets the result. `scratch` is 32 floats of shared memory; the call ends with a barrier, so
// the same scratch may be reused by the next reduction.
template <class WarpOp>
__device__ __forceinline__ float block_reduce(float v, float* scratch, float identity,
                                              WarpOp warp_op) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
  v = warp_op(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const float r = warp_op(lane < num_warps ? scratch[lane] : identity);
  __syncthreads();
  return r;
}
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  return block_reduce(v, scratch, 0.0f, [](float x) { return warp_sum(x); });
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce(v, scratch, -INFINITY, [](float x) { return warp_max(x); });
}

__device__ __forceinline__ float activate(DeviceActivation act, float v) {
  switch (act) {
    case DeviceActivation::kNone:
      return v;
    case DeviceActivation::kGeluTanh: {
      const float kS = 0.7978845608028654f;  // sqrt(2/pi)
      return 0.5f * v * (1.0f + tanhf(kS * (v + 0.044715f * v * v * v)));
    }
    case DeviceActivation::kSilu:
      return v / (1.0f + expf(-v));
    case DeviceActivation::kRelu:
      return v > 0.0f ? v : 0.0f;
  }
  return v;
}

// The GEMM epilogue of C[i, j] (in bounds): alpha·acc (+ beta·C) (+ bias), activation,
// (+ residual). beta = 0 never reads C.
__device__ __forceinline__ void gemm_store(const GemmArgs& p, int64_t i, int64_t j, float acc) {
  float* c = p.c + i * p.ldc + j;
  float v = p.alpha * acc;
  if (p.beta != 0.0f) v += p.beta * *c;
  if (p.bias) v += p.bias[j];
  v = activate(p.act, v);
  if (p.residual) v += p.residual[i * p.ldr + j];
  *c = v;
}

// Keys [lo, hi] that query row t of q_len may see among kv_len keys (attention.h: causal keys
// s <= t + kv_len - q_len, a sliding window keeps s > pos - window, and s < pos + window when
// not causal); hi < lo when none. lo and hi never decrease with t.
__device__ __forceinline__ void attention_key_range(int64_t t, int64_t q_len, int64_t kv_len,
                                                    bool causal, int64_t window, int64_t* lo,
                                                    int64_t* hi) {
  const int64_t pos = t + (kv_len - q_len);
  *lo = 0;
  *hi = kv_len - 1;
  if (causal) *hi = min(*hi, pos);
  if (window > 0) {
    *lo = max(int64_t{0}, pos - window + 1);
    if (!causal) *hi = min(*hi, pos + window - 1);
  }
}

// The block's key tile [kt, kt + kAttnKeyTile) of KV head g, batch b, staged into shared rows
// ks, vs (kv_row = D + 1 floats apart: the 32 lanes of a warp reading one element of 32 rows
// hit 32 banks); consecutive threads take consecutive elements of a row (coalesced). Keys past
// last (the block's last visible key, < kv_len) are zeros. All threads of the block take part.
__device__ __forceinline__ void stage_kv_tile(float* ks, float* vs, const float* k, const float* v,
                                              const AttentionArgs& p, int64_t b, int64_t g,
                                              int64_t kt, int64_t last, int64_t kv_row) {
  const int64_t D = p.head_dim, S = p.kv_len;
  for (int64_t e = threadIdx.x; e < kAttnKeyTile * D; e += blockDim.x) {
    const int64_t j = e / D, d = e % D, key = kt + j;
    const bool in = key <= last && key < S;
    ks[j * kv_row + d] = in ? k[(b * S + key) * p.k_row_stride + g * D + d] : 0.0f;
    vs[j * kv_row + d] = in ? v[(b * S + key) * p.v_row_stride + g * D + d] : 0.0f;
  }
}

// One warp's step of the online softmax over a key tile staged in shared memory (the flash
// forward's and the paged decode's): lane j scores key j against the row's query q_row (shared,
// D floats) when `visible`, then the row's running max m, sum l and unnormalised output o
// (elements lane + 32·i) absorb the tile's kAttnKeyTile keys, values vs (rows kv_row apart).
// Keys nobody sees leave the state alone (the branch is uniform in the warp).
template <int kPerLane>
__device__ __forceinline__ void online_softmax_key_tile(const float* q_row, const float* ks,
                                                        const float* vs, int64_t kv_row, int64_t D,
                                                        float scale, bool visible, int lane,
                                                        float& m, float& l, float (&o)[kPerLane]) {
  float s = -INFINITY;
  if (visible) {
    float dot = 0.0f;
    for (int64_t d = 0; d < D; ++d) dot += q_row[d] * ks[lane * kv_row + d];
    s = dot * scale;
  }
  const float m_new = fmaxf(m, warp_max(s));
  if (m_new == -INFINITY) return;  // no key of this row seen so far (uniform in the warp)
  const float pj = s == -INFINITY ? 0.0f : expf(s - m_new);
  const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
  l = l * corr + warp_sum(pj);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) o[i] *= corr;
  for (int j = 0; j < kAttnKeyTile; ++j) {
    const float pjj = __shfl_sync(0xffffffffu, pj, j);
    if (pjj == 0.0f) continue;  // the same value in every lane: no divergence
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < D) o[i] += pjj * vs[j * kv_row + d];
    }
  }
  m = m_new;
}

// One rotated pair (i, i + D/2) of RoPE (rope.h), pair index e over x (B, T, H, D); cos, sin
// (positions, D/2). sign +1 rotates by the angle (forward), -1 by its negative (backward: the
// inverse rotation, sin negated). out may alias inp: both elements are read before either is
// written.
__device__ __forceinline__ void rope_rotate_pair(float* out, const float* inp, const float* cos,
                                                 const float* sin, int64_t e, int64_t seq_len,
                                                 int64_t n_heads, int64_t head_dim,
                                                 int64_t pos_offset, float sign) {
  const int64_t half = head_dim / 2;
  const int64_t i = e % half, head_row = e / half;  // head_row indexes (B, T, H)
  const int64_t t = (head_row / n_heads) % seq_len;
  const int64_t tab = (pos_offset + t) * half + i;
  const int64_t off = head_row * head_dim + i;
  const float x0 = inp[off], x1 = inp[off + half], c = cos[tab], s = sign * sin[tab];
  out[off] = x0 * c - x1 * s;
  out[off + half] = x1 * c + x0 * s;
}

// A grid-stride loop over [0, n): elementwise kernels launched with elementwise_launch (whose
// grid is capped, so one thread may take several elements).
#define KILN_GRID_STRIDE(i, n)                                                           \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

inline dim3 grid_of(const LaunchConfig& c) {
  return dim3(static_cast<unsigned>(c.grid_x), static_cast<unsigned>(c.grid_y),
              static_cast<unsigned>(c.grid_z));
}
inline dim3 block_of(const LaunchConfig& c) {
  return dim3(static_cast<unsigned>(c.block_x), static_cast<unsigned>(c.block_y), 1);
}

// Opts `kernel` into `bytes` of dynamic shared memory where that is above the 48 KiB every
// kernel gets without asking (the attention kernels at large head dims).
template <class Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, int64_t bytes) {
  constexpr int64_t kDefaultSmemLimit = 48 * 1024;
  if (bytes <= kDefaultSmemLimit) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

}  // namespace kiln::cuda
