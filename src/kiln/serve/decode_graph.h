// The serving engine's decode step as captured graphs (core/graph.h), the CPU form of the CUDA
// graphs vLLM captures per batch size: a step in which every sequence decodes one token and
// samples replays the graph of its batch size S. Its inputs (tokens, positions, block tables,
// logit rows) live in buffers the graph owns, refilled before each replay, so the graph reads
// the new step's values; the block table is padded to the longest context. The first step of a
// batch size captures (running forward_paged once, eagerly, while recording it); a failed guard
// recaptures (counted, the guard named); a graph with breaks (MoE routing, tensor-parallel
// collectives, a backend it cannot record) runs its steps eagerly and lists the breaks.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/graph.h"
#include "kiln/core/status.h"
#include "kiln/model/transformer.h"

namespace kiln {

using GraphStats = graph::GraphStats;

class DecodeGraphs {
 public:
  // relocate: replay in each graph's planned arena (core/graph.h) instead of the eager buffers.
  // pass: run on each graph before it is planned (a fusion pass), may be empty.
  DecodeGraphs(Transformer& model, PagedKvCache& cache, bool relocate = true, graph::GraphPass pass = {});
  ~DecodeGraphs();

  // A step a graph can take: every sequence one new token, logits for every row in order.
  static bool eligible(const PagedBatch& b);
  // Runs an eligible step: logits (S, V), valid until the next step. A step forward_paged
  // would refuse gets its error (Transformer::check_paged), before anything runs.
  Expected<const float*> run(const PagedBatch& b);

  const GraphStats& stats() const { return stats_; }

 private:
  struct Entry;
  graph::GraphKey key_for(int64_t S) const;

  Transformer& model_;
  PagedKvCache& cache_;
  bool relocate_;
  graph::GraphPass pass_;
  int64_t max_blocks_;  // block table width: the longest context's blocks
  std::map<int64_t, std::unique_ptr<Entry>> graphs_;  // by batch size
  GraphStats stats_;
};

}  // namespace kiln
