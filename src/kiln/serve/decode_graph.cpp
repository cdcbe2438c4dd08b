// Decode steps as captured graphs, one per batch size (decode_graph.h).
#include "kiln/serve/decode_graph.h"

#include <algorithm>

#include "kiln/core/cpu_features.h"
#include "kiln/core/thread_pool.h"
#include "kiln/core/trace.h"

namespace kiln {

// A batch size's graph and the inputs it reads (refilled before each step).
struct DecodeGraphs::Entry {
  graph::StepGraph step;
  std::vector<int32_t> tokens, num_cached, num_new, table, logit_rows;  // (S,) and (S, max_blocks)
  PagedBatch batch;  // over the vectors above
  Expected<const float*> logits = nullptr;  // what the last eager (or capturing) run returned
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

Expected<const float*> DecodeGraphs::run(const PagedBatch& b) {
  KILN_CHECK(eligible(b));
  KILN_RETURN_IF_ERROR(model_.check_paged(b, cache_));  // a replay runs without forward_paged's checks
  const int64_t S = static_cast<int64_t>(b.num_new.size());
  std::unique_ptr<Entry>& slot = graphs_[S];
  if (slot == nullptr) {
    slot = std::make_unique<Entry>();
    Entry& e = *slot;
    e.tokens.resize(static_cast<size_t>(S));
    e.num_cached.resize(static_cast<size_t>(S));
    e.num_new.assign(static_cast<size_t>(S), 1);
    for (int32_t i = 0; i < S; ++i) e.logit_rows.push_back(i);
    e.table.assign(static_cast<size_t>(S * max_blocks_), 0);
    e.batch = PagedBatch{e.tokens, e.num_cached, e.num_new, e.table, max_blocks_, e.logit_rows};
  }
  Entry& e = *slot;
  // The inputs, where the graph reads them (the table at the graph's fixed width).
  std::copy(b.tokens.begin(), b.tokens.end(), e.tokens.begin());
  std::copy(b.num_cached.begin(), b.num_cached.end(), e.num_cached.begin());
  for (int64_t i = 0; i < S; ++i)
    std::copy_n(b.block_table.begin() + i * b.max_blocks_per_seq, std::min(b.max_blocks_per_seq, max_blocks_),
                e.table.begin() + i * max_blocks_);
  graph::StepGraph::Step step;
  step.key = [&] { return key_for(S); };
  step.eager = [&] {
    e.logits = model_.forward_paged(e.batch, cache_);
    return e.logits.ok();
  };
  step.keep = [&](graph::Graph& g) { g.keep(*e.logits, S * model_.config().vocab_size * int64_t{sizeof(float)}); };
  step.pass = pass_;
  step.relocate = relocate_;
  trace::Scope ts(trace::Category::kServe, "decode_graph", [&](trace::Event& ev) { ev.set_dims({S}); });
  e.step.run(step, stats_);  // a replay writes the logits where the capturing run returned them
  return e.logits;
}

}  // namespace kiln
