// Activation checkpointing modes of Transformer (`kiln train --checkpoint`):
//   none:      every layer keeps all the activations its backward reads.
//   full:      only each layer's input (the residual stream entering it) is kept; the layer's
//              buffers are one set shared by all layers, and backward re-runs the layer's
//              forward from its input before differentiating it (all layers but the last,
//              whose buffers still hold its forward).
//   selective: every layer keeps its activations except the attention core's outputs — the
//              attention output O (N, H·D) and the row log-sum-exp (B, H, T), one shared set —
//              and backward recomputes the core (softmax(QKᵀ)V, flash) from the saved Q, K, V
//              (again all layers but the last).
#pragma once

#include <string_view>

#include "kiln/core/status.h"

namespace kiln {

enum class CheckpointMode { kNone, kFull, kSelective };

inline std::string_view checkpoint_mode_name(CheckpointMode m) {
  return m == CheckpointMode::kNone ? "none" : m == CheckpointMode::kFull ? "full" : "selective";
}

inline Expected<CheckpointMode> parse_checkpoint_mode(std::string_view s) {
  for (CheckpointMode m : {CheckpointMode::kNone, CheckpointMode::kFull, CheckpointMode::kSelective})
    if (s == checkpoint_mode_name(m)) return m;
  return invalid_argument("[checkpoint] unknown mode '{}' (known: none, full, selective)", s);
}

}  // namespace kiln
