// Memory model of a training step; see memory_model.h. Every term names the buffer that
// kiln allocates for it (transformer.cpp Acts/Layer, trainer.cpp, precision.cpp).
#include "kiln/perf/memory_model.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "kiln/core/allocator.h"
#include "kiln/kernels/attention.h"
#include "kiln/model/transformer.h"

namespace kiln::perf {
namespace {
int64_t block(int64_t bytes) { return static_cast<int64_t>(CachingAllocator::round_size(static_cast<size_t>(std::max<int64_t>(bytes, 1)))); }
}  // namespace

const char* step_phase_name(StepPhase p) {
  switch (p) {
    case StepPhase::kForward: return "forward";
    case StepPhase::kBackward: return "backward";
    case StepPhase::kOptimizerStep: return "optimizer step";
  }
  return "?";
}

std::string phase_set_name(PhaseSet s) {
  if (s == kWholeStep) return "whole step";
  std::string r;
  for (StepPhase p : kStepPhases)
    if (s & phase_bit(p)) r += (r.empty() ? "" : "+") + std::string(step_phase_name(p));
  return r;
}

namespace {
// The items live in phase p, as requested (blocks false) or in blocks.
int64_t live_sum(const MemoryPrediction& m, StepPhase p, bool blocks, const std::string* group = nullptr) {
  int64_t s = 0;
  for (const MemoryItem& i : m.items)
    if (i.live_in(p) && (group == nullptr || i.group == *group)) s += blocks ? i.total_blocks() : i.total();
  return s;
}
// The phase with the largest sum (the first such in step order).
StepPhase peak_of(const MemoryPrediction& m, bool blocks) {
  StepPhase best = kStepPhases[0];
  for (StepPhase p : kStepPhases)
    if (live_sum(m, p, blocks) > live_sum(m, best, blocks)) best = p;
  return best;
}
}  // namespace

int64_t MemoryPrediction::phase_bytes(StepPhase p) const { return live_sum(*this, p, false); }
int64_t MemoryPrediction::phase_block_bytes(StepPhase p) const { return live_sum(*this, p, true); }
StepPhase MemoryPrediction::peak_phase() const { return peak_of(*this, true); }
int64_t MemoryPrediction::total_bytes() const { return phase_bytes(peak_of(*this, false)); }
int64_t MemoryPrediction::total_block_bytes() const { return phase_block_bytes(peak_phase()); }
int64_t MemoryPrediction::group_bytes(const std::string& group) const {
  return live_sum(*this, peak_of(*this, false), false, &group);
}
int64_t MemoryPrediction::group_block_bytes(const std::string& group) const {
  return live_sum(*this, peak_phase(), true, &group);
}

int64_t MemoryPrediction::activation_block_bytes() const {
  return group_block_bytes("layer activations") + group_block_bytes("other activations") + group_block_bytes("scratch") +
         group_block_bytes("kernel scratch");
}

namespace {
// This rank's parameter count Ψ, from the model's own table (tp rank 0's: every tp rank holds
// as many, a replicated KV head being one head like a split one).
int64_t local_num_params(const ModelConfig& c, const TensorParallelMemory& t) {
  const std::vector<ParamEntry> e = Transformer::param_entries_for(c, 0, t.tp, t.sequence_parallel && t.tp > 1);
  return e.empty() ? 0 : e.back().offset + e.back().shape.numel();
}

// The peak as the largest phase, in words and MiB, for the notes under the table.
std::string phase_notes(const MemoryPrediction& r) {
  std::string s =
      "  phases: a buffer counts only in the phases it is live in (the last column). The model states and the\n"
      "  buffers laid out once are live throughout; a kernel's scratch only inside its calls (the flash forward's\n"
      "  in the forward, the backward's in the backward); a data-parallel plan's units in flight only in the passes\n"
      "  that hold them (the optimizer step: ZeRO-1/2's all-gather buffer). The step's peak is the largest phase:\n  ";
  for (StepPhase p : kStepPhases)
    s += fmt::format("{} {:.2f} MiB, ", step_phase_name(p), static_cast<double>(r.phase_block_bytes(p)) / 1048576.0);
  s += fmt::format("in blocks: the peak is the {}.\n", step_phase_name(r.peak_phase()));
  return s;
}

// One rank's model states and activations for tp shard t (tp 1: the single-process model), as
// Transformer::ensure_activations and Layer::alloc lay them out. Formulas name whole sizes; "/tp"
// marks a split one (heads, KV heads, FFN columns, vocabulary; rows under SP).
MemoryPrediction predict_shard(const ModelConfig& c, int64_t B, int64_t T, Precision prec, CheckpointMode mode,
                               const TensorParallelMemory& t) {
  const int64_t R = t.tp;
  const bool sp = t.sequence_parallel && R > 1;
  KILN_CHECK(R >= 1 && check_tensor_split(c, static_cast<int>(R)).ok() && (!sp || T % R == 0));
  MemoryPrediction r;
  r.config = c;
  r.batch = B;
  r.seq_len = T;
  r.precision = prec;
  r.checkpoint = mode;
  r.tp = static_cast<int>(R);
  r.sequence_parallel = sp;
  const int64_t P = local_num_params(c, t), N = B * T, C = c.d_model, L = c.n_layers, D = c.head_dim();
  r.num_params = P;
  // This rank's widths: heads, FFN columns and vocabulary split; KV heads split, or one KV head
  // replicated when tp > n_kv_heads; Ns token rows in the norm and residual region.
  const int64_t H = c.n_heads / R, F = c.d_ff / R, V = c.vocab_size / R, Ns = sp ? N / R : N;
  const bool kv_split = c.n_kv_heads % R == 0;
  const int64_t Hkv = kv_split ? c.n_kv_heads / R : 1;
  auto cols = [&](std::string f) { return R > 1 ? f + "/tp" : f; };  // split by the tp ranks
  auto rows = [&](std::string f) { return sp ? f + "/tp" : f; };     // N / tp rows under SP
  const std::string kv_f = kv_split ? cols("4·N·Hkv·D") : "4·N·D (one KV head, replicated)";
  auto add = [&](const std::string& group, const std::string& name, const std::string& formula, int64_t count,
                 int64_t bytes, PhaseSet live = kWholeStep) {
    if (count > 0 && bytes > 0) r.items.push_back({group, name, formula, count, bytes, block(bytes), live});
  };
  // ---- model states ----
  const std::string ms = "model states";
  if (prec == Precision::kF32) {
    add(ms, "weights (fp32, updated in place)", "4·P", 1, 4 * P);
  } else {
    add(ms, "master weights (fp32)", "4·P", 1, 4 * P);
  }
  add(ms, "gradients (fp32)", "4·P", 1, 4 * P);
  add(ms, "AdamW m (fp32)", "4·P", 1, 4 * P);
  add(ms, "AdamW v (fp32)", "4·P", 1, 4 * P);
  if (prec != Precision::kF32) {
    // One copy per Linear, the LM head (tied: the embedding) included, at this shard's shape.
    const int64_t e = prec == Precision::kBF16 ? 2 : 4;
    const std::string what = prec == Precision::kBF16 ? "bf16" : prec == Precision::kF16 ? "f16 values as f32, emulated"
                                                                                         : "e4m3 values as f32, emulated";
    const std::string f = fmt::format("{}·out·in", e);
    auto lin = [&](const std::string& n, int64_t count, int64_t in, int64_t out) {
      add(ms, fmt::format("working weights {} ({})", n, what), f, count, e * in * out);
    };
    if (c.is_llama()) {
      lin("q_proj", L, C, H * D); lin("k_proj", L, C, Hkv * D); lin("v_proj", L, C, Hkv * D);
      lin("o_proj", L, H * D, C); lin("gate_proj", L, C, F); lin("up_proj", L, C, F); lin("down_proj", L, F, C);
    } else {
      lin("c_attn", L, C, 3 * H * D); lin("attn.c_proj", L, H * D, C); lin("c_fc", L, C, F); lin("mlp.c_proj", L, F, C);
    }
    lin("lm_head", 1, C, V);
  }
  // ---- per-layer activations ----
  const std::string la = "layer activations";
  const int64_t keep_all = mode == CheckpointMode::kFull ? 1 : L;   // layers with their own buffers
  const int64_t keep_core = mode == CheckpointMode::kNone ? L : 1;  // attention O and lse
  auto layer = [&](const std::string& name, const std::string& formula, int64_t bytes, int64_t per_layer = 1,
                   bool core = false) {
    add(la, name, formula, per_layer * (core ? keep_core : keep_all), bytes);
    r.layer_activation_bytes += per_layer * bytes;
  };
  layer(c.is_llama() ? "n1 (rmsnorm 1 out)" : "n1 (layernorm 1 out)", rows("4·N·C"), 4 * Ns * C);
  layer(c.is_llama() ? "mean1 (unused by RMSNorm), rstd1" : "mean1, rstd1", rows("4·N"), 4 * Ns, 2);
  if (c.is_llama()) {
    layer("q (after RoPE)", cols("4·N·H·D"), 4 * N * H * D);
    layer("k (after RoPE)", kv_f, 4 * N * Hkv * D);
    layer("v", kv_f, 4 * N * Hkv * D);
  } else {
    layer("qkv", cols("4·N·3C"), 4 * N * 3 * H * D);
  }
  layer("attention out O", cols("4·N·H·D"), 4 * N * H * D, 1, true);
  layer("attention lse", cols("4·B·H·T"), 4 * B * H * T, 1, true);
  layer("x1 (residual after attention)", rows("4·N·C"), 4 * Ns * C);
  layer("n2 (norm 2 out)", rows("4·N·C"), 4 * Ns * C);
  layer(c.is_llama() ? "mean2 (unused by RMSNorm), rstd2" : "mean2, rstd2", rows("4·N"), 4 * Ns, 2);
  if (c.is_llama()) {
    layer("ff1 (gate), ff2 (up)", cols("4·N·F"), 4 * N * F, 2);
    layer("ffa (swiglu out)", cols("4·N·F"), 4 * N * F);
  } else {
    layer("ff1 (c_fc out)", cols("4·N·F"), 4 * N * F);
    layer("ffa (gelu out)", cols("4·N·F"), 4 * N * F);
  }
  // ---- other activations and backward scratch ----
  const std::string oa = "other activations";
  add(oa, "residual stream (layer inputs + final)", rows("4·N·C") + ", L+1 of them", L + 1, 4 * Ns * C);
  add(oa, "final norm out", "4·N·C", 1, 4 * N * C);  // whole: the LM head's input (SP gathers it)
  add(oa, "final mean, rstd", rows("4·N"), 2, 4 * Ns);
  add(oa, "logits / dlogits", cols("4·N·V"), 1, 4 * N * V);
  add(oa, "losses", "4·N", 1, 4 * N);
  if (R > 1) {  // the vocab-parallel cross-entropy's all-reduced row statistics
    add(oa, "vocab-parallel loss: row max", "4·N", 1, 4 * N);
    add(oa, "vocab-parallel loss: row sum of exp, target logit", "4·2N", 1, 8 * N);
  }
  if (sp) add(oa, "SP: gathered rows, row-parallel partial output", "4·N·C", 2, 4 * N * C);
  const std::string sc = "scratch";
  add(sc, "backward: dresid", rows("4·N·C"), 1, 4 * Ns * C);
  add(sc, "backward: dnorm", "4·N·C", 1, 4 * N * C);
  add(sc, "backward: datt", cols("4·N·H·D"), 1, 4 * N * H * D);
  if (c.is_llama()) add(sc, "backward: dq", cols("4·N·H·D"), 1, 4 * N * H * D);
  else add(sc, "backward: dqkv", cols("4·N·3C"), 1, 4 * N * 3 * H * D);
  add(sc, "backward: dk, dv", kv_f, 2, 4 * N * Hkv * D);
  add(sc, "backward: dff a, b, c", cols("4·N·F"), 3, 4 * N * F);
  {
    // The flash kernels' tile scratch from the caching allocator (per thread, for this process's
    // threads and tiles): not a model buffer, so a group of its own. Each attention call takes
    // its scratch and returns it before the next call, so the forward's is live only in the
    // forward and the backward's only in the backward: they never add to each other, nor to
    // what only the optimizer step holds (ZeRO-1/2's all-gather buffer). Under checkpointing
    // the backward re-runs forward calls too, one call at a time, so its transient is the larger
    // of the two scratches: the backward's (it holds two tile blocks per query tile, and dQ
    // partials, where the forward holds one).
    AttentionParams ap;
    ap.batch = B;
    ap.q_len = ap.kv_len = T;
    ap.n_heads = H;
    ap.n_kv_heads = Hkv;
    ap.head_dim = D;
    const std::string ks = "kernel scratch";
    add(ks, "attention forward: flash tile scratch", "threads·tiles", 1,
        cpu::attention_forward_scratch_bytes(ap, AttentionImpl::kFlash), phase_bit(StepPhase::kForward));
    add(ks, "attention backward: flash tile scratch", "threads·tiles", 1,
        cpu::attention_backward_scratch_bytes(ap, AttentionImpl::kFlash), phase_bit(StepPhase::kBackward));
  }
  if (prec != Precision::kF32) {
    // PrecisionContext's conversion buffers grow to the widest Linear this shard runs.
    const int64_t e = prec == Precision::kBF16 ? 2 : 4;
    const int64_t in = std::max({C, F, H * D});
    const int64_t out = std::max({c.is_llama() ? H * D : 3 * H * D, C, F, V});
    add(sc, "matmul input conversion: activations", fmt::format("{}·N·max(in)", e), 1, e * N * in);
    add(sc, "matmul input conversion: output gradients", fmt::format("{}·N·max(out)", e), 1, e * N * out);
  }
  r.bytes_per_param = P > 0 ? r.group_bytes(ms) / P : 0;
  r.notes = phase_notes(r);
  return r;
}
}  // namespace

MemoryPrediction predict_memory(const ModelConfig& c, int64_t B, int64_t T, Precision prec, CheckpointMode mode) {
  return predict_shard(c, B, T, prec, mode, {});
}

std::vector<int64_t> data_parallel_unit_sizes(const ModelConfig& c, int fsdp_unit_blocks, const TensorParallelMemory& t) {
  const std::vector<ParamEntry> e = Transformer::param_entries_for(c, 0, t.tp, t.sequence_parallel && t.tp > 1);
  const int64_t total = e.empty() ? 0 : e.back().offset + e.back().shape.numel();
  // As Transformer::build_params: the embeddings, then L blocks of the same number of entries,
  // then the final norm (and the untied head).
  const bool gpt2 = c.family == ModelFamily::kGpt2;
  const size_t head = gpt2 ? 2 : 1, tail = (gpt2 ? 2 : 1) + (c.tied_embeddings ? 0 : 1);
  const int64_t L = c.n_layers;
  const size_t per_block = L > 0 ? (e.size() - head - tail) / static_cast<size_t>(L) : 0;
  auto begin = [&](int64_t l) { return e[head + static_cast<size_t>(l) * per_block].offset; };
  std::vector<int64_t> units{begin(0)};
  for (int64_t l = 0; l < L; l += fsdp_unit_blocks) units.push_back(begin(std::min<int64_t>(l + fsdp_unit_blocks, L)) - begin(l));
  units.push_back(total - begin(L));
  return units;
}

MemoryPrediction predict_memory(const ModelConfig& c, int64_t global_batch, int64_t T, Precision prec, CheckpointMode mode,
                                const DataParallelMemory& d, const TensorParallelMemory& t) {
  KILN_CHECK(d.dp >= 1 && global_batch % d.dp == 0 && d.zero >= 0 && d.zero <= 3 && d.fsdp_unit_blocks >= 1);
  KILN_CHECK_MSG(t.tp == 1 || d.zero == 0, "tensor parallelism composes with DDP (zero 0) only, got zero {}", d.zero);
  MemoryPrediction base = predict_shard(c, global_batch / d.dp, T, prec, mode, t);
  const int64_t S = d.zero == 0 ? 1 : (d.shard_group > 0 ? d.shard_group : d.dp);
  KILN_CHECK(d.dp % S == 0);
  MemoryPrediction r = base;
  r.items.clear();
  r.dp = d.dp;
  r.zero = d.zero;
  r.shard_group = static_cast<int>(S);
  const int64_t P = base.num_params;  // this rank's Ψ (the model's at tp = 1)
  // Units and their chunks (DataParallelPlan::build_units).
  const std::vector<int64_t> n = data_parallel_unit_sizes(c, d.fsdp_unit_blocks, t);
  std::vector<int64_t> chunk;
  int64_t shard = 0, most_padded = 1, block_padded = 0, block_chunk = 0;
  for (int64_t x : n) {
    chunk.push_back((x + S - 1) / S);
    shard += chunk.back();
    most_padded = std::max(most_padded, S * chunk.back());
  }
  const size_t nu = n.size(), num_block_units = nu - 2;
  for (size_t u = 1; u + 1 < nu; ++u) {
    block_padded = std::max(block_padded, S * chunk[u]);
    block_chunk = std::max(block_chunk, chunk[u]);
  }
  const int64_t head_padded = std::max<int64_t>(S * chunk[0], 1), tail_padded = std::max<int64_t>(S * chunk[nu - 1], 1);
  const int64_t tail_chunk = std::max<int64_t>(chunk[nu - 1], 1);
  block_padded = std::max<int64_t>(block_padded, 1);
  block_chunk = std::max<int64_t>(block_chunk, 1);
  auto add = [&](const std::string& group, const std::string& name, const std::string& formula, int64_t count, int64_t bytes) {
    if (count > 0 && bytes > 0) r.items.push_back({group, name, formula, count, bytes, block(bytes)});
  };
  const std::string ms = "model states";
  const bool f32 = prec == Precision::kF32;
  // ---- model states, as the stage shards them ----
  if (d.zero <= 2) add(ms, f32 ? "params (fp32, whole)" : "master weights (fp32, whole)", "4·Ψ", 1, 4 * P);
  else add(ms, fmt::format("params (sharded 1/{})", S), "4·Σ⌈n_u/S⌉", 1, 4 * shard);
  if (d.zero <= 1) add(ms, "grads (fp32, whole)", "4·Ψ", 1, 4 * P);
  else add(ms, fmt::format("grads (sharded 1/{})", S), "4·Σ⌈n_u/S⌉", 1, 4 * shard);
  if (d.zero == 0) add(ms, "AdamW m+v (fp32, whole)", "4·Ψ each", 2, 4 * P);
  else add(ms, fmt::format("AdamW m+v (sharded 1/{})", S), "4·Σ⌈n_u/S⌉ each", 2, 4 * shard);
  for (const MemoryItem& i : base.items)
    if (i.group == ms && i.name.starts_with("working weights")) r.items.push_back(i);
  // ---- the plan's transient buffers, each in the phases it is live in ----
  // (DataParallelPlan: ZeRO-3 gathers the root units at the forward's start and releases them
  // after the optimizer step, block units from their forward to their backward; ZeRO-2/3's
  // gradient buffers live in the backward (finish_gradients reaps them all); ZeRO-1/2's
  // all-gather buffer only in after_optimizer_step. None of them is live before the step.)
  const std::string db = "data-parallel buffers";
  const PhaseSet fwd = phase_bit(StepPhase::kForward), bwd = phase_bit(StepPhase::kBackward),
                 step = phase_bit(StepPhase::kOptimizerStep);
  auto put = [&](const std::string& name, const std::string& formula, int64_t count, int64_t bytes, PhaseSet live) {
    if (count > 0 && bytes > 0) r.items.push_back({db, name, formula, count, bytes, block(bytes), live});
  };
  if (d.zero >= 1 && S > 1 && d.zero <= 2)  // after_optimizer_step's all-gather buffer
    put("all-gather buffer after the optimizer", "4·max_u S·⌈n_u/S⌉", 1, 4 * most_padded, step);
  if (d.zero == 3) {
    // Root units stay gathered for the whole step; block units: the one being run and the
    // ones prefetched (reshard_after_forward off: every one, from its forward to its backward).
    put("gathered head unit (padded)", "4·S·chunk", 1, 4 * head_padded, kWholeStep);
    put("gathered tail unit (padded)", "4·S·chunk", 1, 4 * tail_padded, kWholeStep);
    const int64_t gathered = d.reshard_after_forward
                                 ? std::min<int64_t>(1 + d.prefetch, static_cast<int64_t>(num_block_units))
                                 : static_cast<int64_t>(num_block_units);
    put(d.reshard_after_forward ? "gathered block units in flight (1 + prefetch)" : "gathered block units (all, kept from forward)",
        "4·S·chunk", gathered, 4 * block_padded, fwd | bwd);
  }
  if (d.zero >= 2) {
    // Backward: the head's gradient buffer lives through it. Besides it, DataParallelPlan keeps
    // at most two units' buffers, each with its reduce temporary once it reduces (older
    // reductions are waited for before a new buffer or temporary is made): the bound is two of
    // the largest non-head unit, buffers and temporaries. How much of the bound is reached
    // depends on the communication's lag: between one unit (reductions done at once) and two.
    int64_t largest_padded = tail_padded, largest_chunk = tail_chunk;
    for (size_t u = 1; u + 1 < nu; ++u) {
      largest_padded = std::max(largest_padded, std::max<int64_t>(S * chunk[u], 1));
      largest_chunk = std::max(largest_chunk, std::max<int64_t>(chunk[u], 1));
    }
    put("head unit gradient buffer (padded)", "4·S·chunk", 1, 4 * head_padded, bwd);
    put("unit gradient buffers (padded): computing, reducing", "4·S·chunk", 1, 4 * largest_padded, bwd);
    put("unit gradient buffers (padded): reducing, second", "4·S·chunk", 1, 4 * largest_padded, bwd);
    put("reduce-scatter temporaries", "4·chunk", 2, 4 * largest_chunk, bwd);
  }
  // ---- TensorParallelPlan: one pack per replica-group size of the gradients left partial ----
  // (SP's norms and GPT-2 positions over the tp ranks, replicated KV heads over tp / n_kv_heads
  // ranks), copied in, all-reduced over the replicas and copied out in finish_gradients.
  std::map<int, int64_t> partial;  // replicas -> floats
  if (t.tp > 1)
    for (const ParamEntry& e : Transformer::param_entries_for(c, 0, t.tp, r.sequence_parallel))
      if (e.split.partial_grad && e.split.replicas > 1) partial[e.split.replicas] += e.shape.numel();
  for (auto [replicas, floats] : partial)
    add("tensor-parallel buffers", fmt::format("partial-gradient pack (summed over {} replicas)", replicas),
        "4·Σ partial entries", 1, 4 * floats);
  // ---- activations of the per-rank batch ----
  for (const MemoryItem& i : base.items)
    if (i.group != ms) r.items.push_back(i);
  r.bytes_per_param = P > 0 ? r.group_bytes(ms) / P : 0;
  const char* stage[] = {"DDP: every buffer whole", "ZeRO-1: m, v sharded", "ZeRO-2: grads, m, v sharded",
                         "ZeRO-3 (FSDP): params, grads, m, v sharded"};
  r.notes = fmt::format(
      "  data parallel: P = {} ranks, per-rank batch {} (global {}), shard group S = {}, {} units ({} per FSDP unit)\n"
      "  per rank, all fp32: params 4Ψ, grads 4Ψ, AdamW moments 8Ψ, each divided by S where the stage shards\n"
      "  it ({}); a shard is Σ_u ⌈n_u/S⌉ = {} floats (Ψ/S = {:.0f}; padding: S·shard − Ψ = {}).\n"
      "  Plus the activations of the per-rank batch and the units in flight: ZeRO-1/2 all-gather the updated\n"
      "  shards through one padded buffer (max_u S·⌈n_u/S⌉) in the optimizer step, when the backward's kernel\n"
      "  scratch is gone; ZeRO-2/3 hold the head's padded gradient through the backward and at most two other\n"
      "  units' (each with its reduce temporary); ZeRO-3 also holds the root units (head, tail) for the whole\n"
      "  step and 1 + prefetch ({}) block units gathered in the forward and backward (every block unit without\n"
      "  reshard_after_forward).\n",
      d.dp, global_batch / d.dp, global_batch, S, nu, d.fsdp_unit_blocks, stage[d.zero], shard,
      static_cast<double>(P) / static_cast<double>(S), S * shard - P, d.prefetch);
  if (t.tp > 1) {
    const bool kv_split = c.n_kv_heads % t.tp == 0;
    r.notes += fmt::format(
        "  tensor parallel: tp = {} ranks (× dp = {}, DDP); Ψ = {} of the model's {} params on\n"
        "  each rank: heads H/tp = {}, KV heads {}, FFN F/tp = {}, vocabulary V/tp = {} (the logits too: the\n"
        "  vocab-parallel loss keeps a row max and sum, 4·N and 4·2N); norms and row-parallel biases whole.\n",
        t.tp, d.dp, P, c.num_params(), c.n_heads / t.tp,
        kv_split ? fmt::format("Hkv/tp = {}", c.n_kv_heads / t.tp)
                 : fmt::format("1 (each of {} replicated over {} ranks)", c.n_kv_heads, t.tp / c.n_kv_heads),
        c.d_ff / t.tp, c.vocab_size / t.tp);
    r.notes += r.sequence_parallel
                   ? fmt::format("  sequence parallel: the norm and residual regions hold N/tp = {} of the N = {} rows; the\n"
                                 "  column-parallel blocks gather all N rows (4·N·C) and the row-parallel ones reduce-scatter\n"
                                 "  their partial output (4·N·C); the final norm's output is gathered whole.\n",
                                 r.batch * T / t.tp, r.batch * T)
                   : "  no sequence parallelism: the norm and residual regions hold all N rows on every tp rank.\n";
  }
  r.notes += phase_notes(r);
  r.notes += fmt::format("  peak per rank: {:.2f} MiB in allocator blocks (the allocator's peak_bytes_in_use)\n",
                         static_cast<double>(r.total_block_bytes()) / 1048576.0);
  return r;
}

double recompute_flops_per_token(const ModelConfig& c, int64_t T, CheckpointMode m) {
  const double attn = 4.0 * static_cast<double>(T) * c.d_model;  // QKᵀ and PV, forward
  const double layer_params = static_cast<double>(c.num_non_embedding_params() - (c.is_llama() ? c.d_model : 2 * c.d_model)) /
                              static_cast<double>(c.n_layers);  // per-layer parameters (norms: negligible)
  switch (m) {
    case CheckpointMode::kNone: return 0;
    // The last layer is not recomputed: its buffers still hold its forward when backward starts.
    case CheckpointMode::kSelective: return static_cast<double>(c.n_layers - 1) * attn;
    case CheckpointMode::kFull: return static_cast<double>(c.n_layers - 1) * (2.0 * layer_params + attn);
  }
  return 0;
}

void offload_optimizer_state(MemoryPrediction& p, int64_t staging_bytes) {
  const std::string phases = phase_notes(p);  // restated below with the moments gone
  int64_t moved = 0;
  std::erase_if(p.items, [&](const MemoryItem& it) {
    const bool moments = it.group == "model states" && it.name.starts_with("AdamW");
    if (moments) moved += it.total();
    return moments;
  });
  if (p.num_params > 0) p.bytes_per_param = p.group_bytes("model states") / p.num_params;
  if (const size_t at = p.notes.find(phases); at != std::string::npos) p.notes.replace(at, phases.size(), phase_notes(p));
  p.notes += fmt::format(
      "  optimizer state offloaded: AdamW m and v ({:.2f} MiB, 8·P) in a file, streamed through {:.1f} MiB of "
      "staging buffers outside the caching allocator\n",
      static_cast<double>(moved) / 1048576.0, static_cast<double>(staging_bytes) / 1048576.0);
}

std::string format_memory_prediction(const MemoryPrediction& p) {
  const ModelConfig& c = p.config;
  auto mib = [](int64_t b) { return static_cast<double>(b) / 1048576.0; };
  std::string s = fmt::format(
      "memory model: {}\n  batch B {} × seq T {} (N = B·T = {}), precision {}, checkpoint {}\n"
      "  P = {} params{}, L = {}, C = {}, F = {}, V = {}, H = {}, Hkv = {}, D = {}{}\n",
      c.describe(), p.batch, p.seq_len, p.batch * p.seq_len, precision_name(p.precision),
      checkpoint_mode_name(p.checkpoint), p.num_params,
      p.tp > 1 ? fmt::format(" on this rank (tp {}{})", p.tp, p.sequence_parallel ? " + sp" : "") : "", c.n_layers,
      c.d_model, c.d_ff, c.vocab_size, c.n_heads, c.n_kv_heads, c.head_dim(), p.tp > 1 ? " (whole model; /tp: split)" : "");
  std::string group;
  for (const MemoryItem& i : p.items) {
    if (i.group != group) {
      group = i.group;
      s += fmt::format("  {} ({:.2f} MiB at the peak):\n", group, mib(p.group_bytes(group)));
    }
    s += fmt::format("    {:<52} {:>20} × {:<3} = {:>9.2f} MiB  {}\n", i.name, i.formula, i.count, mib(i.total()),
                     phase_set_name(i.live));
  }
  s += fmt::format("  model states: {:.2f} bytes/param ({:.2f} MiB); one layer's activations (none): {:.2f} MiB = {:.1f} bytes/token\n",
                   static_cast<double>(p.group_bytes("model states")) / static_cast<double>(p.num_params), mib(p.group_bytes("model states")), mib(p.layer_activation_bytes),
                   static_cast<double>(p.layer_activation_bytes) / static_cast<double>(p.batch * p.seq_len));
  s += "  (× count: buffers of that size, e.g. one per layer; last column: the phases a buffer is live in)\n";
  s += fmt::format("  peak (the {}): {:.2f} MiB as requested, {:.2f} MiB in allocator blocks\n",
                   step_phase_name(p.peak_phase()), mib(p.total_bytes()), mib(p.total_block_bytes()));
  s += p.notes;
  return s;
}

}  // namespace kiln::perf
