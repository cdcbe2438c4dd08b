// The CPU rows of `kiln bench launch` (launch_bench.h).
#include "bench/launch_bench.h"

#include <fmt/format.h>

#include <vector>

#include "bench/bench_util.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/activation.h"

namespace kiln::bench {

std::vector<LaunchRow> run_launch_bench_host(const LaunchBenchOptions& opt) {
  // The smallest real kernel: SwiGLU of 16 floats, called directly (what a CPU "launch" is).
  std::vector<float> gate(16, 0.5f), up(16, 2.0f), out(16);
  const int threads = num_threads();
  // An empty parallel region with one task per thread: waking the workers and joining them.
  const auto region = [threads] { thread_pool().run(threads, [](int64_t, int) {}); };
  const auto call = [&] { cpu::swiglu_forward(out.data(), gate.data(), up.data(), 16); };
  const std::vector<Summary> t = time_interleaved(opt.reps, {call, region});
  return {
      {"CPU kernel call (cpu::swiglu_forward, 16 floats)", t[0].median * 1e9, "ns",
       "a function call: no launch to pay"},
      {fmt::format("CPU parallel region, {} threads (empty)", threads), t[1].median * 1e6, "us",
       threads > 1 ? "wake the pool's workers and join them: the CPU's launch cost"
                   : "one thread: the region runs inline"},
  };
}

}  // namespace kiln::bench
