// Quantized weights sliced for tensor-parallel shards (quant::shard_quantized_state): each
// shard's QTensor dequantizes to exactly the slice of the whole tensor's dequantized values
// (column-parallel rows, row-parallel columns, GPT-2's fused q | k | v blocks, the replicated
// KV head of tp > n_kv_heads), and splits that would change the computation are refused.
#include <gtest/gtest.h>

#include "kiln/model/transformer.h"
#include "kiln/quant/qmodel.h"

namespace kiln::quant {
namespace {

ModelConfig tiny(ModelFamily f) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 40; c.d_model = 32; c.n_layers = 2; c.n_heads = 4;
  c.n_kv_heads = f == ModelFamily::kLlama ? 2 : 4;
  c.d_ff = 64; c.max_seq_len = 16; c.tied_embeddings = f == ModelFamily::kGpt2;
  return c;
}

QuantizedState quantized(Transformer& m, int64_t group, ActQuant act = ActQuant::kNone) {
  QuantizeOptions o;
  o.scheme.bits = 4;
  o.scheme.group = group;
  auto st = quantize_model(m, nullptr, o, nullptr);
  EXPECT_TRUE(st.ok()) << st.status().message();
  st->act = act;
  return *st;
}

TEST(QuantShard, SlicesDequantizeToTheWholeTensorsSlices) {
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGpt2}) {
    for (int64_t group : {int64_t{4}, QuantScheme::kPerChannel, QuantScheme::kPerTensor}) {
      auto m = Transformer::create(tiny(f), 3).value();
      const QuantizedState full = quantized(*m, group);
      for (int tp : {2, 4}) {
        for (int r = 0; r < tp; ++r) {
          const std::vector<ParamEntry> entries = Transformer::param_entries_for(tiny(f), r, tp);
          auto sliced = shard_quantized_state(full, entries);
          ASSERT_TRUE(sliced.ok()) << sliced.status().message();
          int64_t checked = 0;
          for (const ParamEntry& e : entries) {
            auto whole = full.weights.find(e.name);
            if (whole == full.weights.end()) continue;
            const std::vector<float> w = whole->second.dequantize();
            const std::vector<float> mine = sliced->weights.at(e.name).dequantize();
            ASSERT_EQ(static_cast<int64_t>(mine.size()), e.shape.numel()) << e.name;
            for_each_entry_run(e, [&](int64_t local, int64_t at, int64_t n) {
              for (int64_t i = 0; i < n; ++i)
                ASSERT_EQ(mine[local - e.offset + i], w[at - e.split.full_offset + i]) << e.name << " tp " << tp;
            });
            ++checked;
          }
          EXPECT_EQ(checked, static_cast<int64_t>(full.weights.size())) << "tp " << tp;
        }
      }
    }
  }
}

TEST(QuantShard, SplitsThatChangeTheComputationAreRefused) {
  auto m = Transformer::create(tiny(ModelFamily::kLlama), 3).value();
  // Groups of 16 along o_proj's 32 inputs: whole at tp 2, straddling at tp 4 (8 columns each).
  const QuantizedState g16 = quantized(*m, 16);
  EXPECT_TRUE(shard_quantized_state(g16, Transformer::param_entries_for(tiny(ModelFamily::kLlama), 1, 2)).ok());
  auto bad = shard_quantized_state(g16, Transformer::param_entries_for(tiny(ModelFamily::kLlama), 1, 4));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("o_proj.weight"), std::string::npos) << bad.status().message();
  // Int8 activations: the per-token scale of a row-parallel input spans the whole row.
  auto m2 = Transformer::create(tiny(ModelFamily::kLlama), 3).value();
  const QuantizedState act = quantized(*m2, QuantScheme::kPerChannel, ActQuant::kInt8);
  auto refused = shard_quantized_state(act, Transformer::param_entries_for(tiny(ModelFamily::kLlama), 0, 2));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("int8 activations"), std::string::npos) << refused.status().message();
  // One process: the state unchanged.
  auto same = shard_quantized_state(act, Transformer::param_entries_for(tiny(ModelFamily::kLlama)));
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->weights.size(), act.weights.size());
}

}  // namespace
}  // namespace kiln::quant
