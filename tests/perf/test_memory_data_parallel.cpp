// The data-parallel memory model (perf/memory_model.h) against values worked by hand: DDP's
// model states are the single-process ones, ZeRO-3's shards and gathered units for a config
// small enough to count, the stages order as they shard more, and the peak is the largest
// phase's buffers, not the sum of all. The measured check is
// tests/parallel/test_memory_per_rank.cpp (under MPI).
#include <gtest/gtest.h>

#include <algorithm>

#include "kiln/core/allocator.h"
#include "kiln/perf/memory_model.h"

namespace kiln::perf {
namespace {

int64_t item_bytes(const MemoryPrediction& p, const std::string& prefix) {
  int64_t s = 0;
  for (const MemoryItem& i : p.items)
    if (i.name.starts_with(prefix)) s += i.total();
  return s;
}

// Llama, V 13, C 6 (H 2, Hkv 1, D 3), F 11, L 2, untied: every unit but the tail is padded at S = 4.
ModelConfig odd() {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.vocab_size = 13; c.d_model = 6; c.n_layers = 2; c.n_heads = 2; c.n_kv_heads = 1;
  c.d_ff = 11; c.max_seq_len = 16; c.tied_embeddings = false;
  return c;
}

TEST(DataParallelMemory, UnitsAreHeadBlockGroupsTail) {
  // head V·C = 78; block C + 6·6 + 3·6 + 3·6 + 6·6 + C + 3·11·6 = 318; tail C + V·C = 84.
  EXPECT_EQ(data_parallel_unit_sizes(odd(), 1), (std::vector<int64_t>{78, 318, 318, 84}));
  EXPECT_EQ(data_parallel_unit_sizes(odd(), 2), (std::vector<int64_t>{78, 636, 84}));
  EXPECT_EQ(odd().num_params(), 78 + 2 * 318 + 84);
}

TEST(DataParallelMemory, StageZeroIsTheSingleProcessModelStates) {
  const ModelConfig c = preset("llama-tiny").value();
  const MemoryPrediction one = predict_memory(c, 4, 64, Precision::kF32, CheckpointMode::kNone);
  DataParallelMemory d;
  d.dp = 2;
  const MemoryPrediction two = predict_memory(c, 8, 64, Precision::kF32, CheckpointMode::kNone, d);
  EXPECT_EQ(item_bytes(two, "params"), item_bytes(one, "weights"));
  EXPECT_EQ(item_bytes(two, "grads"), item_bytes(one, "gradients"));
  EXPECT_EQ(item_bytes(two, "AdamW m+v"), item_bytes(one, "AdamW m") + item_bytes(one, "AdamW v"));
  EXPECT_EQ(two.group_bytes("model states"), one.group_bytes("model states"));
  // The per-rank batch (4 of the global 8): the same activations, nothing else.
  EXPECT_EQ(two.batch, 4);
  EXPECT_EQ(two.total_block_bytes(), one.total_block_bytes());
}

TEST(DataParallelMemory, StageThreeByHand) {
  DataParallelMemory d;
  d.dp = 4;
  d.zero = 3;
  d.prefetch = 1;
  const MemoryPrediction p = predict_memory(odd(), 8, 4, Precision::kF32, CheckpointMode::kNone, d);
  // Chunks at S = 4: head ⌈78/4⌉ = 20, blocks ⌈318/4⌉ = 80, tail ⌈84/4⌉ = 21; shard 201 floats.
  EXPECT_EQ(p.shard_group, 4);
  EXPECT_EQ(item_bytes(p, "params (sharded"), 4 * 201);
  EXPECT_EQ(item_bytes(p, "grads (sharded"), 4 * 201);
  EXPECT_EQ(item_bytes(p, "AdamW m+v (sharded"), 2 * 4 * 201);
  EXPECT_EQ(item_bytes(p, "gathered head unit"), 4 * 80);
  EXPECT_EQ(item_bytes(p, "gathered tail unit"), 4 * 84);
  EXPECT_EQ(item_bytes(p, "gathered block units"), 2 * 4 * 320);  // 1 + prefetch, both blocks
  // Gradient buffers, the bound: the head's, two of the largest other unit (a block, padded
  // 320) and two temporaries of its chunk (80).
  EXPECT_EQ(item_bytes(p, "head unit gradient"), 4 * 80);
  EXPECT_EQ(item_bytes(p, "unit gradient buffers (padded): computing"), 4 * 320);
  EXPECT_EQ(item_bytes(p, "unit gradient buffers (padded): reducing"), 4 * 320);
  EXPECT_EQ(item_bytes(p, "reduce-scatter temporaries"), 2 * 4 * 80);
  EXPECT_EQ(p.group_bytes("data-parallel buffers"), 320 + 336 + 2560 + 320 + 1280 + 1280 + 640);
  // Activations: those of the per-rank batch, 2 of 8.
  const MemoryPrediction one = predict_memory(odd(), 2, 4, Precision::kF32, CheckpointMode::kNone);
  EXPECT_EQ(p.total_bytes() - p.group_bytes("model states") - p.group_bytes("data-parallel buffers"),
            one.total_bytes() - one.group_bytes("model states"));
  // Without resharding after forward both block units stay gathered (also 2 here); with
  // prefetch 0 only one is.
  d.prefetch = 0;
  EXPECT_EQ(item_bytes(predict_memory(odd(), 8, 4, Precision::kF32, CheckpointMode::kNone, d), "gathered block units"), 4 * 320);
  d.reshard_after_forward = false;
  EXPECT_EQ(item_bytes(predict_memory(odd(), 8, 4, Precision::kF32, CheckpointMode::kNone, d), "gathered block units"),
            2 * 4 * 320);
}

// ZeRO-1 at P = 2: the flash backward's tile scratch is live only in the backward, the
// all-gather buffer only in the optimizer step, the flash forward's scratch only in the forward;
// everything else for the whole step. The peak is the whole-step part plus the largest of the
// three, and the groups at the peak add up to it.
TEST(DataParallelMemory, PeakIsTheLargestPhaseNotTheSum) {
  const ModelConfig c = preset("llama-tiny").value();
  DataParallelMemory d;
  d.dp = 2;
  d.zero = 1;
  const MemoryPrediction p = predict_memory(c, 8, 64, Precision::kF32, CheckpointMode::kNone, d);
  int64_t whole = 0, forward = 0, backward = 0, step = 0;
  for (const MemoryItem& i : p.items) {
    if (i.name.starts_with("attention forward")) {
      EXPECT_EQ(i.live, phase_bit(StepPhase::kForward));
      forward += i.total_blocks();
    } else if (i.name.starts_with("attention backward")) {
      EXPECT_EQ(i.live, phase_bit(StepPhase::kBackward));
      backward += i.total_blocks();
    } else if (i.name.starts_with("all-gather buffer after the optimizer")) {
      EXPECT_EQ(i.live, phase_bit(StepPhase::kOptimizerStep));
      step += i.total_blocks();
    } else {
      EXPECT_EQ(i.live, kWholeStep) << i.name;
      whole += i.total_blocks();
    }
  }
  ASSERT_GT(forward, 0);
  ASSERT_GT(backward, 0);
  ASSERT_GT(step, 0);
  EXPECT_EQ(p.phase_block_bytes(StepPhase::kForward), whole + forward);
  EXPECT_EQ(p.phase_block_bytes(StepPhase::kBackward), whole + backward);
  EXPECT_EQ(p.phase_block_bytes(StepPhase::kOptimizerStep), whole + step);
  EXPECT_EQ(p.total_block_bytes(), whole + std::max({forward, backward, step}));
  int64_t groups = 0;
  for (const char* g : {"model states", "data-parallel buffers", "layer activations", "other activations", "scratch",
                        "kernel scratch"})
    groups += p.group_block_bytes(g);
  EXPECT_EQ(groups, p.total_block_bytes());
  // One process: nothing lives in the optimizer step alone, so the peak is the forward's or the
  // backward's, whichever attention scratch is larger (at T = 64 their tiles may take the same
  // blocks: the flash tiles are fitted to the length, flash_tiles_for_length).
  const MemoryPrediction one = predict_memory(c, 4, 64, Precision::kF32, CheckpointMode::kNone);
  EXPECT_NE(one.peak_phase(), StepPhase::kOptimizerStep);
  EXPECT_EQ(one.total_block_bytes(),
            whole - (p.group_block_bytes("model states") - one.group_block_bytes("model states")) +
                std::max(forward, backward));
}

TEST(DataParallelMemory, StagesShardMoreInOrder) {
  const ModelConfig c = preset("llama-tiny").value();
  int64_t last = 0, last_total = 0;
  for (int z = 0; z <= 3; ++z) {
    DataParallelMemory d;
    d.dp = 4;
    d.zero = z;
    // The model states shrink stage by stage, and so do the totals (units in flight included).
    const MemoryPrediction p = predict_memory(c, 8, 64, Precision::kF32, CheckpointMode::kNone, d);
    const int64_t states = p.group_block_bytes("model states");
    if (z > 0) {
      EXPECT_LT(states, last) << "ZeRO-" << z;
      EXPECT_LT(p.total_block_bytes(), last_total) << "ZeRO-" << z;
    }
    last = states;
    last_total = p.total_block_bytes();
  }
  // HSDP shards over its group only: between ZeRO-3 at S = P and DDP.
  DataParallelMemory h;
  h.dp = 4;
  h.zero = 3;
  h.shard_group = 2;
  const MemoryPrediction hs = predict_memory(c, 8, 64, Precision::kF32, CheckpointMode::kNone, h);
  EXPECT_EQ(hs.shard_group, 2);
  EXPECT_GT(hs.group_block_bytes("model states"), last);
}

}  // namespace
}  // namespace kiln::perf
