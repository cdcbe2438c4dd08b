// `kiln bench mla-decode` (issue 21): decode tokens/s and KV bytes per token of multi-head,
// grouped-query and multi-head latent attention models of the same width, at a long context
// (4096) and batch 1 and 8, through the serving paged KV cache (serve/kv_decode_bench.h).
#include <fmt/format.h>

#include <memory>
#include <vector>

#include "apps/kiln/commands.h"
#include "kiln/core/thread_pool.h"
#include "kiln/serve/kv_decode_bench.h"

namespace kiln::app {
namespace {

struct MlaDecodeArgs {
  SameWidthOptions width;
  DecodeBenchOptions bench;
};

[[noreturn]] void fail(const Status& s) {
  fmt::print(stderr, "kiln bench mla-decode: {}\n", s.message());
  throw CLI::RuntimeError(kUserError);
}

void run(MlaDecodeArgs a) {
  a.width.max_seq_len = a.bench.context + a.bench.num_tokens;
  auto models = same_width_models(a.width);
  if (!models.ok()) fail(models.status());
  fmt::print("# context {} tokens per sequence, {} decode steps per run, median of {} runs after a warm-up; "
             "fp32 KV cache, {} thread(s)\n",
             a.bench.context, a.bench.num_tokens, a.bench.repeats, num_threads());
  std::vector<std::vector<DecodeBenchRow>> results;
  for (const SameWidthModel& m : *models) {
    fmt::print("# {}: {}\n", attention_kind_name(m.kind), m.config.describe());
    std::fflush(stdout);
    auto rows = run_decode_bench(m.config, a.bench);
    if (!rows.ok()) fail(rows.status());
    results.push_back(std::move(*rows));
  }
  fmt::print("{:<5} {:>5} {:>12} {:>12} {:>10} {:>10} {:>10} {:>9} {:>9}\n", "attn", "batch", "KV B/token",
             "measured", "KV MiB", "tok/s", "ms/step", "KV/MHA", "tok/MHA");
  for (size_t i = 0; i < a.bench.batches.size(); ++i) {
    const DecodeBenchRow& mha = results.front()[i];
    for (size_t k = 0; k < results.size(); ++k) {
      const DecodeBenchRow& r = results[k][i];
      fmt::print("{:<5} {:>5} {:>12} {:>12.1f} {:>10.1f} {:>10.1f} {:>10.2f} {:>9.3f} {:>9.3f}\n",
                 attention_kind_name((*models)[k].kind), r.batch, r.kv_bytes_per_token,
                 r.measured_kv_bytes_per_token(), double(r.kv_bytes_in_use) / 1048576.0, r.tokens_per_second(),
                 1e3 * r.seconds_per_step, double(r.kv_bytes_per_token) / double(mha.kv_bytes_per_token),
                 r.tokens_per_second() / mha.tokens_per_second());
    }
  }
  fmt::print("# KV B/token: kv_bytes_per_token (formula); measured: the pool's bytes in the blocks the batch holds / "
             "its tokens; KV MiB: those bytes at context x batch\n");
}

}  // namespace

void register_bench_mla_decode(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto a = std::make_shared<MlaDecodeArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "mla-decode", "Decode tokens/s and KV bytes per token of MHA, GQA and MLA of one width at a long context");
  SameWidthOptions& w = a->width;
  DecodeBenchOptions& o = a->bench;
  cmd->add_option("--context", o.context, "Tokens prefilled per sequence")->check(CLI::Range(int64_t{1}, int64_t{1} << 17));
  cmd->add_option("--tokens", o.num_tokens, "Decode steps per timed run")->check(CLI::Range(int64_t{1}, int64_t{1} << 12));
  cmd->add_option("--batch", o.batches, "Batch sizes, e.g. 1,8 (sequences decoding together)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  cmd->add_option("--repeats", o.repeats, "Timed runs per batch (the median is kept)")->check(CLI::Range(1, 100));
  cmd->add_option("--prefill-chunk", o.prefill_chunk, "Tokens per prefill forward")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 17));
  cmd->add_option("--block-size", o.block_size, "Tokens per KV-cache block")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  cmd->add_option("--vocab", w.vocab_size, "Vocabulary size")->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  cmd->add_option("--d-model", w.d_model, "Model width")->check(CLI::Range(int64_t{8}, int64_t{1} << 14));
  cmd->add_option("--heads", w.n_heads, "Attention heads (head_dim = d_model / heads)")
      ->check(CLI::Range(int64_t{1}, int64_t{256}));
  cmd->add_option("--layers", w.n_layers, "Transformer blocks")->check(CLI::Range(int64_t{1}, int64_t{256}));
  cmd->add_option("--d-ff", w.d_ff, "SwiGLU hidden size")->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  cmd->add_option("--gqa-group", w.gqa_group, "GQA: query heads per KV head (KV heads = heads / group)")
      ->check(CLI::Range(int64_t{1}, int64_t{256}));
  cmd->add_option("--q-lora-rank", w.q_lora_rank, "MLA: query latent (0: 3 * d_model / 8)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 14));
  cmd->callback([a] { run(*a); });
}

}  // namespace kiln::app
