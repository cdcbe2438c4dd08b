// The tensor-parallel memory model (perf::predict_memory with TensorParallelMemory) against
// the model it mirrors and values worked by hand: at tp = 1 it is the data-parallel prediction
// item for item, and its activations are the bytes the single-process model allocates; at tp 2
// and 4 each activation shrinks by its split (columns, KV heads, vocabulary; rows under SP).
// The measured check is tests/parallel/test_memory_tensor_parallel.cpp (under MPI).
#include <gtest/gtest.h>

#include "kiln/model/transformer.h"
#include "kiln/perf/memory_model.h"

namespace kiln::perf {
namespace {

int64_t item_bytes(const MemoryPrediction& p, const std::string& prefix) {
  int64_t s = 0;
  for (const MemoryItem& i : p.items)
    if (i.name.starts_with(prefix)) s += i.total();
  return s;
}

int64_t named_bytes(const MemoryPrediction& p, const std::string& name) {
  int64_t s = 0;
  for (const MemoryItem& i : p.items)
    if (i.name == name) s += i.total();
  return s;
}

// The MPI test's model: Llama V 512, C 128 (H 4, Hkv 2, D 32), F 256, L 2, untied.
ModelConfig llama() {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.vocab_size = 512; c.d_model = 128; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 2;
  c.d_ff = 256; c.max_seq_len = 16; c.tied_embeddings = false;
  return c;
}

ModelConfig gpt2() {
  ModelConfig c = llama();
  c.family = ModelFamily::kGpt2;
  c.n_kv_heads = 4;
  c.tied_embeddings = true;
  return c;
}

MemoryPrediction at(const ModelConfig& c, int tp, bool sp, int dp = 1) {
  DataParallelMemory d;
  d.dp = dp;
  return predict_memory(c, 4 * dp, 16, Precision::kF32, CheckpointMode::kNone, d, {tp, sp});
}

TEST(TensorParallelMemory, TpOneIsTheDataParallelPrediction) {
  for (const ModelConfig& c : {llama(), gpt2()})
    for (Precision p : {Precision::kF32, Precision::kBF16})
      for (CheckpointMode m : {CheckpointMode::kNone, CheckpointMode::kFull, CheckpointMode::kSelective})
        for (int dp : {1, 2}) {
          DataParallelMemory d;
          d.dp = dp;
          const MemoryPrediction ref = predict_memory(c, 4 * dp, 16, p, m, d);
          // Sequence parallelism takes effect at tp >= 2 only (TensorParallelPlan::shard()).
          for (bool sp : {false, true}) {
            const MemoryPrediction got = predict_memory(c, 4 * dp, 16, p, m, d, {1, sp});
            ASSERT_EQ(got.items.size(), ref.items.size());
            for (size_t i = 0; i < ref.items.size(); ++i) {
              EXPECT_EQ(got.items[i].name, ref.items[i].name);
              EXPECT_EQ(got.items[i].formula, ref.items[i].formula) << ref.items[i].name;
              EXPECT_EQ(got.items[i].count, ref.items[i].count) << ref.items[i].name;
              EXPECT_EQ(got.items[i].bytes, ref.items[i].bytes) << ref.items[i].name;
            }
            EXPECT_EQ(got.num_params, c.num_params());
            EXPECT_FALSE(got.sequence_parallel);
          }
          if (dp == 1) {  // and the single-process prediction of the same batch
            EXPECT_EQ(ref.total_block_bytes(), predict_memory(c, 4, 16, p, m).total_block_bytes());
          }
        }
}

// The activation items are the buffers the model allocates: the prediction's requested bytes
// are Transformer::activation_bytes() after a forward, in both families and every mode.
TEST(TensorParallelMemory, TpOneActivationsAreTheModelsBuffers) {
  for (const ModelConfig& c : {llama(), gpt2()})
    for (CheckpointMode m : {CheckpointMode::kNone, CheckpointMode::kFull, CheckpointMode::kSelective}) {
      auto model = Transformer::create(c, 1).value();
      model->set_checkpointing(m);
      std::vector<int32_t> x(4 * 16, 7);
      ASSERT_TRUE(model->forward(x.data(), x.data(), 4, 16).ok());
      DataParallelMemory d;
      const MemoryPrediction p = predict_memory(c, 4, 16, Precision::kF32, m, d, {1, false});
      EXPECT_EQ(p.group_bytes("layer activations") + p.group_bytes("other activations") + p.group_bytes("scratch"),
                model->activation_bytes())
          << family_name(c.family) << " " << checkpoint_mode_name(m);
    }
}

TEST(TensorParallelMemory, ActivationsShrinkByTheirSplit) {
  const ModelConfig c = llama();
  const MemoryPrediction one = at(c, 1, false);
  const int64_t N = 4 * 16, C = 128, D = 32;
  for (int tp : {2, 4})
    for (bool sp : {false, true}) {
      const MemoryPrediction p = at(c, tp, sp);
      const std::string what = fmt::format("tp {}{}", tp, sp ? " sp" : "");
      EXPECT_EQ(p.tp, tp);
      EXPECT_EQ(p.sequence_parallel, sp);
      // Column-parallel outputs, the attention core and the vocabulary: 1/tp.
      for (const char* name : {"q (after RoPE)", "attention out O", "attention lse", "ff1 (gate)", "ffa", "logits",
                               "backward: datt", "backward: dq", "backward: dff"})
        EXPECT_EQ(item_bytes(p, name) * tp, item_bytes(one, name)) << what << " " << name;
      // KV heads: 2 split over tp 2; over tp 4 each rank holds one of them (replicated).
      for (const char* name : {"k (after RoPE)", "backward: dk, dv"})
        EXPECT_EQ(item_bytes(p, name) * std::min(tp, 2), item_bytes(one, name)) << what << " " << name;
      EXPECT_EQ(named_bytes(p, "v"), item_bytes(p, "k (after RoPE)")) << what;
      EXPECT_EQ(item_bytes(p, "k (after RoPE)"), 2 * 4 * N * D) << what;  // 2 layers of (N, 1 or Hkv/tp · D)
      // The norm and residual regions: whole rows, or N / tp of them under SP.
      for (const char* name : {"n1", "mean1", "x1", "n2", "mean2", "residual stream", "final mean", "backward: dresid"})
        EXPECT_EQ(item_bytes(p, name) * (sp ? tp : 1), item_bytes(one, name)) << what << " " << name;
      // Whole on every rank: the LM head's input, its gradient, the losses.
      for (const char* name : {"final norm out", "backward: dnorm", "losses"})
        EXPECT_EQ(item_bytes(p, name), item_bytes(one, name)) << what << " " << name;
      // New at tp > 1: the vocab-parallel loss's row max and (sum, target logit); SP's gathered
      // rows and row-parallel output.
      EXPECT_EQ(item_bytes(p, "vocab-parallel loss"), 4 * N + 8 * N) << what;
      EXPECT_EQ(item_bytes(p, "SP:"), sp ? 2 * 4 * N * C : 0) << what;
      // Model states: Ψ is this rank's share of the model's own table.
      const std::vector<ParamEntry> e = Transformer::param_entries_for(c, 0, tp, sp);
      EXPECT_EQ(p.num_params, e.back().offset + e.back().shape.numel()) << what;
      EXPECT_EQ(item_bytes(p, "params"), 4 * p.num_params) << what;
      EXPECT_LT(p.num_params, one.num_params) << what;
    }
  // Fewer activations with every split; SP saves on top of tp.
  EXPECT_GT(one.activation_block_bytes(), at(c, 2, false).activation_block_bytes());
  EXPECT_GT(at(c, 2, false).activation_block_bytes(), at(c, 4, false).activation_block_bytes());
  EXPECT_GT(at(c, 2, false).activation_block_bytes(), at(c, 2, true).activation_block_bytes());
  EXPECT_GT(at(c, 4, false).activation_block_bytes(), at(c, 4, true).activation_block_bytes());
}

TEST(TensorParallelMemory, PartialGradientPacksByHand) {
  const ModelConfig c = llama();
  const int64_t C = 128, D = 32, L = 2;
  // tp 2: KV heads split, nothing partial without SP; SP's norms (2 per layer + the final) are.
  EXPECT_EQ(at(c, 2, false).group_bytes("tensor-parallel buffers"), 0);
  EXPECT_EQ(item_bytes(at(c, 2, true), "partial-gradient pack (summed over 2"), 4 * (2 * L + 1) * C);
  // tp 4 over 2 KV heads: each k and v weight (D rows of C) is held by 2 ranks; SP adds the norms
  // over all 4.
  EXPECT_EQ(item_bytes(at(c, 4, false), "partial-gradient pack (summed over 2"), 4 * 2 * L * D * C);
  EXPECT_EQ(item_bytes(at(c, 4, true), "partial-gradient pack (summed over 4"), 4 * (2 * L + 1) * C);
  // DDP over dp 2 adds nothing per rank (buckets reduce in place): the per-rank batch is the same.
  EXPECT_EQ(at(c, 2, true, 2).total_block_bytes(), at(c, 2, true, 1).total_block_bytes());
}

TEST(TensorParallelMemory, GptTwoSplitsItsFusedProjection) {
  const ModelConfig c = gpt2();
  const MemoryPrediction one = at(c, 1, false), two = at(c, 2, true);
  EXPECT_EQ(item_bytes(two, "qkv") * 2, item_bytes(one, "qkv"));
  EXPECT_EQ(item_bytes(two, "backward: dqkv") * 2, item_bytes(one, "backward: dqkv"));
  // SP: GPT-2's position table is partial too, with the norms (2 weights + 2 biases per layer, ln_f's 2).
  EXPECT_EQ(item_bytes(two, "partial-gradient pack"), 4 * (16 * 128 + (4 * 2 + 2) * 128));
}

}  // namespace
}  // namespace kiln::perf
