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

struct GraphStats {
  int64_t captures = 0;    // graphs captured for a new batch size
  int64_t recaptures = 0;  // captured again because a guard failed
  int64_t replays = 0;     // decode steps replayed
  int64_t eager_steps = 0;  // decode steps run eagerly (their graph has breaks)
  std::string last_recapture;       // the guard that failed last, e.g. "threads 2 -> 1"
  std::vector<std::string> breaks;  // every distinct break reason seen
  // Of the graphs held now: nodes and parallel levels, and internal activation bytes kept apart
  // (as eager keeps them) vs packed by lifetime into each graph's arena.
  int64_t nodes = 0, levels = 0, eager_bytes = 0, arena_bytes = 0;
};

// One line: "graph capture: 2 captured, 1 recaptured (threads 2 -> 1), 30 replayed, ...".
std::string describe(const GraphStats& s);

class DecodeGraphs {
 public:
  // relocate: replay in each graph's planned arena (core/graph.h) instead of the eager buffers.
  DecodeGraphs(Transformer& model, PagedKvCache& cache, bool relocate = true);
  ~DecodeGraphs();

  // A step a graph can take: every sequence one new token, logits for every row in order.
  static bool eligible(const PagedBatch& b);
  // Runs an eligible step: logits (S, V), valid until the next step. Steps whose values
  // forward_paged would refuse run eagerly, so the error is forward_paged's.
  Expected<const float*> run(const PagedBatch& b);

  const GraphStats& stats() const { return stats_; }

 private:
  struct Entry;
  graph::GraphKey key_for(int64_t S) const;
  bool valid_step(const PagedBatch& b) const;
  Expected<const float*> capture(Entry& e, int64_t S);

  Transformer& model_;
  PagedKvCache& cache_;
  bool relocate_;
  int64_t max_blocks_;  // block table width: the longest context's blocks
  std::map<int64_t, std::unique_ptr<Entry>> graphs_;  // by batch size
  GraphStats stats_;
};

}  // namespace kiln
