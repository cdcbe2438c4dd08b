// Decode steps as captured graphs, one per batch size (decode_graph.h).
#include "kiln/serve/decode_graph.h"

#include <algorithm>

#include "kiln/core/cpu_features.h"
#include "kiln/core/thread_pool.h"
#include "kiln/core/trace.h"

namespace kiln {

// A batch size's graph and the inputs it reads.
struct DecodeGraphs::Entry {
  std::unique_ptr<graph::Graph> graph;
  graph::GraphKey key;
  std::vector<int32_t> tokens, num_cached, num_new, table, logit_rows;  // (S,) and (S, max_blocks)
  const float* logits = nullptr;
  bool eager = false;  // the graph has breaks: its steps run eagerly
};

DecodeGraphs::DecodeGraphs(Transformer& model, PagedKvCache& cache, bool relocate, graph::GraphPass pass)
    : model_(model),
      cache_(cache),
      relocate_(relocate),
      pass_(std::move(pass)),
      max_blocks_((model.config().max_seq_len + cache.block_size - 1) / cache.block_size) {}
DecodeGraphs::~DecodeGraphs() = default;

bool DecodeGraphs::eligible(const PagedBatch& b) {
  const size_t S = b.num_new.size();
  if (S == 0 || b.tokens.size() != S || b.logit_rows.size() != S) return false;
  for (size_t i = 0; i < S; ++i)
    if (b.num_new[i] != 1 || b.logit_rows[i] != static_cast<int32_t>(i)) return false;
  return true;
}

// What the graph of S sequences assumed: anything that changes a node's arguments or buffers.
graph::GraphKey DecodeGraphs::key_for(int64_t S) const {
  graph::GraphKey k;
  k.add("batch", S)
      .add("threads", num_threads())
      .add("simd target", static_cast<int64_t>(active_simd_target()))
      .add("model buffers epoch", static_cast<int64_t>(model_.buffer_epoch()))
      .add("kv blocks", cache_.num_blocks)
      .add("kv pool address", static_cast<int64_t>(reinterpret_cast<uintptr_t>(cache_.k.empty() ? nullptr : cache_.k[0].raw_data())));
  return k;
}

// The checks forward_paged makes of a decode step, which a replay skips.
bool DecodeGraphs::valid_step(const PagedBatch& b) const {
  const ModelConfig& c = model_.config();
  const int64_t S = static_cast<int64_t>(b.num_new.size()), bs = cache_.block_size;
  if (b.max_blocks_per_seq < 1 || static_cast<int64_t>(b.block_table.size()) != S * b.max_blocks_per_seq ||
      static_cast<int64_t>(b.num_cached.size()) != S)
    return false;
  for (int64_t i = 0; i < S; ++i) {
    const int64_t end = int64_t{b.num_cached[i]} + 1;
    if (b.num_cached[i] < 0 || end > c.max_seq_len || (end + bs - 1) / bs > b.max_blocks_per_seq) return false;
    if (b.tokens[i] < 0 || b.tokens[i] >= c.vocab_size) return false;
    for (int64_t j = 0; j < (end + bs - 1) / bs; ++j) {
      const int32_t id = b.block_table[i * b.max_blocks_per_seq + j];
      if (id < 0 || id >= cache_.num_blocks) return false;
    }
  }
  return true;
}

Expected<const float*> DecodeGraphs::capture(Entry& e, int64_t S) {
  e.graph = std::make_unique<graph::Graph>();
  e.eager = false;
  PagedBatch pb;
  pb.tokens = e.tokens;
  pb.num_cached = e.num_cached;
  pb.num_new = e.num_new;
  pb.block_table = e.table;
  pb.max_blocks_per_seq = max_blocks_;
  pb.logit_rows = e.logit_rows;
  Expected<const float*> logits = [&] {
    graph::Capture recording(*e.graph);
    return model_.forward_paged(pb, cache_);
  }();
  if (!logits.ok()) {
    e.graph.reset();
    return logits;
  }
  e.key = key_for(S);  // after the forward: it may have grown buffers (a new epoch)
  e.logits = *logits;
  if (!e.graph->replayable()) {
    e.eager = true;
    for (const graph::Break& b : e.graph->breaks())
      if (std::find(stats_.breaks.begin(), stats_.breaks.end(), b.reason) == stats_.breaks.end())
        stats_.breaks.push_back(b.reason);
    e.graph.reset();
    return logits;
  }
  e.graph->keep(e.logits, S * model_.config().vocab_size * static_cast<int64_t>(sizeof(float)));
  if (pass_) stats_.fused_nodes = pass_(*e.graph);
  e.graph->plan(relocate_);
  stats_.nodes = stats_.levels = stats_.eager_bytes = stats_.arena_bytes = 0;
  for (const auto& [size, g] : graphs_) {
    if (!g->graph) continue;
    const graph::Plan& p = g->graph->last_plan();
    stats_.nodes = static_cast<int64_t>(g->graph->nodes().size());
    stats_.levels = p.num_levels;
    stats_.eager_bytes += p.eager_bytes;
    stats_.arena_bytes += p.arena_bytes;
  }
  return logits;
}

Expected<const float*> DecodeGraphs::run(const PagedBatch& b) {
  KILN_CHECK(eligible(b));
  const int64_t S = static_cast<int64_t>(b.num_new.size());
  if (!valid_step(b)) return model_.forward_paged(b, cache_);  // its error names what is wrong
  std::unique_ptr<Entry>& slot = graphs_[S];
  const bool fresh = slot == nullptr;
  if (fresh) slot = std::make_unique<Entry>();
  Entry& e = *slot;
  // The inputs, where the graph reads them (the table at the graph's fixed width).
  e.tokens.assign(b.tokens.begin(), b.tokens.end());
  e.num_cached.assign(b.num_cached.begin(), b.num_cached.end());
  e.num_new.assign(static_cast<size_t>(S), 1);
  e.logit_rows.resize(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) e.logit_rows[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  e.table.assign(static_cast<size_t>(S * max_blocks_), 0);
  for (int64_t i = 0; i < S; ++i)
    std::copy_n(b.block_table.begin() + i * b.max_blocks_per_seq, std::min(b.max_blocks_per_seq, max_blocks_),
                e.table.begin() + i * max_blocks_);
  const graph::GraphKey now = key_for(S);
  if (fresh || e.key != now) {  // capture (the step runs eagerly while it is recorded)
    if (fresh) {
      ++stats_.captures;
    } else {
      ++stats_.recaptures;
      stats_.last_recapture = e.key.mismatch(now);
    }
    return capture(e, S);
  }
  if (e.eager) {
    ++stats_.eager_steps;
    return model_.forward_paged(b, cache_);
  }
  trace::Scope ts(trace::Category::kServe, "graph_replay", [&](trace::Event& ev) { ev.set_dims({S}); });
  e.graph->replay();
  ++stats_.replays;
  return e.logits;
}

}  // namespace kiln
