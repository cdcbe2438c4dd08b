// `kiln bench mla-decode`'s models and measurements (serve/kv_decode_bench.h): the three models
// share one width, and the paged cache's bytes per held token are kv_bytes_per_token's formula.
#include <gtest/gtest.h>

#include "kiln/serve/kv_decode_bench.h"

namespace kiln {
namespace {

TEST(KvDecodeBench, ModelsShareOneWidth) {
  const SameWidthOptions o;  // the bench's defaults: d_model 512, 8 heads of 64, 4 layers
  const auto models = same_width_models(o).value();
  ASSERT_EQ(models.size(), 3u);
  EXPECT_EQ(models[0].kind, AttentionKind::kMha);
  EXPECT_EQ(models[1].kind, AttentionKind::kGqa);
  EXPECT_EQ(models[2].kind, AttentionKind::kMla);
  for (const SameWidthModel& m : models) {
    const ModelConfig& c = m.config;
    SCOPED_TRACE(attention_kind_name(m.kind));
    EXPECT_EQ(c.vocab_size, 8192);
    EXPECT_EQ(c.d_model, 512);
    EXPECT_EQ(c.n_heads, 8);
    EXPECT_EQ(c.head_dim(), 64);
    EXPECT_EQ(c.n_layers, 4);
    EXPECT_EQ(c.d_ff, models[0].config.d_ff);
    EXPECT_EQ(c.max_seq_len, models[0].config.max_seq_len);
    EXPECT_TRUE(check_config(c).ok());
  }
  EXPECT_FALSE(models[0].config.is_mla());
  EXPECT_EQ(models[0].config.n_kv_heads, 8);
  EXPECT_EQ(models[1].config.n_kv_heads, 2);  // a quarter of the heads
  const ModelConfig& mla = models[2].config;
  EXPECT_TRUE(mla.is_mla());
  EXPECT_EQ(mla.kv_lora_rank, 256);  // DeepSeek-V3's ratios at head_dim 64
  EXPECT_EQ(mla.qk_rope_head_dim, 32);
  EXPECT_EQ(mla.qk_nope_head_dim, 64);
  EXPECT_EQ(mla.v_head_dim, 64);  // the output of attention is as wide as MHA's
  EXPECT_EQ(mla.q_lora_rank, 192);
  // The formula per kind, by hand: 2 · layers · kv_heads · head_dim · 4 and layers · (r + rope) · 4.
  EXPECT_EQ(kv_bytes_per_token(models[0].config, DType::kF32), 2 * 4 * 8 * 64 * 4);
  EXPECT_EQ(kv_bytes_per_token(models[1].config, DType::kF32), 2 * 4 * 2 * 64 * 4);
  EXPECT_EQ(kv_bytes_per_token(mla, DType::kF32), 4 * (256 + 32) * 4);
}

TEST(KvDecodeBench, BadWidthsAreNamed) {
  SameWidthOptions o;
  o.gqa_group = 3;  // does not divide 8 heads
  EXPECT_NE(same_width_models(o).status().message().find("--gqa-group 3"), std::string::npos);
  o = {};
  o.d_model = 100;  // not a multiple of 8 heads
  EXPECT_FALSE(same_width_models(o).ok());
  o = {};
  o.n_heads = 16;  // head_dim 32: fine
  EXPECT_TRUE(same_width_models(o).ok());
}

// A small width and context: every kind's cache holds exactly its formula's bytes per token
// (pool bytes of the blocks held / tokens held), at batch 1 and 2, and the decode runs.
TEST(KvDecodeBench, MeasuredCacheBytesPerTokenEqualTheFormula) {
  SameWidthOptions w;
  w.vocab_size = 97;
  w.d_model = 64;
  w.n_heads = 4;  // head_dim 16
  w.n_layers = 2;
  w.d_ff = 96;
  w.max_seq_len = 64;
  DecodeBenchOptions o;
  o.context = 48;        // three blocks of 16
  o.num_tokens = 3;
  o.batches = {1, 2};
  o.repeats = 1;
  o.prefill_chunk = 20;  // chunks of 20, 20, 8
  const auto models = same_width_models(w).value();
  for (const SameWidthModel& m : models) {
    SCOPED_TRACE(attention_kind_name(m.kind));
    const auto rows = run_decode_bench(m.config, o).value();
    ASSERT_EQ(rows.size(), 2u);
    for (const DecodeBenchRow& r : rows) {
      EXPECT_EQ(r.tokens_held, r.batch * o.context);
      EXPECT_EQ(r.kv_bytes_per_token, kv_bytes_per_token(m.config, DType::kF32));
      EXPECT_EQ(r.kv_bytes_in_use, r.kv_bytes_per_token * r.tokens_held);
      EXPECT_DOUBLE_EQ(r.measured_kv_bytes_per_token(), double(r.kv_bytes_per_token));
      EXPECT_GT(r.seconds_per_step, 0.0);
    }
  }
  o.context = 62;  // + 3 decoded tokens > the 64 of max_seq_len
  EXPECT_FALSE(run_decode_bench(models[0].config, o).ok());
}

}  // namespace
}  // namespace kiln
