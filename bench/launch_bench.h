// `kiln bench launch`: what it costs to start work, before any work is done, on the CPU and on a
// GPU, in one table. On the CPU a kernel is a function call (nanoseconds) and a parallel region
// wakes and joins the thread pool (microseconds). On a GPU (--device cuda) a launch costs host
// time to submit and a gap on the GPU between kernels; a host-device sync adds a round trip; a
// CUDA graph replays many launches for one submit; streams let a copy from pinned memory run
// beside a kernel. A build or machine without CUDA gets a named error for the GPU rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/status.h"

namespace kiln::bench {

struct LaunchBenchOptions {
  int launches = 2000;     // kernels (or regions) per timed batch
  int reps = 5;            // timed batches; the median is printed
  int64_t copy_mib = 256;  // host -> device copy size of the copy and overlap rows
  int64_t gemm = 4096;     // bf16 GEMM m = n = k run beside the copy in the overlap rows
};

struct LaunchRow {
  std::string what;
  double value = 0;
  std::string unit;  // "ns", "us", "ms", "GB/s", "%"
  std::string note;
};

// The CPU rows (every machine).
std::vector<LaunchRow> run_launch_bench_host(const LaunchBenchOptions& opt);
// The GPU rows: launch_bench_cuda.cpp; launch_bench_nocuda.cpp says the build has no CUDA.
Expected<std::vector<LaunchRow>> run_launch_bench_cuda(const LaunchBenchOptions& opt);

}  // namespace kiln::bench
