// The trace recorder (trace.h): per-thread buffers of fixed-size blocks that never move, so the
// owning thread appends without a lock (the block list grows under the buffer's mutex once per
// kBlockEvents events) and a reader copies the published prefix under that mutex.
#include "kiln/core/trace.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <unordered_set>

namespace kiln::trace {

namespace detail {
std::atomic<bool> g_enabled{false};
}  // namespace detail

namespace {

// 4096 events of ~190 bytes: ~0.8 MB per block; a W1a step records a few hundred events.
constexpr size_t kBlockEvents = 4096;

struct Block {
  Event events[kBlockEvents];
};

struct ThreadBuffer {
  int tid = 0;
  std::mutex mu;  // guards name, the block list's growth and readers
  std::string name;
  std::vector<std::unique_ptr<Block>> blocks;
  std::atomic<size_t> count{0};  // events published (written by the owner only, but start())
};

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;  // kept after their thread exits
  int next_tid = 1;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: threads may record during exit
  return *r;
}

ThreadBuffer& buffer() {
  thread_local std::shared_ptr<ThreadBuffer> mine;
  if (!mine) {
    auto b = std::make_shared<ThreadBuffer>();
    Registry& r = registry();
    std::lock_guard lk(r.mu);
    b->tid = r.next_tid++;
    b->name = b->tid == 1 ? "main" : "thread " + std::to_string(b->tid);
    r.buffers.push_back(b);
    mine = std::move(b);
  }
  return *mine;
}

// Outermost-only categories: kernel and comm (trace.h).
thread_local int t_depth[2] = {0, 0};
int* depth_slot(Category c) {
  if (c == Category::kKernel) return &t_depth[0];
  if (c == Category::kComm) return &t_depth[1];
  return nullptr;
}

}  // namespace

void Event::set_dims(std::initializer_list<int64_t> d) {
  num_dims = static_cast<uint8_t>(std::min<size_t>(d.size(), kMaxDims));
  std::copy_n(d.begin(), num_dims, dims);
}

void Event::add_arg(const char* key, int64_t value) {
  if (num_args < kMaxArgs) args[num_args++] = {key, value};
}

void start() {
  Registry& r = registry();
  {
    std::lock_guard lk(r.mu);
    for (auto& b : r.buffers) {
      std::lock_guard blk(b->mu);
      b->count.store(0, std::memory_order_relaxed);
    }
  }
  detail::g_enabled.store(true, std::memory_order_release);
}

void stop() { detail::g_enabled.store(false, std::memory_order_release); }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* intern(std::string_view s) {
  static std::mutex mu;
  static auto* pool = new std::unordered_set<std::string>;  // never destroyed (see registry())
  std::lock_guard lk(mu);
  return pool->emplace(s).first->c_str();
}

void set_thread_name(std::string_view name) {
  ThreadBuffer& b = buffer();
  std::lock_guard lk(b.mu);
  b.name = std::string(name);
}

std::vector<ThreadEvents> snapshot() {
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  {
    Registry& r = registry();
    std::lock_guard lk(r.mu);
    buffers = r.buffers;
  }
  std::vector<ThreadEvents> out;
  for (auto& b : buffers) {
    std::lock_guard lk(b->mu);
    const size_t n = b->count.load(std::memory_order_acquire);
    if (n == 0) continue;
    ThreadEvents t;
    t.tid = b->tid;
    t.name = b->name;
    t.events.reserve(n);
    for (size_t i = 0; i < n; ++i) t.events.push_back(b->blocks[i / kBlockEvents]->events[i % kBlockEvents]);
    out.push_back(std::move(t));
  }
  return out;
}

int kernel_depth() { return t_depth[0]; }
void set_kernel_depth(int depth) { t_depth[0] = depth; }

void record(const Event& e) {
  ThreadBuffer& b = buffer();
  const size_t n = b.count.load(std::memory_order_relaxed);
  const size_t blk = n / kBlockEvents;
  if (blk >= b.blocks.size()) {
    std::lock_guard lk(b.mu);
    b.blocks.push_back(std::make_unique<Block>());
  }
  b.blocks[blk]->events[n % kBlockEvents] = e;
  b.count.store(n + 1, std::memory_order_release);
}

bool Scope::begin(Category cat, const char* name) {
  event_.cat = cat;
  if (int* d = depth_slot(cat); d && (*d)++ > 0) {
    state_ = kNested;
    return false;
  }
  state_ = kRecording;
  event_.name = name;
  event_.start_ns = now_ns();
  return true;
}

void Scope::end() {
  if (int* d = depth_slot(event_.cat); d) --*d;
  if (state_ == kRecording) {
    event_.dur_ns = now_ns() - event_.start_ns;
    record(event_);
  }
}

}  // namespace kiln::trace
