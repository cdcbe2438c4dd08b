// The same-width MHA / GQA / MLA decode benchmark (see kv_decode_bench.h): configs, prefill
// through the paged cache, timed decode steps.
#include "kiln/serve/kv_decode_bench.h"

#include <algorithm>
#include <chrono>
#include <span>

#include "kiln/core/median.h"
#include "kiln/core/rng.h"
#include "kiln/model/packed_linear.h"
#include "kiln/model/transformer.h"

namespace kiln {

std::string_view attention_kind_name(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kMha: return "MHA";
    case AttentionKind::kGqa: return "GQA";
    case AttentionKind::kMla: return "MLA";
  }
  return "?";
}

Expected<std::vector<SameWidthModel>> same_width_models(const SameWidthOptions& o) {
  if (o.n_heads < 1 || o.d_model % o.n_heads != 0)
    return invalid_argument("[mla-decode] --d-model {} must be a multiple of --heads {}", o.d_model, o.n_heads);
  const int64_t head_dim = o.d_model / o.n_heads;
  if (head_dim % 4 != 0)
    return invalid_argument("[mla-decode] head_dim {} (--d-model / --heads) must be a multiple of 4: MLA's RoPE key "
                            "is head_dim / 2, which RoPE needs even", head_dim);
  if (o.gqa_group < 1 || o.n_heads % o.gqa_group != 0)
    return invalid_argument("[mla-decode] --gqa-group {} must divide --heads {}", o.gqa_group, o.n_heads);
  ModelConfig base;
  base.family = ModelFamily::kLlama;
  base.vocab_size = o.vocab_size;
  base.d_model = o.d_model;
  base.n_layers = o.n_layers;
  base.n_heads = base.n_kv_heads = o.n_heads;
  base.d_ff = o.d_ff;
  base.max_seq_len = o.max_seq_len;
  base.tied_embeddings = true;
  ModelConfig mla = base;
  mla.kv_lora_rank = 4 * head_dim;
  mla.qk_rope_head_dim = head_dim / 2;
  mla.qk_nope_head_dim = head_dim;
  mla.v_head_dim = head_dim;
  mla.q_lora_rank = o.q_lora_rank > 0 ? o.q_lora_rank : 3 * o.d_model / 8;
  mla.rope_interleave = true;  // DeepSeek-V3's checkpoints' layout
  std::vector<SameWidthModel> models = {{AttentionKind::kMha, mha_of_same_width(base)},
                                        {AttentionKind::kGqa, gqa_of_same_width(base, o.gqa_group)},
                                        {AttentionKind::kMla, mla}};
  for (const SameWidthModel& m : models) {
    if (Status s = check_config(m.config); !s.ok())
      return invalid_argument("[mla-decode] {}: {}", attention_kind_name(m.kind), s.message());
  }
  return models;
}

namespace {

// The PagedBatch of one step, built in reused buffers: sequence i of `seqs` runs num_new[i] new
// tokens (packed in `tokens`) after num_cached[i] positions; logits for its last token.
struct StepBuffers {
  std::vector<int32_t> tokens, num_cached, num_new, table, logit_rows;
  int64_t max_blocks = 0;

  PagedBatch view(std::span<const BlockTable> seqs) {
    KILN_CHECK(seqs.size() == num_new.size() && seqs.size() == num_cached.size());
    table.assign(seqs.size() * static_cast<size_t>(max_blocks), 0);  // (S, max_blocks)
    logit_rows.clear();
    int32_t row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto ids = seqs[i].block_ids();
      KILN_CHECK(static_cast<int64_t>(ids.size()) <= max_blocks);
      std::copy(ids.begin(), ids.end(), table.begin() + static_cast<std::ptrdiff_t>(i) * max_blocks);
      row += num_new[i];
      logit_rows.push_back(row - 1);
    }
    return {.tokens = tokens, .num_cached = num_cached, .num_new = num_new, .block_table = table,
            .max_blocks_per_seq = max_blocks, .logit_rows = logit_rows};
  }
};

}  // namespace

Expected<std::vector<DecodeBenchRow>> run_decode_bench(const ModelConfig& config, const DecodeBenchOptions& o) {
  if (o.batches.empty()) return invalid_argument("[mla-decode] no batch sizes");
  const int64_t max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  if (*std::min_element(o.batches.begin(), o.batches.end()) < 1)
    return invalid_argument("[mla-decode] --batch sizes must be >= 1");
  if (o.context < 1 || o.num_tokens < 1 || o.repeats < 1 || o.prefill_chunk < 1 || o.block_size < 1)
    return invalid_argument("[mla-decode] --context {}, --tokens {}, --repeats {}, --prefill-chunk {} and "
                            "--block-size {} must be >= 1", o.context, o.num_tokens, o.repeats, o.prefill_chunk,
                            o.block_size);
  if (o.context + o.num_tokens > config.max_seq_len)
    return invalid_argument("[mla-decode] --context {} + --tokens {} exceed the model's context {}", o.context,
                            o.num_tokens, config.max_seq_len);
  const int64_t blocks_per_seq = (o.context + o.num_tokens + o.block_size - 1) / o.block_size;
  const double pool_bytes = double(max_batch * blocks_per_seq * o.block_size) * double(kv_bytes_per_token(config, DType::kF32));
  if (pool_bytes > double(physical_memory_bytes()))
    return resource_exhausted("[mla-decode] the KV cache of --batch {} × (--context {} + --tokens {}) needs {:.0f} MiB, "
                              "more than the machine's {} MiB", max_batch, o.context, o.num_tokens, pool_bytes / 1048576.0,
                              physical_memory_bytes() >> 20);
  KILN_ASSIGN_OR_RETURN(auto model, Transformer::create(config, o.seed));  // random weights
  if (o.packed_weights) install_packed_weights(*model);
  Transformer& m = *model;

  // Exactly the blocks the sequences need (prefix caching off: every sequence owns its blocks).
  KvCacheConfig kc;
  kc.block_size = o.block_size;
  kc.enable_prefix_caching = false;
  kc.num_blocks = max_batch * blocks_per_seq;
  KvCacheManager kv(kc);
  PagedKvCache cache = m.make_paged_kv_cache(kc.num_blocks, kc.block_size);
  const int64_t bytes_per_block = cache.bytes() / cache.num_blocks;  // every layer's K and V rows of one block

  // Prefill: each sequence's random context in chunks, one sequence per forward.
  std::vector<BlockTable> seqs(static_cast<size_t>(max_batch), BlockTable(o.block_size));
  StepBuffers step;
  step.max_blocks = blocks_per_seq;
  Rng rng(o.seed + 1);
  std::vector<BlockCopy> copies;  // stays empty: no block is shared
  std::vector<int32_t> context(static_cast<size_t>(o.context));
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int32_t& t : context) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size)));
    for (int64_t begin = 0; begin < o.context; begin += o.prefill_chunk) {
      const int64_t n = std::min(o.prefill_chunk, o.context - begin);
      const bool fits = kv.allocate_slots(seqs[s], {}, n, copies);
      KILN_CHECK(fits);
      step.tokens.assign(context.begin() + begin, context.begin() + begin + n);
      step.num_cached = {static_cast<int32_t>(begin)};
      step.num_new = {static_cast<int32_t>(n)};
      KILN_RETURN_IF_ERROR(m.forward_paged(step.view({&seqs[s], 1}), cache).status());
    }
  }
  std::vector<int64_t> blocks_held, tokens_held;  // per sequence, after prefill
  for (const BlockTable& t : seqs) {
    blocks_held.push_back(t.num_blocks());
    tokens_held.push_back(t.num_tokens());
  }
  for (BlockTable& t : seqs) {  // the decode slots
    const bool fits = kv.allocate_slots(t, {}, o.num_tokens, copies);
    KILN_CHECK(fits);
  }
  KILN_CHECK(copies.empty());

  const int64_t V = config.vocab_size;
  std::vector<DecodeBenchRow> rows;
  for (int64_t B : o.batches) {
    DecodeBenchRow row;
    row.batch = B;
    row.kv_bytes_per_token = kv_bytes_per_token(config, DType::kF32);
    for (size_t s = 0; s < static_cast<size_t>(B); ++s) {
      row.kv_bytes_in_use += blocks_held[s] * bytes_per_block;
      row.tokens_held += tokens_held[s];
    }
    // One run: num_tokens steps of the B sequences from position `context`, greedy tokens.
    auto run = [&]() -> Expected<double> {
      step.tokens.assign(static_cast<size_t>(B), 1);
      step.num_new.assign(static_cast<size_t>(B), 1);
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t t = 0; t < o.num_tokens; ++t) {
        step.num_cached.assign(static_cast<size_t>(B), static_cast<int32_t>(o.context + t));
        KILN_ASSIGN_OR_RETURN(const float* logits, m.forward_paged(step.view({seqs.data(), static_cast<size_t>(B)}),
                                                                   cache));  // (B, V)
        for (int64_t s = 0; s < B; ++s) {
          const float* row = logits + s * V;
          step.tokens[static_cast<size_t>(s)] = static_cast<int32_t>(std::max_element(row, row + V) - row);
        }
      }
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    KILN_RETURN_IF_ERROR(run().status());  // warm-up: first touch of the decode slots, caches
    std::vector<double> seconds;
    for (int r = 0; r < o.repeats; ++r) {
      KILN_ASSIGN_OR_RETURN(const double t, run());
      seconds.push_back(t);
    }
    row.seconds_per_step = median(seconds) / double(o.num_tokens);
    rows.push_back(row);
  }
  return rows;
}

}  // namespace kiln
