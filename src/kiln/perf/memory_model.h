// The memory model of one training step: model states (weights, gradients, master weights,
// AdamW states, low-precision weight copies) and activations (per layer, by buffer, and the
// rest), each with the formula it comes from, for a precision and a checkpointing mode, on one
// process or one rank of a dp × tp layout. It mirrors the buffers Transformer, Trainer, the
// precision backends and the parallel plans allocate, and rounds each to the caching
// allocator's size classes, so it can be held against the allocator's peak. A buffer is live in
// some phases of the step (StepPhase); the peak is the largest phase's sum, not the sum of all.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/model/checkpoint_mode.h"
#include "kiln/model/config.h"
#include "kiln/train/precision.h"

namespace kiln::perf {

// The phases of one training step, in order. The model states and the buffers laid out once
// (activations, the shared backward scratch, precision conversion buffers) are live in all of
// them; a transient buffer is made and freed inside some: a kernel's scratch inside its call
// (the flash forward's in the forward, the flash backward's in the backward), a data-parallel
// plan's units in flight in the passes that hold them, ZeRO-1/2's all-gather in the optimizer
// step. Transient buffers of different phases are never live together, so the step's peak is
// the largest phase's sum (MemoryPrediction::total_block_bytes), not the sum of every buffer.
enum class StepPhase : uint8_t { kForward, kBackward, kOptimizerStep };
inline constexpr StepPhase kStepPhases[] = {StepPhase::kForward, StepPhase::kBackward, StepPhase::kOptimizerStep};
const char* step_phase_name(StepPhase p);  // "forward", "backward", "optimizer step"

// A set of phases (bit i: StepPhase i), the ones a buffer is live in.
using PhaseSet = uint8_t;
constexpr PhaseSet phase_bit(StepPhase p) { return static_cast<PhaseSet>(1u << static_cast<unsigned>(p)); }
inline constexpr PhaseSet kWholeStep = phase_bit(StepPhase::kForward) | phase_bit(StepPhase::kBackward) |
                                       phase_bit(StepPhase::kOptimizerStep);
std::string phase_set_name(PhaseSet s);  // "whole step", "backward", "forward+backward", ...

struct MemoryItem {
  std::string group;    // "model states", "layer activations", "other activations", "scratch", "kernel scratch"
  std::string name;     // e.g. "gradients", "ff1 (gate)"
  std::string formula;  // symbolic, e.g. "4·P"
  int64_t count = 1;    // how many such buffers (layers that keep it)
  int64_t bytes = 0;    // one buffer, as requested
  int64_t block_bytes = 0;  // one buffer, rounded to the allocator's block size
  PhaseSet live = kWholeStep;  // the phases it is live in
  int64_t total() const { return count * bytes; }
  int64_t total_blocks() const { return count * block_bytes; }
  bool live_in(StepPhase p) const { return (live & phase_bit(p)) != 0; }
};

struct MemoryPrediction {
  ModelConfig config;
  int64_t batch = 0, seq_len = 0;
  Precision precision = Precision::kF32;
  CheckpointMode checkpoint = CheckpointMode::kNone;
  std::vector<MemoryItem> items;  // every phase's buffers (MemoryItem::live says which)
  int64_t bytes_per_param = 0;  // model states / P
  // The items live in phase p, summed as requested and in allocator blocks.
  int64_t phase_bytes(StepPhase p) const;
  int64_t phase_block_bytes(StepPhase p) const;
  // The phase whose live items take the most blocks (the first such, in step order).
  StepPhase peak_phase() const;
  int64_t total_bytes() const;         // the largest phase as requested (compare: peak_bytes_requested)
  int64_t total_block_bytes() const;   // the largest phase in blocks (compare: peak_bytes_in_use)
  // A group's items live at the peak (the peak phase by requested bytes, resp. by blocks), so
  // the groups add up to total_bytes(), resp. total_block_bytes().
  int64_t group_bytes(const std::string& group) const;
  int64_t group_block_bytes(const std::string& group) const;
  // The activation groups (layer activations, other activations, scratch, kernel scratch) at
  // the peak, in blocks.
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

// One process's step: everything whole-step but the flash kernels' scratch (forward, backward),
// so the peak falls in the backward, with the backward's tile scratch.
MemoryPrediction predict_memory(const ModelConfig& c, int64_t batch, int64_t seq_len, Precision p, CheckpointMode m);

// The allocator peak of one rank under data parallelism: the model states as the stage shards
// them (fp32: params 4Ψ, grads 4Ψ, AdamW m+v 8Ψ), the unit buffers DataParallelPlan allocates
// (gathered parameters, padded gradient buffers, reduce-scatter and all-gather temporaries) in
// the phases they are live in, at their bound there, plus the activations and kernel scratch
// of the per-rank batch (global_batch / P, which the caller has checked divides); the peak is
// the largest phase (the backward, or under ZeRO-1/2 possibly the optimizer step's all-gather). Units: the head range, groups of fsdp_unit_blocks blocks,
// the tail range; unit u of n_u floats has chunk ceil(n_u / S) and is padded to S chunks.
// With tp > 1 (TensorParallelPlan: DDP over the dp axis, zero 0 only; the config passes
// check_tensor_split, and seq_len divides by tp under sequence parallelism) every buffer is
// this rank's shard: Ψ from Transformer::param_entries_for, activations at their local widths
// (heads, KV heads, FFN columns, vocabulary over tp; norm and residual rows N / tp under SP, plus
// SP's gathered rows and row-parallel output), the vocab-parallel loss's buffers, and the plan's
// packs of the gradients summed over replicas.
MemoryPrediction predict_memory(const ModelConfig& c, int64_t global_batch, int64_t seq_len, Precision p,
                                CheckpointMode m, const DataParallelMemory& dp, const TensorParallelMemory& tp = {});

// Optimizer-state offloading (train/offload.h): the AdamW moments leave memory for a file. Drops
// their items from p (model states and bytes per parameter shrink by 8 bytes a parameter) and
// says so in the notes, with the staging buffers the stream keeps instead (outside the caching
// allocator, so outside the peak this prediction is held against).
void offload_optimizer_state(MemoryPrediction& p, int64_t staging_bytes);

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
