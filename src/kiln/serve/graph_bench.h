// The benchmark behind `kiln bench graph` (issue 22): the serving decode step of S sequences
// (one token each after `cached` positions, random weights) run eagerly through forward_paged
// and replayed from its captured graph (serve/decode_graph.h), in one run: ms per step, the
// graph's nodes and levels, the per-op overhead replay removes, and whether the logits match.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/model/config.h"
#include "kiln/serve/decode_graph.h"

namespace kiln {

struct GraphBenchOptions {
  ModelConfig config;
  std::vector<int64_t> seqs = {1};  // batch sizes
  int64_t cached = 32;              // positions already cached per sequence
  int64_t steps = 32;               // decode steps per timed run
  int reps = 5;                     // timed runs (median)
  bool packed_weights = true;       // as the serving engine runs
  bool split_epilogues = false;     // bias and residual adds as kernels of their own (Linear::split_epilogue)
  graph::GraphPass pass;            // set: a third column, the graphs after this pass (--fused)
};

struct GraphBenchRow {
  int64_t seqs = 0;
  double eager_s = 0, replay_s = 0;  // per decode step (median)
  double fused_s = 0;                // replayed after the pass (0: no pass)
  int64_t fused_nodes = 0;           // nodes the pass folded
  int64_t nodes = 0, levels = 0;
  int64_t eager_bytes = 0, arena_bytes = 0;  // internal activations: eager's buffers vs the arena
  bool same_logits = false;  // the last step's logits, bitwise (replayed vs eager)
  // (eager - replay) / nodes: what one op costs eagerly beyond its kernel.
  double overhead_per_op_s() const { return nodes > 0 ? (eager_s - replay_s) / double(nodes) : 0.0; }
};

// InvalidArgument for options that cannot run (no batch sizes, a context too short).
Expected<std::vector<GraphBenchRow>> run_graph_bench(const GraphBenchOptions& o);

}  // namespace kiln
