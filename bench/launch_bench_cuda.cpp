// The GPU rows of `kiln bench launch` (launch_bench.h): the empty kernel (kernels/cuda/probe.cu)
// queued back to back, each followed by a sync, and replayed from a CUDA graph; host-to-device
// copies from pageable and pinned memory; a copy on its own stream beside a bf16 GEMM. Host
// times come from the host clock, GPU times from events recorded on the stream.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "bench/bench_util.h"
#include "bench/launch_bench.h"
#include "kiln/core/device.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/cuda/kernels.h"

namespace kiln::bench {
namespace {

using cuda_runtime::Event;
using cuda_runtime::Graph;
using cuda_runtime::PinnedBuffer;
using cuda_runtime::Stream;
using cuda_runtime::StreamScope;

// GPU seconds of what `queue` puts on `stream`, between two events.
Expected<double> gpu_seconds(const Stream& stream, Event& start, Event& end,
                             const std::function<Status()>& queue) {
  KILN_RETURN_IF_ERROR(start.record(stream));
  KILN_RETURN_IF_ERROR(queue());
  KILN_RETURN_IF_ERROR(end.record(stream));
  KILN_RETURN_IF_ERROR(end.synchronize());
  KILN_ASSIGN_OR_RETURN(float ms, Event::elapsed_ms(start, end));
  return ms * 1e-3;
}

double median(std::vector<double> v) {
  return summarize(std::move(v)).median;
}

}  // namespace

Expected<std::vector<LaunchRow>> run_launch_bench_cuda(const LaunchBenchOptions& opt) {
  if (!cuda_available())
    return Status(StatusCode::kUnavailable, cuda_runtime::unavailable_reason());
  KILN_ASSIGN_OR_RETURN(Stream stream, Stream::create());
  KILN_ASSIGN_OR_RETURN(Stream copy_stream, Stream::create());
  KILN_ASSIGN_OR_RETURN(Event start, Event::create());
  KILN_ASSIGN_OR_RETURN(Event end, Event::create());
  StreamScope scope(stream);
  const int n = opt.launches;
  const auto queue_empty = [n]() -> Status {
    for (int i = 0; i < n; ++i) KILN_RETURN_IF_ERROR(cuda::queue_empty_kernel());
    return {};
  };
  KILN_RETURN_IF_ERROR(queue_empty());  // warm-up: module load, first-launch setup
  KILN_RETURN_IF_ERROR(stream.synchronize());

  // Back to back: the host's submit time per launch, and the GPU's time per kernel of the queue.
  std::vector<double> submit, gpu_each, round_trip, replay_host, replay_gpu_each;
  for (int r = 0; r < opt.reps; ++r) {
    double host = 0;
    KILN_ASSIGN_OR_RETURN(double gpu, gpu_seconds(stream, start, end, [&]() -> Status {
                            const double t0 = now_seconds();
                            KILN_RETURN_IF_ERROR(queue_empty());
                            host = now_seconds() - t0;
                            return {};
                          }));
    submit.push_back(host / n);
    gpu_each.push_back(gpu / n);
    // A sync after every launch: the host waits for the GPU each time (a host-device sync).
    const int syncs = std::max(1, n / 10);
    const double t0 = now_seconds();
    for (int i = 0; i < syncs; ++i) {
      KILN_RETURN_IF_ERROR(cuda::queue_empty_kernel());
      KILN_RETURN_IF_ERROR(stream.synchronize());
    }
    round_trip.push_back((now_seconds() - t0) / syncs);
  }

  // The same n launches captured once and replayed: one submit for all of them.
  KILN_ASSIGN_OR_RETURN(Graph graph, Graph::capture(stream, queue_empty));
  KILN_RETURN_IF_ERROR(graph.launch(stream));  // warm-up (the first replay uploads the graph)
  KILN_RETURN_IF_ERROR(stream.synchronize());
  for (int r = 0; r < opt.reps; ++r) {
    double host = 0;
    KILN_ASSIGN_OR_RETURN(double gpu, gpu_seconds(stream, start, end, [&]() -> Status {
                            const double t0 = now_seconds();
                            KILN_RETURN_IF_ERROR(graph.launch(stream));
                            host = now_seconds() - t0;
                            return {};
                          }));
    replay_host.push_back(host);
    replay_gpu_each.push_back(gpu / n);
  }

  std::vector<LaunchRow> rows = {
      {"GPU launch, host submit (empty kernel)", median(submit) * 1e6, "us",
       "host time to queue one launch"},
      {"GPU launch, back to back on the GPU", median(gpu_each) * 1e6, "us",
       "GPU time per kernel of a queue of empty kernels"},
      {"GPU launch + stream sync (round trip)", median(round_trip) * 1e6, "us",
       "a host-device sync after every kernel: the queue drains each time"},
      {fmt::format("CUDA graph replay of {} launches, host", n), median(replay_host) * 1e6, "us",
       fmt::format("one submit: {:.3f} us per captured launch", median(replay_host) * 1e6 / n)},
      {"CUDA graph replay, on the GPU per kernel", median(replay_gpu_each) * 1e6, "us",
       fmt::format("{} nodes in the graph", graph.nodes())},
  };

  // Host -> device copies of copy_mib MiB: pageable (staged by the driver) and pinned.
  const int64_t bytes = opt.copy_mib << 20;
  std::vector<char> pageable(static_cast<size_t>(bytes), 1);
  KILN_ASSIGN_OR_RETURN(PinnedBuffer pinned, PinnedBuffer::allocate(bytes));
  std::fill_n(static_cast<char*>(pinned.data()), bytes, 1);
  KILN_ASSIGN_OR_RETURN(auto dst, Storage::allocate(bytes, Device::kCuda));
  const auto copy_pinned = [&]() -> Status {
    return cuda_runtime::copy_host_to_device_async(dst->data(), pinned.data(), bytes, copy_stream);
  };
  std::vector<double> t_pageable, t_pinned;
  for (int r = 0; r < opt.reps; ++r) {
    double t0 = now_seconds();
    KILN_RETURN_IF_ERROR(cuda_runtime::copy_host_to_device(dst->data(), pageable.data(), bytes));
    t_pageable.push_back(now_seconds() - t0);
    t0 = now_seconds();
    KILN_RETURN_IF_ERROR(copy_pinned());
    KILN_RETURN_IF_ERROR(copy_stream.synchronize());
    t_pinned.push_back(now_seconds() - t0);
  }
  const double copy_s = median(t_pinned);
  rows.push_back({fmt::format("H2D copy {} MiB, pageable", opt.copy_mib),
                  static_cast<double>(bytes) / median(t_pageable) * 1e-9, "GB/s",
                  "staged through a driver buffer; blocks the host"});
  rows.push_back({fmt::format("H2D copy {} MiB, pinned, async", opt.copy_mib),
                  static_cast<double>(bytes) / copy_s * 1e-9, "GB/s",
                  "the copy engine reads host memory directly"});

  // Overlap: a bf16 GEMM on `stream` and the pinned copy on `copy_stream`, alone and together.
  const int64_t g = opt.gemm;
  KILN_ASSIGN_OR_RETURN(Tensor a, Tensor::zeros({g, g}, DType::kBF16).to(Device::kCuda));
  KILN_ASSIGN_OR_RETURN(Tensor b, Tensor::zeros({g, g}, DType::kBF16).to(Device::kCuda));
  KILN_ASSIGN_OR_RETURN(Tensor c, Tensor::zeros({g, g}).to(Device::kCuda));
  GemmParams p;
  p.m = p.n = p.k = g;
  p.a = a.raw_data(), p.lda = g, p.a_dtype = DType::kBF16;
  p.b = b.raw_data(), p.ldb = g, p.b_dtype = DType::kBF16, p.trans_b = true;
  p.c = static_cast<float*>(c.raw_data()), p.ldc = g;
  KILN_RETURN_IF_ERROR(cuda::gemm(p));  // warm-up
  KILN_RETURN_IF_ERROR(stream.synchronize());
  std::vector<double> t_gemm, t_serial, t_both;
  for (int r = 0; r < opt.reps; ++r) {
    double t0 = now_seconds();
    KILN_RETURN_IF_ERROR(cuda::gemm(p));
    KILN_RETURN_IF_ERROR(stream.synchronize());
    t_gemm.push_back(now_seconds() - t0);
    t0 = now_seconds();
    KILN_RETURN_IF_ERROR(cuda::gemm(p));
    KILN_RETURN_IF_ERROR(stream.synchronize());
    KILN_RETURN_IF_ERROR(copy_pinned());
    KILN_RETURN_IF_ERROR(copy_stream.synchronize());
    t_serial.push_back(now_seconds() - t0);
    t0 = now_seconds();
    KILN_RETURN_IF_ERROR(cuda::gemm(p));
    KILN_RETURN_IF_ERROR(copy_pinned());
    KILN_RETURN_IF_ERROR(stream.synchronize());
    KILN_RETURN_IF_ERROR(copy_stream.synchronize());
    t_both.push_back(now_seconds() - t0);
  }
  const double gemm_s = median(t_gemm), serial = median(t_serial), both = median(t_both);
  const double hidden = (serial - both) / std::min(gemm_s, copy_s);
  rows.push_back({fmt::format("bf16 GEMM {}^3 alone", g), gemm_s * 1e3, "ms",
                  fmt::format("{:.1f} TFLOP/s", 2.0 * g * g * g / gemm_s * 1e-12)});
  rows.push_back({"GEMM then copy, one after the other", serial * 1e3, "ms", ""});
  rows.push_back({"GEMM and copy on two streams", both * 1e3, "ms",
                  fmt::format("{:.0f}% of the shorter one hidden", 100.0 * hidden)});
  return rows;
}

}  // namespace kiln::bench
