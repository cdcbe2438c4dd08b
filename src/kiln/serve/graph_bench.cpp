// `kiln bench graph`: eager vs captured decode steps (graph_bench.h).
#include "kiln/serve/graph_bench.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "kiln/core/median.h"
#include "kiln/model/packed_linear.h"

namespace kiln {
Expected<std::vector<GraphBenchRow>> run_graph_bench(const GraphBenchOptions& o) {
  if (o.seqs.empty()) return invalid_argument("[bench graph] no batch sizes");
  if (o.cached < 0 || o.steps < 1 || o.cached + o.steps > o.config.max_seq_len)
    return invalid_argument("[bench graph] {} cached + {} steps must fit the context of {}", o.cached, o.steps,
                            o.config.max_seq_len);
  if (o.reps < 1) return invalid_argument("[bench graph] reps {} must be positive", o.reps);
  KILN_ASSIGN_OR_RETURN(auto model, Transformer::create(o.config, 1));
  Transformer& m = *model;
  if (o.packed_weights) install_packed_weights(m);
  m.set_split_epilogues(o.split_epilogues);
  constexpr int64_t kBlock = 16;
  const int64_t max_s = *std::max_element(o.seqs.begin(), o.seqs.end());
  const int64_t maxb = (o.cached + o.steps + kBlock - 1) / kBlock, V = o.config.vocab_size;
  PagedKvCache cache = m.make_paged_kv_cache(max_s * maxb, kBlock);
  std::vector<GraphBenchRow> rows;
  for (const int64_t S : o.seqs) {
    if (S < 1) return invalid_argument("[bench graph] batch size {} must be positive", S);
    std::vector<int32_t> tokens(static_cast<size_t>(S)), cached(static_cast<size_t>(S)), one(static_cast<size_t>(S), 1),
        table(static_cast<size_t>(S * maxb)), logit_rows(static_cast<size_t>(S));
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    for (int64_t i = 0; i < S; ++i) logit_rows[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    const PagedBatch b{tokens, cached, one, table, maxb, logit_rows};
    DecodeGraphs graphs(m, cache), fused(m, cache, true, o.pass);
    std::vector<float> last[3];
    // One timed run: `steps` decode steps from position `cached`: eager (0), replayed (1) or
    // replayed after the pass (2).
    auto run = [&](int mode) {
      const auto t0 = std::chrono::steady_clock::now();
      const float* logits = nullptr;
      for (int64_t step = 0; step < o.steps; ++step) {
        for (int64_t i = 0; i < S; ++i) {
          tokens[static_cast<size_t>(i)] = static_cast<int32_t>((7 * i + 3 * step + 1) % V);
          cached[static_cast<size_t>(i)] = static_cast<int32_t>(o.cached + step);
        }
        auto r = mode == 1 ? graphs.run(b) : mode == 2 ? fused.run(b) : m.forward_paged(b, cache);
        KILN_CHECK_MSG(r.ok(), "{}", r.status().message());
        logits = *r;
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      last[mode].assign(logits, logits + S * V);
      return s / double(o.steps);
    };
    const int modes = o.pass ? 3 : 2;
    for (int mode = 0; mode < modes; ++mode) run(mode);  // warm: page faults, the captures
    std::vector<double> times[3];
    for (int r = 0; r < o.reps; ++r)  // interleaved, so drift hits all
      for (int mode = 0; mode < modes; ++mode) times[mode].push_back(run(mode));
    GraphBenchRow row;
    row.seqs = S;
    row.eager_s = median(times[0]);
    row.replay_s = median(times[1]);
    if (o.pass) {
      row.fused_s = median(times[2]);
      row.fused_nodes = fused.stats().fused_nodes;
    }
    const GraphStats& st = graphs.stats();
    row.nodes = st.nodes;
    row.levels = st.levels;
    row.eager_bytes = st.eager_bytes;
    row.arena_bytes = st.arena_bytes;
    row.same_logits = last[0] == last[1];
    rows.push_back(row);
  }
  return rows;
}

}  // namespace kiln
