// The decode benchmark behind `kiln bench mla-decode`: three random-weight Llama models of one
// width — multi-head (MHA), grouped-query (GQA) and multi-head latent attention (MLA) — each
// holding a batch of long contexts in the serving paged KV cache, timed over decode steps of the
// whole batch, with the cache's bytes per token measured beside kv_bytes_per_token's formula.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/model/config.h"
#include "kiln/serve/kv_cache_manager.h"

namespace kiln {

// The width the three models share: vocabulary, d_model, n_heads heads of d_model / n_heads,
// layers, SwiGLU d_ff. GQA keeps n_heads / gqa_group KV heads (gqa_of_same_width). MLA takes
// DeepSeek-V3's ratios to the head (head_dim 128 there): a KV latent of 4 · head_dim, one RoPE
// key of head_dim / 2, nope and value heads of head_dim; its queries go through a latent of
// q_lora_rank (0: 3 · d_model / 8, which keeps the query path's weights near MHA's q_proj).
struct SameWidthOptions {
  int64_t vocab_size = 8192, d_model = 512, n_heads = 8, n_layers = 4, d_ff = 1408;
  int64_t gqa_group = kDefaultGqaGroup;
  int64_t q_lora_rank = 0;
  int64_t max_seq_len = 4096 + 64;
};

enum class AttentionKind { kMha, kGqa, kMla };
std::string_view attention_kind_name(AttentionKind kind);  // "MHA", "GQA", "MLA"

struct SameWidthModel {
  AttentionKind kind = AttentionKind::kMha;
  ModelConfig config;
};

// MHA, GQA and MLA in that order, each passing check_config; InvalidArgument naming the option
// that breaks one (d_model not divisible by n_heads, an odd head_dim, a group that does not
// divide the heads).
Expected<std::vector<SameWidthModel>> same_width_models(const SameWidthOptions& o);

struct DecodeBenchOptions {
  int64_t context = 4096;     // tokens prefilled per sequence before decoding
  int64_t num_tokens = 32;    // decode steps per timed run
  std::vector<int64_t> batches = {1, 8};
  int repeats = 3;            // timed runs per batch (the median is kept), after one warm-up run
  int64_t prefill_chunk = 512;  // tokens per prefill forward, as serving's chunked prefill
  int64_t block_size = kDefaultKvBlockSize;
  bool packed_weights = true;   // pack the weights once, as the engine does (EngineConfig)
  uint64_t seed = 1;
};

// One batch size of one model.
struct DecodeBenchRow {
  int64_t batch = 0;
  int64_t kv_bytes_per_token = 0;          // kv_bytes_per_token(config, f32): the formula
  int64_t kv_bytes_in_use = 0;             // the pool's bytes in the blocks of the batch, after prefill
  int64_t tokens_held = 0;                 // the batch's tokens in those blocks: batch · context
  double seconds_per_step = 0;             // one decode step of the whole batch, median of the runs
  double measured_kv_bytes_per_token() const { return double(kv_bytes_in_use) / double(tokens_held); }
  double tokens_per_second() const { return double(batch) / seconds_per_step; }
};

// Prefills max(batches) sequences of `context` random tokens into one paged cache (blocks taken
// through KvCacheManager, K/V written by forward_paged in chunks of prefill_chunk), then for each
// batch B times num_tokens decode steps of the first B sequences: one forward_paged of B one-token
// sequences per step (what the serving executor runs for a decode batch), each fed its greedy
// next token. Every run decodes the same positions context, context + 1, ... again.
// InvalidArgument for options out of range or a context + num_tokens beyond max_seq_len.
Expected<std::vector<DecodeBenchRow>> run_decode_bench(const ModelConfig& config, const DecodeBenchOptions& o);

}  // namespace kiln
