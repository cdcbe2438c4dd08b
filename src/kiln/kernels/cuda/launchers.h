// The raw launchers the .cu files export: each launches its kernel(s) on this host thread's
// current stream (launch_stream(): the default stream unless core/device.h's StreamScope set
// another) with launch.h's configuration and returns the launch's cudaError_t. They assume checked
// arguments; kernels.h (kernels_cuda.cpp) is the checked, Status-returning API over them.
// Plain structs only: the .cu files include no kiln core header (fmt, which those pull in,
// does not compile under nvcc), so GemmParams and AttentionParams arrive as GemmArgs and
// AttentionArgs, filled by kernels_cuda.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kiln/core/cuda_stream.h"
#include "kiln/kernels/cuda/launch.h"

namespace kiln::cuda {

// The stream every launcher below queues its kernels on.
inline cudaStream_t launch_stream() {
  return static_cast<cudaStream_t>(cuda_runtime::current_stream());
}

// gemm.h's Activation, value for value (kernels_cuda.cpp maps one onto the other).
enum class DeviceActivation : int { kNone, kGeluTanh, kSilu, kRelu };

// GemmParams with the dtypes as flags (f32 unless *_bf16).
struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  bool a_bf16 = false, trans_a = false;
  const void* b = nullptr;
  int64_t ldb = 0;
  bool b_bf16 = false, trans_b = false;
  float* c = nullptr;
  int64_t ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
  const float* bias = nullptr;
  DeviceActivation act = DeviceActivation::kNone;
  const float* residual = nullptr;
  int64_t ldr = 0;
};
cudaError_t launch_gemm(const GemmArgs& p, GemmKernel kernel);  // kernel != kAuto

cudaError_t launch_layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                     const float* weight, const float* bias, int64_t rows,
                                     int64_t cols, float eps);
cudaError_t launch_rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                                   int64_t rows, int64_t cols, float eps);
cudaError_t launch_softmax_forward(float* out, const float* inp, int64_t rows, int64_t cols);
cudaError_t launch_cross_entropy_forward(float* losses, const float* logits, const int32_t* targets,
                                         int64_t rows, int64_t vocab);
cudaError_t launch_embedding_forward(float* out, const int32_t* ids, const float* weight,
                                     int64_t num_tokens, int64_t vocab_size, int64_t cols);
cudaError_t launch_rope_forward(float* out, const float* inp, const float* cos, const float* sin,
                                int64_t batch, int64_t seq_len, int64_t n_heads, int64_t head_dim,
                                int64_t pos_offset);
enum class Elementwise { kGelu, kSilu };
// The empty kernel (probe.cu): one warp that does nothing.
cudaError_t launch_empty_kernel();
cudaError_t launch_activation_forward(Elementwise op, float* out, const float* inp, int64_t n);
cudaError_t launch_swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
// The AdamW scalars, computed in double on the host and applied in fp32 (adamw.h).
struct AdamWScalars {
  float decay;  // 1 - lr·λ
  float beta1, beta2;
  float step_size;  // lr / (1 - β1^t)
  float rsqrt_bc2;  // 1 / sqrt(1 - β2^t)
  float eps;
};
cudaError_t launch_adamw_step(float* param, const float* grad, float* m, float* v, int64_t n,
                              const AdamWScalars& s);
// AttentionParams after check_attention (strides filled in, scale resolved).
struct AttentionArgs {
  int64_t batch = 1, q_len = 0, kv_len = 0, n_heads = 1, n_kv_heads = 1, head_dim = 0;
  bool causal = true;
  int64_t window = 0;
  float scale = 0.0f;
  int64_t q_row_stride = 0, k_row_stride = 0, v_row_stride = 0, o_row_stride = 0;
};
// head_dim <= kAttnMaxHeadDim.
cudaError_t launch_attention_forward(float* out, float* lse, const float* q, const float* k,
                                     const float* v, const AttentionArgs& p);


// ---- backward passes (rows_backward.cu, attention_backward.cu) ------------------------------
cudaError_t launch_layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                      const float* inp, const float* weight, const float* mean,
                                      const float* rstd, int64_t rows, int64_t cols);
cudaError_t launch_rmsnorm_backward(float* dinp, float* dweight, const float* dout,
                                    const float* inp, const float* weight, const float* rstd,
                                    int64_t rows, int64_t cols);
cudaError_t launch_softmax_backward(float* dinp, const float* dout, const float* out, int64_t rows,
                                    int64_t cols);
cudaError_t launch_cross_entropy_backward(float* dlogits, const float* logits,
                                          const int32_t* targets, const float* dlosses,
                                          int64_t rows, int64_t vocab);
cudaError_t launch_embedding_backward(float* dweight, const float* dout, const int32_t* ids,
                                      int64_t num_tokens, int64_t vocab_size, int64_t cols);
cudaError_t launch_rope_backward(float* dinp, const float* dout, const float* cos, const float* sin,
                                 int64_t batch, int64_t seq_len, int64_t n_heads, int64_t head_dim,
                                 int64_t pos_offset);
cudaError_t launch_activation_backward(Elementwise op, float* dinp, const float* dout,
                                       const float* inp, int64_t n);
cudaError_t launch_swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                   const float* up, int64_t n);
// dq (q_row_stride), dk (k_row_stride), dv (v_row_stride) overwritten; dout and out rows of
// o_row_stride; head_dim <= kAttnMaxHeadDim.
cudaError_t launch_attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                      const float* q, const float* k, const float* v,
                                      const float* out, const float* lse, const AttentionArgs& p);

// ---- split-KV decode over the paged cache (attention_decode.cu) ------------------------------
// attention.h's PagedKv with the split (launch.h's decode_split) resolved; attn.batch is
// num_seqs, attn.kv_len unused (each sequence's length is seq_lens[i], on the device).
struct PagedDecodeArgs {
  AttentionArgs attn;
  const float* k_pool = nullptr;
  const float* v_pool = nullptr;
  const int32_t* block_table = nullptr;  // (num_seqs, max_blocks_per_seq)
  const int32_t* seq_lens = nullptr;     // (num_seqs,)
  int64_t block_size = 0, max_blocks_per_seq = 0;
  int64_t num_splits = 1, chunk_keys = 0;
};
// workspace: decode_workspace_floats(num_splits, num_seqs · n_heads · q_len, head_dim) floats
// (unused, may be null, with one split).
cudaError_t launch_attention_decode_paged(float* out, float* lse, const float* q,
                                          const PagedDecodeArgs& a, float* workspace);

}  // namespace kiln::cuda
