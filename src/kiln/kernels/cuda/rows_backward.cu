// Row-wise and elementwise CUDA backward kernels behind the norm.h, softmax.h, cross_entropy.h,
// embedding.h, rope.h and activation.h contracts (fp32): d-inputs are overwritten, parameter
// gradients accumulate (+=). Row kernels give each row one block (row_launch) and reduce with
// warp shuffles, then across warps through shared memory (common.cuh); the norms' weight
// gradients are a column reduction over the rows (column_launch); the rest are grid-stride loops.
#include "kiln/kernels/cuda/common.cuh"

namespace kiln::cuda {

// ---- norms --------------------------------------------------------------------------------------
// dinp of LayerNorm, one block per row: with g = dy·w and xhat = (x - mean)·rstd,
// dx = rstd·(g - mean(g) - xhat·mean(g·xhat)). Each thread sums both terms over its columns in
// one pass, two block reductions give the means, a second pass writes dx.
__global__ void layernorm_backward_kernel(float* dinp, const float* dout, const float* inp,
                                          const float* weight, const float* mean, const float* rstd,
                                          int64_t cols) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* x = inp + row * cols;  // (cols,)
  const float* dy = dout + row * cols;
  float* dx = dinp + row * cols;
  const float mu = mean[row], r = rstd[row];
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float g = dy[j] * weight[j];
    sg += g;
    sgx += g * (x[j] - mu) * r;
  }
  const float a = block_sum(sg, scratch) / static_cast<float>(cols);
  const float b = block_sum(sgx, scratch) / static_cast<float>(cols);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float xhat = (x[j] - mu) * r;
    dx[j] = r * (dy[j] * weight[j] - a - xhat * b);
  }
}

// dinp of RMSNorm, one block per row: xhat = x·rstd, dx = rstd·(g - xhat·mean(g·xhat)).
__global__ void rmsnorm_backward_kernel(float* dinp, const float* dout, const float* inp,
                                        const float* weight, const float* rstd, int64_t cols) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* x = inp + row * cols;  // (cols,)
  const float* dy = dout + row * cols;
  float* dx = dinp + row * cols;
  const float r = rstd[row];
  float sgx = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sgx += dy[j] * weight[j] * x[j] * r;
  const float b = block_sum(sgx, scratch) / static_cast<float>(cols);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    dx[j] = r * (dy[j] * weight[j] - x[j] * r * b);
}

// dweight[c] += Σ_rows dy·xhat and (LayerNorm) dbias[c] += Σ_rows dy, column_launch: thread
// (x, y) of block bx owns column bx·32 + x and rows y, y + 8, ...; a warp (one y) reads 32
// consecutive floats of a row. The 8 partial sums of each column meet in shared memory and the
// y = 0 row of threads adds them in order: deterministic. mean null is RMSNorm (xhat = x·rstd);
// dbias null skips the bias.
__global__ void norm_weight_backward_kernel(float* dweight, float* dbias, const float* dout,
                                            const float* inp, const float* mean, const float* rstd,
                                            int64_t rows, int64_t cols) {
  __shared__ float dw_part[kColRows][kColTile];
  __shared__ float db_part[kColRows][kColTile];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  float dw = 0.0f, db = 0.0f;
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kColRows) {
      const float dy = dout[r * cols + c];
      const float xhat = (inp[r * cols + c] - (mean ? mean[r] : 0.0f)) * rstd[r];
      dw += dy * xhat;
      db += dy;
    }
  }
  dw_part[threadIdx.y][threadIdx.x] = dw;
  db_part[threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float sw = 0.0f, sb = 0.0f;
    for (int y = 0; y < kColRows; ++y) {
      sw += dw_part[y][threadIdx.x];
      sb += db_part[y][threadIdx.x];
    }
    dweight[c] += sw;
    if (dbias) dbias[c] += sb;
  }
}

// ---- softmax, cross-entropy ---------------------------------------------------------------------
// dx = y ⊙ (dy - <dy, y>), one block per row. dinp may alias dout: thread j reads dy[j] (both
// passes) before it writes dx[j], and no other thread touches column j.
__global__ void softmax_backward_kernel(float* dinp, const float* dout, const float* out,
                                        int64_t cols) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* y = out + row * cols;  // (cols,)
  const float* dy = dout + row * cols;
  float* dx = dinp + row * cols;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dot += dy[j] * y[j];
  dot = block_sum(dot, scratch);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dx[j] = y[j] * (dy[j] - dot);
}

namespace {
// (m, s) ← the running max and Σ exp(x - max) of the union of two disjoint sets of logits.
// (-inf, 0) is the empty set.
__device__ __forceinline__ void merge_max_sum(float* m, float* s, float m2, float s2) {
  const float mn = fmaxf(*m, m2);
  if (mn == -INFINITY) return;  // both empty
  *s = *s * expf(*m - mn) + s2 * expf(m2 - mn);
  *m = mn;
}
__device__ __forceinline__ void warp_max_sum(float* m, float* s) {
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, *m, off);
    const float s2 = __shfl_xor_sync(0xffffffffu, *s, off);
    merge_max_sum(m, s, m2, s2);
  }
}
// The block's (max, sum), as block_sum (common.cuh) with pairs: a butterfly in each warp, one
// pair per warp through shared memory (scratch: 64 floats), then every warp merges those pairs,
// so every thread ends with the same pair (the merge is symmetric: butterfly partners compute
// identical bits). Ends with a barrier, so the scratch may be reused.
__device__ __forceinline__ void block_max_sum(float* m, float* s, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
  warp_max_sum(m, s);
  if (lane == 0) scratch[warp] = *m, scratch[32 + warp] = *s;
  __syncthreads();
  *m = lane < num_warps ? scratch[lane] : -INFINITY;
  *s = lane < num_warps ? scratch[32 + lane] : 0.0f;
  warp_max_sum(m, s);
  __syncthreads();
}
}  // namespace

// dlogits = (softmax(logits) - onehot(t))·dlosses[row], one block per row. The row's max and sum
// of exp come from ONE streaming pass (each thread keeps a running max and rescales its sum when
// the max grows; the pairs merge through warp shuffles and shared memory), then a second pass
// writes the gradient: two reads of the logits instead of three. Target -1 gives a zero row, one
// outside [0, vocab) a NaN row. dlogits may alias logits: every read of the first pass is done
// before the block reduction's barrier, and in the second thread j reads x[j] before writing it.
__global__ void cross_entropy_backward_kernel(float* dlogits, const float* logits,
                                              const int32_t* targets, const float* dlosses,
                                              int64_t vocab) {
  __shared__ float scratch[64];
  const int64_t row = blockIdx.x;
  const int32_t t = targets[row];
  const float* x = logits + row * vocab;  // (vocab,)
  float* dx = dlogits + row * vocab;
  if (t == -1) {  // the whole block takes this branch (no barrier below is skipped by some only)
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) dx[j] = 0.0f;
    return;
  }
  float m = -INFINITY, s = 0.0f;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float xv = x[j];
    if (xv > m) {
      s = s * expf(m - xv) + 1.0f;  // m = -inf: s is 0 and expf(-inf) 0
      m = xv;
    } else if (m != -INFINITY) {  // an -inf logit before any finite one adds nothing
      s += expf(xv - m);
    }
  }
  block_max_sum(&m, &s, scratch);
  const bool ok = t >= 0 && t < vocab;
  const float dl = dlosses[row], inv = 1.0f / s;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float p = expf(x[j] - m) * inv;
    dx[j] = ok ? (p - (j == t ? 1.0f : 0.0f)) * dl : NAN;
  }
}

// ---- embedding ----------------------------------------------------------------------------------
// dweight[ids[row]] += dout[row], one block per token, threads along the columns, with fp32
// atomicAdd. Why atomics rather than a sort by id and an ordered sum per id: the adds are
// fire-and-forget reductions performed at L2 (RED.ADD.F32: no value comes back to the thread),
// the kernel streams dout once with coalesced 128-byte runs, needs no sort pass and no scratch,
// and tokens only contend where an id repeats (even then per column, spread over the row).
// The price: with repeated ids the order of the additions, hence the last bits of dweight, can
// differ from run to run (the CPU's scatter is deterministic); a sorted accumulation is the step
// to take if bitwise reproducibility on the GPU is required. An id outside [0, vocab) is skipped.
__global__ void embedding_backward_kernel(float* dweight, const float* dout, const int32_t* ids,
                                          int64_t vocab_size, int64_t cols) {
  const int64_t row = blockIdx.x;
  const int32_t id = ids[row];
  if (id < 0 || id >= vocab_size) return;  // uniform in the block
  float* dw = dweight + static_cast<int64_t>(id) * cols;
  const float* dy = dout + row * cols;  // (cols,)
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) atomicAdd(dw + j, dy[j]);
}

// ---- RoPE, activations --------------------------------------------------------------------------
// The inverse rotation of each pair (rope.h: sin negated), one thread per pair.
__global__ void rope_backward_kernel(float* dinp, const float* dout, const float* cos,
                                     const float* sin, int64_t num_pairs, int64_t seq_len,
                                     int64_t n_heads, int64_t head_dim, int64_t pos_offset) {
  KILN_GRID_STRIDE(e, num_pairs)
  rope_rotate_pair(dinp, dout, cos, sin, e, seq_len, n_heads, head_dim, pos_offset, -1.0f);
}

namespace {
// gelu'(x) of the tanh form: 0.5·(1 + th) + 0.5·x·(1 - th²)·sqrt(2/π)·(1 + 3·0.044715·x²).
__device__ __forceinline__ float gelu_grad(float x) {
  const float kS = 0.7978845608028654f, kA = 0.044715f;
  const float th = tanhf(kS * (x + kA * x * x * x));
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kS * (1.0f + 3.0f * kA * x * x);
}
// silu'(x) = s·(1 + x·(1 - s)), s = sigmoid(x).
__device__ __forceinline__ float silu_grad(float x) {
  const float s = 1.0f / (1.0f + expf(-x));
  return s * (1.0f + x * (1.0f - s));
}
}  // namespace

// Elementwise: every input of index i is read before dinp[i] is written (outputs may alias).
__global__ void gelu_backward_kernel(float* dinp, const float* dout, const float* inp, int64_t n) {
  KILN_GRID_STRIDE(i, n) dinp[i] = dout[i] * gelu_grad(inp[i]);
}

__global__ void silu_backward_kernel(float* dinp, const float* dout, const float* inp, int64_t n) {
  KILN_GRID_STRIDE(i, n) dinp[i] = dout[i] * silu_grad(inp[i]);
}

// dgate = dy·up·silu'(gate), dup = dy·silu(gate).
__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dout,
                                       const float* gate, const float* up, int64_t n) {
  KILN_GRID_STRIDE(i, n) {
    const float g = gate[i], u = up[i], dy = dout[i];
    const float s = 1.0f / (1.0f + expf(-g));
    dgate[i] = dy * u * s * (1.0f + g * (1.0f - s));
    dup[i] = dy * g * s;
  }
}

// ---- launchers (checked arguments: kernels_cuda.cpp) -------------------------------------------
cudaError_t launch_layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                      const float* inp, const float* weight, const float* mean,
                                      const float* rstd, int64_t rows, int64_t cols) {
  const LaunchConfig c = row_launch(rows, cols);
  layernorm_backward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(
      dinp, dout, inp, weight, mean, rstd, cols);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const LaunchConfig w = column_launch(cols);
  norm_weight_backward_kernel<<<grid_of(w), block_of(w), 0, launch_stream()>>>(
      dweight, dbias, dout, inp, mean, rstd, rows, cols);
  return cudaGetLastError();
}

cudaError_t launch_rmsnorm_backward(float* dinp, float* dweight, const float* dout,
                                    const float* inp, const float* weight, const float* rstd,
                                    int64_t rows, int64_t cols) {
  const LaunchConfig c = row_launch(rows, cols);
  rmsnorm_backward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(dinp, dout, inp, weight,
                                                                           rstd, cols);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const LaunchConfig w = column_launch(cols);
  norm_weight_backward_kernel<<<grid_of(w), block_of(w), 0, launch_stream()>>>(
      dweight, nullptr, dout, inp, nullptr, rstd, rows, cols);
  return cudaGetLastError();
}

cudaError_t launch_softmax_backward(float* dinp, const float* dout, const float* out, int64_t rows,
                                    int64_t cols) {
  const LaunchConfig c = row_launch(rows, cols);
  softmax_backward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(dinp, dout, out, cols);
  return cudaGetLastError();
}

cudaError_t launch_cross_entropy_backward(float* dlogits, const float* logits,
                                          const int32_t* targets, const float* dlosses,
                                          int64_t rows, int64_t vocab) {
  const LaunchConfig c = row_launch(rows, vocab);
  cross_entropy_backward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(
      dlogits, logits, targets, dlosses, vocab);
  return cudaGetLastError();
}

cudaError_t launch_embedding_backward(float* dweight, const float* dout, const int32_t* ids,
                                      int64_t num_tokens, int64_t vocab_size, int64_t cols) {
  const LaunchConfig c = row_launch(num_tokens, cols);
  embedding_backward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(dweight, dout, ids,
                                                                             vocab_size, cols);
  return cudaGetLastError();
}

cudaError_t launch_rope_backward(float* dinp, const float* dout, const float* cos, const float* sin,
                                 int64_t batch, int64_t seq_len, int64_t n_heads, int64_t head_dim,
                                 int64_t pos_offset) {
  const int64_t pairs = batch * seq_len * n_heads * (head_dim / 2);
  const LaunchConfig c = elementwise_launch(pairs);
  rope_backward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(
      dinp, dout, cos, sin, pairs, seq_len, n_heads, head_dim, pos_offset);
  return cudaGetLastError();
}

cudaError_t launch_activation_backward(Elementwise op, float* dinp, const float* dout,
                                       const float* inp, int64_t n) {
  const LaunchConfig c = elementwise_launch(n);
  if (op == Elementwise::kGelu) {
    gelu_backward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(dinp, dout, inp, n);
  } else {
    silu_backward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(dinp, dout, inp, n);
  }
  return cudaGetLastError();
}

cudaError_t launch_swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                   const float* up, int64_t n) {
  const LaunchConfig c = elementwise_launch(n);
  swiglu_backward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(dgate, dup, dout, gate,
                                                                          up, n);
  return cudaGetLastError();
}

}  // namespace kiln::cuda
