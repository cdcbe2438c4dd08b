// Graph capture and replay, the CPU form of CUDA graphs / torch.compile's captured graph. While
// a Capture is open on a thread, every kernel call that thread makes (at the outermost level)
// is recorded as a node: its name, the buffers it reads and writes, and a closure that runs the
// same kernel again with the same arguments. The kernel still runs at capture, so the captured
// step computes what eager would. Replay runs the nodes and nothing else: none of the model's
// control flow, checks, allocation or per-op dispatch. Control flow the graph cannot hold
// breaks it, as torch.compile's graph breaks do: an eager_region() (MoE routing, whose token
// counts per expert decide the expert GEMMs) becomes one node that runs its code eagerly at
// replay, so the graph splits there into segments replayed around it; a plain graph_break()
// (communication between the model's ops, backends that do not record) leaves a graph that is
// listed, not replayed. Data-dependent values inside nodes (the loss scaler's verdict, the
// clip factor, decode positions) are read when the node runs and need no break.
//
// Plan (plan()): the buffers a node list touches are grouped into regions; a region that the
// graph writes before it reads and that is not declared external (inputs, outputs, state kept
// across replays) is internal, and internal regions are laid out by lifetime in one arena (a
// region's bytes are reused once its last reader ran): the peak is reported beside eager's sum.
// With relocate, the nodes' pointers into internal regions are rewritten to the arena once, so
// replay runs in the planned memory. Independent consecutive nodes form a level, run as the tasks
// of one parallel region (each node on one thread) instead of a fork/join per op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kiln::graph {

// One buffer a node touches: [ptr, ptr + bytes). The closure gets its node's accesses back, in
// the order they were recorded, with pointers relocated by the plan.
struct Access {
  void* ptr = nullptr;
  int64_t bytes = 0;
  bool write = false;
  template <class T>
  T* mut() const { return static_cast<T*>(ptr); }
  template <class T>
  const T* as() const { return static_cast<const T*>(ptr); }
};
template <class T>
Access reads(const T* p, int64_t count) {
  return {const_cast<T*>(p), p ? count * static_cast<int64_t>(sizeof(T)) : 0, false};
}
template <class T>
Access writes(T* p, int64_t count) {
  return {p, p ? count * static_cast<int64_t>(sizeof(T)) : 0, true};
}
inline Access reads_bytes(const void* p, int64_t bytes) { return {const_cast<void*>(p), p ? bytes : 0, false}; }
inline Access writes_bytes(void* p, int64_t bytes) { return {p, p ? bytes : 0, true}; }
// A strided access: `rows` rows of `width` elements, `stride` apart.
template <class T>
Access reads_rows(const T* p, int64_t rows, int64_t width, int64_t stride) {
  return reads(p, rows > 0 ? (rows - 1) * stride + width : 0);
}
template <class T>
Access writes_rows(T* p, int64_t rows, int64_t width, int64_t stride) {
  return writes(p, rows > 0 ? (rows - 1) * stride + width : 0);
}

using NodeFn = std::function<void(const Access* io)>;

struct Node {
  const char* name = nullptr;  // a literal (the kernel's name)
  std::vector<Access> io;
  NodeFn fn;
  float scalar = 0;  // a kernel's scalar argument (scale's factor), for passes over the graph
  bool eager = false;  // an eager_region(): host control flow run as it is (a segment boundary)
};

// A point where capture could not continue as one graph.
struct Break {
  size_t at_node = 0;  // nodes before it
  std::string reason;
  bool resumed = false;  // an eager region: the graph goes on after it (the next segment)
};

// The arena plan of a graph (see the file comment).
struct Plan {
  int64_t eager_bytes = 0;   // internal regions, each its own allocation (as eager keeps them)
  int64_t arena_bytes = 0;   // the arena: internal regions packed by lifetime
  int64_t external_bytes = 0;  // regions outside the plan (weights, state, inputs, outputs)
  int num_internal = 0, num_external = 0;
  int num_levels = 0;        // parallel regions at replay (== nodes when no two are independent)
  bool relocated = false;
};

class Graph {
 public:
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Break>& breaks() const { return breaks_; }
  // Every break is an eager region (replay runs the segments around them), and there are nodes.
  bool replayable() const;
  int segments() const;  // graphs replayed between eager regions (1 without breaks)
  // Declares [p, p + bytes) external: kept as it is by the plan (call before plan()).
  void keep(const void* p, int64_t bytes);
  // Groups regions, plans the arena and the levels. With relocate the internal regions move to
  // the arena (their eager buffers are no longer touched by replay).
  const Plan& plan(bool relocate);
  const Plan& last_plan() const { return plan_; }
  // Runs every node (in levels when planned and threads > 1).
  void replay() const;
  // Replaces nodes [first, first + count) by one (a fusion pass; before plan()).
  void replace(size_t first, size_t count, Node fused);
  // Whether keep() covers any of [p, p + bytes).
  bool kept(const void* p, int64_t bytes) const;

  // Capture's side.
  void add(Node n) { nodes_.push_back(std::move(n)); }
  void add_break(std::string reason, bool resumed = false) {
    breaks_.push_back({nodes_.size(), std::move(reason), resumed});
  }

 private:
  std::vector<Node> nodes_;
  std::vector<Break> breaks_;
  std::vector<std::pair<const char*, int64_t>> kept_;
  std::vector<int> level_end_;  // node index where each level ends (empty: one node per level)
  std::unique_ptr<char[]> arena_;
  Plan plan_;
};

// What a captured graph assumed (its guards): named values such as shapes, thread count, SIMD
// target, precision, buffer epochs. A graph runs only under the key it was captured with.
struct GraphKey {
  std::vector<std::pair<std::string, int64_t>> fields;
  GraphKey& add(std::string name, int64_t value) {
    fields.emplace_back(std::move(name), value);
    return *this;
  }
  bool operator==(const GraphKey&) const = default;
  // The first guard `now` fails, e.g. "threads 2 -> 1" (empty when they are equal).
  std::string mismatch(const GraphKey& now) const;
};

// Whether any access of `n` overlaps [p, p + bytes) (passes over a graph ask it).
bool touches(const Node& n, const void* p, int64_t bytes);

// What a caller that captures and replays graphs counts (decode steps, training micro-batches).
struct GraphStats {
  int64_t captures = 0;    // graphs captured (a new shape, e.g. batch size)
  int64_t recaptures = 0;  // captured again because a guard failed
  int64_t replays = 0;     // steps replayed
  int64_t eager_steps = 0;  // steps run eagerly (their graph has breaks that are not eager regions)
  std::string last_recapture;       // the guard that failed last, e.g. "threads 2 -> 1"
  std::vector<std::string> breaks;  // every distinct break reason seen
  // Of the graph planned last: nodes and parallel levels, and internal activation bytes kept
  // apart (as eager keeps them) vs packed by lifetime into its arena.
  int64_t nodes = 0, levels = 0, eager_bytes = 0, arena_bytes = 0;
  int64_t fused_nodes = 0;  // nodes a pass (perf/graph_fusion.h) folded into fused ones, last capture
  int64_t segments = 0;     // of the graph planned last: replayed segments around its eager regions
};

// A pass over a captured graph before it is planned (perf/graph_fusion.h's fusion): returns the
// number of nodes it removed. The layers above core get it from the CLI (EngineConfig,
// TrainOptions), so they need not depend on perf.
using GraphPass = std::function<int64_t(Graph&)>;

// One step captured once and replayed while its guards hold: what every caller of Capture,
// plan() and replay() shares. The first run captures (the step runs eagerly while it is
// recorded); a changed key recaptures, counted and named; a graph with breaks that are not
// eager regions is not kept (its breaks go to the stats and the step keeps running eagerly).
class StepGraph {
 public:
  struct Step {
    std::function<GraphKey()> key;      // the guards as they are now
    std::function<bool()> eager;        // runs the step; false: it failed (nothing is kept)
    std::function<void(Graph&)> keep;   // after a capture: keep() what callers read afterwards
    GraphPass pass;                     // may be empty
    bool relocate = true;               // replay in the planned arena
  };
  enum class Ran { kReplayed, kEagerly, kFailed };
  Ran run(const Step& step, GraphStats& stats);

 private:
  std::unique_ptr<Graph> graph_;  // null: not captured, or captured with breaks
  GraphKey key_;
  bool captured_ = false;
};

// One line: "graph capture: 2 captured, 1 recaptured (threads 2 -> 1), 30 replayed, ...".
std::string describe(const GraphStats& s);

// True while a Capture is open on this thread and no recorded kernel is running (a kernel
// inside a kernel is part of it, as in the profiler).
bool recording();
// Records a kernel call as a node and runs it (through fn, so nested kernels are not recorded).
// eager: an eager_region()'s node, listed as a break the graph resumes after.
void record(const char* name, const Access* io, size_t num_io, NodeFn fn, float scalar = 0, bool eager = false);
// Where capture cannot go on: while capturing, breaks the graph here (listed with the reason;
// such a graph is not replayed).
void graph_break(const char* reason);

// Host control flow that depends on data, run eagerly inside a graph: fn runs now, and while
// capturing it is also recorded as one node that runs fn again at each replay (its kernels
// dispatch, allocate and branch as they do eagerly), listed as a break the graph resumes after.
// io must name every buffer fn shares with the recorded nodes (its inputs and outputs, for
// ordering); the plan keeps those where they are, so fn may reach them by its own pointers.
// fn must not hold references to the capturing call's locals. `reason` is a literal.
template <class F>
void eager_region(const char* reason, std::initializer_list<Access> io, F&& fn) {
  if (recording()) record(reason, io.begin(), io.size(), NodeFn(std::forward<F>(fn)), 0, true);
  else fn(io.begin());
}

// A step that is not one kernel call: host code between kernels (a copy, a reduction), or
// kernels whose arguments come from state read when it runs (the cache positions of a decode
// step). Runs fn(io) now; while capturing, also records it as one node. fn must reach every
// buffer through io (so the plan can move it) and read step-varying values at run time.
template <class F>
void op(const char* name, std::initializer_list<Access> io, F&& fn) {
  if (recording()) record(name, io.begin(), io.size(), NodeFn(std::forward<F>(fn)));
  else fn(io.begin());
}
template <class F>
void op(const char* name, const std::vector<Access>& io, F&& fn) {
  if (recording()) record(name, io.data(), io.size(), NodeFn(std::forward<F>(fn)));
  else fn(io.data());
}

// Records the kernel calls of this thread into `g` for the scope's lifetime.
class Capture {
 public:
  explicit Capture(Graph& g);
  ~Capture();
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;

 private:
  Graph* previous_;
};

}  // namespace kiln::graph

// At the top of a kernel: while capturing, record this call as a node whose closure runs the
// kernel again (with the node's possibly relocated pointers), and return.
//   KILN_GRAPH_NODE("add", [=](const graph::Access* io) { add(io[0].mut<float>(), ...); },
//                   graph::writes(out, n), graph::reads(a, n), graph::reads(b, n));
#define KILN_GRAPH_NODE(name, fn, ...)                                                  \
  do {                                                                                  \
    if (::kiln::graph::recording()) {                                                   \
      const ::kiln::graph::Access kiln_graph_io_[] = {__VA_ARGS__};                      \
      ::kiln::graph::record(name, kiln_graph_io_, std::size(kiln_graph_io_), fn);        \
      return;                                                                           \
    }                                                                                   \
  } while (0)
// The same with the kernel's scalar argument recorded (passes read it: Node::scalar).
#define KILN_GRAPH_NODE_SCALAR(name, scalar, fn, ...)                                    \
  do {                                                                                  \
    if (::kiln::graph::recording()) {                                                   \
      const ::kiln::graph::Access kiln_graph_io_[] = {__VA_ARGS__};                      \
      ::kiln::graph::record(name, kiln_graph_io_, std::size(kiln_graph_io_), fn, scalar); \
      return;                                                                           \
    }                                                                                   \
  } while (0)
// The same with the accesses in a container (e.g. gemm_io()'s array).
#define KILN_GRAPH_NODE_IO(name, fn, io)                                     \
  do {                                                                       \
    if (::kiln::graph::recording()) {                                        \
      const auto& kiln_graph_io_ = (io);                                     \
      ::kiln::graph::record(name, kiln_graph_io_.data(), kiln_graph_io_.size(), fn); \
      return;                                                                \
    }                                                                        \
  } while (0)
