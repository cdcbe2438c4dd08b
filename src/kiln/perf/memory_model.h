// The memory model of one training step: model states (weights, gradients, master weights,
// AdamW states, low-precision weight copies) and activations (per layer, by buffer, and the
// rest), each with the formula it comes from, for a precision and a checkpointing mode. It
// mirrors the buffers Transformer, Trainer and the precision backends allocate, and rounds each
// to the caching allocator's size classes, so it can be held against the allocator's peak.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/model/checkpoint_mode.h"
#include "kiln/model/config.h"
#include "kiln/train/precision.h"

namespace kiln::perf {

struct MemoryItem {
  std::string group;    // "model states", "layer activations", "other activations", "scratch"
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
  // One layer's saved activations when every layer keeps its own (the none layout).
  int64_t layer_activation_bytes = 0;
};

MemoryPrediction predict_memory(const ModelConfig& c, int64_t batch, int64_t seq_len, Precision p, CheckpointMode m);

// FLOPs per token recomputed by checkpointing (for HFU): full re-runs the forward of every layer
// but the last, 2·P_layer + 4·T·d each; selective only their attention core, 4·T·d each (the
// forward third of the 12·L·T·d attention term of ModelConfig::train_flops_per_token).
double recompute_flops_per_token(const ModelConfig& c, int64_t seq_len, CheckpointMode m);

// A text table of the prediction, formulas included.
std::string format_memory_prediction(const MemoryPrediction& p);

}  // namespace kiln::perf
