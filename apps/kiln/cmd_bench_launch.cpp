// `kiln bench launch` (issue 23): what starting work costs on the CPU and, with --device cuda, on
// the GPU: launches, host-device syncs, CUDA graph replay, pageable and pinned copies, and a copy
// overlapped with a GEMM on a second stream (bench/launch_bench.h), printed as one table.
#include <fmt/format.h>

#include <memory>
#include <string>

#include "apps/kiln/commands.h"
#include "bench/launch_bench.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/device.h"

namespace kiln::app {
namespace {

struct LaunchArgs {
  std::string device = "host";
  bench::LaunchBenchOptions bench;
};

void print_rows(const std::vector<bench::LaunchRow>& rows) {
  for (const bench::LaunchRow& r : rows)
    fmt::print("{:<46} {:>10.3f} {:<5} {}\n", r.what, r.value, r.unit, r.note);
}

void run(const LaunchArgs& a) {
  const auto device = parse_device(a.device);
  if (!device.ok()) {
    fmt::print(stderr, "kiln bench launch: --device: {}\n", device.status().message());
    throw CLI::RuntimeError(kUserError);
  }
  if (*device == Device::kCuda && !cuda_available()) {  // the verdict before any timing
    fmt::print(stderr, "kiln bench launch --device cuda: {}\n", cuda_runtime::unavailable_reason());
    throw CLI::RuntimeError(kUserError);
  }
  fmt::print("# launch cost: {} launches per batch, median of {} batches; {}\n", a.bench.launches,
             a.bench.reps, cpu_features().brand);
  fmt::print("{:<46} {:>10} {:<5} {}\n", "what", "value", "unit", "meaning");
  print_rows(bench::run_launch_bench_host(a.bench));
  if (*device != Device::kCuda) return;
  const auto gpu = bench::run_launch_bench_cuda(a.bench);
  if (!gpu.ok()) {
    fmt::print(stderr, "kiln bench launch --device cuda: {}\n", gpu.status().message());
    throw CLI::RuntimeError(kUserError);
  }
  print_rows(*gpu);
}

}  // namespace

void register_bench_launch(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto a = std::make_shared<LaunchArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "launch",
      "Launch cost: a CPU kernel call and parallel region; with --device cuda, GPU launches, "
      "syncs, CUDA graph replay, pinned copies and copy/compute overlap on two streams");
  cmd->add_option("--device", a->device, "host (the CPU rows) or cuda (the GPU rows too)");
  cmd->add_option("--launches", a->bench.launches, "Launches per timed batch")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--reps", a->bench.reps, "Timed batches (median)")->check(CLI::Range(1, 1000));
  cmd->add_option("--copy-mib", a->bench.copy_mib, "Host-to-device copy size in MiB (GPU rows)")
      ->check(CLI::Range(1, 16384));
  cmd->add_option("--gemm", a->bench.gemm, "bf16 GEMM size m = n = k beside the copy (GPU rows)")
      ->check(CLI::Range(64, 16384));
  cmd->callback([a] { run(*a); });
}

}  // namespace kiln::app
