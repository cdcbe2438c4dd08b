// The trace recorder every layer emits into: complete events (a name, a category, start and
// duration on the steady clock, a few fixed arguments) kept in per-thread buffers, written out
// by perf/profiler.h as a Chrome/Perfetto trace. Off (the default) a scope costs one relaxed
// atomic load and a predictable branch, and nothing is allocated; on, recording takes no lock
// per event (each thread appends to its own buffer).
//
// Kernel and comm scopes count only at the outermost level of their category: a GEMM inside
// naive attention, or a sendrecv inside a ring all-reduce, is part of the op that called it
// (its FLOPs and time are that op's), so FLOP totals never count work twice. The thread pool
// carries the caller's kernel depth into its workers (a task of a kernel records nothing).
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::trace {

enum class Category : uint8_t { kKernel, kComm, kTrain, kModel, kServe, kOther, kCount };
inline constexpr std::string_view kCategoryNames[] = {"kernel", "comm", "train", "model", "serve", "other"};
static_assert(std::size(kCategoryNames) == static_cast<size_t>(Category::kCount));
constexpr std::string_view category_name(Category c) { return kCategoryNames[static_cast<int>(c)]; }

inline constexpr int kMaxDims = 4;
inline constexpr int kMaxArgs = 3;

// One complete event. Every string is a literal or interned (intern()): it outlives the trace.
struct Event {
  const char* name = nullptr;
  Category cat = Category::kOther;
  uint8_t num_dims = 0, num_args = 0;
  int64_t start_ns = 0, dur_ns = 0;  // steady clock (now_ns())
  double flops = 0, bytes = 0;       // kernel: its OpCost; comm: bytes of the collective
  int64_t dims[kMaxDims] = {};       // the shape the op ran on, e.g. (m, n, k)
  const char* dtype = nullptr;       // e.g. "f32", "bf16"
  const char* op = nullptr;          // comm: the collective ("allreduce", "send")
  const char* algo = nullptr;        // comm: the algorithm; kernel: the implementation
  const char* peers = nullptr;       // comm: world ranks taking part, e.g. "0,1"
  struct Arg {
    const char* key = nullptr;
    int64_t value = 0;
  } args[kMaxArgs];

  void set_dims(std::initializer_list<int64_t> d);
  void add_arg(const char* key, int64_t value);  // ignored past kMaxArgs
};

namespace detail {
extern std::atomic<bool> g_enabled;
}  // namespace detail

// The one check every scope makes.
inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }

// Clears every thread's buffer and turns recording on / off. Call while no scope is open
// elsewhere (between steps): buffers are reset, not locked.
void start();
void stop();

// Nanoseconds on the steady clock (the clock of every event).
int64_t now_ns();

// A stable copy of `s` (one per distinct string, kept to the end of the process).
const char* intern(std::string_view s);

// Names the calling thread's track ("main", "pool worker 1", "comm world"); cheap, allowed
// while off (the name is kept for a later trace).
void set_thread_name(std::string_view name);

// What one thread recorded, in the order its scopes ended.
struct ThreadEvents {
  int tid = 0;  // small id, in order of first use (the main thread is usually 1)
  std::string name;
  std::vector<Event> events;
};
// Every thread's events so far (call after stop(), or while the threads are quiet).
std::vector<ThreadEvents> snapshot();

// Kernel nesting depth of the calling thread (see the file comment); the thread pool copies
// the caller's into the workers that run a region's tasks.
int kernel_depth();
void set_kernel_depth(int depth);

// Appends a finished event to the calling thread's buffer (tests build synthetic traces).
void record(const Event& e);

// An event that lasts as long as the scope. `describe(Event&)` fills the arguments and runs
// only when the event is recorded.
class Scope {
 public:
  Scope(Category cat, const char* name) {
    if (enabled()) begin(cat, name);
  }
  template <class Describe>
  Scope(Category cat, const char* name, Describe&& describe) {
    if (enabled() && begin(cat, name)) {
      describe(event_);
      event_.start_ns = now_ns();  // the description's cost is not the op's
    }
  }
  ~Scope() {
    if (state_ != kIdle) end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  bool active() const { return state_ == kRecording; }
  Event& event() { return event_; }

 private:
  enum State : uint8_t { kIdle, kNested, kRecording };
  bool begin(Category cat, const char* name);  // true when this scope records
  void end();
  State state_ = kIdle;
  Event event_;
};

}  // namespace kiln::trace

#define KILN_TRACE_CONCAT2(a, b) a##b
#define KILN_TRACE_CONCAT(a, b) KILN_TRACE_CONCAT2(a, b)
// KILN_TRACE_SCOPE(kTrain, "forward"): an event for the rest of the enclosing scope.
#define KILN_TRACE_SCOPE(cat, name) \
  ::kiln::trace::Scope KILN_TRACE_CONCAT(kiln_trace_scope_, __LINE__)(::kiln::trace::Category::cat, name)
// KILN_TRACE_KERNEL("rmsnorm_forward", rmsnorm_forward_cost(rows, cols), rows, cols): a kernel
// event with the FLOPs and bytes of `cost` (anything with .flops and .bytes, e.g. an OpCost)
// and the shape; `cost` is evaluated only when the event is recorded.
#define KILN_TRACE_KERNEL(name, cost, ...)                                                           \
  ::kiln::trace::Scope KILN_TRACE_CONCAT(kiln_trace_kernel_, __LINE__)(                            \
      ::kiln::trace::Category::kKernel, name, [&](::kiln::trace::Event& kiln_e_) {                   \
        const auto kiln_c_ = (cost);                                                               \
        kiln_e_.flops = kiln_c_.flops;                                                             \
        kiln_e_.bytes = kiln_c_.bytes;                                                             \
        kiln_e_.dtype = "f32";                                                                     \
        kiln_e_.set_dims({__VA_ARGS__});                                                           \
      })
