// Row-wise and elementwise CUDA kernels behind the norm.h, softmax.h, cross_entropy.h,
// embedding.h, rope.h, activation.h and adamw.h contracts (forward passes, fp32). A row kernel
// gives each row one block (launch.h's row_launch): threads stride over the columns, partial
// sums and maxima meet through warp shuffles and 32 floats of shared memory (common.cuh).
#include "kiln/kernels/cuda/common.cuh"

namespace kiln::cuda {

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int64_t cols,
                                         float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* x = inp + row * cols;  // (cols,)
  float* y = out + row * cols;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += x[j];
  const float mu = block_sum(s, scratch) / static_cast<float>(cols);
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float d = x[j] - mu;
    ss += d * d;
  }
  const float r = rsqrtf(block_sum(ss, scratch) / static_cast<float>(cols) + eps);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    y[j] = (x[j] - mu) * r * weight[j] + bias[j];
  if (threadIdx.x == 0) {
    if (mean) mean[row] = mu;
    if (rstd) rstd[row] = r;
  }
}

__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp,
                                       const float* weight, int64_t cols, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* x = inp + row * cols;  // (cols,)
  float* y = out + row * cols;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) ss += x[j] * x[j];
  const float r = rsqrtf(block_sum(ss, scratch) / static_cast<float>(cols) + eps);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) y[j] = x[j] * r * weight[j];
  if (threadIdx.x == 0 && rstd) rstd[row] = r;
}

__global__ void softmax_forward_kernel(float* out, const float* inp, int64_t cols) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* x = inp + row * cols;  // (cols,)
  float* y = out + row * cols;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) mx = fmaxf(mx, x[j]);
  mx = block_max(mx, scratch);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += expf(x[j] - mx);
  const float inv = 1.0f / block_sum(s, scratch);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) y[j] = expf(x[j] - mx) * inv;
}

// loss = logsumexp(row) - row[target]; target -1 gives 0, one outside [0, vocab) gives NaN.
__global__ void cross_entropy_forward_kernel(float* losses, const float* logits,
                                             const int32_t* targets, int64_t vocab) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int32_t t = targets[row];
  if (t == -1) {  // the whole block takes this branch: no barrier is skipped by only some
    if (threadIdx.x == 0) losses[row] = 0.0f;
    return;
  }
  const float* x = logits + row * vocab;  // (vocab,)
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, x[j]);
  mx = block_max(mx, scratch);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) s += expf(x[j] - mx);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) losses[row] = (t >= 0 && t < vocab) ? logf(s) + mx - x[t] : NAN;
}

// out row = weight[ids[row]]; an id outside [0, vocab) fills the row with NaN.
__global__ void embedding_forward_kernel(float* out, const int32_t* ids, const float* weight,
                                         int64_t vocab_size, int64_t cols) {
  const int64_t row = blockIdx.x;
  const int32_t id = ids[row];
  float* y = out + row * cols;
  const bool ok = id >= 0 && id < vocab_size;
  const float* w = weight + (ok ? id : 0) * cols;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) y[j] = ok ? w[j] : NAN;
}

// One thread per rotated pair (i, i + D/2) of x (B, T, H, D); cos, sin (positions, D/2).
__global__ void rope_forward_kernel(float* out, const float* inp, const float* cos,
                                    const float* sin, int64_t num_pairs, int64_t seq_len,
                                    int64_t n_heads, int64_t head_dim, int64_t pos_offset) {
  KILN_GRID_STRIDE(e, num_pairs)
  rope_rotate_pair(out, inp, cos, sin, e, seq_len, n_heads, head_dim, pos_offset, 1.0f);
}

__global__ void gelu_forward_kernel(float* out, const float* inp, int64_t n) {
  KILN_GRID_STRIDE(i, n) out[i] = activate(DeviceActivation::kGeluTanh, inp[i]);
}

__global__ void silu_forward_kernel(float* out, const float* inp, int64_t n) {
  KILN_GRID_STRIDE(i, n) out[i] = activate(DeviceActivation::kSilu, inp[i]);
}

__global__ void swiglu_forward_kernel(float* out, const float* gate, const float* up, int64_t n) {
  KILN_GRID_STRIDE(i, n) out[i] = activate(DeviceActivation::kSilu, gate[i]) * up[i];
}

// adamw.h's update in fp32 with the host's double-precision scalars.
__global__ void adamw_step_kernel(float* param, const float* grad, float* m, float* v, int64_t n,
                                  AdamWScalars s) {
  KILN_GRID_STRIDE(i, n) {
    const float g = grad[i];
    const float mi = s.beta1 * m[i] + (1.0f - s.beta1) * g;
    const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
    param[i] = param[i] * s.decay - s.step_size * mi / (sqrtf(vi) * s.rsqrt_bc2 + s.eps);
    m[i] = mi;
    v[i] = vi;
  }
}

// ---- launchers (checked arguments: kernels_cuda.cpp) -------------------------------------------
cudaError_t launch_layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                     const float* weight, const float* bias, int64_t rows,
                                     int64_t cols, float eps) {
  const LaunchConfig c = row_launch(rows, cols);
  layernorm_forward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(
      out, mean, rstd, inp, weight, bias, cols, eps);
  return cudaGetLastError();
}

cudaError_t launch_rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                                   int64_t rows, int64_t cols, float eps) {
  const LaunchConfig c = row_launch(rows, cols);
  rmsnorm_forward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(out, rstd, inp, weight,
                                                                          cols, eps);
  return cudaGetLastError();
}

cudaError_t launch_softmax_forward(float* out, const float* inp, int64_t rows, int64_t cols) {
  const LaunchConfig c = row_launch(rows, cols);
  softmax_forward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(out, inp, cols);
  return cudaGetLastError();
}

cudaError_t launch_cross_entropy_forward(float* losses, const float* logits, const int32_t* targets,
                                         int64_t rows, int64_t vocab) {
  const LaunchConfig c = row_launch(rows, vocab);
  cross_entropy_forward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(losses, logits,
                                                                                targets, vocab);
  return cudaGetLastError();
}

cudaError_t launch_embedding_forward(float* out, const int32_t* ids, const float* weight,
                                     int64_t num_tokens, int64_t vocab_size, int64_t cols) {
  const LaunchConfig c = row_launch(num_tokens, cols);
  embedding_forward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(out, ids, weight,
                                                                            vocab_size, cols);
  return cudaGetLastError();
}

cudaError_t launch_rope_forward(float* out, const float* inp, const float* cos, const float* sin,
                                int64_t batch, int64_t seq_len, int64_t n_heads, int64_t head_dim,
                                int64_t pos_offset) {
  const int64_t pairs = batch * seq_len * n_heads * (head_dim / 2);
  const LaunchConfig c = elementwise_launch(pairs);
  rope_forward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(
      out, inp, cos, sin, pairs, seq_len, n_heads, head_dim, pos_offset);
  return cudaGetLastError();
}

cudaError_t launch_activation_forward(Elementwise op, float* out, const float* inp, int64_t n) {
  const LaunchConfig c = elementwise_launch(n);
  if (op == Elementwise::kGelu) {
    gelu_forward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(out, inp, n);
  } else {
    silu_forward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(out, inp, n);
  }
  return cudaGetLastError();
}

cudaError_t launch_swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  const LaunchConfig c = elementwise_launch(n);
  swiglu_forward_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(out, gate, up, n);
  return cudaGetLastError();
}

cudaError_t launch_adamw_step(float* param, const float* grad, float* m, float* v, int64_t n,
                              const AdamWScalars& s) {
  const LaunchConfig c = elementwise_launch(n);
  adamw_step_kernel<<<grid_of(c), block_of(c), 0, launch_stream()>>>(param, grad, m, v, n, s);
  return cudaGetLastError();
}

}  // namespace kiln::cuda
