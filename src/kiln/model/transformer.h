// The transformer of both families, llm.c style: all parameters in one flat fp32 buffer (and
// gradients in a twin), named with Hugging Face tensor names; each layer owns forward() and
// backward() and saves exactly the activations its backward needs. No general autograd.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/kernels/attention.h"
#include "kiln/kernels/gemm.h"
#include "kiln/kernels/rope.h"
#include "kiln/model/checkpoint_mode.h"
#include "kiln/model/config.h"

namespace kiln {

namespace comm {
class Communicator;
}

// The tensor-parallel shard a model is built for (Megatron's layout; src/kiln/parallel builds
// it from the mesh's tp axis). Over `size` ranks: attention heads and FFN columns are split
// (Q, K, V, gate, up and GPT-2's c_attn, c_fc by output rows: column-parallel; o, down and
// GPT-2's c_proj by input columns: row-parallel, one reduction after each), KV heads are split
// when size divides n_kv_heads and replicated (each rank holds the one its query heads read)
// when n_kv_heads divides size, and the vocabulary is split (vocab-parallel embedding, LM head
// and cross-entropy: no rank holds the full logits). Norms, row-parallel biases and GPT-2's
// position table are whole on every rank. size 1 is the single-process model: the same code.
struct TensorShard {
  int rank = 0, size = 1;
  comm::Communicator* comm = nullptr;  // the tp ranks; null at size 1
  // Sequence parallelism (training): the norm and residual regions hold N / size of the N
  // token rows; an all-gather enters each column-parallel block, a reduce-scatter leaves each
  // row-parallel one (instead of the all-reduces). The KV-cache and paged paths do not use it.
  bool sequence_parallel = false;
};

// The expert-parallel shard a MoE model is built for (src/kiln/parallel/expert_parallel.h):
// over `size` ranks, experts [rank · E / size, (rank + 1) · E / size) of every MoE block are this
// rank's; a block sends its tokens' rows to the ranks holding their experts (all-to-all over
// `comm`) and combines the results back (model/moe.h). `batch` is the group of ranks whose
// micro-batches together make the single-process batch (every data-parallel rank, in data-rank
// order): the load-balancing loss's statistics and the capacity limit are taken over it, so a
// layout computes the single-process model's losses, drops and gradients. `chunks`: tokens are
// dispatched in that many chunks, chunk i + 1's all-to-all in flight while chunk i's experts
// run. The default is one process: its own batch, all experts.
struct ExpertShard {
  int rank = 0, size = 1;
  comm::Communicator* comm = nullptr;   // the ep ranks; null at size 1
  comm::Communicator* batch = nullptr;  // the data-parallel ranks; null: this process's batch only
  int chunks = 1;
};

// What a rank put through the tensor-parallel collectives (bytes of each whole buffer: an
// all-reduce's, an all-gather's output, a reduce-scatter's input), and their time: they block
// the layer that calls them.
struct TensorParallelTraffic {
  int64_t all_reduce_bytes = 0, all_gather_bytes = 0, reduce_scatter_bytes = 0;
  int64_t cross_entropy_bytes = 0;  // the vocab-parallel loss's row max, sum and target logit
  int64_t logits_bytes = 0;         // whole logits gathered for sampling (decode)
  double seconds = 0;
};

// Attention over a sequence split across ranks (context parallelism; src/kiln/parallel implements
// it with ring attention or Ulysses): the calls take this rank's rows exactly as
// cpu::attention_forward / attention_backward would, and give the whole sequence's attention of
// them. Every rank of the group calls them in the same order.
class SequenceAttention {
 public:
  virtual ~SequenceAttention() = default;
  virtual void forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionParams& local) const = 0;
  virtual void backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const AttentionParams& local) const = 0;
};

// The context-parallel shard a model is built for (src/kiln/parallel/context_parallel_plan.h): of
// each sequence this rank holds the token positions [start, start + len) of `segments`, in that
// order (a contiguous or zig-zag layout), so a forward of seq_len T / C rows runs RoPE at those
// positions and its attention through `attention`; everything else is local. No segments: the
// whole sequence (one process).
struct ContextShard {
  std::vector<std::pair<int64_t, int64_t>> segments;  // (start, len)
  const SequenceAttention* attention = nullptr;
  bool on() const { return !segments.empty(); }
};

// MoE routing (model/moe.h), summed over the model's MoE blocks and forwards (batch-group-wide
// values).
struct MoeStats {
  int64_t blocks = 0;
  double aux = 0, z = 0;                    // Σ over blocks of aux_l and z_l (before the coefficients)
  int64_t assignments = 0, dropped = 0;     // Σ over blocks: N · k and those over capacity
  std::vector<int64_t> tokens_per_expert;   // (blocks, E): assignments routed to each expert
  // Expert parallelism: bytes this rank sent through the all-to-alls (dispatch and combine,
  // forward and backward), their time on the communication thread, and the compute thread's
  // wait for them (exposed).
  int64_t all_to_all_bytes = 0;
  double all_to_all_seconds = 0, exposed_seconds = 0;
  double aux_mean() const { return blocks ? aux / blocks : 0.0; }
  double z_mean() const { return blocks ? z / blocks : 0.0; }
  double drop_rate() const { return assignments ? static_cast<double>(dropped) / assignments : 0.0; }
  // max over experts / mean of the tokens per expert, over all blocks (1: balanced).
  double max_over_mean() const;
  void add(const MoeStats& o);
};

// Blocks [begin, end) of a model.
struct BlockRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const BlockRange&) const = default;
};

// The pipeline stage a model is built for (src/kiln/parallel/pipeline.h): one or more chunks of
// blocks (interleaved schedules give a rank several, e.g. blocks [0, 2) and [4, 6)), ascending
// and disjoint; each chunk runs forward and backward alone (forward_stage's `chunk`). The model
// with block 0 also holds the embedding, the one with the last block the final norm, the LM
// head and the loss. With tied embeddings a model with the head but not the embedding holds a
// copy of the token embedding (Megatron's layout): its gradient adds to the first stage's, and
// checkpoints take the first stage's. No chunks: the whole model.
struct PipelineStage {
  std::vector<BlockRange> chunks;
  static PipelineStage blocks(int64_t begin, int64_t end) { return {{{begin, end}}}; }
  bool whole(const ModelConfig& c) const {
    return chunks.empty() || (chunks.size() == 1 && chunks[0].begin == 0 && chunks[0].end == c.n_layers);
  }
  bool operator==(const PipelineStage&) const = default;
};

// InvalidArgument naming the counts when `c` does not split over tp ranks: tp >= 1 divides
// n_heads, d_ff and vocab_size, and tp divides n_kv_heads or n_kv_heads divides tp; a MoE
// model does not split (its experts shard over ep instead).
Status check_tensor_split(const ModelConfig& c, int tp);
// InvalidArgument when `c`'s experts do not shard over ep ranks: ep >= 1 divides num_experts
// (ep > 1 needs a MoE model).
Status check_expert_split(const ModelConfig& c, int ep);

// Where a shard's parameter sits in the whole (single-process) tensor.
struct ParamSplit {
  enum class Kind : uint8_t {
    kWhole,    // the whole tensor (replicated over the tp ranks)
    kRows,     // rows [begin, begin + count) of each of `parts` equal blocks of dim 0
    kColumns,  // columns [begin, begin + count) of every row (a matrix)
  };
  Kind kind = Kind::kWhole;
  int64_t parts = 1;  // kRows: GPT-2's fused c_attn is q | k | v, three blocks split alike
  int64_t begin = 0, count = 0;
  Shape full;               // the whole tensor's shape
  int64_t full_offset = 0;  // its offset in the single-process flat buffer
  // How many tp ranks hold these same values (1: a shard of its own; the tp size: kWhole; the
  // ranks sharing a replicated KV head), consecutive ranks: rank / replicas names the group.
  int replicas = 1;
  // This rank's gradient is a part of the sum over its replicas (sequence parallelism's norms
  // and positions saw N / size token rows; a replicated KV head saw some of its query heads):
  // the layout all-reduces it over the replicas before the optimizer.
  bool partial_grad = false;
  // Pipeline parallelism: the last stage's copy of the tied token embedding (PipelineStage).
  bool stage_copy = false;
  // Expert parallelism: one of this rank's experts (ExpertShard), held by the ranks with the
  // same ep coordinate only; everything else is replicated over the ep ranks.
  bool expert = false;
};

struct ParamEntry {
  std::string name;  // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  Shape shape;       // kiln's layout: linear weights are (out, in) as in PyTorch nn.Linear
  int64_t offset;    // elements into the flat buffer
  bool decay;        // AdamW weight decay applies (matrices yes; norms, biases no)
  ParamSplit split = {};  // tensor parallelism; kWhole with replicas 1 in a single-process model
};

struct Linear;

// A range [begin, end) of the flat parameter (and gradient) buffer.
struct ParamRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

enum class Pass : uint8_t { kForward, kBackward };

// Callbacks the parallel layouts hang on the model (train/plan.h, src/kiln/parallel): where
// parameters are gathered and released, and when a gradient range is final. Called in the
// order the layers run; every default does nothing.
class ModelHooks {
 public:
  virtual ~ModelHooks() = default;
  // At the start of forward() (and forward_cached()) and of backward(): the embedding, the
  // final norm and the head are used next.
  virtual void before_model(Pass /*pass*/) {}
  // Around block l's forward, and its backward (a checkpointed block's recomputed forward
  // runs inside its backward's pair).
  virtual void before_block(int64_t /*block*/, Pass /*pass*/) {}
  virtual void after_block(int64_t /*block*/, Pass /*pass*/) {}
  // During backward(), in backward order: the gradients of `range` are final for this
  // backward (tail_range(), then block_range(L-1) ... block_range(0), then head_range()).
  virtual void grads_ready(ParamRange /*range*/) {}
  // Whether the hooks do nothing a captured graph (core/graph.h) would have to replay; hooks
  // that communicate or time are a graph break.
  virtual bool captured() const { return false; }
};

// How a Linear computes when its weight is used in another format than the fp32 master: a
// bf16/fp16/fp8 copy for mixed-precision training, or a quantized weight (src/kiln/quant).
// Installed per Linear (Transformer::linears()); the fp32 weight stays the master copy that
// the optimizer updates. A backend that keeps a converted copy refreshes it in sync().
class LinearBackend {
 public:
  virtual ~LinearBackend() = default;
  // y (n, out) = x Wᵀ + b (+ residual); x (n, in).
  virtual void forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const = 0;
  // dx (n, in) = dy W (or += when accumulate_dx); dW += dyᵀ x; db += Σ dy. Default: fp32 path.
  virtual void backward(const Linear& l, float* dx, const float* dy, const float* x, int64_t n,
                        bool accumulate_dx) const;
  // Called after the master weight changed (an optimizer step, a load).
  virtual void sync(const Linear& /*l*/) {}
  // Whether graph capture (core/graph.h) records all of forward's work: true when every kernel
  // it calls records itself and it keeps no per-call buffers; otherwise a forward through it is
  // a graph break.
  virtual bool captured() const { return false; }
};

// y = x Wᵀ + b over n rows; W (out, in), b (out,) or null.
struct Linear {
  std::string name;  // the weight's Hugging Face name
  int64_t in = 0, out = 0;
  const float* w = nullptr;
  const float* b = nullptr;
  float* dw = nullptr;
  float* db = nullptr;
  std::shared_ptr<LinearBackend> backend;  // null: the fp32 GEMM
  // The fp32 forward adds b and the residual as their own kernels after the GEMM instead of in
  // its epilogue: the unfused shape of PyTorch's eager mode, which a graph's fusion pass
  // (perf/graph_fusion.h) fuses again (Transformer::set_split_epilogues).
  bool split_epilogue = false;
  // y (n, out) = act(x Wᵀ + b) + residual; x (n, in).
  void forward(float* y, const float* x, int64_t n, const float* residual = nullptr) const;
  // y_act (n, out) = act(x Wᵀ + b), keeping the activation's input x Wᵀ + b in y_pre for the
  // backward (act: GELU or SiLU). The fp32 GEMM does both in its epilogue (GemmParams::save_pre);
  // a backend or split_epilogue runs the activation as a kernel of its own after forward().
  void forward_act(float* y_act, float* y_pre, const float* x, int64_t n, Activation act) const;
  // dx (n, in) = dy W (or += when accumulate_dx); dW += dyᵀ x; db += Σ dy.
  void backward(float* dx, const float* dy, const float* x, int64_t n, bool accumulate_dx) const;
  // The fp32 paths, whatever the backend (backends fall back to them); backward_f32 is the
  // input half (dx) then the weight half (dW, db), which zero-bubble schedules run apart.
  void forward_f32(float* y, const float* x, int64_t n, const float* residual) const;
  // With split_epilogue, after a GEMM without bias or residual: y += b, then y += residual.
  void split_epilogue_adds(float* y, int64_t n, const float* residual) const;
  void backward_f32(float* dx, const float* dy, const float* x, int64_t n, bool accumulate_dx) const;
  void backward_input_f32(float* dx, const float* dy, int64_t n, bool accumulate_dx) const;
  void backward_weight_f32(const float* dy, const float* x, int64_t n) const;
};

// Keys and values of past tokens for incremental decoding (batch 1), one (max_len, Hkv·D)
// buffer per layer for K and for V. The same layer code fills it: a forward with a cache
// appends the new tokens' K/V at positions [len, len + T) and attends over [0, len + T).
struct KVCache {
  int64_t max_len = 0;
  int64_t len = 0;  // tokens cached so far
  std::vector<Tensor> k, v;
  // Bytes per cached token: 2 · layers · kv_heads · head_dim · 4.
  int64_t bytes_per_token() const;
};

// The serving KV cache (src/kiln/serve): per layer one K and one V pool of num_blocks blocks
// of block_size token rows of Hkv·D floats, the PagedKv layout of kernels/attention.h. Which
// blocks a sequence owns is the serving layer's bookkeeping; this holds only the data.
struct PagedKvCache {
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t row_width = 0;     // Hkv·D floats per token row
  std::vector<Tensor> k, v;  // per layer (num_blocks · block_size, Hkv·D)
  // Called by forward_paged after layer l has written its new tokens' K/V (disaggregated
  // serving sends them from here while the next layers compute); may be empty.
  std::function<void(int64_t layer)> on_layer_written;
  int64_t bytes() const;
  // Copies the first num_tokens rows of block src into block dst, in every layer
  // (copy-on-write of a shared, partially filled block).
  void copy_block(int32_t src, int32_t dst, int64_t num_tokens);
  // The K (and V) rows of positions [pos, pos + n) of a sequence whose blocks are `blocks`, in
  // layer `layer`, to or from packed (n, row_width) buffers; v is ignored (may be null) for a
  // latent-attention cache, which has no V rows.
  void read_rows(int64_t layer, std::span<const int32_t> blocks, int64_t pos, int64_t n, float* k, float* v) const;
  void write_rows(int64_t layer, std::span<const int32_t> blocks, int64_t pos, int64_t n, const float* k,
                  const float* v);
};

// A ragged batch for forward_paged: sequence i runs num_new[i] new tokens (a prefill chunk or
// one decode token) at positions [num_cached[i], num_cached[i] + num_new[i]), whose K/V go to
// the slots of block_table row i; the new tokens of all sequences are packed in order.
struct PagedBatch {
  std::span<const int32_t> tokens;       // (N,) new tokens, sequence after sequence
  std::span<const int32_t> num_cached;   // (S,) positions already in the cache
  std::span<const int32_t> num_new;      // (S,) >= 1 each, summing to N
  std::span<const int32_t> block_table;  // (S, max_blocks_per_seq) block ids
  int64_t max_blocks_per_seq = 0;
  std::span<const int32_t> logit_rows;   // rows of `tokens` whose logits to compute
};

class Transformer {
 public:
  // A shard of size > 1 starts from the single-process model's initial values (the same seed),
  // sliced; its config must pass check_tensor_split.
  // A pipeline stage holds only its blocks (and the embedding or head where it has them); its
  // values are the single-process model's.
  // An expert shard holds its experts only (ExpertShard), with the single-process values.
  static Expected<std::unique_ptr<Transformer>> create(const ModelConfig& config, uint64_t seed,
                                                       const TensorShard& shard = {},
                                                       const PipelineStage& stage = {},
                                                       const ExpertShard& experts = {},
                                                       const ContextShard& context = {});
  // The parameters create(config) allocates (names, kiln shapes, offsets), computed without
  // allocating anything, so a loader checks a file against them first. config passes check_config.
  // With a shard: its local shapes and offsets, and each entry's split.
  static std::vector<ParamEntry> param_entries_for(const ModelConfig& config, int tp_rank = 0, int tp_size = 1,
                                                   bool sequence_parallel = false,
                                                   const PipelineStage& stage = {}, int ep_rank = 0,
                                                   int ep_size = 1);
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const ModelConfig& config() const { return config_; }
  std::span<float> params() { return {params_.data<float>(), static_cast<size_t>(params_.numel())}; }
  std::span<float> grads() { return {grads_.data<float>(), static_cast<size_t>(grads_.numel())}; }
  const std::vector<ParamEntry>& param_entries() const { return entries_; }
  // Null when the name is unknown.
  float* param(std::string_view name);
  float* grad(std::string_view name);
  // Every Linear of the model (all layers, then the LM head), to install backends on.
  std::vector<Linear*> linears();
  // Every Linear's split_epilogue (off by default): the bias and residual adds as kernels of
  // their own, for comparing hand-fused, unfused and graph-fused steps.
  void set_split_epilogues(bool on);

  // ---- the parallel layouts' view (src/kiln/parallel) ----
  int64_t num_params() const { return num_params_; }
  const TensorShard& tensor_shard() const { return shard_; }
  // This shard's KV heads (n_kv_heads at tp = 1): the width of its KV-cache rows over head_dim.
  int64_t kv_heads() const;
  // Floats of one token's KV-cache row per layer (K; V the same, or none for latent attention,
  // whose cache holds [c, k_pe] only).
  int64_t kv_row_width() const;
  // The single-process model's parameter count (num_params() at tp = 1).
  int64_t full_num_params() const { return full_num_params_; }
  // f(local offset, full offset, n) for each run of n contiguous elements of this shard's flat
  // buffer inside the single-process flat buffer, in flat order (one run per entry at tp = 1).
  template <class F>
  void for_each_shard_run(F&& f) const;
  // This shard's values taken from the single-process model's flat parameters (full_num_params()).
  void load_from_full(std::span<const float> full);
  // The tensor-parallel collectives since the last call (zeros at tp = 1).
  TensorParallelTraffic take_tp_traffic();
  // MoE: the routing of the forwards (and the all-to-all traffic of their backwards) since the
  // last call; empty for a dense model.
  MoeStats take_moe_stats();
  const ExpertShard& expert_shard() const { return experts_; }
  int64_t num_blocks() const { return static_cast<int64_t>(layers_.size()); }
  // Block l's parameters: one contiguous range. head_range(): the embeddings before the
  // blocks; tail_range(): the final norm and the untied LM head after them.
  ParamRange block_range(int64_t l) const;
  ParamRange head_range() const { return {0, block_begin_.front()}; }
  ParamRange tail_range() const { return {block_begin_.back(), num_params_}; }
  void set_hooks(ModelHooks* hooks) { hooks_ = hooks; }
  // Points every weight inside `range` at params + (offset - range.begin), and its gradient
  // at grads + (offset - range.begin) (grads may be null: gradients left as they are). The
  // buffers hold range.size() floats and must outlive their use. A tied LM head follows the
  // embedding it shares.
  void bind(ParamRange range, const float* params, float* grads);
  // Frees the flat fp32 buffers (params() / grads() become empty) once a layout holds the
  // values elsewhere (ZeRO-3 shards the parameters; ZeRO-2 and 3 the gradients); the layout
  // binds every range before the model runs. restore_storage() allocates them again (zeros)
  // and binds everything back to them.
  void release_params();
  void release_grads();
  void restore_storage();

  // tokens, targets (B, T); targets may be null (no loss: logits only). Returns the mean loss
  // over targets that are not -1. Errors name bad ids or shapes; nothing is computed then.
  Expected<float> forward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq_len);
  // Incremental decoding, batch 1: runs `n` new tokens at positions [cache.len, cache.len + n)
  // through the same layers, appending their K/V to the cache; returns logits (n, V).
  KVCache make_kv_cache(int64_t max_len) const;
  Expected<const float*> forward_cached(const int32_t* tokens, int64_t n, KVCache& cache);
  // Serving over the paged cache: one ragged batch (PagedBatch) through the same layers, K/V
  // written to and read through each sequence's blocks (paged attention, split over blocks for
  // decode). Returns logits (logit_rows.size(), V); errors name bad shapes, ids or positions.
  PagedKvCache make_paged_kv_cache(int64_t num_blocks, int64_t block_size) const;
  Expected<const float*> forward_paged(const PagedBatch& batch, PagedKvCache& cache);
  // forward_paged's checks of a batch against this model and cache (a replayed graph of the
  // step runs without them, so its driver calls this first).
  Status check_paged(const PagedBatch& batch, const PagedKvCache& cache) const;
  // Changes whenever a buffer a forward wrote may have moved (activations reallocated, the paged
  // scratch grown): a captured graph (core/graph.h) holds pointers into them, so it is keyed by it.
  uint64_t buffer_epoch() const { return buffer_epoch_; }
  // The last forward's results a caller reads after it (its mean loss and the count behind it,
  // the logits): a captured graph must keep these where they are.
  std::vector<std::pair<const void*, int64_t>> graph_outputs() const;
  // Where the last forward wrote its mean loss (what forward() returned; a replayed graph writes
  // it there too, and a training graph's node reads it there); null before one ran.
  const float* last_loss_ptr() const;
  // Bytes of the activation and backward-scratch buffers for the last forward's (B, T), with
  // the MoE blocks' routing-sized buffers (every slot's).
  int64_t activation_bytes() const;

  // ---- pipeline stages (src/kiln/parallel/pipeline.h) ----
  const PipelineStage& stage() const { return stage_; }  // its chunks (the whole model: one)
  int num_chunks() const { return static_cast<int>(stage_.chunks.size()); }
  bool has_embedding() const { return stage_.chunks.front().begin == 0; }
  bool has_head() const { return stage_.chunks.back().end == config_.n_layers; }
  // One stage's forward of a micro-batch (B, T): the first stage reads `tokens`, the others
  // `input` (B·T rows of d_model, this tp rank's rows under sequence parallelism: the previous
  // stage's stage_output()); the last computes the mean loss over `targets` and returns it, the
  // others return 0. forward() is forward_stage on the whole model.
  // With several chunks, `chunk` picks the one to run: the embedding is chunk 0's (if the model
  // has it), the head and loss the last chunk's.
  Expected<float> forward_stage(const int32_t* tokens, const int32_t* targets, const float* input, int64_t batch,
                                int64_t seq_len, int chunk = 0);
  // (rows, d_model): the chunk's last block's output; rows are B·T, or this tp rank's B·T / tp
  // under sequence parallelism (input_grad() alike).
  const float* stage_output(int chunk = 0) const;
  // The stage's backward: the last stage starts from its loss (scaled by loss_scale), the others
  // from `doutput` (the next stage's input_grad()). Gradients accumulate (+=). With
  // defer_weights the weight-gradient GEMMs of every Linear are not run but queued with a copy
  // of their output gradient (zero-bubble's B); backward_weights() runs them (its W). The
  // norms' and embeddings' gradients are computed in B.
  void backward_stage(const float* doutput, float loss_scale, bool defer_weights = false, int chunk = 0);
  void backward_weights();
  bool weights_pending() const;
  const float* input_grad() const;  // (rows, d_model): the gradient of the stage's input
  // Micro-batches in flight: the activations a forward saves for its backward live in slot
  // `slot` (0 is the default) from its forward until its backward (and backward_weights) ran;
  // a slot's buffers are allocated by its first forward (for that forward's chunk only) and
  // kept (reallocated if a forward of another chunk uses it). The backward scratch is shared.
  void use_activation_slot(int slot);
  int activation_slots() const;              // allocated so far
  int64_t saved_activation_bytes() const;    // of one slot, for the last (B, T)
  int64_t deferred_weight_bytes() const;     // the output gradients queued now (all slots)
  // Logits (B, T, V) of the last forward (valid until backward()).
  const float* logits() const;
  void zero_grad();
  // Gradients of the last forward's mean loss, accumulated (+=) into grads(). loss_scale
  // multiplies the loss gradient (loss scaling for fp16); the caller divides it back out.
  void backward(float loss_scale = 1.0f);
  // Activation checkpointing (checkpoint_mode.h); takes effect at the next forward. The
  // gradients are bitwise those of kNone; activation_bytes() shrinks.
  void set_checkpointing(CheckpointMode mode) { ckpt_ = mode; }
  CheckpointMode checkpointing() const { return ckpt_; }

  struct Layer;  // one transformer block (defined in transformer.cpp)

 private:
  Transformer(const ModelConfig& c, const TensorShard& shard, const PipelineStage& stage, const ExpertShard& experts,
              const ContextShard& context);
  void build_params(uint64_t seed);
  // Row-parallel biases are added by tp rank 0 only (the reduction sums the partial outputs);
  // the other ranks keep their gradients. Called after every rewiring of the pointers.
  void drop_row_parallel_biases();
  // Calls f(pointer, is_grad) on every weight and gradient pointer, in one fixed order.
  template <class F>
  void for_each_pointer(F&& f);
  void record_pointer_offsets();
  void ensure_activations(int64_t batch, int64_t seq_len);
  void alloc_saved(int chunk);  // the current slot's saved activations for `chunk`, for acts_'s (B, T)
  struct Slots;        // activation slots and deferred weight gradients (transformer.cpp)
  void swap_saved(int slot);  // the live saved activations <-> slot's stored ones
  Expected<float> forward_impl(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq_len,
                               KVCache* cache, const float* input = nullptr, int chunk = 0);
  // Chunk c's local layers [chunk_first_[c], chunk_first_[c + 1]); local layer l of chunk c reads
  // resid[l + c] and writes resid[l + c + 1] (each chunk its own input and output rows).
  std::vector<size_t> chunk_first_;
  size_t resid_index(size_t layer, int chunk) const { return layer + static_cast<size_t>(chunk); }
  // The token embedding of N tokens into this rank's rows (vocab-parallel above tp = 1).
  void embed(float* out, const int32_t* tokens, int64_t N);
  // The final norm of `rows` rows, its statistics saved for backward.
  void final_norm(float* y, const float* x, int64_t rows);

  ModelConfig config_;
  Tensor params_, grads_;
  std::vector<ParamEntry> entries_;
  std::vector<std::unique_ptr<Layer>> layers_;
  // The final norm and the LM head (its weight is the token embedding when tied), wired once.
  float *final_norm_w_ = nullptr, *final_norm_b_ = nullptr, *dfinal_norm_w_ = nullptr, *dfinal_norm_b_ = nullptr;
  Linear head_;
  const float *wte_ = nullptr, *wpe_ = nullptr;  // token and (GPT-2) position embeddings
  float *dwte_ = nullptr, *dwpe_ = nullptr;
  int64_t num_params_ = 0;
  std::vector<int64_t> block_begin_;     // (L + 1,) offsets: block l is [block_begin_[l], block_begin_[l + 1])
  std::vector<int64_t> pointer_offset_;  // for_each_pointer order: the flat offset (-1: null)
  ModelHooks* hooks_ = nullptr;
  TensorShard shard_;
  PipelineStage stage_;
  ExpertShard experts_;
  ContextShard context_;
  MoeStats moe_stats_;
  int64_t full_num_params_ = 0;
  struct Tp;  // the layers' tensor-parallel collectives and their scratch (transformer.cpp)
  std::unique_ptr<Tp> tp_;
  RopeTable rope_;
  struct Acts;
  std::unique_ptr<Acts> acts_;
  std::unique_ptr<Slots> slots_;
  struct PagedScratch;  // forward_paged's reused buffers (transformer.cpp)
  std::unique_ptr<PagedScratch> paged_;
  int64_t activation_bytes_ = 0;
  int64_t scratch_bytes_ = 0;  // of it, the backward scratch shared by the slots
  uint64_t buffer_epoch_ = 0;
  // Graph capture (core/graph.h): the parts of this model a forward cannot record, as breaks.
  void note_graph_breaks();
  // v.resize(n) when smaller; a move of its data is a new buffer epoch.
  template <class T>
  void grow_tracked(std::vector<T>& v, size_t n);
  CheckpointMode ckpt_ = CheckpointMode::kNone;
};

// f(local offset, full offset, n) for each contiguous run of entry e (ParamSplit's layout).
template <class F>
void for_each_entry_run(const ParamEntry& e, F&& f) {
  const ParamSplit& s = e.split;
  switch (s.kind) {
    case ParamSplit::Kind::kWhole:
      f(e.offset, s.full_offset, e.shape.numel());
      break;
    case ParamSplit::Kind::kRows: {
      const int64_t cols = s.full.numel() / s.full[0], block = s.full[0] / s.parts;
      for (int64_t p = 0; p < s.parts; ++p)
        f(e.offset + p * s.count * cols, s.full_offset + (p * block + s.begin) * cols, s.count * cols);
      break;
    }
    case ParamSplit::Kind::kColumns: {
      const int64_t rows = s.full[0], cols = s.full[1];
      for (int64_t r = 0; r < rows; ++r) f(e.offset + r * s.count, s.full_offset + r * cols + s.begin, s.count);
      break;
    }
  }
}

template <class F>
void Transformer::for_each_shard_run(F&& f) const {
  for (const ParamEntry& e : entries_) for_each_entry_run(e, f);
}

}  // namespace kiln
