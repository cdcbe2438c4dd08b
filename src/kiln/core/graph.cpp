// Capture, plan and replay of kernel graphs (graph.h).
#include "kiln/core/graph.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "kiln/core/status.h"
#include "kiln/core/thread_pool.h"

namespace kiln::graph {
namespace {
thread_local Graph* t_graph = nullptr;  // the open capture of this thread
thread_local int t_depth = 0;           // > 0 while a recorded kernel runs

constexpr int64_t kAlign = 64;  // the arena keeps each region's offset within a cache line
// A level of independent nodes runs as one parallel region only when it moves at least this
// much: opening a region costs a few microseconds (2-core dev VM, AMD EPYC), what a level of
// decode-sized ops under ~256 KiB takes on one core; below it the nodes run one after another.
constexpr int64_t kParallelLevelBytes = int64_t{256} << 10;

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// A maximal run of touched bytes: overlapping or adjacent accesses merge into one.
struct Region {
  uintptr_t begin = 0, end = 0;
  size_t first = SIZE_MAX, last = 0;  // nodes touching it
  bool external = false;
  int64_t offset = -1;  // in the arena (internal)
  int64_t bytes() const { return static_cast<int64_t>(end - begin); }
};

bool overlaps(uintptr_t a0, uintptr_t a1, uintptr_t b0, uintptr_t b1) { return a0 < b1 && b0 < a1; }

// Whether node b must run after node a (a read or write of one meets a write of the other). An
// eager region runs alone: it may touch buffers beyond its io (its own scratch) and open its own
// parallel regions.
bool conflict(const Node& a, const Node& b) {
  if (a.eager || b.eager) return true;
  for (const Access& x : a.io) {
    if (x.bytes == 0) continue;
    for (const Access& y : b.io) {
      if (y.bytes == 0 || !(x.write || y.write)) continue;
      if (overlaps(addr(x.ptr), addr(x.ptr) + x.bytes, addr(y.ptr), addr(y.ptr) + y.bytes)) return true;
    }
  }
  return false;
}
}  // namespace

bool touches(const Node& n, const void* p, int64_t bytes) {
  for (const Access& a : n.io)
    if (a.bytes > 0 && overlaps(addr(a.ptr), addr(a.ptr) + a.bytes, addr(p), addr(p) + bytes)) return true;
  return false;
}

bool recording() { return t_graph != nullptr && t_depth == 0; }

void record(const char* name, const Access* io, size_t num_io, NodeFn fn, float scalar, bool eager) {
  Graph& g = *t_graph;
  if (eager) g.add_break(name, true);
  g.add(Node{name, std::vector<Access>(io, io + num_io), std::move(fn), scalar, eager});
  const Node& n = g.nodes().back();
  ++t_depth;
  n.fn(n.io.data());
  --t_depth;
}

void graph_break(const char* reason) {
  if (t_graph != nullptr && t_depth == 0) t_graph->add_break(reason);
}

std::string GraphKey::mismatch(const GraphKey& now) const {
  for (size_t i = 0; i < std::max(fields.size(), now.fields.size()); ++i) {
    if (i >= fields.size()) return now.fields[i].first + " (new guard)";
    if (i >= now.fields.size()) return fields[i].first + " (guard gone)";
    if (fields[i] != now.fields[i])
      return fields[i].first + " " + std::to_string(fields[i].second) + " -> " + std::to_string(now.fields[i].second);
  }
  return {};
}

std::string describe(const GraphStats& s) {
  std::string line = fmt::format("graph capture: {} captured, {} recaptured", s.captures, s.recaptures);
  if (!s.last_recapture.empty()) line += fmt::format(" (last: {})", s.last_recapture);
  line += fmt::format(", {} steps replayed, {} eager", s.replays, s.eager_steps);
  if (s.nodes > 0)
    line += fmt::format("; {} nodes in {} levels, activations {:.1f} KiB eager vs {:.1f} KiB arena", s.nodes,
                        s.levels, s.eager_bytes / 1024.0, s.arena_bytes / 1024.0);
  if (s.fused_nodes > 0) line += fmt::format("; {} elementwise nodes fused", s.fused_nodes);
  if (s.segments > 1) line += fmt::format("; {} segments around eager regions", s.segments);
  for (const std::string& b : s.breaks) line += fmt::format("\n  graph break: {}", b);
  return line;
}

StepGraph::Ran StepGraph::run(const Step& step, GraphStats& stats) {
  const GraphKey now = step.key();
  if (captured_ && key_ == now) {
    if (graph_ == nullptr) {  // it had breaks
      ++stats.eager_steps;
      return step.eager() ? Ran::kEagerly : Ran::kFailed;
    }
    graph_->replay();
    ++stats.replays;
    return Ran::kReplayed;
  }
  if (captured_) {
    ++stats.recaptures;
    stats.last_recapture = key_.mismatch(now);
  } else {
    ++stats.captures;
  }
  auto g = std::make_unique<Graph>();
  graph_.reset();
  bool ok = false;
  {
    Capture recording(*g);
    ok = step.eager();
  }
  captured_ = ok;
  if (!ok) return Ran::kFailed;
  key_ = step.key();  // after the step: its first run may have allocated (a new buffer epoch)
  for (const Break& b : g->breaks()) {
    const std::string line = b.resumed ? b.reason + " (an eager region: the graph splits and resumes after it)" : b.reason;
    if (std::find(stats.breaks.begin(), stats.breaks.end(), line) == stats.breaks.end()) stats.breaks.push_back(line);
  }
  if (!g->replayable()) return Ran::kEagerly;
  if (step.keep) step.keep(*g);
  if (step.pass) stats.fused_nodes = step.pass(*g);
  const Plan& p = g->plan(step.relocate);
  stats.nodes = static_cast<int64_t>(g->nodes().size());
  stats.levels = p.num_levels;
  stats.eager_bytes = p.eager_bytes;
  stats.arena_bytes = p.arena_bytes;
  stats.segments = g->segments();
  graph_ = std::move(g);
  return Ran::kEagerly;
}

Capture::Capture(Graph& g) : previous_(t_graph) { t_graph = &g; }
Capture::~Capture() { t_graph = previous_; }

void Graph::keep(const void* p, int64_t bytes) {
  if (p != nullptr && bytes > 0) kept_.emplace_back(static_cast<const char*>(p), bytes);
}

const Plan& Graph::plan(bool relocate) {
  KILN_CHECK_MSG(!plan_.relocated, "a graph is planned once");
  // Regions: the union of every access, merged where they overlap or touch.
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;
  for (const Node& n : nodes_)
    for (const Access& a : n.io)
      if (a.bytes > 0) spans.emplace_back(addr(a.ptr), addr(a.ptr) + a.bytes);
  std::sort(spans.begin(), spans.end());
  std::vector<Region> regions;
  for (auto [b, e] : spans) {
    if (!regions.empty() && b <= regions.back().end) regions.back().end = std::max(regions.back().end, e);
    else regions.push_back({b, e});
  }
  auto region_of = [&](const void* p) -> Region& {
    auto it = std::upper_bound(regions.begin(), regions.end(), addr(p),
                               [](uintptr_t v, const Region& r) { return v < r.begin; });
    return *(it - 1);
  };
  // Lifetimes, and which regions the graph defines: the first node touching a region must write
  // all of it and read none of it, and nobody outside must need it (keep()).
  for (size_t i = 0; i < nodes_.size(); ++i)
    for (const Access& a : nodes_[i].io)
      if (a.bytes > 0) {
        Region& r = region_of(a.ptr);
        r.first = std::min(r.first, i);
        r.last = std::max(r.last, i);
      }
  for (Region& r : regions) {
    r.external = kept(reinterpret_cast<const void*>(r.begin), r.bytes());
    for (size_t i = r.first; i <= r.last && !r.external; ++i)  // an eager region's own pointers
      r.external = nodes_[i].eager && touches(nodes_[i], reinterpret_cast<const void*>(r.begin), r.bytes());
    if (r.external) continue;
    int64_t written = 0;
    for (const Access& a : nodes_[r.first].io) {
      if (a.bytes == 0 || !overlaps(r.begin, r.end, addr(a.ptr), addr(a.ptr) + a.bytes)) continue;
      if (!a.write) r.external = true;  // read before the graph wrote it: it comes from outside
      else written += a.bytes;           // writes of one node to one region do not overlap
    }
    if (written < r.bytes()) r.external = true;
  }
  // The arena: each internal region at the lowest offset free over its lifetime (first fit); a
  // region keeps its address's offset within a cache line.
  std::vector<Region*> internal;
  for (Region& r : regions) {
    if (r.external) {
      plan_.external_bytes += r.bytes();
      ++plan_.num_external;
    } else {
      plan_.eager_bytes += r.bytes();
      internal.push_back(&r);
    }
  }
  plan_.num_internal = static_cast<int>(internal.size());
  // Larger first; equal sizes in order of birth (first fit in start order colours an interval
  // graph with the fewest colours, so equal-sized temporaries pack optimally).
  std::sort(internal.begin(), internal.end(), [](const Region* a, const Region* b) {
    return a->bytes() != b->bytes() ? a->bytes() > b->bytes() : a->first < b->first;
  });
  // Each region takes a slot of its bytes rounded up to a cache line plus one line, so it keeps
  // its address's offset within a line (alignment-dependent SIMD paths run as in eager) and any
  // two regions of one size fit each other's slots.
  auto slot_bytes = [](const Region* r) { return (r->bytes() + kAlign - 1) / kAlign * kAlign + kAlign; };
  std::vector<std::pair<const Region*, int64_t>> placed;  // (region, slot offset)
  for (Region* r : internal) {
    std::vector<std::pair<int64_t, int64_t>> busy;  // slots of regions live at the same time
    for (auto [q, at] : placed)
      if (q->first <= r->last && r->first <= q->last) busy.emplace_back(at, at + slot_bytes(q));
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (auto [b, e] : busy) {
      if (at + slot_bytes(r) <= b) break;
      at = std::max(at, e);
    }
    r->offset = at + static_cast<int64_t>(r->begin % kAlign);
    plan_.arena_bytes = std::max(plan_.arena_bytes, at + slot_bytes(r));
    placed.emplace_back(r, at);
  }
  if (relocate && !internal.empty()) {
    arena_ = std::make_unique<char[]>(static_cast<size_t>(plan_.arena_bytes + kAlign));
    char* base = arena_.get() + (kAlign - static_cast<int64_t>(addr(arena_.get()) % kAlign)) % kAlign;
    for (Node& n : nodes_)
      for (Access& a : n.io) {
        if (a.bytes == 0) continue;
        const Region& r = region_of(a.ptr);
        if (!r.external) a.ptr = base + r.offset + static_cast<int64_t>(addr(a.ptr) - r.begin);
      }
    plan_.relocated = true;
  }
  // Levels: consecutive nodes with no hazard between any two of them; a level too small to pay
  // for a parallel region is split back into single nodes.
  level_end_.clear();
  size_t begin = 0;
  int64_t level_bytes = 0;
  for (size_t i = 1; i <= nodes_.size(); ++i) {
    for (const Access& a : nodes_[i - 1].io) level_bytes += a.bytes;
    bool joins = i < nodes_.size();
    for (size_t j = begin; joins && j < i; ++j) joins = !conflict(nodes_[j], nodes_[i]);
    if (joins) continue;
    if (level_bytes < kParallelLevelBytes)
      for (size_t j = begin + 1; j < i; ++j) level_end_.push_back(static_cast<int>(j));
    level_end_.push_back(static_cast<int>(i));
    begin = i;
    level_bytes = 0;
  }
  plan_.num_levels = static_cast<int>(level_end_.size());
  return plan_;
}

bool Graph::replayable() const {
  return !nodes_.empty() && std::all_of(breaks_.begin(), breaks_.end(), [](const Break& b) { return b.resumed; });
}

int Graph::segments() const {
  int n = 0;
  for (size_t i = 0; i < nodes_.size(); ++i)  // maximal runs of recorded nodes
    n += !nodes_[i].eager && (i == 0 || nodes_[i - 1].eager);
  return n;
}

void Graph::replay() const {
  KILN_CHECK_MSG(replayable(), "a graph with breaks that are not eager regions is not replayed");
  ++t_depth;  // the nodes' kernels run, they do not record
  if (level_end_.empty() || num_threads() == 1) {
    for (const Node& n : nodes_) n.fn(n.io.data());
  } else {
    int begin = 0;
    for (int end : level_end_) {
      if (end - begin == 1) {
        nodes_[static_cast<size_t>(begin)].fn(nodes_[static_cast<size_t>(begin)].io.data());
      } else {
        thread_pool().run(end - begin, [&](int64_t t, int) {
          const Node& n = nodes_[static_cast<size_t>(begin + t)];
          n.fn(n.io.data());
        });
      }
      begin = end;
    }
  }
  --t_depth;
}

bool Graph::kept(const void* p, int64_t bytes) const {
  for (auto [k, n] : kept_)
    if (overlaps(addr(p), addr(p) + bytes, addr(k), addr(k) + n)) return true;
  return false;
}

void Graph::replace(size_t first, size_t count, Node fused) {
  KILN_CHECK_MSG(first + count <= nodes_.size() && count > 0 && level_end_.empty(), "replace before plan()");
  nodes_.erase(nodes_.begin() + static_cast<std::ptrdiff_t>(first),
               nodes_.begin() + static_cast<std::ptrdiff_t>(first + count));
  nodes_.insert(nodes_.begin() + static_cast<std::ptrdiff_t>(first), std::move(fused));
}

}  // namespace kiln::graph
