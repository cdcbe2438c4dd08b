// The memory model of one training step: model states (weights, gradients, master weights,
// AdamW states, low-precision weight copies) and activations (per layer, by buffer, and the
// rest), each with the formula it comes from, for a precision and a checkpointing mode, on one
// process or one rank of a dp × tp layout. It mirrors the buffers Transformer, Trainer, the
// precision backends and the parallel plans allocate, and rounds each to the caching
// allocator's size classes, so it can be held against the allocator's peak.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/model/checkpoint_mode.h"
#include "kiln/model/config.h"
#include "kiln/train/precision.h"

namespace kiln::perf {

struct MemoryItem {
  std::string group;    // "model states", "layer activations", "other activations", "scratch", "kernel scratch"
  std::string name;     // e.g. "gradients", "ff1 (gate)"
  std::string formula;  // symbolic, e.g. "4·P"
  int64_t count = 1;    // how many such buffers (layers that keep it)
  int64_t bytes = 0;    // one buffer, as requested
  int64_t block_bytes = 0;  // one buffer, rounded to the allocator's block size
  int64_t total() const { return count * bytes; }
  int64_t total_blocks() const { return count * block_bytes; }
};

struct MemoryPrediction {
  ModelConfig config;
  int64_t batch = 0, seq_len = 0;
  Precision precision = Precision::kF32;
  CheckpointMode checkpoint = CheckpointMode::kNone;
  std::vector<MemoryItem> items;
  int64_t bytes_per_param = 0;  // model states / P
  int64_t total_bytes() const;         // sum as requested (compare: peak_bytes_requested)
  int64_t total_block_bytes() const;   // sum of blocks (compare: peak_bytes_in_use)
  int64_t group_bytes(const std::string& group) const;
  int64_t group_block_bytes(const std::string& group) const;
  // The activation groups (layer activations, other activations, scratch, kernel scratch), in blocks.
  int64_t activation_block_bytes() const;
  // One layer's saved activations when every layer keeps its own (the none layout).
  int64_t layer_activation_bytes = 0;
  // Data parallel (predict_memory with DataParallelMemory): batch above is per rank.
  int dp = 1, zero = 0, shard_group = 1;
  // Tensor parallel (TensorParallelMemory): every size above is this rank's shard.
  int tp = 1;
  bool sequence_parallel = false;
  int64_t num_params = 0;  // Ψ, this rank's parameters (the model's at tp = 1)
  std::string notes;  // the formula in words, printed under the table
};

// A data-parallel layout (parallel/data_parallel.h's DataParallelOptions, restated here so that
// perf stays below parallel): P ranks, a ZeRO stage, shards over groups of S ranks.
struct DataParallelMemory {
  int dp = 1;                  // P, data-parallel ranks
  int zero = 0;                // ZeRO stage 0 (DDP) .. 3 (FSDP)
  int shard_group = 0;         // HSDP group size S; 0: S = P (stages >= 1)
  int fsdp_unit_blocks = 1;    // blocks per FSDP unit
  int prefetch = 1;            // ZeRO-3 units gathered ahead
  bool reshard_after_forward = true;
};

// A tensor-parallel layout (parallel/tensor_parallel.h's TensorParallelOptions, restated): the
// model split over tp ranks (model/transformer.h's TensorShard), sequence parallelism on or off
// (it takes effect at tp >= 2 only, as in TensorParallelPlan::shard()).
struct TensorParallelMemory {
  int tp = 1;
  bool sequence_parallel = false;
};

MemoryPrediction predict_memory(const ModelConfig& c, int64_t batch, int64_t seq_len, Precision p, CheckpointMode m);

// The allocator peak of one rank under data parallelism: the model states as the stage shards
// them (fp32: params 4Ψ, grads 4Ψ, AdamW m+v 8Ψ), the unit buffers DataParallelPlan allocates
// (gathered parameters, padded gradient buffers, reduce-scatter and all-gather temporaries) at
// the moment they peak, plus the activations of the per-rank batch (global_batch / P, which
// the caller has checked divides). Units: the head range, groups of fsdp_unit_blocks blocks,
// the tail range; unit u of n_u floats has chunk ceil(n_u / S) and is padded to S chunks.
// With tp > 1 (TensorParallelPlan: DDP over the dp axis, zero 0 only; the config passes
// check_tensor_split, and seq_len divides by tp under sequence parallelism) every buffer is
// this rank's shard: Ψ from Transformer::param_entries_for, activations at their local widths
// (heads, KV heads, FFN columns, vocabulary over tp; norm and residual rows N / tp under SP, plus
// SP's gathered rows and row-parallel output), the vocab-parallel loss's buffers, and the plan's
// packs of the gradients summed over replicas.
MemoryPrediction predict_memory(const ModelConfig& c, int64_t global_batch, int64_t seq_len, Precision p,
                                CheckpointMode m, const DataParallelMemory& dp, const TensorParallelMemory& tp = {});

// Float counts of the data-parallel units of a config (head, block groups, tail), from
// Transformer::param_entries_for (of tp rank 0's shard): what DataParallelPlan::build_units cuts.
std::vector<int64_t> data_parallel_unit_sizes(const ModelConfig& c, int fsdp_unit_blocks,
                                              const TensorParallelMemory& tp = {});

// FLOPs per token recomputed by checkpointing (for HFU): full re-runs the forward of every layer
// but the last, 2·P_layer + 4·T·d each; selective only their attention core, 4·T·d each (the
// forward third of the 12·L·T·d attention term of ModelConfig::train_flops_per_token).
double recompute_flops_per_token(const ModelConfig& c, int64_t seq_len, CheckpointMode m);

// A text table of the prediction, formulas included.
std::string format_memory_prediction(const MemoryPrediction& p);

}  // namespace kiln::perf
