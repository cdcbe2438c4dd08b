// The trace recorder (core/trace.h): nothing is recorded while off, scopes nest, kernel and comm
// events count only at their outermost level (also inside the thread pool's tasks), and events
// of other threads land in their own named buffers.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "kiln/core/thread_pool.h"
#include "kiln/core/trace.h"

namespace kiln {
namespace {

std::vector<trace::Event> events_named(const std::vector<trace::ThreadEvents>& all, std::string_view name) {
  std::vector<trace::Event> out;
  for (const auto& t : all)
    for (const auto& e : t.events)
      if (e.name == name) out.push_back(e);
  return out;
}

size_t total_events(const std::vector<trace::ThreadEvents>& all) {
  size_t n = 0;
  for (const auto& t : all) n += t.events.size();
  return n;
}

struct Cost {
  double flops, bytes;
};

TEST(Trace, OffRecordsNothingAndSkipsTheDescription) {
  trace::start();
  trace::stop();
  bool described = false;
  {
    trace::Scope s(trace::Category::kKernel, "k", [&](trace::Event&) { described = true; });
    EXPECT_FALSE(s.active());
    KILN_TRACE_SCOPE(kTrain, "step");
    KILN_TRACE_KERNEL("gemm", (Cost{1, 2}), 3, 4);
  }
  EXPECT_FALSE(described);
  EXPECT_EQ(total_events(trace::snapshot()), 0u);
}

TEST(Trace, ScopesNestAndCarryTheirArguments) {
  trace::start();
  {
    KILN_TRACE_SCOPE(kTrain, "step");
    {
      KILN_TRACE_KERNEL("rmsnorm_forward", (Cost{40, 80}), 2, 5);
    }
  }
  trace::stop();
  const auto all = trace::snapshot();
  const auto step = events_named(all, "step");
  const auto norm = events_named(all, "rmsnorm_forward");
  ASSERT_EQ(step.size(), 1u);
  ASSERT_EQ(norm.size(), 1u);
  EXPECT_EQ(norm[0].cat, trace::Category::kKernel);
  EXPECT_EQ(norm[0].flops, 40);
  EXPECT_EQ(norm[0].bytes, 80);
  ASSERT_EQ(norm[0].num_dims, 2);
  EXPECT_EQ(norm[0].dims[0], 2);
  EXPECT_EQ(norm[0].dims[1], 5);
  EXPECT_STREQ(norm[0].dtype, "f32");
  // The kernel lies inside the step.
  EXPECT_GE(norm[0].start_ns, step[0].start_ns);
  EXPECT_LE(norm[0].start_ns + norm[0].dur_ns, step[0].start_ns + step[0].dur_ns);
  EXPECT_GE(norm[0].dur_ns, 0);
}

TEST(Trace, NestedKernelsAndCommCountOnceEvenInPoolTasks) {
  trace::start();
  {
    KILN_TRACE_KERNEL("attention_forward", (Cost{100, 10}), 1);
    KILN_TRACE_KERNEL("gemm", (Cost{7, 7}), 1);  // same thread, inside: part of the attention
    // Tasks long enough that the workers join the region.
    thread_pool().run(8, [](int64_t, int) {
      KILN_TRACE_KERNEL("gemm", (Cost{7, 7}), 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    });
  }
  {
    KILN_TRACE_SCOPE(kComm, "allreduce");
    KILN_TRACE_SCOPE(kComm, "sendrecv");
  }
  // A pool region outside any kernel: its tasks' kernels are events of their own.
  thread_pool().run(4, [](int64_t, int) {
    KILN_TRACE_KERNEL("accumulate", (Cost{1, 12}), 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  });
  trace::stop();
  const auto all = trace::snapshot();
  EXPECT_EQ(events_named(all, "attention_forward").size(), 1u);
  EXPECT_EQ(events_named(all, "gemm").size(), 0u);
  EXPECT_EQ(events_named(all, "allreduce").size(), 1u);
  EXPECT_EQ(events_named(all, "sendrecv").size(), 0u);
  EXPECT_EQ(events_named(all, "accumulate").size(), 4u);
  EXPECT_EQ(trace::kernel_depth(), 0);
}

TEST(Trace, ThreadsHaveTheirOwnNamedBuffers) {
  trace::start();
  std::thread t([] {
    trace::set_thread_name("test helper");
    KILN_TRACE_SCOPE(kServe, "engine_step");
  });
  t.join();
  {
    KILN_TRACE_SCOPE(kServe, "engine_step");
  }
  trace::stop();
  const auto all = trace::snapshot();
  int threads_with_step = 0;
  bool named = false;
  for (const auto& th : all) {
    for (const auto& e : th.events) threads_with_step += std::string_view(e.name) == "engine_step";
    named |= th.name == "test helper" && th.events.size() == 1;
  }
  EXPECT_EQ(threads_with_step, 2);
  EXPECT_TRUE(named);
  // start() clears every buffer, also those of threads that have exited.
  trace::start();
  trace::stop();
  EXPECT_EQ(total_events(trace::snapshot()), 0u);
}

TEST(Trace, ManyEventsCrossBlockBoundaries) {
  trace::start();
  for (int i = 0; i < 10000; ++i) {
    KILN_TRACE_KERNEL("add", (Cost{1, 12}), i);
  }
  trace::stop();
  const auto adds = events_named(trace::snapshot(), "add");
  ASSERT_EQ(adds.size(), 10000u);
  for (int i = 0; i < 10000; ++i) ASSERT_EQ(adds[static_cast<size_t>(i)].dims[0], i);
}

TEST(Trace, InternGivesOneStableCopy) {
  const char* a = trace::intern(std::string("0,1"));
  const char* b = trace::intern("0,1");
  EXPECT_EQ(a, b);
  EXPECT_STREQ(a, "0,1");
}

}  // namespace
}  // namespace kiln
