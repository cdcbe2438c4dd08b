// The CUDA kernels behind the same contracts as kiln::ref / kiln::cpu (gemm.h, norm.h, ...),
// on DEVICE pointers (Tensor::to(Device::kCuda), core/device.h). Each call launches on this
// thread's current stream (core/device.h's StreamScope; the default stream unless set) and
// returns once the launch is queued: Unimplemented for a path that does not exist (e.g. an f32
// operand on the tensor-core rungs), InvalidArgument for arguments the kernel cannot take,
// Internal for a failed launch; kernel-time faults surface at the next stream or device
// synchronize. Ids and targets are not checked on the host (they live on the device): an
// out-of-range one yields a NaN row (the embedding backward skips it), never an out-of-bounds
// access.
// Only built with the CUDA backend (KILN_CUDA); see launch.h for every launch configuration.
#pragma once

#include <cstdint>

#include "kiln/core/status.h"
#include "kiln/kernels/adamw.h"
#include "kiln/kernels/attention.h"
#include "kiln/kernels/cuda/launch.h"
#include "kiln/kernels/gemm.h"
#include "kiln/kernels/norm.h"

namespace kiln::cuda {

// C = act(alpha·op(A)·op(B) + beta·C + bias) + residual, as ref::gemm, through rung `kernel`.
// The mma rungs need bf16 A and B; kMmaCpAsync and kMmaTma also need A row-major and B stored
// (n, k) (trans_a false, trans_b true), lda, ldb multiples of 8 and 16-byte aligned A and B;
// kMmaTma also an sm_90 device and k > 0. kAuto never picks kMmaTma until a device run has
// measured it faster than kMmaCpAsync.
Status gemm(const GemmParams& p, GemmKernel kernel = GemmKernel::kAuto);
// Whether rung `kernel` takes these params; the message of the Unimplemented says why not.
Status gemm_supports(const GemmParams& p, GemmKernel kernel);
// The rung kAuto runs for p.
GemmKernel gemm_auto_kernel(const GemmParams& p);

// norm.h
Status layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int64_t rows, int64_t cols,
                         float eps = kLayerNormEps);
Status rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t rows,
                       int64_t cols, float eps = kRmsNormEps);
// softmax.h
Status softmax_forward(float* out, const float* inp, int64_t rows, int64_t cols);
// rope.h, with the table's cos and sin (max_positions, head_dim/2) copied to the device.
Status rope_forward(float* out, const float* inp, const float* cos, const float* sin,
                    int64_t max_positions, int64_t batch, int64_t seq_len, int64_t n_heads,
                    int64_t head_dim, int64_t pos_offset);
// activation.h
Status gelu_forward(float* out, const float* inp, int64_t n);
Status silu_forward(float* out, const float* inp, int64_t n);
Status swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
// embedding.h
Status embedding_forward(float* out, const int32_t* ids, const float* weight, int64_t num_tokens,
                         int64_t vocab_size, int64_t cols);
// adamw.h (the per-step scalars in double on the host, as torch)
Status adamw_step(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWConfig& config, int64_t step);
// cross_entropy.h
Status cross_entropy_forward(float* losses, const float* logits, const int32_t* targets,
                             int64_t rows, int64_t vocab);
// attention.h: FlashAttention forward (causal or not, sliding window, GQA), out and lse as
// ref::attention_forward; head_dim <= kAttnMaxHeadDim. `p` is checked (check_attention).
Status attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const AttentionParams& p);

// ---- backward passes: d-inputs overwritten, parameter gradients accumulated (+=) -------------
// norm.h. dweight (and dbias) are summed over the rows in a fixed order (deterministic).
Status layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int64_t rows, int64_t cols);
Status rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                        const float* weight, const float* rstd, int64_t rows, int64_t cols);
// softmax.h (dinp may alias dout).
Status softmax_backward(float* dinp, const float* dout, const float* out, int64_t rows,
                        int64_t cols);
// rope.h's inverse rotation, with the table's cos and sin on the device (dinp may alias dout).
Status rope_backward(float* dinp, const float* dout, const float* cos, const float* sin,
                     int64_t max_positions, int64_t batch, int64_t seq_len, int64_t n_heads,
                     int64_t head_dim, int64_t pos_offset);
// activation.h.
Status gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n);
Status silu_backward(float* dinp, const float* dout, const float* inp, int64_t n);
Status swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                       const float* up, int64_t n);
// embedding.h: dweight (V, C) += scatter of dout (N, C) by ids, with fp32 atomics: with repeated
// ids the last bits may differ from run to run (rows_backward.cu says why); an id outside
// [0, vocab_size) is skipped.
Status embedding_backward(float* dweight, const float* dout, const int32_t* ids,
                          int64_t num_tokens, int64_t vocab_size, int64_t cols);
// cross_entropy.h: fused softmax + cross-entropy gradient; dlogits may alias logits.
Status cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                              const float* dlosses, int64_t rows, int64_t vocab);
// attention.h: FlashAttention backward, dq/dk/dv as ref::attention_backward from the forward's
// out and lse; head_dim <= kAttnMaxHeadDim. Deterministic (no atomics).
Status attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                          const float* k, const float* v, const float* out, const float* lse,
                          const AttentionParams& p);

// ---- the launch alone ----------------------------------------------------------------------
// Queues the empty kernel (probe.cu, kiln::cuda::empty_kernel): a launch with no work, for
// measuring launch cost.
Status queue_empty_kernel();

// ---- decode over the paged KV cache ----------------------------------------------------------
// cpu::attention_decode_paged (attention.h) on the device, split-KV: kv's pools, block table and
// seq_lens are device pointers; p.q_len, heads, head_dim, causal, window, scale, strides and
// num_splits are used (0: launch.h's decode_split). With more than one chunk, the chunks'
// partial results go to `workspace`: attention_decode_paged_workspace_floats(p, kv) floats of
// device memory (none, and workspace may be null, for one chunk). Block ids are not checked
// (the pool's size is not in PagedKv): ids outside the pool read out of bounds.
int64_t attention_decode_paged_workspace_floats(const AttentionParams& p, const PagedKv& kv);
Status attention_decode_paged(float* out, float* lse, const float* q, const PagedKv& kv,
                              const AttentionParams& p, float* workspace,
                              int64_t workspace_floats);

}  // namespace kiln::cuda
