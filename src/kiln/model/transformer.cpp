// Transformer forward and backward for GPT-2 and Llama blocks over flat buffers; the HF config
// options (Llama biases, GPT-2 attention scales, RoPE scalings via the table) live in the one
// layer code that training, the KV-cache decode and the paged serving path all run.
#include "kiln/model/transformer.h"

#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include "kiln/comm/collectives.h"
#include "kiln/comm/work.h"
#include "kiln/core/graph.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/core/trace.h"
#include "kiln/kernels/activation.h"
#include "kiln/kernels/cross_entropy.h"
#include "kiln/kernels/elementwise.h"
#include "kiln/kernels/embedding.h"
#include "kiln/kernels/norm.h"
#include "kiln/model/mla.h"
#include "kiln/model/moe.h"

namespace kiln {

// ---- Linear --------------------------------------------------------------------------------
void Linear::forward(float* y, const float* x, int64_t n, const float* residual) const {
  if (backend) {
    backend->forward(*this, y, x, n, residual);
  } else {
    forward_f32(y, x, n, residual);
  }
}

void Linear::forward_act(float* y_act, float* y_pre, const float* x, int64_t n, Activation act) const {
  KILN_CHECK_MSG(act == Activation::kGeluTanh || act == Activation::kSilu,
                 "{}: activation {} (GELU or SiLU)", name, activation_name(act));
  if (backend || split_epilogue) {
    forward(y_pre, x, n);
    if (act == Activation::kGeluTanh) return cpu::gelu_forward(y_act, y_pre, n * out);
    return cpu::silu_forward(y_act, y_pre, n * out);
  }
  GemmParams p;
  p.m = n; p.n = out; p.k = in;
  p.a = x; p.lda = in;
  p.b = w; p.ldb = in; p.trans_b = true;
  p.c = y_act; p.ldc = out;
  p.bias = b;
  p.act = act;
  p.save_pre = y_pre; p.ldpre = out;
  cpu::gemm(p);
}

void Linear::backward(float* dx, const float* dy, const float* x, int64_t n, bool accumulate_dx) const {
  if (backend) {
    backend->backward(*this, dx, dy, x, n, accumulate_dx);
  } else {
    backward_f32(dx, dy, x, n, accumulate_dx);
  }
}

void LinearBackend::backward(const Linear& l, float* dx, const float* dy, const float* x, int64_t n,
                             bool accumulate_dx) const {
  l.backward_f32(dx, dy, x, n, accumulate_dx);
}

void Linear::forward_f32(float* y, const float* x, int64_t n, const float* residual) const {
  GemmParams p;
  p.m = n; p.n = out; p.k = in;
  p.a = x; p.lda = in;
  p.b = w; p.ldb = in; p.trans_b = true;
  p.c = y; p.ldc = out;
  if (split_epilogue) {
    cpu::gemm(p);
    return split_epilogue_adds(y, n, residual);
  }
  p.bias = b;
  p.residual = residual; p.ldr = out;
  cpu::gemm(p);
}

void Linear::split_epilogue_adds(float* y, int64_t n, const float* residual) const {
  if (b) cpu::add_bias(y, y, b, n, out);
  if (residual) cpu::add(y, y, residual, n * out);
}

void Linear::backward_f32(float* dx, const float* dy, const float* x, int64_t n, bool accumulate_dx) const {
  backward_input_f32(dx, dy, n, accumulate_dx);
  backward_weight_f32(dy, x, n);
}

void Linear::backward_input_f32(float* dx, const float* dy, int64_t n, bool accumulate_dx) const {
  GemmParams pd;  // dx (n, in) = dy (n, out) W (out, in)
  pd.m = n; pd.n = in; pd.k = out;
  pd.a = dy; pd.lda = out;
  pd.b = w; pd.ldb = in;
  pd.c = dx; pd.ldc = in;
  pd.beta = accumulate_dx ? 1.0f : 0.0f;
  cpu::gemm(pd);
}

void Linear::backward_weight_f32(const float* dy, const float* x, int64_t n) const {
  GemmParams pw;  // dW (out, in) += dyᵀ (out, n) x (n, in)
  pw.m = out; pw.n = in; pw.k = n;
  pw.a = dy; pw.lda = out; pw.trans_a = true;
  pw.b = x; pw.ldb = in;
  pw.c = dw; pw.ldc = in;
  pw.beta = 1.0f;
  // db += the sum of dy's rows, made while the GEMM packs dyᵀ (cuBLASLt's BGRADA). The separate
  // pass ran on one thread even at two (its 4 KiB rows split poorly): ~9 ms of W1a's step.
  if (!split_epilogue) pw.bias_grad = db;
  cpu::gemm(pw);
  if (split_epilogue && db != nullptr) cpu::bias_backward(db, dy, n, out);
}

// ---- activations ---------------------------------------------------------------------------
namespace {
// Bytes allocated by Buf::alloc since the last reset (for Transformer::activation_bytes).
int64_t g_activation_bytes = 0;

// A tensor-parallel collective's status: the arguments are the model's own, so a failure is a
// broken invariant (a dead rank ends the job in the communicator's wait).
void comm_ok(const Status& s) {
  if (!s.ok()) fatal(__FILE__, __LINE__, "tensor-parallel collective: " + s.to_string());
}

// A float buffer from the caching allocator (so memory reports see it).
struct Buf {
  Tensor t;
  float* p = nullptr;
  void alloc(int64_t n) {
    t = Tensor::empty({std::max<int64_t>(n, 1)});
    p = t.data<float>();
    g_activation_bytes += t.nbytes();
  }
  // Points at another layer's buffer (activation checkpointing: one set shared by layers).
  void share(const Buf& other) {
    t = Tensor();
    p = other.p;
  }
};

// Zero-bubble schedules split a Linear's backward: B computes dx now, W the weight gradients
// later, from a copy of dy and the saved input x (which stays in its activation slot until W).
struct DeferredWeightGrad {
  const Linear* linear = nullptr;
  Tensor dy;
  const float* x = nullptr;
  int64_t n = 0;
};
using WeightGradQueue = std::vector<DeferredWeightGrad>;

// l.backward(), or with a queue its input half now and its weight half queued (fp32 only: a
// precision backend computes both halves together).
void linear_backward(WeightGradQueue* queue, const Linear& l, float* dx, const float* dy, const float* x, int64_t n,
                     bool accumulate_dx) {
  if (queue == nullptr) return l.backward(dx, dy, x, n, accumulate_dx);
  KILN_CHECK_MSG(l.backend == nullptr, "{}: deferred weight gradients need the fp32 Linear", l.name);
  l.backward_input_f32(dx, dy, n, accumulate_dx);
  Tensor copy = Tensor::empty({n * l.out});
  std::memcpy(copy.raw_data(), dy, static_cast<size_t>(n * l.out) * sizeof(float));
  queue->push_back({&l, std::move(copy), x, n});
}
}  // namespace

// Activation slots (Transformer::use_activation_slot): the live buffers are the current slot's;
// the others' are kept here, swapped in and out (no copies).
struct Transformer::Slots {
  struct Saved {
    std::vector<Buf> resid;
    Buf final_norm, final_mean, final_rstd, logits, losses, ce_max, ce_sum;
    std::vector<int32_t> tokens, targets;
    int64_t num_valid = 0;
    std::vector<std::vector<Buf>> layers;  // per layer, Layer::kSaved order
    std::vector<MoeActivations> moe;       // per layer (MoE blocks)
    std::vector<MlaActivations> mla;       // per layer (latent attention)
  };
  std::vector<Saved> stored;              // per slot; the current slot's entry is empty
  std::vector<int> chunk_of;              // per slot: the chunk its buffers are for; -1: none yet
  std::vector<WeightGradQueue> deferred;  // per slot: W still to run
  int current = 0;
  WeightGradQueue* deferring = nullptr;   // during a backward_stage(…, defer_weights)
  int64_t saved_bytes = 0;                // of one slot
  void grow(int n) {
    if (static_cast<int>(stored.size()) >= n) return;
    stored.resize(static_cast<size_t>(n));
    chunk_of.resize(static_cast<size_t>(n), -1);
    deferred.resize(static_cast<size_t>(n));
  }
};

// ---- tensor parallelism inside the layers ---------------------------------------------------
// Megatron's pair of conjugate operators around each parallel block, as three calls: gather()
// before a column-parallel Linear (identity, or with sequence parallelism the all-gather of
// the N / size local rows), reduce() after a row-parallel one (the all-reduce of the partial
// sums, or the reduce-scatter to this rank's rows), and their backward roles swapped. At
// size 1 each is the identity and the layers run the single-process code.
struct Transformer::Tp {
  TensorShard shard;
  bool sp = false;  // sequence parallelism in the forward now running (training forward only)
  Buf full, partial;          // (N, C) gathered rows; a row-parallel Linear's partial output (SP)
  Buf ce_max, ce_sum;         // vocab-parallel cross-entropy: per row max and sum of exp (N,)
  std::vector<float> gather_buf, logits_full;  // (size, M, V / size) then (M, V): whole logits

  TensorParallelTraffic traffic;

  bool on() const { return shard.size > 1; }
  int64_t rows(int64_t n) const { return sp ? n / shard.size : n; }
  // Runs one collective of `bytes` (the whole buffer: the all-reduce's, the all-gather's output,
  // the reduce-scatter's input), counted in traffic.
  template <class F>
  void timed(int64_t TensorParallelTraffic::*counter, int64_t bytes, F&& collective) {
    const double t0 = comm::now_seconds();
    comm_ok(collective());
    traffic.seconds += comm::now_seconds() - t0;
    traffic.*counter += bytes;
  }
  int64_t row0(int64_t n) const { return sp ? shard.rank * (n / shard.size) : 0; }
  comm::Communicator& comm() const { return *shard.comm; }

  // The N rows of C floats whose local part is `local`: itself, or (SP) all-gathered into full.
  const float* gather(const float* local, int64_t n, int64_t c) {
    if (!sp) return local;
    timed(&TensorParallelTraffic::all_gather_bytes, n * c * 4,
          [&] { return comm::all_gather(comm(), local, full.p, rows(n) * c, DType::kF32); });
    return full.p;
  }
  // partial (N, C) summed over the ranks: in place, or (SP) this rank's rows reduce-scattered
  // in place; returns where the result is.
  float* reduce(float* partial_sum, int64_t n, int64_t c) {
    if (!on()) return partial_sum;
    if (!sp) {
      timed(&TensorParallelTraffic::all_reduce_bytes, n * c * 4, [&] {
        return comm::all_reduce(comm(), partial_sum, partial_sum, n * c, DType::kF32, comm::ReduceOp::kSum);
      });
      return partial_sum;
    }
    float* mine = partial_sum + row0(n) * c;
    timed(&TensorParallelTraffic::reduce_scatter_bytes, n * c * 4, [&] {
      return comm::reduce_scatter(comm(), partial_sum, mine, rows(n) * c, DType::kF32, comm::ReduceOp::kSum);
    });
    return mine;
  }
  // `whole` (N, C) holds this rank's rows at row0(N); SP gathers the other ranks' rows in place.
  void gather_into(float* whole, int64_t n, int64_t c) {
    if (!sp) return;
    timed(&TensorParallelTraffic::all_gather_bytes, n * c * 4,
          [&] { return comm::all_gather(comm(), whole + row0(n) * c, whole, rows(n) * c, DType::kF32); });
  }
  // Logits (M, V / size) of every rank as (M, V), for sampling (this shard's pointer at size 1).
  const float* whole_logits(const float* local, int64_t m, int64_t vl) {
    if (!on()) return local;
    const int64_t R = shard.size;
    gather_buf.resize(static_cast<size_t>(R * m * vl));
    logits_full.resize(static_cast<size_t>(m * R * vl));
    timed(&TensorParallelTraffic::logits_bytes, R * m * vl * 4,
          [&] { return comm::all_gather(comm(), local, gather_buf.data(), m * vl, DType::kF32); });
    for (int64_t r = 0; r < R; ++r)
      for (int64_t i = 0; i < m; ++i)
        std::memcpy(logits_full.data() + i * R * vl + r * vl, gather_buf.data() + (r * m + i) * vl,
                    static_cast<size_t>(vl) * sizeof(float));
    return logits_full.data();
  }
  // Vocab-parallel cross-entropy (Megatron): this shard's logits (N, Vl) start at vocabulary
  // id v0 = rank · Vl. The row max is all-reduced, then the sum of exp and the target's logit
  // (held by one rank, 0 elsewhere) in one all-reduce; every rank gets the whole losses (N,).
  // The backward needs no communication: softmax from the saved max and sum.
  void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t n, int64_t vl) {
    if (!on()) return cpu::cross_entropy_forward(losses, logits, targets, n, vl);
    const int64_t v0 = shard.rank * vl;
    float* mx = ce_max.p;
    float* sums = ce_sum.p;  // (2, N): sum of exp, then the target's logit
    parallel_for(n, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* row = logits + r * vl;
        float m = row[0];
        for (int64_t j = 1; j < vl; ++j) m = std::max(m, row[j]);
        mx[r] = m;
      }
    });
    timed(&TensorParallelTraffic::cross_entropy_bytes, n * 4,
          [&] { return comm::all_reduce(comm(), mx, mx, n, DType::kF32, comm::ReduceOp::kMax); });
    parallel_for(n, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* row = logits + r * vl;
        double sum = 0;
        for (int64_t j = 0; j < vl; ++j) sum += std::exp(static_cast<double>(row[j]) - mx[r]);
        sums[r] = static_cast<float>(sum);
        const int64_t t = targets[r] - v0;
        sums[n + r] = targets[r] != kIgnoreTarget && t >= 0 && t < vl ? row[t] : 0.0f;
      }
    });
    timed(&TensorParallelTraffic::cross_entropy_bytes, 2 * n * 4,
          [&] { return comm::all_reduce(comm(), sums, sums, 2 * n, DType::kF32, comm::ReduceOp::kSum); });
    for (int64_t r = 0; r < n; ++r)
      losses[r] = targets[r] == kIgnoreTarget ? 0.0f : std::log(sums[r]) + mx[r] - sums[n + r];
  }
  // dlogits (N, Vl) = (softmax − onehot) · dlosses; may alias logits.
  void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets, const float* dlosses,
                              int64_t n, int64_t vl) {
    if (!on()) return cpu::cross_entropy_backward(dlogits, logits, targets, dlosses, n, vl);
    const int64_t v0 = shard.rank * vl;
    parallel_for(n, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* out = dlogits + r * vl;
        const float* row = logits + r * vl;
        if (targets[r] == kIgnoreTarget) {
          std::fill(out, out + vl, 0.0f);
          continue;
        }
        const double inv = 1.0 / ce_sum.p[r];
        const float m = ce_max.p[r], g = dlosses[r];
        for (int64_t j = 0; j < vl; ++j) out[j] = static_cast<float>(std::exp(static_cast<double>(row[j]) - m) * inv) * g;
        const int64_t t = targets[r] - v0;
        if (t >= 0 && t < vl) out[t] -= g;
      }
    });
  }
  // y (local rows, C) = x Wᵀ + b + residual for a row-parallel Linear over x (N, in): each
  // rank's partial product, summed (rank 0 adds the bias, drop_row_parallel_biases, and
  // without SP the residual too, so each is counted once).
  void row_forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) {
    if (!sp) {
      l.forward(y, x, n, shard.rank == 0 ? residual : nullptr);
      reduce(y, n, l.out);
      return;
    }
    l.forward(partial.p, x, n, nullptr);
    const float* mine = reduce(partial.p, n, l.out);
    std::memcpy(y, mine, static_cast<size_t>(rows(n) * l.out) * sizeof(float));
    if (residual) cpu::accumulate(y, residual, rows(n) * l.out);
  }
};

struct Transformer::Acts {
  int64_t B = 0, T = 0;
  CheckpointMode mode = CheckpointMode::kNone;  // how the layer buffers were laid out
  bool sp = false;                              // sequence-parallel rows (Tp::rows)
  // Saved for backward:
  std::vector<Buf> resid;   // (L+1) × (Ns, C): input of each layer, then the final stream
  Buf final_norm, final_mean, final_rstd;  // (N, C), (Ns,), (Ns,)
  Buf logits;               // (N, V / tp); the backward turns it into dlogits in place
  Buf losses;               // (N,)
  std::vector<int32_t> tokens, targets;
  int64_t num_valid = 0;
  float loss = 0;  // the last forward's mean loss (a captured graph writes it here too)
  // Backward scratch (shared by layers):
  Buf dresid, dnorm, datt, dq, dk, dv, dff_a, dff_b, dff_c;
};

// What one layer's attention needs of a paged (serving) step: the batch, where each sequence's
// rows start, its K/V length, this layer's pools and a gather buffer for long prefill chunks.
struct PagedStep {
  const PagedBatch* batch = nullptr;
  const int32_t* row_begin = nullptr;  // (S + 1,) cumulative num_new
  const int32_t* kv_lens = nullptr;    // (S,) num_cached + num_new
  int64_t block_size = 0;
  float* k_pool = nullptr;             // this layer's (num_blocks · block_size, Hkv·D)
  float* v_pool = nullptr;
  int64_t pool_rows = 0;               // num_blocks · block_size
  float* gather = nullptr;             // (2, max kv_len of a chunk > kSplitKvMaxQueries, Hkv·D)
};

struct Transformer::PagedScratch {
  std::vector<int32_t> row_begin, kv_lens;
  std::vector<float> gather, x;  // x: (M, C) rows that get logits
};

struct Transformer::Layer {
  const ModelConfig* cfg = nullptr;
  const RopeTable* rope = nullptr;
  Tp* tp = nullptr;
  int64_t index = 0;      // 0-based (GPT-2's scale_attn_by_inverse_layer_idx divides by index + 1)
  // This shard's query heads, KV heads and FFN columns (the config's counts at tp = 1).
  int64_t heads = 0, kv_heads = 0, ff = 0;
  // Parameters (and gradients) of this block.
  float *norm1_w = nullptr, *norm1_b = nullptr, *dnorm1_w = nullptr, *dnorm1_b = nullptr;
  float *norm2_w = nullptr, *norm2_b = nullptr, *dnorm2_w = nullptr, *dnorm2_b = nullptr;
  Linear qkv;             // GPT-2: fused c_attn (3C); Llama: q, k, v below
  Linear q, k, v, o;      // Llama (o is c_proj for GPT-2)
  Linear fc, proj;        // GPT-2 MLP: c_fc, c_proj
  Linear gate, up, down;  // Llama MLP
  std::unique_ptr<MlaAttention> mla;  // multi-head latent attention instead of q, k, v (Llama family)
  MlaActivations mla_acts;            // saved by its forward (kept per layer under checkpointing too)
  std::unique_ptr<MoeBlock> moe;  // a MoE block's MLP instead (Llama family)
  MoeActivations moe_acts;        // saved by its forward (kept per layer under checkpointing too)
  MoeStats* moe_stats = nullptr;  // the model's
  bool recomputing = false;       // a checkpointed forward re-run in backward: routes, records nothing
  const ContextShard* context = nullptr;  // context parallelism: positions of the rows, the sequence attention

  // RoPE (or its backward) over (B, T, nh, D) rows at positions [pos, pos + T), or at the context
  // shard's segments' positions.
  void rope_rows(float* x, int64_t B, int64_t T, int64_t nh, int64_t D, int64_t pos, bool backward) const {
    auto run = [&](float* p, int64_t b, int64_t t, int64_t at) {
      if (backward) cpu::rope_backward(p, p, *rope, b, t, nh, D, at);
      else cpu::rope_forward(p, p, *rope, b, t, nh, D, at);
    };
    if (!context || !context->on()) return run(x, B, T, pos);
    for (int64_t b = 0; b < B; ++b) {
      int64_t row = 0;
      for (auto [start, len] : context->segments) {
        run(x + (b * T + row) * nh * D, 1, len, start);
        row += len;
      }
    }
  }
  // The attention of these rows: the whole sequence's under context parallelism.
  void attend(float* out, float* l, const float* qp, const float* kp, const float* vp, const AttentionParams& p) const {
    if (context && context->on()) return context->attention->forward(out, l, qp, kp, vp, p);
    cpu::attention_forward(out, l, qp, kp, vp, p);
  }
  // Saved activations, (N, ·):
  Buf n1, mean1, rstd1, qkv_out, qb, kb, vb, att, lse, x1, n2, mean2, rstd2, ff1, ff2, ffa;
  static constexpr std::array<Buf Layer::*, 16> kSaved = {
      &Layer::n1, &Layer::mean1, &Layer::rstd1, &Layer::qkv_out, &Layer::qb, &Layer::kb, &Layer::vb, &Layer::att,
      &Layer::lse, &Layer::x1, &Layer::n2, &Layer::mean2, &Layer::rstd2, &Layer::ff1, &Layer::ff2, &Layer::ffa};
  WeightGradQueue* const* defer = nullptr;  // the model's queue while B defers W (else null)

  // Without a cache K/V come from this forward (GPT-2: inside the fused QKV rows); with one
  // they are read back from the cache, which holds kv_len = pos + T rows of Hkv·D.
  AttentionParams attn_params(int64_t B, int64_t T, int64_t kv_len, bool cached) const {
    AttentionParams p;
    p.batch = B; p.q_len = T; p.kv_len = kv_len;
    p.n_heads = heads; p.n_kv_heads = kv_heads; p.head_dim = cfg->head_dim();
    p.causal = true;
    p.scale = cfg->attention_scale(index);
    if (!cfg->is_llama()) {
      p.q_row_stride = 3 * heads * cfg->head_dim();
      if (!cached) p.k_row_stride = p.v_row_stride = 3 * heads * cfg->head_dim();
    }
    return check_attention(p).value();
  }

  // Copies T rows of K and V (row strides ks, vs) into the cache at position pos (batch 1).
  static void append_kv(float* ck, float* cv, const float* k, const float* v, int64_t ks, int64_t vs, int64_t T,
                        int64_t pos, int64_t width) {
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(ck + (pos + t) * width, k + t * ks, static_cast<size_t>(width) * sizeof(float));
      std::memcpy(cv + (pos + t) * width, v + t * vs, static_cast<size_t>(width) * sizeof(float));
    }
  }

  // Attention of a paged step into att/lse: RoPE at each sequence's own positions (Llama), the
  // new K/V rows into their pool slots, then per sequence: runs of decodes (1 query) in one
  // paged split-KV call, short chunks in the same kernel, and longer prefill chunks through the
  // flash kernel over the sequence's K/V gathered into a contiguous buffer.
  // q rows of q_stride, k/v rows of kv_stride (GPT-2: inside the fused QKV rows).
  void attend_paged(float* q, float* k, const float* v, int64_t q_stride, int64_t kv_stride, const PagedStep& ps) {
    const PagedBatch& b = *ps.batch;
    const int64_t H = heads, D = cfg->head_dim(), W = kv_heads * D, bs = ps.block_size, Hkv = kv_heads;
    const int64_t S = static_cast<int64_t>(b.num_new.size()), maxb = b.max_blocks_per_seq;
    const int64_t N = static_cast<int64_t>(b.tokens.size()), P = ps.pool_rows * W;
    const bool llama = cfg->is_llama();
    const RopeTable* table = rope;
    // RoPE at each sequence's positions and its new K/V rows into their pool slots: one step
    // that reads positions and slots when it runs (a replayed decode step's are new).
    graph::op("paged_kv_write",
              {graph::writes_rows(q, N, H * D, q_stride), graph::reads_rows(q, N, H * D, q_stride),
               graph::writes_rows(k, N, W, kv_stride), graph::reads_rows(k, N, W, kv_stride),
               graph::reads_rows(v, N, W, kv_stride), graph::writes(ps.k_pool, P), graph::reads(ps.k_pool, P),
               graph::writes(ps.v_pool, P), graph::reads(ps.v_pool, P), graph::reads(b.num_cached.data(), S),
               graph::reads(b.num_new.data(), S), graph::reads(ps.row_begin, S + 1),
               graph::reads(b.block_table.data(), S * maxb)},
              [=](const graph::Access* io) {
                float *qp = io[0].mut<float>(), *kp = io[2].mut<float>(), *kpool = io[5].mut<float>();
                float* vpool = io[7].mut<float>();
                const float* vp = io[4].as<float>();
                const int32_t *cached = io[9].as<int32_t>(), *num_new = io[10].as<int32_t>();
                const int32_t *row_begin = io[11].as<int32_t>(), *tables = io[12].as<int32_t>();
                for (int64_t i = 0; i < S; ++i) {
                  const int64_t r0 = row_begin[i], n = num_new[i], pos = cached[i];
                  if (llama) {  // q, k packed here (q_stride = H·D, kv_stride = W)
                    cpu::rope_forward(qp + r0 * q_stride, qp + r0 * q_stride, *table, 1, n, H, D, pos);
                    cpu::rope_forward(kp + r0 * kv_stride, kp + r0 * kv_stride, *table, 1, n, Hkv, D, pos);
                  }
                  const int32_t* blocks = tables + i * maxb;
                  for (int64_t t = 0; t < n; ++t) {
                    const int64_t p = pos + t, slot = int64_t{blocks[p / bs]} * bs + p % bs;
                    std::memcpy(kpool + slot * W, kp + (r0 + t) * kv_stride, static_cast<size_t>(W) * sizeof(float));
                    std::memcpy(vpool + slot * W, vp + (r0 + t) * kv_stride, static_cast<size_t>(W) * sizeof(float));
                  }
                }
              });
    AttentionParams base;
    base.n_heads = H; base.n_kv_heads = kv_heads; base.head_dim = D; base.causal = true;
    base.scale = cfg->attention_scale(index);
    base.q_row_stride = q_stride; base.k_row_stride = base.v_row_stride = W;
    paged_attention(att.p, lse.p, q, base, ps, ps.v_pool);
  }

  // Latent attention's paged step: each sequence's new latent rows into their pool slots, its
  // absorbed queries over them (values: the same rows), the output through W_uv into att.
  void attend_paged_latent(const float* n1p, int64_t N, const PagedStep& ps) {
    graph::graph_break("latent attention's paged step keeps per-call buffers");
    const PagedBatch& b = *ps.batch;
    const int64_t H = heads, W = mla->latent_width(), C = cfg->d_model, bs = ps.block_size;
    const int64_t S = static_cast<int64_t>(b.num_new.size()), maxb = b.max_blocks_per_seq;
    std::vector<float> rows(static_cast<size_t>(N * W)), qabs(static_cast<size_t>(N * H * W)), out(qabs.size());
    std::vector<float> l(static_cast<size_t>(N * H));
    for (int64_t i = 0; i < S; ++i) {
      const int64_t r0 = ps.row_begin[i], n = b.num_new[i], pos = b.num_cached[i];
      mla->latent(rows.data() + r0 * W, qabs.data() + r0 * H * W, n1p + r0 * C, n, pos);
      const int32_t* table = b.block_table.data() + i * maxb;
      for (int64_t t = 0; t < n; ++t) {
        const int64_t p = pos + t, slot = int64_t{table[p / bs]} * bs + p % bs;
        std::memcpy(ps.k_pool + slot * W, rows.data() + (r0 + t) * W, static_cast<size_t>(W) * sizeof(float));
      }
    }
    AttentionParams base = mla->absorbed_params(1, 1);
    base.q_row_stride = H * W; base.k_row_stride = base.v_row_stride = W;
    paged_attention(out.data(), l.data(), qabs.data(), base, ps, ps.k_pool);
    mla->absorbed_output(att.p, out.data(), N);
  }

  // The attention of a paged step over the pools (K in ps.k_pool, V in v_pool), out rows
  // n_heads · head_dim wide: runs of decodes through the paged split-KV kernel, longer prefill
  // chunks through flash over their gathered rows.
  void paged_attention(float* out, float* lse_out, const float* q, const AttentionParams& base, const PagedStep& ps,
                       const float* v_pool) {
    const PagedBatch& b = *ps.batch;
    const int64_t H = base.n_heads, D = base.head_dim, W = base.n_kv_heads * D, bs = ps.block_size;
    const int64_t S = static_cast<int64_t>(b.num_new.size()), maxb = b.max_blocks_per_seq, q_stride = base.q_row_stride;
    for (int64_t i = 0; i < S;) {
      const int64_t r0 = ps.row_begin[i], n = b.num_new[i];
      if (n <= kSplitKvMaxQueries) {  // a run of sequences with n queries each: one paged call
        int64_t j = i + 1;
        while (j < S && b.num_new[j] == n) ++j;
        AttentionParams p = base;
        p.batch = j - i; p.q_len = n; p.kv_len = n;
        p = check_attention(p).value();
        const PagedKv kv{ps.k_pool, v_pool, b.block_table.data() + i * maxb, ps.kv_lens + i, bs, maxb, j - i};
        cpu::attention_decode_paged(out + r0 * H * D, lse_out + r0 * H, q + r0 * q_stride, kv, p);
        i = j;
        continue;
      }
      graph::graph_break("a prefill chunk's K/V rows are gathered from the pool by host code");
      const int64_t S_kv = ps.kv_lens[i];
      const int32_t* table = b.block_table.data() + i * maxb;
      float* gk = ps.gather;
      float* gv = ps.gather + S_kv * W;
      for (int64_t blk = 0; blk * bs < S_kv; ++blk) {
        const int64_t rows = std::min(bs, S_kv - blk * bs), src = int64_t{table[blk]} * bs;
        std::memcpy(gk + blk * bs * W, ps.k_pool + src * W, static_cast<size_t>(rows * W) * sizeof(float));
        std::memcpy(gv + blk * bs * W, v_pool + src * W, static_cast<size_t>(rows * W) * sizeof(float));
      }
      AttentionParams p = base;
      p.batch = 1; p.q_len = n; p.kv_len = S_kv;
      p = check_attention(p).value();
      cpu::attention_forward(out + r0 * H * D, lse_out + r0 * H, q + r0 * q_stride, gk, gv, p);
      ++i;
    }
  }

  // A Llama block after its attention output att (N, o.in): o_proj into the residual x1, the
  // second norm, the MLP (MoE or dense) into y. `inference` (KV cache, serving): a MoE block is
  // dropless and local; a recomputed forward routes as the first and records nothing.
  void llama_tail_forward(float* y, const float* x, int64_t N, int64_t Ns, bool inference) {
    const int64_t C = cfg->d_model;
    tp->row_forward(o, x1.p, att.p, N, x);
    cpu::rmsnorm_forward(n2.p, rstd2.p, x1.p, norm2_w, Ns, C, cfg->norm_eps);
    if (moe) {  // tp = 1; captured, the routing runs eagerly between replayed segments
      const int stats = inference ? 0 : recomputing ? 1 : 2;  // none, discarded, the model's
      graph::eager_region("MoE routing: the tokens per expert decide the expert GEMMs",
                          {graph::reads(n2.p, N * C), graph::reads(x1.p, N * C), graph::writes(y, N * C)},
                          [this, y, N, stats](const graph::Access*) {
                            MoeStats discarded;
                            moe->forward(y, n2.p, N, x1.p, moe_acts,
                                         stats == 0 ? nullptr : stats == 1 ? &discarded : moe_stats);
                          });
      return;
    }
    const float* in2 = tp->gather(n2.p, N, C);
    gate.forward(ff1.p, in2, N);
    up.forward(ff2.p, in2, N);
    cpu::swiglu_forward(ffa.p, ff1.p, ff2.p, N * ff);
    tp->row_forward(down, y, ffa.p, N, x1.p);
  }

  // With `src` (layer 0) and checkpointing, the buffers this layer recomputes in backward are
  // src's: all of them under kFull, the attention core's output and lse under kSelective.
  // Ns: the token rows of the norm and residual region (N / tp under sequence parallelism).
  void alloc(int64_t B, int64_t T, int64_t Ns, const Layer* src = nullptr, CheckpointMode mode = CheckpointMode::kNone) {
    const int64_t N = B * T, C = cfg->d_model, F = ff, D = cfg->head_dim();
    const bool share_all = src != nullptr && mode == CheckpointMode::kFull;
    const bool share_core = src != nullptr && mode != CheckpointMode::kNone;
    auto get = [&](Buf Layer::*m, int64_t n, bool core = false) {
      if (share_all || (core && share_core)) (this->*m).share(src->*m);
      else (this->*m).alloc(n);
    };
    get(&Layer::n1, Ns * C); get(&Layer::mean1, Ns); get(&Layer::rstd1, Ns);
    const int64_t att_width = mla ? heads * mla->v_dim : heads * D;  // o_proj's input
    get(&Layer::att, N * att_width, true); get(&Layer::lse, mla ? 0 : B * heads * T, true); get(&Layer::x1, Ns * C);
    get(&Layer::n2, Ns * C); get(&Layer::mean2, Ns); get(&Layer::rstd2, Ns);
    const int64_t Fd = moe ? 0 : F;  // a MoE block keeps its own (MoeActivations)
    get(&Layer::ff1, N * Fd); get(&Layer::ffa, N * Fd);
    if (cfg->is_llama()) {
      const int64_t Dq = mla ? 0 : D;  // latent attention keeps its own (MlaActivations)
      get(&Layer::qb, N * heads * Dq); get(&Layer::kb, N * kv_heads * Dq);
      get(&Layer::vb, N * kv_heads * Dq); get(&Layer::ff2, N * Fd);
    } else {
      get(&Layer::qkv_out, N * 3 * heads * D);
    }
  }

  // x (Ns, C) -> y (Ns, C) (Ns = N, or N / tp with sequence parallelism); saves what backward
  // needs. With a cache (batch 1), the tokens sit at positions [pos, pos + T) and K/V are
  // appended to ck/cv (max_len, Hkv·D). With `paged` (serving, B = 1, T = all new tokens of a
  // ragged batch) the attention lines are attend_paged().
  void forward(float* y, const float* x, int64_t B, int64_t T, float* ck = nullptr, float* cv = nullptr,
               int64_t pos = 0, const PagedStep* paged = nullptr) {
    const int64_t N = B * T, Ns = tp->rows(N), C = cfg->d_model, D = cfg->head_dim(), kv_width = kv_heads * D;
    const int64_t qw = heads * D;  // this shard's query (and attention output) width
    const bool cached = ck != nullptr;
    if (mla) {
      if (!paged) graph::graph_break("latent attention keeps per-call buffers");
      cpu::rmsnorm_forward(n1.p, rstd1.p, x, norm1_w, Ns, C, cfg->norm_eps);  // tp = 1: Ns = N
      if (paged) {
        attend_paged_latent(n1.p, N, *paged);
      } else if (cached) {  // the compressed cache: latent rows at [pos, pos + T), absorbed queries
        const int64_t W = mla->latent_width();
        std::vector<float> qabs(static_cast<size_t>(T * heads * W)), out(qabs.size()), l(static_cast<size_t>(heads * T));
        mla->latent(ck + pos * W, qabs.data(), n1.p, T, pos);
        cpu::attention_forward(out.data(), l.data(), qabs.data(), ck, ck, mla->absorbed_params(T, pos + T));
        mla->absorbed_output(att.p, out.data(), T);
      } else {
        mla->forward(att.p, n1.p, B, T, mla_acts);
      }
      return llama_tail_forward(y, x, N, Ns, cached || paged);
    }
    const AttentionParams ap = attn_params(B, T, pos + T, cached);
    if (cfg->is_llama()) {
      cpu::rmsnorm_forward(n1.p, rstd1.p, x, norm1_w, Ns, C, cfg->norm_eps);
      const float* in1 = tp->gather(n1.p, N, C);
      q.forward(qb.p, in1, N);
      k.forward(kb.p, in1, N);
      v.forward(vb.p, in1, N);
      if (paged) {
        attend_paged(qb.p, kb.p, vb.p, qw, kv_width, *paged);
      } else {
        rope_rows(qb.p, B, T, heads, D, pos, false);
        rope_rows(kb.p, B, T, kv_heads, D, pos, false);
        if (cached) append_kv(ck, cv, kb.p, vb.p, kv_width, kv_width, T, pos, kv_width);
        attend(att.p, lse.p, qb.p, cached ? ck : kb.p, cached ? cv : vb.p, ap);
      }
      llama_tail_forward(y, x, N, Ns, cached || paged);
    } else {
      cpu::layernorm_forward(n1.p, mean1.p, rstd1.p, x, norm1_w, norm1_b, Ns, C, cfg->norm_eps);
      qkv.forward(qkv_out.p, tp->gather(n1.p, N, C), N);  // rows: this shard's q | k | v
      if (paged) {
        attend_paged(qkv_out.p, qkv_out.p + qw, qkv_out.p + 2 * qw, 3 * qw, 3 * qw, *paged);
      } else {
        if (cached) append_kv(ck, cv, qkv_out.p + qw, qkv_out.p + 2 * qw, 3 * qw, 3 * qw, T, pos, kv_width);
        cpu::attention_forward(att.p, lse.p, qkv_out.p, cached ? ck : qkv_out.p + qw,
                               cached ? cv : qkv_out.p + 2 * qw, ap);
      }
      tp->row_forward(o, x1.p, att.p, N, x);
      cpu::layernorm_forward(n2.p, mean2.p, rstd2.p, x1.p, norm2_w, norm2_b, Ns, C, cfg->norm_eps);
      fc.forward_act(ffa.p, ff1.p, tp->gather(n2.p, N, C), N, Activation::kGeluTanh);
      tp->row_forward(proj, y, ffa.p, N, x1.p);
    }
  }

  // dy (Ns, C) in, overwritten with dx (Ns, C). x is this block's saved input. With
  // recompute_attention (selective checkpointing) the attention core's output and lse are
  // first recomputed from the saved Q, K, V. Tensor parallelism: a row-parallel Linear's
  // backward reads the whole dy (gathered under SP), a column-parallel one's input gradient is
  // a partial sum (reduced before its norm's backward); SP re-gathers the saved local norm
  // outputs for the weight gradients rather than keeping them whole.
  void backward(float* dy, const float* x, int64_t B, int64_t T, Acts& s, bool recompute_attention = false) {
    const int64_t N = B * T, Ns = tp->rows(N), C = cfg->d_model, F = ff, D = cfg->head_dim(), qw = heads * D;
    if (mla && recompute_attention) {  // its attention output is kept (MlaActivations): o_proj's input again
      const int64_t Dp = mla->padded_dim(), Dv = mla->v_dim;
      for (int64_t i = 0; i < N * heads; ++i)
        std::memcpy(att.p + i * Dv, mla_acts.o.data() + i * Dp, static_cast<size_t>(Dv) * sizeof(float));
      recompute_attention = false;
    }
    const AttentionParams ap = mla ? AttentionParams{} : attn_params(B, T, T, false);
    if (recompute_attention) {
      KILN_TRACE_SCOPE(kModel, "recompute");
      if (cfg->is_llama()) attend(att.p, lse.p, qb.p, kb.p, vb.p, ap);
      else cpu::attention_forward(att.p, lse.p, qkv_out.p, qkv_out.p + qw, qkv_out.p + 2 * qw, ap);
    }
    float* dx1 = dy;  // the residual carries dy straight through; norm branches add to it
    if (cfg->is_llama()) {
      if (moe) {  // its weight gradients are computed here, also when B defers the others' (W)
        graph::eager_region("MoE routing's backward: the tokens per expert decide the expert GEMMs",
                            {graph::writes(s.dnorm.p, N * C), graph::reads(dy, N * C), graph::reads(n2.p, N * C)},
                            [this, dnorm = s.dnorm.p, dy, N](const graph::Access*) {
                              moe->backward(dnorm, dy, n2.p, N, moe_acts, false, *moe_stats);
                            });
      } else {
        linear_backward(*defer, down, s.dff_a.p, tp->gather(dy, N, C), ffa.p, N, false);  // d swiglu out
        cpu::swiglu_backward(s.dff_b.p, s.dff_c.p, s.dff_a.p, ff1.p, ff2.p, N * F);      // d gate, d up
        const float* in2 = tp->gather(n2.p, N, C);
        linear_backward(*defer, gate, s.dnorm.p, s.dff_b.p, in2, N, false);
        linear_backward(*defer, up, s.dnorm.p, s.dff_c.p, in2, N, true);
      }
      // The norms' input gradients join the residual stream's in the kernel (accumulate_dx).
      cpu::rmsnorm_backward(dx1, dnorm2_w, tp->reduce(s.dnorm.p, N, C), x1.p, norm2_w, rstd2.p, Ns, C, true);
      if (mla) {  // its own buffers: o_proj's input is H·Dv wide; the Linears are not deferred
        std::vector<float> datt(static_cast<size_t>(N * o.in));
        o.backward(datt.data(), dx1, att.p, N, false);
        mla->backward(s.dnorm.p, datt.data(), n1.p, mla_acts);
        cpu::rmsnorm_backward(dx1, dnorm1_w, s.dnorm.p, x, norm1_w, rstd1.p, Ns, C, true);
        return;
      }
      linear_backward(*defer, o, s.datt.p, tp->gather(dx1, N, C), att.p, N, false);
      if (context && context->on()) {
        context->attention->backward(s.dq.p, s.dk.p, s.dv.p, s.datt.p, qb.p, kb.p, vb.p, att.p, lse.p, ap);
      } else {
        cpu::attention_backward(s.dq.p, s.dk.p, s.dv.p, s.datt.p, qb.p, kb.p, vb.p, att.p, lse.p, ap);
      }
      rope_rows(s.dq.p, B, T, heads, D, 0, true);
      rope_rows(s.dk.p, B, T, kv_heads, D, 0, true);
      const float* in1 = tp->gather(n1.p, N, C);
      linear_backward(*defer, q, s.dnorm.p, s.dq.p, in1, N, false);
      linear_backward(*defer, k, s.dnorm.p, s.dk.p, in1, N, true);
      linear_backward(*defer, v, s.dnorm.p, s.dv.p, in1, N, true);
      cpu::rmsnorm_backward(dx1, dnorm1_w, tp->reduce(s.dnorm.p, N, C), x, norm1_w, rstd1.p, Ns, C, true);
    } else {
      // GELU's backward as a kernel of its own, not in this GEMM's epilogue (GemmParams::act_grad):
      // fused, the W1a step was 6 ms slower at 1 thread (Xeon; the pass after the GEMM reads its
      // output from cache, while the epilogue's GELU' runs beside the tile's live accumulators).
      linear_backward(*defer, proj, s.dff_a.p, tp->gather(dy, N, C), ffa.p, N, false);
      cpu::gelu_backward(s.dff_b.p, s.dff_a.p, ff1.p, N * F);
      linear_backward(*defer, fc, s.dnorm.p, s.dff_b.p, tp->gather(n2.p, N, C), N, false);
      cpu::layernorm_backward(dx1, dnorm2_w, dnorm2_b, tp->reduce(s.dnorm.p, N, C), x1.p, norm2_w, mean2.p,
                              rstd2.p, Ns, C, true);
      linear_backward(*defer, o, s.datt.p, tp->gather(dx1, N, C), att.p, N, false);
      float* dqkv = s.dq.p;  // (N, 3·qw)
      cpu::attention_backward(dqkv, dqkv + qw, dqkv + 2 * qw, s.datt.p, qkv_out.p, qkv_out.p + qw,
                              qkv_out.p + 2 * qw, att.p, lse.p, ap);
      linear_backward(*defer, qkv, s.dnorm.p, dqkv, tp->gather(n1.p, N, C), N, false);
      cpu::layernorm_backward(dx1, dnorm1_w, dnorm1_b, tp->reduce(s.dnorm.p, N, C), x, norm1_w, mean1.p,
                              rstd1.p, Ns, C, true);
    }
  }
};

Transformer::Transformer(const ModelConfig& c, const TensorShard& shard, const PipelineStage& stage,
                         const ExpertShard& experts, const ContextShard& context)
    : config_(c),
      shard_(shard),
      stage_(stage.chunks.empty() ? PipelineStage::blocks(0, c.n_layers) : stage),
      experts_(experts),
      context_(context) {}
Transformer::~Transformer() = default;

Status check_tensor_split(const ModelConfig& c, int tp) {
  if (tp < 1) return invalid_argument("tensor parallelism over {} ranks: it must be at least 1", tp);
  if (c.n_heads % tp != 0 || c.d_ff % tp != 0 || c.vocab_size % tp != 0)
    return invalid_argument("tensor parallelism over {} ranks must divide n_heads ({}), d_ff ({}) and vocab_size ({})",
                            tp, c.n_heads, c.d_ff, c.vocab_size);
  if (c.n_kv_heads % tp != 0 && tp % c.n_kv_heads != 0)
    return invalid_argument("tensor parallelism over {} ranks: n_kv_heads ({}) must be a multiple of it (KV heads "
                            "split) or divide it (KV heads replicated)", tp, c.n_kv_heads);
  if (tp > 1 && c.is_moe())
    return invalid_argument("tensor parallelism of a MoE model is not implemented: shard its experts with --ep");
  return {};
}

Status check_expert_split(const ModelConfig& c, int ep) {
  if (ep < 1) return invalid_argument("expert parallelism over {} ranks: it must be at least 1", ep);
  if (ep > 1 && !c.is_moe()) return invalid_argument("expert parallelism over {} ranks needs a MoE model (num_experts > 0)", ep);
  if (c.is_moe() && c.num_experts % ep != 0)
    return invalid_argument("expert parallelism over {} ranks must divide num_experts ({})", ep, c.num_experts);
  return {};
}

// ---- parameters ----------------------------------------------------------------------------
std::vector<ParamEntry> Transformer::param_entries_for(const ModelConfig& c, int tp_rank, int tp_size,
                                                      bool sequence_parallel, const PipelineStage& stage, int ep_rank,
                                                      int ep_size) {
  std::vector<ParamEntry> entries_;
  const int64_t C = c.d_model, F = c.d_ff, D = c.head_dim(), V = c.vocab_size, L = c.n_layers;
  const int64_t R = tp_size, r = tp_rank;
  const PipelineStage st = stage.chunks.empty() ? PipelineStage::blocks(0, L) : stage;
  const bool embedding = st.chunks.front().begin == 0, head = st.chunks.back().end == L;
  int64_t offset = 0, full_offset = 0;
  bool keep = embedding;  // whether the tensors added next belong to this pipeline stage
  // A tensor of shape `full`, of which this shard holds `split` (kWhole: all of it).
  auto add_split = [&](std::string name, Shape full, bool decay, ParamSplit split) {
    Shape local = full;
    if (split.kind == ParamSplit::Kind::kRows) local[0] = split.parts * split.count;
    if (split.kind == ParamSplit::Kind::kColumns) local[1] = split.count;
    split.full = full;
    split.full_offset = full_offset;
    if (split.kind == ParamSplit::Kind::kWhole) split.replicas = static_cast<int>(R);
    full_offset += full.numel();
    if (!keep) return;
    entries_.push_back({std::move(name), local, offset, decay, split});
    offset += local.numel();
  };
  auto whole = [&](std::string name, Shape shape, bool decay, bool partial_under_sp) {
    ParamSplit s;
    s.partial_grad = partial_under_sp && sequence_parallel && tp_size > 1;  // it saw N / tp rows
    add_split(std::move(name), shape, decay, s);
  };
  // Rows split evenly over the ranks (column-parallel outputs, the vocabulary), in `parts` blocks.
  auto rows = [&](std::string name, Shape shape, bool decay, int64_t parts = 1) {
    ParamSplit s;
    s.kind = ParamSplit::Kind::kRows;
    s.parts = parts;
    s.count = shape[0] / parts / R;
    s.begin = r * s.count;
    add_split(std::move(name), shape, decay, s);
  };
  auto columns = [&](std::string name, Shape shape, bool decay) {  // row-parallel inputs
    ParamSplit s;
    s.kind = ParamSplit::Kind::kColumns;
    s.count = shape[1] / R;
    s.begin = r * s.count;
    add_split(std::move(name), shape, decay, s);
  };
  // K and V: split by KV heads, or (tp > n_kv_heads) the one KV head rank r's queries read.
  auto kv_rows = [&](std::string name, Shape shape, bool decay) {
    if (c.n_kv_heads % R == 0) return rows(std::move(name), shape, decay);
    ParamSplit s;
    s.kind = ParamSplit::Kind::kRows;
    s.count = D;
    s.replicas = static_cast<int>(R / c.n_kv_heads);
    s.begin = (r / s.replicas) * D;
    s.partial_grad = true;
    add_split(std::move(name), shape, decay, s);
  };
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  if (gpt2) {
    rows("transformer.wte.weight", {V, C}, true);
    whole("transformer.wpe.weight", {c.max_seq_len, C}, true, true);
  } else {
    rows("model.embed_tokens.weight", {V, C}, true);
  }
  for (int64_t i = 0; i < L; ++i) {
    keep = std::any_of(st.chunks.begin(), st.chunks.end(), [&](const BlockRange& r) { return i >= r.begin && i < r.end; });
    if (gpt2) {
      const std::string p = fmt::format("transformer.h.{}.", i);
      whole(p + "ln_1.weight", {C}, false, true);
      whole(p + "ln_1.bias", {C}, false, true);
      rows(p + "attn.c_attn.weight", {3 * C, C}, true, 3);
      rows(p + "attn.c_attn.bias", {3 * C}, false, 3);
      columns(p + "attn.c_proj.weight", {C, C}, true);
      whole(p + "attn.c_proj.bias", {C}, false, false);
      whole(p + "ln_2.weight", {C}, false, true);
      whole(p + "ln_2.bias", {C}, false, true);
      rows(p + "mlp.c_fc.weight", {F, C}, true);
      rows(p + "mlp.c_fc.bias", {F}, false);
      columns(p + "mlp.c_proj.weight", {C, F}, true);
      whole(p + "mlp.c_proj.bias", {C}, false, false);
    } else {
      const std::string p = fmt::format("model.layers.{}.", i);
      whole(p + "input_layernorm.weight", {C}, false, true);
      // Column-parallel projections (a bias splits with its rows), then row-parallel ones
      // (a bias is whole: added once, after the reduction).
      auto col = [&](const char* name, int64_t out, bool bias, bool kv) {
        auto split = [&](std::string n, Shape shape, bool decay) {
          if (kv) kv_rows(std::move(n), shape, decay);
          else rows(std::move(n), shape, decay);
        };
        split(p + name + ".weight", {out, C}, true);
        if (bias) split(p + name + ".bias", {out}, false);
      };
      auto row = [&](const char* name, int64_t in, bool bias) {
        columns(p + name + ".weight", {C, in}, true);
        if (bias) whole(p + name + ".bias", {C}, false, false);
      };
      if (c.is_mla()) {  // tp = 1 (check_tensor_split)
        const int64_t H = c.n_heads, qr = c.q_lora_rank, r = c.kv_lora_rank, Dqk = c.qk_head_dim();
        const std::string a = p + "self_attn.";
        if (qr > 0) {
          whole(a + "q_a_proj.weight", {qr, C}, true, false);
          whole(a + "q_a_layernorm.weight", {qr}, false, false);
          whole(a + "q_b_proj.weight", {H * Dqk, qr}, true, false);
        } else {
          whole(a + "q_proj.weight", {H * Dqk, C}, true, false);
        }
        whole(a + "kv_a_proj_with_mqa.weight", {r + c.qk_rope_head_dim, C}, true, false);
        whole(a + "kv_a_layernorm.weight", {r}, false, false);
        whole(a + "kv_b_proj.weight", {H * (c.qk_nope_head_dim + c.v_head_dim), r}, true, false);
        whole(a + "o_proj.weight", {C, H * c.v_head_dim}, true, false);
      } else {
        col("self_attn.q_proj", c.n_heads * D, c.attention_bias, false);
        col("self_attn.k_proj", c.n_kv_heads * D, c.attention_bias, true);
        col("self_attn.v_proj", c.n_kv_heads * D, c.attention_bias, true);
        row("self_attn.o_proj", c.n_heads * D, c.attention_bias);
      }
      whole(p + "post_attention_layernorm.weight", {C}, false, true);
      if (c.is_moe_layer(i)) {  // tp = 1 (check_tensor_split)
        const std::string m = p + "block_sparse_moe.";
        const int64_t E = c.num_experts, Fe = c.expert_d_ff(), El = E / ep_size;
        whole(m + "gate.weight", {E, C}, true, false);
        const bool block_kept = keep;
        for (int64_t j = 0; j < E; ++j) {  // HF Mixtral: w1 gate, w2 down, w3 up
          keep = block_kept && j / El == ep_rank;
          for (auto [w, shape] : {std::pair{"w1", Shape{Fe, C}}, std::pair{"w2", Shape{C, Fe}}, std::pair{"w3", Shape{Fe, C}}}) {
            whole(fmt::format("{}experts.{}.{}.weight", m, j, w), shape, true, false);
            if (keep) entries_.back().split.expert = ep_size > 1;
          }
        }
        keep = block_kept;
        if (c.num_shared_experts > 0) {
          const int64_t Fs = c.num_shared_experts * Fe;
          whole(m + "shared_experts.gate_proj.weight", {Fs, C}, true, false);
          whole(m + "shared_experts.up_proj.weight", {Fs, C}, true, false);
          whole(m + "shared_experts.down_proj.weight", {C, Fs}, true, false);
        }
      } else {
        col("mlp.gate_proj", F, c.mlp_bias, false);
        col("mlp.up_proj", F, c.mlp_bias, false);
        row("mlp.down_proj", F, c.mlp_bias);
      }
    }
  }
  keep = head;
  if (gpt2) {
    whole("transformer.ln_f.weight", {C}, false, true);
    whole("transformer.ln_f.bias", {C}, false, true);
  } else {
    whole("model.norm.weight", {C}, false, true);
  }
  if (!c.tied_embeddings) rows("lm_head.weight", {V, C}, true);
  if (c.tied_embeddings && head && !embedding) {  // the head's copy of the first stage's table
    const int64_t end = full_offset;
    full_offset = 0;
    rows(gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight", {V, C}, true);
    entries_.back().split.stage_copy = true;
    full_offset = end;
  }
  return entries_;
}

void Transformer::build_params(uint64_t seed) {
  const ModelConfig& c = config_;
  const int64_t F = c.d_ff, L = c.n_layers;
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  entries_ = param_entries_for(c, shard_.rank, shard_.size, shard_.sequence_parallel, stage_, experts_.rank,
                               experts_.size);
  const int64_t offset = entries_.empty() ? 0 : entries_.back().offset + entries_.back().shape.numel();
  // Every tensor of the shard, in draw order: a pipeline stage draws them all and keeps its own.
  const std::vector<ParamEntry> all = param_entries_for(c, shard_.rank, shard_.size, shard_.sequence_parallel);
  full_num_params_ = all.back().split.full_offset + all.back().split.full.numel();
  std::map<int64_t, const ParamEntry*> local_at;  // full offset -> this stage's entry
  for (const ParamEntry& e : entries_) local_at[e.split.full_offset] = &e;
  params_ = Tensor::zeros({offset});
  grads_ = Tensor::zeros({offset});
  // GPT-2 initialization: N(0, 0.02); projections into the residual stream scaled by
  // 1/sqrt(2L); norms 1, biases 0. A shard draws each whole tensor and keeps its slice, so every
  // tp size starts from the single-process values.
  Rng rng(seed);
  float* base = params_.data<float>();
  std::vector<float> whole;
  for (const ParamEntry& e : all) {  // a stage draws every tensor, so each keeps its single-process values
    whole.assign(static_cast<size_t>(e.split.full.numel()), 0.0f);
    const bool is_norm = e.name.find("norm") != std::string::npos || e.name.find("ln_") != std::string::npos;
    if (is_norm && e.name.ends_with(".weight")) {
      std::fill(whole.begin(), whole.end(), 1.0f);
    } else if (e.shape.rank() == 2) {
      const bool residual_proj = e.name.find("c_proj") != std::string::npos ||
                                 e.name.find("o_proj") != std::string::npos ||
                                 e.name.find("down_proj") != std::string::npos ||
                                 e.name.ends_with(".w2.weight");  // a MoE expert's down projection
      rng.fill_normal(whole, 0.0f, residual_proj ? 0.02f / std::sqrt(2.0f * L) : 0.02f);
    }
    const auto mine = local_at.find(e.split.full_offset);
    if (mine == local_at.end()) continue;
    for_each_entry_run(*mine->second, [&](int64_t local, int64_t full, int64_t n) {
      std::copy_n(whole.data() + (full - e.split.full_offset), n, base + local);
    });
  }
  // Wire the layers to their slices; a Linear's in and out are its weight's local shape.
  auto P = [&](const std::string& name) { return param(name); };
  auto G = [&](const std::string& name) { return grad(name); };
  auto lin = [&](const std::string& w, const std::string& b) {
    Linear l;
    l.name = w;
    for (const ParamEntry& e : entries_)
      if (e.name == w) { l.out = e.shape[0]; l.in = e.shape[1]; }
    l.w = P(w); l.dw = G(w);
    if (!b.empty()) { l.b = P(b); l.db = G(b); }
    return l;
  };
  const int64_t R = shard_.size;
  tp_ = std::make_unique<Tp>();  // at size 1 every operator is the identity
  slots_ = std::make_unique<Slots>();
  slots_->grow(1);
  tp_->shard = shard_;
  chunk_first_.clear();
  for (int64_t i = 0; i < L; ++i) {
    for (const BlockRange& r : stage_.chunks)
      if (i == r.begin) chunk_first_.push_back(layers_.size());
    if (std::none_of(stage_.chunks.begin(), stage_.chunks.end(),
                     [&](const BlockRange& r) { return i >= r.begin && i < r.end; }))
      continue;
    auto layer = std::make_unique<Layer>();
    layer->cfg = &config_;
    layer->rope = &rope_;
    layer->tp = tp_.get();
    layer->defer = &slots_->deferring;
    layer->context = &context_;
    layer->index = i;
    layer->heads = c.n_heads / R;
    layer->kv_heads = kv_heads();
    layer->ff = F / R;
    if (gpt2) {
      const std::string p = fmt::format("transformer.h.{}.", i);
      layer->norm1_w = P(p + "ln_1.weight"); layer->norm1_b = P(p + "ln_1.bias");
      layer->dnorm1_w = G(p + "ln_1.weight"); layer->dnorm1_b = G(p + "ln_1.bias");
      layer->norm2_w = P(p + "ln_2.weight"); layer->norm2_b = P(p + "ln_2.bias");
      layer->dnorm2_w = G(p + "ln_2.weight"); layer->dnorm2_b = G(p + "ln_2.bias");
      layer->qkv = lin(p + "attn.c_attn.weight", p + "attn.c_attn.bias");
      layer->o = lin(p + "attn.c_proj.weight", p + "attn.c_proj.bias");
      layer->fc = lin(p + "mlp.c_fc.weight", p + "mlp.c_fc.bias");
      layer->proj = lin(p + "mlp.c_proj.weight", p + "mlp.c_proj.bias");
    } else {
      const std::string p = fmt::format("model.layers.{}.", i);
      layer->norm1_w = P(p + "input_layernorm.weight"); layer->dnorm1_w = G(p + "input_layernorm.weight");
      layer->norm2_w = P(p + "post_attention_layernorm.weight");
      layer->dnorm2_w = G(p + "post_attention_layernorm.weight");
      // A projection's Linear: its weight and, when the config has them, its bias.
      auto llama_lin = [&](const char* name, bool bias) {
        return lin(p + name + ".weight", bias ? p + name + ".bias" : std::string());
      };
      if (c.is_mla()) {
        auto mla = std::make_unique<MlaAttention>();
        mla->d_model = c.d_model; mla->heads = c.n_heads; mla->q_rank = c.q_lora_rank; mla->kv_rank = c.kv_lora_rank;
        mla->nope = c.qk_nope_head_dim; mla->rope_dim = c.qk_rope_head_dim; mla->v_dim = c.v_head_dim;
        mla->interleave = c.rope_interleave; mla->eps = 1e-6f;  // transformers' latent norms: RMSNorm's default eps
        mla->rope = &rope_;
        const std::string a = p + "self_attn.";
        if (c.q_lora_rank > 0) {
          mla->q_a = lin(a + "q_a_proj.weight", "");
          mla->q_b = lin(a + "q_b_proj.weight", "");
          mla->q_a_norm_w = P(a + "q_a_layernorm.weight"); mla->dq_a_norm_w = G(a + "q_a_layernorm.weight");
        } else {
          mla->q = lin(a + "q_proj.weight", "");
        }
        mla->kv_a = lin(a + "kv_a_proj_with_mqa.weight", "");
        mla->kv_b = lin(a + "kv_b_proj.weight", "");
        mla->kv_a_norm_w = P(a + "kv_a_layernorm.weight"); mla->dkv_a_norm_w = G(a + "kv_a_layernorm.weight");
        layer->mla = std::move(mla);
        layer->o = lin(a + "o_proj.weight", "");
      } else {
        layer->q = llama_lin("self_attn.q_proj", c.attention_bias);
        layer->k = llama_lin("self_attn.k_proj", c.attention_bias);
        layer->v = llama_lin("self_attn.v_proj", c.attention_bias);
        layer->o = llama_lin("self_attn.o_proj", c.attention_bias);
      }
      if (c.is_moe_layer(i)) {
        auto moe = std::make_unique<MoeBlock>();
        moe->d_model = c.d_model;
        moe->d_ff = c.expert_d_ff();
        moe->num_experts = c.num_experts;
        moe->top_k = c.num_experts_per_tok;
        moe->shared_ff = c.num_shared_experts * c.expert_d_ff();
        moe->capacity_factor = c.capacity_factor;
        moe->aux_coef = static_cast<float>(c.router_aux_loss_coef / static_cast<double>(c.num_moe_layers()));
        moe->z_coef = static_cast<float>(c.router_z_loss_coef / static_cast<double>(c.num_moe_layers()));
        moe->ep = experts_;
        const std::string m = p + "block_sparse_moe.";
        moe->router = lin(m + "gate.weight", "");
        for (int64_t j = moe->first_expert(); j < moe->first_expert() + moe->local_experts(); ++j) {
          moe->w1.push_back(lin(fmt::format("{}experts.{}.w1.weight", m, j), ""));
          moe->w2.push_back(lin(fmt::format("{}experts.{}.w2.weight", m, j), ""));
          moe->w3.push_back(lin(fmt::format("{}experts.{}.w3.weight", m, j), ""));
        }
        if (c.num_shared_experts > 0) {
          moe->shared_gate = lin(m + "shared_experts.gate_proj.weight", "");
          moe->shared_up = lin(m + "shared_experts.up_proj.weight", "");
          moe->shared_down = lin(m + "shared_experts.down_proj.weight", "");
        }
        layer->moe = std::move(moe);
        layer->moe_stats = &moe_stats_;
      } else {
        layer->gate = llama_lin("mlp.gate_proj", c.mlp_bias);
        layer->up = llama_lin("mlp.up_proj", c.mlp_bias);
        layer->down = llama_lin("mlp.down_proj", c.mlp_bias);
      }
    }
    layers_.push_back(std::move(layer));
  }
  const std::string wte = gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
  if (has_head()) {
    const std::string final_norm = gpt2 ? "transformer.ln_f." : "model.norm.";
    final_norm_w_ = P(final_norm + "weight");
    dfinal_norm_w_ = G(final_norm + "weight");
    if (gpt2) {
      final_norm_b_ = P(final_norm + "bias");
      dfinal_norm_b_ = G(final_norm + "bias");
    }
    head_ = lin(c.tied_embeddings ? wte : "lm_head.weight", "");
  }
  if (has_embedding()) {
    wte_ = P(wte);
    dwte_ = G(wte);
    if (gpt2) {
      wpe_ = P("transformer.wpe.weight");
      dwpe_ = G("transformer.wpe.weight");
    }
  }
  num_params_ = offset;
  // Blocks: each starts at its first entry, after the embeddings; then the tail (or the end).
  chunk_first_.push_back(layers_.size());
  block_begin_.clear();
  size_t e = 0;
  for (const auto& layer : layers_) {
    const std::string prefix = gpt2 ? fmt::format("transformer.h.{}.", layer->index) : fmt::format("model.layers.{}.", layer->index);
    while (e < entries_.size() && !entries_[e].name.starts_with(prefix)) ++e;
    KILN_CHECK_MSG(e < entries_.size(), "block {} has no parameters", layer->index);
    block_begin_.push_back(entries_[e].offset);
  }
  const size_t tail_entries = !has_head() ? 0
                              : (gpt2 ? 2 : 1) + (c.tied_embeddings ? (has_embedding() ? 0 : 1) : 1);
  block_begin_.push_back(tail_entries > 0 ? entries_[entries_.size() - tail_entries].offset : offset);
  record_pointer_offsets();
  drop_row_parallel_biases();
}

void Transformer::drop_row_parallel_biases() {
  if (shard_.rank == 0) return;
  for (auto& l : layers_)
    for (Linear* x : {&l->o, &l->proj, &l->down}) x->b = nullptr;
}

int64_t Transformer::kv_row_width() const {
  if (config_.is_mla()) return config_.kv_lora_rank + config_.qk_rope_head_dim;
  return kv_heads() * config_.head_dim();
}

int64_t Transformer::kv_heads() const {
  return config_.n_kv_heads % shard_.size == 0 ? config_.n_kv_heads / shard_.size : 1;
}

MoeStats Transformer::take_moe_stats() { return std::exchange(moe_stats_, MoeStats{}); }

TensorParallelTraffic Transformer::take_tp_traffic() {
  const TensorParallelTraffic t = tp_->traffic;
  tp_->traffic = {};
  return t;
}

void Transformer::load_from_full(std::span<const float> full) {
  KILN_CHECK(static_cast<int64_t>(full.size()) == full_num_params_ && params_.defined());
  float* base = params_.data<float>();
  for_each_shard_run([&](int64_t local, int64_t at, int64_t n) { std::copy_n(full.data() + at, n, base + local); });
}

template <class F>
void Transformer::for_each_pointer(F&& f) {
  auto lin = [&](Linear& l) {
    f(l.w, false);
    f(l.b, false);
    f(l.dw, true);
    f(l.db, true);
  };
  for (auto& l : layers_) {
    f(l->norm1_w, false); f(l->norm1_b, false); f(l->dnorm1_w, true); f(l->dnorm1_b, true);
    f(l->norm2_w, false); f(l->norm2_b, false); f(l->dnorm2_w, true); f(l->dnorm2_b, true);
    for (Linear* x : {&l->qkv, &l->q, &l->k, &l->v, &l->o, &l->fc, &l->proj, &l->gate, &l->up, &l->down}) lin(*x);
    if (l->mla) {
      MlaAttention& a = *l->mla;
      for (Linear* x : {&a.q, &a.q_a, &a.q_b, &a.kv_a, &a.kv_b}) lin(*x);
      f(a.q_a_norm_w, false); f(a.dq_a_norm_w, true); f(a.kv_a_norm_w, false); f(a.dkv_a_norm_w, true);
    }
    if (!l->moe) continue;
    MoeBlock& m = *l->moe;
    for (Linear* x : {&m.router, &m.shared_gate, &m.shared_up, &m.shared_down}) lin(*x);
    for (auto* experts : {&m.w1, &m.w2, &m.w3})
      for (Linear& x : *experts) lin(x);
  }
  f(final_norm_w_, false); f(final_norm_b_, false); f(dfinal_norm_w_, true); f(dfinal_norm_b_, true);
  lin(head_);
  f(wte_, false); f(wpe_, false); f(dwte_, true); f(dwpe_, true);
}

void Transformer::record_pointer_offsets() {
  pointer_offset_.clear();
  const float* pb = params_.data<float>();
  const float* gb = grads_.data<float>();
  for_each_pointer([&](auto& ptr, bool is_grad) {
    pointer_offset_.push_back(ptr == nullptr ? -1 : static_cast<int64_t>(ptr - (is_grad ? gb : pb)));
  });
}

ParamRange Transformer::block_range(int64_t l) const {
  KILN_CHECK(l >= 0 && l < num_blocks());
  return {block_begin_[static_cast<size_t>(l)], block_begin_[static_cast<size_t>(l) + 1]};
}

void Transformer::bind(ParamRange r, const float* params, float* grads) {
  size_t i = 0;
  for_each_pointer([&](auto& ptr, bool is_grad) {
    const int64_t off = pointer_offset_[i++];
    if (off < r.begin || off >= r.end) return;
    if (is_grad) {
      if (grads != nullptr) ptr = grads + (off - r.begin);
    } else {
      ptr = const_cast<float*>(params) + (off - r.begin);  // a weight slot is const float* or float*
    }
  });
  drop_row_parallel_biases();
}

void Transformer::release_params() { params_ = Tensor(); }
void Transformer::release_grads() { grads_ = Tensor(); }

void Transformer::restore_storage() {
  if (!params_.defined()) params_ = Tensor::zeros({num_params_});
  if (!grads_.defined()) grads_ = Tensor::zeros({num_params_});
  bind({0, num_params_}, params_.data<float>(), grads_.data<float>());
}

float* Transformer::param(std::string_view name) {
  if (!params_.defined()) return nullptr;
  for (const ParamEntry& e : entries_)
    if (e.name == name) return params_.data<float>() + e.offset;
  return nullptr;
}

void Transformer::set_split_epilogues(bool on) {
  for (Linear* l : linears()) l->split_epilogue = on;
}

std::vector<Linear*> Transformer::linears() {
  std::vector<Linear*> out;
  for (auto& l : layers_) {
    for (Linear* lin : {&l->qkv, &l->q, &l->k, &l->v, &l->o, &l->fc, &l->proj, &l->gate, &l->up, &l->down})
      if (lin->w != nullptr) out.push_back(lin);
    if (l->mla)  // latent attention's projections (its absorbed decode reads kv_b's fp32 master)
      for (Linear* lin : {&l->mla->q, &l->mla->q_a, &l->mla->q_b, &l->mla->kv_a, &l->mla->kv_b})
        if (lin->w != nullptr) out.push_back(lin);
    // A MoE block's shared experts run through their Linears; the router (fp32) and the routed
    // experts (grouped GEMMs over raw weights) do not take backends.
    if (l->moe)
      for (Linear* lin : {&l->moe->shared_gate, &l->moe->shared_up, &l->moe->shared_down})
        if (lin->w != nullptr) out.push_back(lin);
  }
  out.push_back(&head_);
  return out;
}

float* Transformer::grad(std::string_view name) {
  if (!grads_.defined()) return nullptr;
  for (const ParamEntry& e : entries_)
    if (e.name == name) return grads_.data<float>() + e.offset;
  return nullptr;
}

Expected<std::unique_ptr<Transformer>> Transformer::create(const ModelConfig& config, uint64_t seed,
                                                           const TensorShard& shard, const PipelineStage& stage,
                                                           const ExpertShard& experts, const ContextShard& context) {
  KILN_RETURN_IF_ERROR(check_config(config));
  KILN_RETURN_IF_ERROR(check_tensor_split(config, shard.size));
  KILN_RETURN_IF_ERROR(check_expert_split(config, experts.size));
  if (experts.rank < 0 || experts.rank >= experts.size || (experts.size > 1 && experts.comm == nullptr) ||
      experts.chunks < 1)
    return invalid_argument("expert shard {} of {} needs a rank in [0, size), above size 1 a communicator, and at "
                            "least 1 dispatch chunk (got {})", experts.rank, experts.size, experts.chunks);
  if (shard.rank < 0 || shard.rank >= shard.size || (shard.size > 1 && shard.comm == nullptr))
    return invalid_argument("tensor shard {} of {} needs a rank in [0, size) and, above size 1, a communicator",
                            shard.rank, shard.size);
  int64_t last_end = 0;
  for (const BlockRange& r : stage.chunks) {
    if (r.begin < last_end || r.begin >= r.end || r.end > config.n_layers)
      return invalid_argument("pipeline stage chunk of blocks [{}, {}) is not a non-empty range of the model's {} "
                              "blocks after the previous chunk", r.begin, r.end, config.n_layers);
    last_end = r.end;
  }
  if (context.on() && (!config.is_llama() || config.is_mla() || context.attention == nullptr))
    return invalid_argument("context parallelism runs a Llama-family model with multi-head attention and a sequence "
                            "attention ({})", config.describe());
  std::unique_ptr<Transformer> t(new Transformer(config, shard, stage, experts, context));  // private constructor
  if (config.is_llama()) {
    KILN_ASSIGN_OR_RETURN(t->rope_, make_rope_table(config.rope_dim(), config.max_seq_len, config.rope_theta,
                                                     config.rope_scaling));
  }
  t->build_params(seed);
  return t;
}

void Transformer::ensure_activations(int64_t B, int64_t T) {
  Tp& tp = *tp_;
  if (acts_ && acts_->B == B && acts_->T == T && acts_->mode == ckpt_ && acts_->sp == tp.sp) return;
  g_activation_bytes = 0;
  ++buffer_epoch_;
  acts_.reset();  // free the old buffers before allocating the new ones
  Slots& sl = *slots_;
  for (Slots::Saved& saved : sl.stored) saved = {};  // every slot's activations are for the old shape
  std::fill(sl.chunk_of.begin(), sl.chunk_of.end(), -1);
  acts_ = std::make_unique<Acts>();
  Acts& a = *acts_;
  a.B = B;
  a.T = T;
  a.mode = ckpt_;
  a.sp = tp.sp;
  const int64_t N = B * T, Ns = tp.rows(N), C = config_.d_model, R = shard_.size;
  const int64_t F = config_.d_ff / R, D = config_.head_dim(), qw = config_.n_heads / R * D;
  const int64_t kvw = layers_.empty() ? 0 : layers_[0]->kv_heads * D;
  a.dresid.alloc(Ns * C); a.dnorm.alloc(N * C); a.datt.alloc(N * qw);
  a.dq.alloc(N * (config_.is_llama() ? qw : 3 * qw));
  a.dk.alloc(N * kvw); a.dv.alloc(N * kvw);
  a.dff_a.alloc(N * F); a.dff_b.alloc(N * F); a.dff_c.alloc(N * F);
  if (tp.on() && tp.sp) { tp.full.alloc(N * C); tp.partial.alloc(N * C); }
  for (auto& l : layers_)  // the live saved buffers are the old shape's too
    for (Buf Layer::*b : Layer::kSaved) (*l).*b = Buf();
  scratch_bytes_ = g_activation_bytes;
  sl.saved_bytes = 0;
  activation_bytes_ = scratch_bytes_;
}

void Transformer::alloc_saved(int chunk) {
  ++buffer_epoch_;
  Acts& a = *acts_;
  Tp& tp = *tp_;
  const int64_t N = a.B * a.T, Ns = tp.rows(N), C = config_.d_model, V = config_.vocab_size / shard_.size;
  const auto c = static_cast<size_t>(chunk);
  const size_t first = chunk_first_[c], end = chunk_first_[c + 1];
  // A chunk without the head keeps none of its buffers; each chunk keeps only its own layers'
  // and its own input and output rows (resid_index).
  const int64_t H = chunk + 1 == num_chunks() && has_head() ? 1 : 0;
  const int64_t before = g_activation_bytes;
  a.resid.resize(layers_.size() + stage_.chunks.size());
  for (size_t i = 0; i < a.resid.size(); ++i)
    a.resid[i].alloc(i >= resid_index(first, chunk) && i <= resid_index(end, chunk) ? Ns * C : 0);
  a.final_norm.alloc(H * N * C);  // whole: the LM head's input (SP gathers it in place)
  a.final_mean.alloc(H * Ns); a.final_rstd.alloc(H * Ns);
  a.logits.alloc(H * N * V); a.losses.alloc(H * N);
  if (tp.on()) { tp.ce_max.alloc(H * N); tp.ce_sum.alloc(H * 2 * N); }
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (i < first || i >= end) {
      for (Buf Layer::*b : Layer::kSaved) (*layers_[i]).*b = Buf();
      continue;
    }
    layers_[i]->alloc(a.B, a.T, Ns, i == first ? nullptr : layers_[first].get(), ckpt_);
  }
  Slots& sl = *slots_;
  sl.chunk_of[static_cast<size_t>(sl.current)] = chunk;
  sl.saved_bytes = std::max(sl.saved_bytes, g_activation_bytes - before);
  activation_bytes_ = scratch_bytes_ + sl.saved_bytes * activation_slots();
}

void Transformer::swap_saved(int slot) {
  Slots::Saved& s = slots_->stored[static_cast<size_t>(slot)];
  Acts& a = *acts_;
  std::swap(a.resid, s.resid);
  std::swap(a.final_norm, s.final_norm); std::swap(a.final_mean, s.final_mean); std::swap(a.final_rstd, s.final_rstd);
  std::swap(a.logits, s.logits); std::swap(a.losses, s.losses);
  std::swap(tp_->ce_max, s.ce_max); std::swap(tp_->ce_sum, s.ce_sum);
  std::swap(a.tokens, s.tokens); std::swap(a.targets, s.targets); std::swap(a.num_valid, s.num_valid);
  s.layers.resize(layers_.size());
  s.moe.resize(layers_.size());
  s.mla.resize(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    s.layers[i].resize(Layer::kSaved.size());
    for (size_t k = 0; k < Layer::kSaved.size(); ++k) std::swap((*layers_[i]).*Layer::kSaved[k], s.layers[i][k]);
    std::swap(layers_[i]->moe_acts, s.moe[i]);
    std::swap(layers_[i]->mla_acts, s.mla[i]);
  }
}

void Transformer::use_activation_slot(int slot) {
  KILN_CHECK(slot >= 0);
  Slots& sl = *slots_;
  if (slot == sl.current) return;
  ++buffer_epoch_;
  sl.grow(slot + 1);
  if (acts_) {
    swap_saved(sl.current);  // the live buffers go to their slot
    swap_saved(slot);        // and the slot's come in
  }
  sl.current = slot;
}

int64_t Transformer::activation_bytes() const {
  int64_t bytes = activation_bytes_;
  for (const auto& l : layers_) bytes += l->moe_acts.bytes() + l->mla_acts.bytes();
  for (const Slots::Saved& saved : slots_->stored) {
    for (const MoeActivations& m : saved.moe) bytes += m.bytes();
    for (const MlaActivations& m : saved.mla) bytes += m.bytes();
  }
  return bytes;
}

int Transformer::activation_slots() const {
  return static_cast<int>(std::count_if(slots_->chunk_of.begin(), slots_->chunk_of.end(), [](int c) { return c >= 0; }));
}
int64_t Transformer::saved_activation_bytes() const { return slots_->saved_bytes; }

void Transformer::backward_weights() {
  WeightGradQueue& q = slots_->deferred[static_cast<size_t>(slots_->current)];
  for (const DeferredWeightGrad& d : q) d.linear->backward_weight_f32(d.dy.data<float>(), d.x, d.n);
  q.clear();
}

bool Transformer::weights_pending() const { return !slots_->deferred[static_cast<size_t>(slots_->current)].empty(); }

int64_t Transformer::deferred_weight_bytes() const {
  int64_t bytes = 0;
  for (const WeightGradQueue& q : slots_->deferred)
    for (const DeferredWeightGrad& d : q) bytes += d.dy.nbytes();
  return bytes;
}

// ---- forward / backward -------------------------------------------------------------------
Expected<float> Transformer::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) {
  return forward_impl(tokens, targets, B, T, nullptr);
}

int64_t KVCache::bytes_per_token() const {
  if (k.empty() || max_len == 0) return 0;
  return static_cast<int64_t>(k.size()) * (k[0].numel() + v[0].numel()) / max_len * static_cast<int64_t>(sizeof(float));
}

KVCache Transformer::make_kv_cache(int64_t max_len) const {
  KVCache cache;
  cache.max_len = std::min(max_len, config_.max_seq_len);
  const int64_t width = kv_row_width();
  for (size_t l = 0; l < layers_.size(); ++l) {
    cache.k.push_back(Tensor::zeros({cache.max_len, width}));
    cache.v.push_back(Tensor::zeros({cache.max_len, config_.is_mla() ? 0 : width}));  // MLA: values are the key rows
  }
  return cache;
}

Expected<const float*> Transformer::forward_cached(const int32_t* tokens, int64_t n, KVCache& cache) {
  if (n <= 0) return invalid_argument("[forward_cached] no tokens");
  if (!stage_.whole(config_)) return invalid_argument("[forward_cached] needs the whole model, not a pipeline stage");
  if (context_.on()) return invalid_argument("[forward_cached] needs the whole sequence, not a context-parallel shard");
  if (cache.len + n > cache.max_len)
    return out_of_range("[forward_cached] {} cached + {} new tokens exceed the cache of {}", cache.len, n, cache.max_len);
  if (static_cast<int64_t>(cache.k.size()) != config_.n_layers)
    return invalid_argument("[forward_cached] the cache has {} layers, the model {}", cache.k.size(), config_.n_layers);
  KILN_RETURN_IF_ERROR(forward_impl(tokens, nullptr, 1, n, &cache).status());
  cache.len += n;
  return tp_->whole_logits(acts_->logits.p, n, config_.vocab_size / shard_.size);
}

namespace {
// Vocab-parallel embedding: out (N, C) = this shard's rows (ids [v0, v0 + vl) of the table)
// for the ids it holds and 0 for the others; the sum over the shards is the lookup.
void embedding_shard_forward(float* out, const int32_t* ids, const float* w, int64_t n, int64_t v0, int64_t vl,
                             int64_t c) {
  parallel_for(n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t id = ids[r] - v0;
      if (id >= 0 && id < vl) std::memcpy(out + r * c, w + id * c, static_cast<size_t>(c) * sizeof(float));
      else std::fill(out + r * c, out + (r + 1) * c, 0.0f);
    }
  });
}
// dw (vl, C) += the rows of dout whose ids this shard holds; threads split the columns and
// add in token order (deterministic, as the cpu kernel).
void embedding_shard_backward(float* dw, const float* dout, const int32_t* ids, int64_t n, int64_t v0, int64_t vl,
                              int64_t c) {
  parallel_for(c, 64, [&](int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t id = ids[r] - v0;
      if (id < 0 || id >= vl) continue;
      for (int64_t j = c0; j < c1; ++j) dw[id * c + j] += dout[r * c + j];
    }
  });
}
// GPT-2 positions for token rows [row0, row0 + rows) of sequences of T tokens at positions
// [pos, pos + T): x += wpe rows, or (backward) dwpe += dx rows, one sequence's segment at a time.
template <class F>
void for_each_position_segment(int64_t row0, int64_t rows, int64_t T, F&& f) {
  for (int64_t r = row0; r < row0 + rows;) {
    const int64_t t = r % T, len = std::min(T - t, row0 + rows - r);
    f(r - row0, t, len);  // local row, position in the sequence, rows
    r += len;
  }
}
void add_positions(float* x, const float* wpe, int64_t row0, int64_t rows, int64_t T, int64_t pos, int64_t C) {
  if (row0 % T == 0 && rows % T == 0) return cpu::positional_forward(x, wpe + pos * C, rows / T, T, C);
  for_each_position_segment(row0, rows, T, [&](int64_t at, int64_t t, int64_t len) {
    cpu::positional_forward(x + at * C, wpe + (pos + t) * C, 1, len, C);
  });
}
void positions_backward(float* dwpe, const float* dx, int64_t row0, int64_t rows, int64_t T, int64_t C) {
  if (row0 % T == 0 && rows % T == 0) return cpu::positional_backward(dwpe, dx, rows / T, T, C);
  for_each_position_segment(row0, rows, T, [&](int64_t at, int64_t t, int64_t len) {
    cpu::positional_backward(dwpe + t * C, dx + at * C, 1, len, C);
  });
}
}  // namespace

Expected<float> Transformer::forward_stage(const int32_t* tokens, const int32_t* targets, const float* input,
                                           int64_t B, int64_t T, int chunk) {
  return forward_impl(tokens, targets, B, T, nullptr, input, chunk);
}

Expected<float> Transformer::forward_impl(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                                          KVCache* cache, const float* input, int chunk) {
  trace::Scope ts(trace::Category::kModel, "forward", [&](trace::Event& e) { e.set_dims({B, T}); });
  const ModelConfig& c = config_;
  if (B <= 0 || T <= 0 || T > c.max_seq_len)
    return invalid_argument("[forward] batch {} × seq_len {} must be positive with seq_len <= {}", B, T, c.max_seq_len);
  if (chunk < 0 || chunk >= num_chunks())
    return invalid_argument("[forward] chunk {} of a stage of {} chunks", chunk, num_chunks());
  const BlockRange range = stage_.chunks[static_cast<size_t>(chunk)];
  const bool embedding = chunk == 0 && has_embedding(), head = chunk + 1 == num_chunks() && has_head();
  const int64_t pos = cache ? cache->len : 0;
  const int64_t N = B * T, C = c.d_model, V = c.vocab_size;
  if (embedding) {
    if (tokens == nullptr) return invalid_argument("[forward] the first stage needs tokens");
    KILN_RETURN_IF_ERROR(check_token_ids({tokens, static_cast<size_t>(N)}, V));
  } else if (input == nullptr) {
    return invalid_argument("[forward] pipeline stage of blocks [{}, {}) needs the previous stage's output",
                            range.begin, range.end);
  }
  if (!head) targets = nullptr;  // the loss is the last stage's
  if (targets) KILN_RETURN_IF_ERROR(check_targets({targets, static_cast<size_t>(N)}, V));
  Tp& tp = *tp_;
  tp.sp = shard_.sequence_parallel && tp.on() && cache == nullptr;
  if (tp.sp && N % shard_.size != 0)
    return invalid_argument("[forward] sequence parallelism over {} ranks needs batch × seq_len ({} × {}) divisible by it",
                            shard_.size, B, T);
  ensure_activations(B, T);
  Slots& sl = *slots_;
  const auto cur = static_cast<size_t>(sl.current);
  if (sl.chunk_of[cur] != chunk) alloc_saved(chunk);
  Acts& a = *acts_;
  note_graph_breaks();
  // The ids backward reads again (a graph's copy runs at replay too).
  const auto keep_ids = [&](std::vector<int32_t>& dst, const int32_t* src) {
    grow_tracked(dst, static_cast<size_t>(N));
    graph::op("copy_ids", {graph::writes(dst.data(), N), graph::reads(src, N)}, [N](const graph::Access* io) {
      std::memcpy(io[0].ptr, io[1].ptr, static_cast<size_t>(N) * sizeof(int32_t));
    });
  };
  if (embedding) keep_ids(a.tokens, tokens);
  if (const int32_t* t = targets ? targets : tokens; head && t) keep_ids(a.targets, t);
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  const int64_t Ns = tp.rows(N), row0 = tp.row0(N), Vl = V / shard_.size;
  const size_t first = chunk_first_[static_cast<size_t>(chunk)], end = chunk_first_[static_cast<size_t>(chunk) + 1];
  float* x0 = a.resid[resid_index(first, chunk)].p;
  if (hooks_) hooks_->before_model(Pass::kForward);
  if (embedding) {
    embed(x0, tokens, N);
    if (gpt2) add_positions(x0, wpe_, row0, Ns, T, pos, C);
  } else {
    std::memcpy(x0, input, static_cast<size_t>(Ns * C) * sizeof(float));
  }
  for (size_t l = first; l < end; ++l) {
    float* ck = cache ? cache->k[l].data<float>() : nullptr;
    float* cv = cache && cache->v[l].numel() > 0 ? cache->v[l].data<float>() : ck;  // MLA: the key rows
    if (hooks_) hooks_->before_block(static_cast<int64_t>(l), Pass::kForward);
    layers_[l]->forward(a.resid[resid_index(l + 1, chunk)].p, a.resid[resid_index(l, chunk)].p, B, T, ck, cv, pos);
    if (hooks_) hooks_->after_block(static_cast<int64_t>(l), Pass::kForward);
  }
  a.num_valid = 0;
  if (!head) return 0.0f;
  final_norm(a.final_norm.p + row0 * C, a.resid[resid_index(end, chunk)].p, Ns);
  tp.gather_into(a.final_norm.p, N, C);
  head_.forward(a.logits.p, a.final_norm.p, N);
  if (!targets) return 0.0f;
  tp.cross_entropy_forward(a.losses.p, a.logits.p, targets, N, Vl);
  // The mean over the targets that count (a step of its own: a replayed graph computes it too).
  graph::op("mean_loss",
            {graph::writes(&a.loss, 1), graph::writes(&a.num_valid, 1), graph::reads(a.losses.p, N),
             graph::reads(targets, N)},
            [N](const graph::Access* io) {
              const float* losses = io[2].as<float>();
              const int32_t* t = io[3].as<int32_t>();
              double sum = 0;
              int64_t valid = 0;
              for (int64_t i = 0; i < N; ++i) {
                if (t[i] == kIgnoreTarget) continue;
                sum += losses[i];
                ++valid;
              }
              *io[1].mut<int64_t>() = valid;
              *io[0].mut<float>() = valid ? static_cast<float>(sum / static_cast<double>(valid)) : 0.0f;
            });
  return a.loss;
}

const float* Transformer::stage_output(int chunk) const {
  if (!acts_) return nullptr;
  return acts_->resid[resid_index(chunk_first_[static_cast<size_t>(chunk) + 1], chunk)].p;
}
const float* Transformer::input_grad() const { return acts_ ? acts_->dresid.p : nullptr; }

void Transformer::embed(float* out, const int32_t* tokens, int64_t N) {
  Tp& tp = *tp_;
  const int64_t C = config_.d_model, V = config_.vocab_size;
  if (!tp.on()) return cpu::embedding_forward(out, tokens, wte_, N, V, C);
  const int64_t Vl = V / shard_.size;
  float* whole = tp.sp ? tp.partial.p : out;  // (N, C) partial lookups
  embedding_shard_forward(whole, tokens, wte_, N, shard_.rank * Vl, Vl, C);
  const float* mine = tp.reduce(whole, N, C);
  if (tp.sp) std::memcpy(out, mine, static_cast<size_t>(tp.rows(N) * C) * sizeof(float));
}

void Transformer::final_norm(float* y, const float* x, int64_t rows) {
  const ModelConfig& c = config_;
  Acts& a = *acts_;
  if (c.family == ModelFamily::kGpt2) {
    cpu::layernorm_forward(y, a.final_mean.p, a.final_rstd.p, x, final_norm_w_, final_norm_b_, rows, c.d_model,
                           c.norm_eps);
  } else {
    cpu::rmsnorm_forward(y, a.final_rstd.p, x, final_norm_w_, rows, c.d_model, c.norm_eps);
  }
}

const float* Transformer::logits() const { return acts_ ? acts_->logits.p : nullptr; }

const float* Transformer::last_loss_ptr() const { return acts_ ? &acts_->loss : nullptr; }

void Transformer::note_graph_breaks() {
  if (!graph::recording()) return;
  if (hooks_ && !hooks_->captured()) graph::graph_break("the parallel plan's hooks run between the model's ops");
  if (context_.on()) graph::graph_break("context-parallel attention exchanges K/V between ranks");
  if (tp_->on()) graph::graph_break("tensor-parallel collectives run outside the graph");
  for (const Linear* l : linears())
    if (l->backend && !l->backend->captured()) graph::graph_break("a Linear backend that graph capture does not record");
}

template <class T>
void Transformer::grow_tracked(std::vector<T>& v, size_t n) {
  const void* before = v.data();
  if (v.size() < n) v.resize(n);
  if (v.data() != before) ++buffer_epoch_;
}

std::vector<std::pair<const void*, int64_t>> Transformer::graph_outputs() const {
  if (!acts_) return {};
  const Acts& a = *acts_;
  return {{&a.loss, int64_t{sizeof(float)}},
          {&a.num_valid, int64_t{sizeof(int64_t)}},
          {a.logits.p, a.logits.t.nbytes()}};
}

void Transformer::zero_grad() {
  if (!grads_.defined()) return;
  // In 1 MiB pieces over the pool: one thread's memset of GPT-2 124M's 497 MB of gradients took
  // 49 ms (10 GB/s, a twentieth of W1b's step at 2 threads), both threads' 26 ms (Xeon).
  graph::op("zero_grad", {graph::writes_bytes(grads_.raw_data(), grads_.nbytes())},
            [](const graph::Access* io) {
              constexpr int64_t kPiece = int64_t{1} << 20;
              char* p = static_cast<char*>(io[0].ptr);
              const int64_t bytes = io[0].bytes;
              thread_pool().run((bytes + kPiece - 1) / kPiece, [&](int64_t i, int) {
                std::memset(p + i * kPiece, 0,
                            static_cast<size_t>(std::min(kPiece, bytes - i * kPiece)));
              });
            });
}

void Transformer::backward(float loss_scale) { backward_stage(nullptr, loss_scale); }

void Transformer::backward_stage(const float* doutput, float loss_scale, bool defer_weights, int chunk) {
  KILN_TRACE_SCOPE(kModel, "backward");
  KILN_CHECK(chunk >= 0 && chunk < num_chunks());
  const bool embedding = chunk == 0 && has_embedding(), head = chunk + 1 == num_chunks() && has_head();
  KILN_CHECK_MSG(acts_ && (!head || acts_->num_valid > 0), "backward() needs a forward() with targets first");
  KILN_CHECK_MSG(slots_->chunk_of[static_cast<size_t>(slots_->current)] == chunk,
                 "backward of chunk {} on an activation slot its forward did not fill", chunk);
  KILN_CHECK_MSG(head || doutput != nullptr, "a pipeline stage's chunk {} needs the next stage's input gradient", chunk);
  const ModelConfig& c = config_;
  Acts& a = *acts_;
  Tp& tp = *tp_;
  const int64_t B = a.B, T = a.T, N = B * T, Ns = tp.rows(N), C = c.d_model, V = c.vocab_size / shard_.size;
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  const size_t first = chunk_first_[static_cast<size_t>(chunk)], end = chunk_first_[static_cast<size_t>(chunk) + 1];
  slots_->deferring = defer_weights ? &slots_->deferred[static_cast<size_t>(slots_->current)] : nullptr;
  if (hooks_) hooks_->before_model(Pass::kBackward);
  if (head) {
    // dlosses = 1/num_valid for the mean; dlogits overwrite the logits.
    graph::op("mean_loss_backward", {graph::writes(a.losses.p, N), graph::reads(&a.num_valid, 1)},
              [N, loss_scale](const graph::Access* io) {
                const float d = loss_scale / static_cast<float>(*io[1].as<int64_t>());
                for (int64_t i = 0; i < N; ++i) io[0].mut<float>()[i] = d;
              });
    tp.cross_entropy_backward(a.logits.p, a.logits.p, a.targets.data(), a.losses.p, N, V);
    linear_backward(slots_->deferring, head_, a.dnorm.p, a.logits.p, a.final_norm.p, N, false);  // a partial sum over vocabulary shards
    const float* dnorm = tp.reduce(a.dnorm.p, N, C);
    const float* x = a.resid[resid_index(end, chunk)].p;
    if (gpt2) {
      cpu::layernorm_backward(a.dresid.p, dfinal_norm_w_, dfinal_norm_b_, dnorm, x, final_norm_w_, a.final_mean.p,
                              a.final_rstd.p, Ns, C);
    } else {
      cpu::rmsnorm_backward(a.dresid.p, dfinal_norm_w_, dnorm, x, final_norm_w_, a.final_rstd.p, Ns, C);
    }
    if (hooks_) hooks_->grads_ready(tail_range());
  } else {
    std::memcpy(a.dresid.p, doutput, static_cast<size_t>(Ns * C) * sizeof(float));
  }
  KILN_CHECK_MSG(a.mode == ckpt_, "set_checkpointing() between forward() and backward()");
  for (size_t l = end; l-- > first;) {
    const auto li = static_cast<int64_t>(l);
    if (hooks_) hooks_->before_block(li, Pass::kBackward);
    // The chunk's last layer's buffers still hold its forward (the shared ones were written by
    // it last): only the layers below it recompute.
    const bool recompute = l + 1 < end;
    const float* x = a.resid[resid_index(l, chunk)].p;
    // Full checkpointing: re-run the layer from its saved input (its output, rewritten with the
    // same values, is no longer read), filling the shared buffers its backward reads.
    if (recompute && ckpt_ == CheckpointMode::kFull) {
      KILN_TRACE_SCOPE(kModel, "recompute");  // its kernels are hardware FLOPs, not model FLOPs
      layers_[l]->recomputing = true;
      layers_[l]->forward(a.resid[resid_index(l + 1, chunk)].p, x, B, T);
      layers_[l]->recomputing = false;
    }
    layers_[l]->backward(a.dresid.p, x, B, T, a, recompute && ckpt_ == CheckpointMode::kSelective);
    if (hooks_) {
      hooks_->after_block(li, Pass::kBackward);
      hooks_->grads_ready(block_range(li));
    }
  }
  if (embedding) {
    if (tp.on()) {
      embedding_shard_backward(dwte_, tp.gather(a.dresid.p, N, C), a.tokens.data(), N, shard_.rank * V, V, C);
    } else {
      cpu::embedding_backward(dwte_, a.dresid.p, a.tokens.data(), N, V, C);
    }
    if (gpt2) positions_backward(dwpe_, a.dresid.p, tp.row0(N), Ns, T, C);
    if (hooks_) hooks_->grads_ready(head_range());
  }
  slots_->deferring = nullptr;
}

// ---- serving: the paged KV cache ------------------------------------------------------------
int64_t PagedKvCache::bytes() const {
  int64_t n = 0;
  for (size_t l = 0; l < k.size(); ++l) n += k[l].numel() + v[l].numel();
  return n * static_cast<int64_t>(sizeof(float));
}

void PagedKvCache::copy_block(int32_t src, int32_t dst, int64_t num_tokens) {
  KILN_CHECK(src >= 0 && src < num_blocks && dst >= 0 && dst < num_blocks && num_tokens >= 0 &&
             num_tokens <= block_size);
  const size_t n = static_cast<size_t>(num_tokens * row_width) * sizeof(float);
  for (size_t l = 0; l < k.size(); ++l) {
    std::memcpy(k[l].data<float>() + dst * block_size * row_width, k[l].data<float>() + src * block_size * row_width, n);
    if (v[l].numel() == 0) continue;  // latent attention: the values are the key rows
    std::memcpy(v[l].data<float>() + dst * block_size * row_width, v[l].data<float>() + src * block_size * row_width, n);
  }
}

namespace {
// Calls fn(row, slot, rows) for each run of the positions [pos, pos + n) inside one block: the
// first packed row, its slot in the pool and how many rows follow it there.
template <class Fn>
void for_each_block_run(std::span<const int32_t> blocks, int64_t block_size, int64_t pos, int64_t n, Fn fn) {
  for (int64_t i = 0; i < n;) {
    const int64_t p = pos + i, rows = std::min(n - i, block_size - p % block_size);
    KILN_CHECK(p / block_size < static_cast<int64_t>(blocks.size()));
    fn(i, int64_t{blocks[static_cast<size_t>(p / block_size)]} * block_size + p % block_size, rows);
    i += rows;
  }
}
}  // namespace

void PagedKvCache::read_rows(int64_t layer, std::span<const int32_t> blocks, int64_t pos, int64_t n, float* kd,
                             float* vd) const {
  const auto l = static_cast<size_t>(layer);
  for_each_block_run(blocks, block_size, pos, n, [&](int64_t i, int64_t slot, int64_t rows) {
    const size_t bytes = static_cast<size_t>(rows * row_width) * sizeof(float);
    std::memcpy(kd + i * row_width, k[l].data<float>() + slot * row_width, bytes);
    if (vd != nullptr && v[l].numel() > 0) std::memcpy(vd + i * row_width, v[l].data<float>() + slot * row_width, bytes);
  });
}

void PagedKvCache::write_rows(int64_t layer, std::span<const int32_t> blocks, int64_t pos, int64_t n, const float* ks,
                              const float* vs) {
  const auto l = static_cast<size_t>(layer);
  for_each_block_run(blocks, block_size, pos, n, [&](int64_t i, int64_t slot, int64_t rows) {
    const size_t bytes = static_cast<size_t>(rows * row_width) * sizeof(float);
    std::memcpy(k[l].data<float>() + slot * row_width, ks + i * row_width, bytes);
    if (vs != nullptr && v[l].numel() > 0) std::memcpy(v[l].data<float>() + slot * row_width, vs + i * row_width, bytes);
  });
}

PagedKvCache Transformer::make_paged_kv_cache(int64_t num_blocks, int64_t block_size) const {
  PagedKvCache c;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.row_width = kv_row_width();
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    c.k.push_back(Tensor::zeros({num_blocks * block_size, c.row_width}));
    c.v.push_back(Tensor::zeros({num_blocks * block_size, config_.is_mla() ? 0 : c.row_width}));  // MLA: the key rows
  }
  return c;
}

Status Transformer::check_paged(const PagedBatch& b, const PagedKvCache& cache) const {
  if (!stage_.whole(config_)) return invalid_argument("[forward_paged] needs the whole model, not a pipeline stage");
  if (context_.on()) return invalid_argument("[forward_paged] needs the whole sequence, not a context-parallel shard");
  const ModelConfig& c = config_;
  const int64_t S = static_cast<int64_t>(b.num_new.size()), N = static_cast<int64_t>(b.tokens.size());
  const int64_t bs = cache.block_size, maxb = b.max_blocks_per_seq;
  if (S == 0 || static_cast<int64_t>(b.num_cached.size()) != S || maxb < 1 ||
      static_cast<int64_t>(b.block_table.size()) != S * maxb)
    return invalid_argument("[forward_paged] {} sequences need num_cached ({}) of the same size and a block table of "
                            "{} × max_blocks_per_seq ({}), got {}", S, b.num_cached.size(), S, maxb, b.block_table.size());
  const int64_t kv_width = kv_row_width();
  if (static_cast<int64_t>(cache.k.size()) != c.n_layers || cache.row_width != kv_width || bs < 1)
    return invalid_argument("[forward_paged] the cache has {} layers of rows {}, the model {} of {}", cache.k.size(),
                            cache.row_width, c.n_layers, kv_width);
  int64_t rows = 0;
  for (int64_t i = 0; i < S; ++i) {
    const int64_t n = b.num_new[i], end = int64_t{b.num_cached[i]} + n;
    if (n < 1 || b.num_cached[i] < 0 || end > c.max_seq_len || (end + bs - 1) / bs > maxb)
      return invalid_argument("[forward_paged] sequence {}: {} cached + {} new tokens must be positive, within the "
                              "context {} and the {} blocks of {} tokens of its table", i, b.num_cached[i], n,
                              c.max_seq_len, maxb, bs);
    for (int64_t j = 0; j < (end + bs - 1) / bs; ++j) {
      const int32_t id = b.block_table[i * maxb + j];
      if (id < 0 || id >= cache.num_blocks)
        return invalid_argument("[forward_paged] sequence {} block {} is {}, the cache has {}", i, j, id, cache.num_blocks);
    }
    rows += n;
  }
  if (rows != N) return invalid_argument("[forward_paged] num_new sums to {}, tokens has {}", rows, N);
  for (int32_t r : b.logit_rows)
    if (r < 0 || r >= N) return invalid_argument("[forward_paged] logit row {} of {} tokens", r, N);
  return check_token_ids(b.tokens, c.vocab_size);
}

Expected<const float*> Transformer::forward_paged(const PagedBatch& b, PagedKvCache& cache) {
  KILN_RETURN_IF_ERROR(check_paged(b, cache));
  const ModelConfig& c = config_;
  const int64_t S = static_cast<int64_t>(b.num_new.size()), N = static_cast<int64_t>(b.tokens.size());
  const int64_t C = c.d_model, V = c.vocab_size, M = static_cast<int64_t>(b.logit_rows.size());
  const int64_t bs = cache.block_size;
  note_graph_breaks();
  if (cache.on_layer_written) graph::graph_break("disaggregated serving sends each layer's K/V as it is written");
  if (!paged_) paged_ = std::make_unique<PagedScratch>();
  PagedScratch& ps = *paged_;
  int64_t gather_rows = 0;  // the longest prefill chunk's K/V, gathered for the flash kernel
  for (int64_t i = 0; i < S; ++i)
    if (b.num_new[i] > kSplitKvMaxQueries) gather_rows = std::max<int64_t>(gather_rows, b.num_cached[i] + b.num_new[i]);

  // Activation buffers for at least N rows, grown in steps of 64 so a varying batch rarely
  // reallocates. Serving never runs sequence parallelism.
  tp_->sp = false;
  if (!acts_ || acts_->B != 1 || acts_->T < N || acts_->sp) ensure_activations(1, (N + 63) / 64 * 64);
  if (slots_->chunk_of[static_cast<size_t>(slots_->current)] != 0) alloc_saved(0);
  Acts& a = *acts_;
  a.num_valid = 0;
  const size_t gather_floats = static_cast<size_t>(2 * gather_rows * cache.row_width);
  grow_tracked(ps.gather, gather_floats);
  grow_tracked(ps.row_begin, static_cast<size_t>(S + 1));
  grow_tracked(ps.kv_lens, static_cast<size_t>(S));
  grow_tracked(ps.x, static_cast<size_t>(M * C));
  // Each sequence's first row and its K/V length, from the batch (read when the step runs).
  graph::op("paged_positions",
            {graph::writes(ps.row_begin.data(), S + 1), graph::writes(ps.kv_lens.data(), S),
             graph::reads(b.num_cached.data(), S), graph::reads(b.num_new.data(), S)},
            [S](const graph::Access* io) {
              int32_t *row_begin = io[0].mut<int32_t>(), *kv_lens = io[1].mut<int32_t>();
              const int32_t *cached = io[2].as<int32_t>(), *num_new = io[3].as<int32_t>();
              row_begin[0] = 0;
              for (int64_t i = 0; i < S; ++i) {
                row_begin[i + 1] = row_begin[i] + num_new[i];
                kv_lens[i] = cached[i] + num_new[i];
              }
            });
  embed(a.resid[0].p, b.tokens.data(), N);
  if (c.family == ModelFamily::kGpt2) {
    graph::op("positional_paged",
              {graph::writes(a.resid[0].p, N * C), graph::reads(a.resid[0].p, N * C), graph::reads(wpe_, c.max_seq_len * C),
               graph::reads(ps.row_begin.data(), S + 1), graph::reads(b.num_cached.data(), S),
               graph::reads(b.num_new.data(), S)},
              [S, C](const graph::Access* io) {
                const int32_t *row_begin = io[3].as<int32_t>(), *cached = io[4].as<int32_t>();
                const int32_t* num_new = io[5].as<int32_t>();
                for (int64_t i = 0; i < S; ++i)
                  cpu::positional_forward(io[0].mut<float>() + int64_t{row_begin[i]} * C,
                                          io[2].as<float>() + int64_t{cached[i]} * C, 1, num_new[i], C);
              });
  }
  PagedStep step;
  step.batch = &b;
  step.row_begin = ps.row_begin.data();
  step.kv_lens = ps.kv_lens.data();
  step.block_size = bs;
  step.gather = ps.gather.data();
  step.pool_rows = cache.num_blocks * bs;
  for (size_t l = 0; l < layers_.size(); ++l) {
    step.k_pool = cache.k[l].data<float>();
    step.v_pool = cache.v[l].numel() > 0 ? cache.v[l].data<float>() : step.k_pool;  // MLA: the key rows
    layers_[l]->forward(a.resid[l + 1].p, a.resid[l].p, 1, N, nullptr, nullptr, 0, &step);
    if (cache.on_layer_written) cache.on_layer_written(static_cast<int64_t>(l));
  }
  if (M == 0) return a.logits.p;
  // Final norm and LM head only for the rows that get logits: x (M, C) -> logits (M, V).
  graph::op("gather_rows",
            {graph::writes(ps.x.data(), M * C), graph::reads(a.resid.back().p, N * C), graph::reads(b.logit_rows.data(), M)},
            [M, C](const graph::Access* io) {
              const int32_t* logit_rows = io[2].as<int32_t>();
              for (int64_t r = 0; r < M; ++r)
                std::memcpy(io[0].mut<float>() + r * C, io[1].as<float>() + int64_t{logit_rows[r]} * C,
                            static_cast<size_t>(C) * sizeof(float));
            });
  final_norm(a.final_norm.p, ps.x.data(), M);
  head_.forward(a.logits.p, a.final_norm.p, M);
  return tp_->whole_logits(a.logits.p, M, V / shard_.size);
}

}  // namespace kiln
