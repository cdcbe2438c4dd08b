// The checked CUDA kernel API (kernels.h): validates arguments the way the ops do, picks the
// GEMM rung, launches through the .cu files' raw launchers (launchers.h) and turns their
// cudaError_t into a Status. Host C++ compiled only with the CUDA backend (the _cuda suffix).
#include <cuda_runtime_api.h>

#include <cmath>

#include "kiln/kernels/cuda/kernels.h"
#include "kiln/kernels/cuda/launchers.h"
#include "kiln/kernels/rope.h"

namespace kiln::cuda {
namespace {
Status launched(cudaError_t err, std::string_view kernel) {
  if (err == cudaSuccess) return {};
  cudaGetLastError();  // clear it: a launch error is not sticky
  return internal_error("[cuda] launch of {} failed: {} ({})", kernel, cudaGetErrorString(err),
                        cudaGetErrorName(err));
}

Status check_rows(const char* op, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0)
    return invalid_argument("[cuda::{}] negative shape ({}, {})", op, rows, cols);
  if (rows > int64_t{0x7fffffff})
    return invalid_argument("[cuda::{}] {} rows: at most 2^31 - 1 (one block per row)", op, rows);
  return {};
}

GemmArgs gemm_args(const GemmParams& p) {
  GemmArgs a;
  a.m = p.m, a.n = p.n, a.k = p.k;
  a.a = p.a, a.lda = p.lda, a.a_bf16 = p.a_dtype == DType::kBF16, a.trans_a = p.trans_a;
  a.b = p.b, a.ldb = p.ldb, a.b_bf16 = p.b_dtype == DType::kBF16, a.trans_b = p.trans_b;
  a.c = p.c, a.ldc = p.ldc, a.alpha = p.alpha, a.beta = p.beta, a.bias = p.bias;
  switch (p.act) {
    case Activation::kNone:
      a.act = DeviceActivation::kNone;
      break;
    case Activation::kGeluTanh:
      a.act = DeviceActivation::kGeluTanh;
      break;
    case Activation::kSilu:
      a.act = DeviceActivation::kSilu;
      break;
    case Activation::kRelu:
      a.act = DeviceActivation::kRelu;
      break;
  }
  a.residual = p.residual, a.ldr = p.ldr;
  return a;
}

Status check_count(const char* op, int64_t n) {
  if (n < 0) return invalid_argument("[cuda::{}] negative element count {}", op, n);
  return {};
}

Status check_rope(const char* op, int64_t max_positions, int64_t batch, int64_t seq_len,
                  int64_t n_heads, int64_t head_dim, int64_t pos_offset) {
  if (head_dim <= 0 || head_dim % 2 != 0)
    return invalid_argument("[cuda::{}] head_dim {} must be even and > 0", op, head_dim);
  if (batch < 0 || seq_len < 0 || n_heads < 0 || pos_offset < 0)
    return invalid_argument(
        "[cuda::{}] negative size batch={} seq_len={} n_heads={} pos_offset={}", op, batch,
        seq_len, n_heads, pos_offset);
  if (pos_offset + seq_len > max_positions)
    return invalid_argument("[cuda::{}] positions [{}, {}) past the table's {}", op, pos_offset,
                            pos_offset + seq_len, max_positions);
  return {};
}
}  // namespace

// ---- GEMM -------------------------------------------------------------------------------------
Status gemm_supports(const GemmParams& p, GemmKernel kernel) {
  if (p.save_pre != nullptr || p.act_grad != Activation::kNone)
    return unimplemented(
        "[cuda::gemm] the training epilogues (save_pre, act_grad {}) run on the host only; "
        "apply the activation or its gradient as a kernel of its own",
        activation_name(p.act_grad));
  if (p.bias_grad != nullptr)
    return unimplemented(
        "[cuda::gemm] the bias-gradient epilogue (bias_grad) runs on the host only; sum dY's rows "
        "as a kernel of its own");
  const bool both_bf16 = p.a_dtype == DType::kBF16 && p.b_dtype == DType::kBF16;
  const bool async_rung = kernel == GemmKernel::kMmaCpAsync || kernel == GemmKernel::kMmaTma;
  if ((kernel == GemmKernel::kMma || async_rung) && !both_bf16)
    return unimplemented("[cuda::gemm] the {} rung needs bf16 A and B, got {} and {}",
                         gemm_kernel_name(kernel), dtype_name(p.a_dtype), dtype_name(p.b_dtype));
  if (kernel == GemmKernel::kMmaTma) {
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      cudaGetLastError();
      return unimplemented("[cuda::gemm] the {} rung needs an sm_90 device; none is current",
                           gemm_kernel_name(kernel));
    }
    if (major < 9)
      return unimplemented("[cuda::gemm] the {} rung needs sm_90 (the Tensor Memory Accelerator), "
                           "this device is sm_{}x",
                           gemm_kernel_name(kernel), major);
    if (p.k == 0 || p.m > int64_t{0x7fffffff} || p.n > int64_t{0x7fffffff})
      return unimplemented("[cuda::gemm] the {} rung needs k > 0 and m, n below 2^31 (tensor-map "
                           "dims and int32 box coordinates), got m={} n={} k={}",
                           gemm_kernel_name(kernel), p.m, p.n, p.k);
  }
  if (async_rung) {
    const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    if (p.trans_a || !p.trans_b)
      return unimplemented(
          "[cuda::gemm] the {} rung needs A (m, k) row-major and B stored (n, k) "
          "(trans_a=0 trans_b=1), got trans_a={} trans_b={}",
          gemm_kernel_name(kernel), p.trans_a, p.trans_b);
    if (p.lda % 8 != 0 || p.ldb % 8 != 0 || !aligned(p.a) || !aligned(p.b))
      return unimplemented(
          "[cuda::gemm] the {} rung needs lda, ldb multiples of 8 and 16-byte "
          "aligned A and B, got lda={} ldb={}",
          gemm_kernel_name(kernel), p.lda, p.ldb);
  }
  return {};
}

GemmKernel gemm_auto_kernel(const GemmParams& p) {
  if (gemm_supports(p, GemmKernel::kMmaCpAsync).ok()) return GemmKernel::kMmaCpAsync;
  if (gemm_supports(p, GemmKernel::kMma).ok()) return GemmKernel::kMma;
  return GemmKernel::kPadded;
}

Status gemm(const GemmParams& p, GemmKernel kernel) {
  KILN_RETURN_IF_ERROR(check_gemm(p));
  if (kernel == GemmKernel::kAuto) kernel = gemm_auto_kernel(p);
  KILN_RETURN_IF_ERROR(gemm_supports(p, kernel));
  if (p.m == 0 || p.n == 0) return {};
  const LaunchConfig c = gemm_launch(kernel, p.m, p.n);
  if (c.grid_y > 65535)
    return invalid_argument("[cuda::gemm] m={} needs {} row blocks on the {} rung (at most 65535)",
                            p.m, c.grid_y, gemm_kernel_name(kernel));
  return launched(launch_gemm(gemm_args(p), kernel), gemm_kernel_symbol(kernel));
}

// ---- row-wise and elementwise ----------------------------------------------------------------
Status layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int64_t rows, int64_t cols,
                         float eps) {
  KILN_RETURN_IF_ERROR(check_rows("layernorm_forward", rows, cols));
  if (rows == 0) return {};
  return launched(launch_layernorm_forward(out, mean, rstd, inp, weight, bias, rows, cols, eps),
                  "kiln::cuda::layernorm_forward_kernel");
}

Status rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t rows,
                       int64_t cols, float eps) {
  KILN_RETURN_IF_ERROR(check_rows("rmsnorm_forward", rows, cols));
  if (rows == 0) return {};
  return launched(launch_rmsnorm_forward(out, rstd, inp, weight, rows, cols, eps),
                  "kiln::cuda::rmsnorm_forward_kernel");
}

Status queue_empty_kernel() {
  return launched(launch_empty_kernel(), "kiln::cuda::empty_kernel");
}

Status softmax_forward(float* out, const float* inp, int64_t rows, int64_t cols) {
  KILN_RETURN_IF_ERROR(check_rows("softmax_forward", rows, cols));
  if (rows == 0) return {};
  return launched(launch_softmax_forward(out, inp, rows, cols),
                  "kiln::cuda::softmax_forward_kernel");
}

Status cross_entropy_forward(float* losses, const float* logits, const int32_t* targets,
                             int64_t rows, int64_t vocab) {
  KILN_RETURN_IF_ERROR(check_rows("cross_entropy_forward", rows, vocab));
  if (rows == 0) return {};
  if (vocab == 0)
    return invalid_argument("[cuda::cross_entropy_forward] vocab 0 with {} rows", rows);
  return launched(launch_cross_entropy_forward(losses, logits, targets, rows, vocab),
                  "kiln::cuda::cross_entropy_forward_kernel");
}

Status embedding_forward(float* out, const int32_t* ids, const float* weight, int64_t num_tokens,
                         int64_t vocab_size, int64_t cols) {
  KILN_RETURN_IF_ERROR(check_rows("embedding_forward", num_tokens, cols));
  if (vocab_size <= 0)
    return invalid_argument("[cuda::embedding_forward] vocab_size {}", vocab_size);
  if (num_tokens == 0) return {};
  return launched(launch_embedding_forward(out, ids, weight, num_tokens, vocab_size, cols),
                  "kiln::cuda::embedding_forward_kernel");
}

Status rope_forward(float* out, const float* inp, const float* cos, const float* sin,
                    int64_t max_positions, int64_t batch, int64_t seq_len, int64_t n_heads,
                    int64_t head_dim, int64_t pos_offset) {
  KILN_RETURN_IF_ERROR(
      check_rope("rope_forward", max_positions, batch, seq_len, n_heads, head_dim, pos_offset));
  if (batch * seq_len * n_heads == 0) return {};
  return launched(
      launch_rope_forward(out, inp, cos, sin, batch, seq_len, n_heads, head_dim, pos_offset),
      "kiln::cuda::rope_forward_kernel");
}

Status gelu_forward(float* out, const float* inp, int64_t n) {
  KILN_RETURN_IF_ERROR(check_count("gelu_forward", n));
  if (n == 0) return {};
  return launched(launch_activation_forward(Elementwise::kGelu, out, inp, n),
                  "kiln::cuda::gelu_forward_kernel");
}

Status silu_forward(float* out, const float* inp, int64_t n) {
  KILN_RETURN_IF_ERROR(check_count("silu_forward", n));
  if (n == 0) return {};
  return launched(launch_activation_forward(Elementwise::kSilu, out, inp, n),
                  "kiln::cuda::silu_forward_kernel");
}

Status swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  KILN_RETURN_IF_ERROR(check_count("swiglu_forward", n));
  if (n == 0) return {};
  return launched(launch_swiglu_forward(out, gate, up, n), "kiln::cuda::swiglu_forward_kernel");
}

Status adamw_step(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWConfig& c, int64_t step) {
  KILN_RETURN_IF_ERROR(check_adamw_config(c));
  KILN_RETURN_IF_ERROR(check_count("adamw_step", n));
  if (step < 1)
    return invalid_argument("[cuda::adamw_step] step {} (the first update is step 1)", step);
  if (n == 0) return {};
  const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(step));
  const AdamWScalars s{static_cast<float>(1.0 - c.lr * c.weight_decay),
                       static_cast<float>(c.beta1),
                       static_cast<float>(c.beta2),
                       static_cast<float>(c.lr / bc1),
                       static_cast<float>(1.0 / std::sqrt(bc2)),
                       static_cast<float>(c.eps)};
  return launched(launch_adamw_step(param, grad, m, v, n, s), "kiln::cuda::adamw_step_kernel");
}

// ---- backward passes --------------------------------------------------------------------------
Status layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int64_t rows, int64_t cols) {
  KILN_RETURN_IF_ERROR(check_rows("layernorm_backward", rows, cols));
  if (rows == 0 || cols == 0) return {};
  return launched(launch_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd,
                                            rows, cols),
                  "kiln::cuda::layernorm_backward_kernel / norm_weight_backward_kernel");
}

Status rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                        const float* weight, const float* rstd, int64_t rows, int64_t cols) {
  KILN_RETURN_IF_ERROR(check_rows("rmsnorm_backward", rows, cols));
  if (rows == 0 || cols == 0) return {};
  return launched(
      launch_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, rows, cols),
      "kiln::cuda::rmsnorm_backward_kernel / norm_weight_backward_kernel");
}

Status softmax_backward(float* dinp, const float* dout, const float* out, int64_t rows,
                        int64_t cols) {
  KILN_RETURN_IF_ERROR(check_rows("softmax_backward", rows, cols));
  if (rows == 0) return {};
  return launched(launch_softmax_backward(dinp, dout, out, rows, cols),
                  "kiln::cuda::softmax_backward_kernel");
}

Status cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                              const float* dlosses, int64_t rows, int64_t vocab) {
  KILN_RETURN_IF_ERROR(check_rows("cross_entropy_backward", rows, vocab));
  if (rows == 0) return {};
  if (vocab == 0)
    return invalid_argument("[cuda::cross_entropy_backward] vocab 0 with {} rows", rows);
  return launched(launch_cross_entropy_backward(dlogits, logits, targets, dlosses, rows, vocab),
                  "kiln::cuda::cross_entropy_backward_kernel");
}

Status embedding_backward(float* dweight, const float* dout, const int32_t* ids,
                          int64_t num_tokens, int64_t vocab_size, int64_t cols) {
  KILN_RETURN_IF_ERROR(check_rows("embedding_backward", num_tokens, cols));
  if (vocab_size <= 0)
    return invalid_argument("[cuda::embedding_backward] vocab_size {}", vocab_size);
  if (num_tokens == 0) return {};
  return launched(launch_embedding_backward(dweight, dout, ids, num_tokens, vocab_size, cols),
                  "kiln::cuda::embedding_backward_kernel");
}

Status rope_backward(float* dinp, const float* dout, const float* cos, const float* sin,
                     int64_t max_positions, int64_t batch, int64_t seq_len, int64_t n_heads,
                     int64_t head_dim, int64_t pos_offset) {
  KILN_RETURN_IF_ERROR(
      check_rope("rope_backward", max_positions, batch, seq_len, n_heads, head_dim, pos_offset));
  if (batch * seq_len * n_heads == 0) return {};
  return launched(
      launch_rope_backward(dinp, dout, cos, sin, batch, seq_len, n_heads, head_dim, pos_offset),
      "kiln::cuda::rope_backward_kernel");
}

Status gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  KILN_RETURN_IF_ERROR(check_count("gelu_backward", n));
  if (n == 0) return {};
  return launched(launch_activation_backward(Elementwise::kGelu, dinp, dout, inp, n),
                  "kiln::cuda::gelu_backward_kernel");
}

Status silu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  KILN_RETURN_IF_ERROR(check_count("silu_backward", n));
  if (n == 0) return {};
  return launched(launch_activation_backward(Elementwise::kSilu, dinp, dout, inp, n),
                  "kiln::cuda::silu_backward_kernel");
}

Status swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                       const float* up, int64_t n) {
  KILN_RETURN_IF_ERROR(check_count("swiglu_backward", n));
  if (n == 0) return {};
  return launched(launch_swiglu_backward(dgate, dup, dout, gate, up, n),
                  "kiln::cuda::swiglu_backward_kernel");
}

// ---- attention --------------------------------------------------------------------------------
namespace {
// AttentionParams after check_attention, as the .cu files take them.
AttentionArgs attention_args(const AttentionParams& p) {
  AttentionArgs a;
  a.batch = p.batch, a.q_len = p.q_len, a.kv_len = p.kv_len, a.n_heads = p.n_heads;
  a.n_kv_heads = p.n_kv_heads, a.head_dim = p.head_dim, a.causal = p.causal, a.window = p.window;
  a.scale = p.softmax_scale();
  a.q_row_stride = p.q_row_stride, a.k_row_stride = p.k_row_stride;
  a.v_row_stride = p.v_row_stride, a.o_row_stride = p.o_row_stride;
  return a;
}

Status check_head_dim(const char* op, const AttentionParams& p) {
  if (p.head_dim > kAttnMaxHeadDim)
    return unimplemented(
        "[cuda::{}] head_dim {} (at most {}: each lane keeps head_dim/32 output elements)", op,
        p.head_dim, kAttnMaxHeadDim);
  return {};
}

Status check_grid(const char* op, const LaunchConfig& c) {
  if (c.grid_y > 65535 || c.grid_z > 65535)
    return invalid_argument("[cuda::{}] grid ({}, {}, {}): y and z at most 65535", op, c.grid_x,
                            c.grid_y, c.grid_z);
  return {};
}
}  // namespace

Status attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const AttentionParams& params) {
  KILN_ASSIGN_OR_RETURN(const AttentionParams p, check_attention(params));
  KILN_RETURN_IF_ERROR(check_head_dim("attention_forward", p));
  const LaunchConfig c = attention_launch(p.batch, p.n_heads, p.q_len, p.head_dim);
  if (c.grid_y > 65535 || c.grid_z > 65535)
    return invalid_argument("[cuda::attention_forward] n_heads={} batch={}: at most 65535 each",
                            p.n_heads, p.batch);
  if (p.batch * p.n_heads * p.q_len == 0) return {};
  return launched(launch_attention_forward(out, lse, q, k, v, attention_args(p)),
                  "kiln::cuda::attention_forward_kernel");
}

Status attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                          const float* k, const float* v, const float* out, const float* lse,
                          const AttentionParams& params) {
  KILN_ASSIGN_OR_RETURN(const AttentionParams p, check_attention(params));
  KILN_RETURN_IF_ERROR(check_head_dim("attention_backward", p));
  KILN_RETURN_IF_ERROR(check_grid(
      "attention_backward", attention_backward_dq_launch(p.batch, p.n_heads, p.q_len, p.head_dim)));
  if (p.batch == 0 || (p.q_len == 0 && p.kv_len == 0)) return {};
  return launched(launch_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, attention_args(p)),
                  "kiln::cuda::attention_backward_dkdv_kernel / attention_backward_dq_kernel");
}

namespace {
// The chunking of a paged decode (p checked).
DecodeSplit paged_split(const AttentionParams& p, const PagedKv& kv) {
  return decode_split(p.num_splits, kv.num_seqs, p.n_heads, p.n_kv_heads, p.q_len, kv.block_size,
                      kv.max_blocks_per_seq);
}
}  // namespace

int64_t attention_decode_paged_workspace_floats(const AttentionParams& params, const PagedKv& kv) {
  const Expected<AttentionParams> p = check_attention(params);
  if (!p.ok() || kv.num_seqs <= 0) return 0;
  return decode_workspace_floats(paged_split(*p, kv).num_splits,
                                 kv.num_seqs * p->n_heads * p->q_len, p->head_dim);
}

Status attention_decode_paged(float* out, float* lse, const float* q, const PagedKv& kv,
                              const AttentionParams& params, float* workspace,
                              int64_t workspace_floats) {
  KILN_ASSIGN_OR_RETURN(const AttentionParams p, check_attention(params));
  KILN_RETURN_IF_ERROR(check_head_dim("attention_decode_paged", p));
  if (kv.num_seqs < 0 || kv.block_size <= 0 || kv.max_blocks_per_seq < 0)
    return invalid_argument(
        "[cuda::attention_decode_paged] num_seqs {} block_size {} max_blocks_per_seq {}: "
        "block_size must be > 0, the others >= 0",
        kv.num_seqs, kv.block_size, kv.max_blocks_per_seq);
  if (kv.num_seqs == 0 || p.q_len == 0) return {};
  if (!kv.k_pool || !kv.v_pool || !kv.block_table || !kv.seq_lens)
    return invalid_argument(
        "[cuda::attention_decode_paged] {} sequences need the K and V pools, the block table "
        "and seq_lens",
        kv.num_seqs);
  const DecodeSplit split = paged_split(p, kv);
  KILN_RETURN_IF_ERROR(check_grid("attention_decode_paged",
                                  attention_decode_launch(kv.num_seqs, p.n_heads, p.n_kv_heads,
                                                          p.q_len, p.head_dim, split.num_splits)));
  const int64_t need =
      decode_workspace_floats(split.num_splits, kv.num_seqs * p.n_heads * p.q_len, p.head_dim);
  if (need > 0 && (!workspace || workspace_floats < need))
    return invalid_argument(
        "[cuda::attention_decode_paged] {} chunks of {} keys need a workspace of {} floats, got {}",
        split.num_splits, split.chunk_keys, need, workspace ? workspace_floats : 0);
  PagedDecodeArgs a;
  a.attn = attention_args(p);
  a.attn.batch = kv.num_seqs;
  a.k_pool = kv.k_pool, a.v_pool = kv.v_pool, a.block_table = kv.block_table;
  a.seq_lens = kv.seq_lens, a.block_size = kv.block_size;
  a.max_blocks_per_seq = kv.max_blocks_per_seq;
  a.num_splits = split.num_splits, a.chunk_keys = split.chunk_keys;
  return launched(launch_attention_decode_paged(out, lse, q, a, workspace),
                  "kiln::cuda::attention_decode_split_kernel / attention_decode_combine_kernel");
}

}  // namespace kiln::cuda
