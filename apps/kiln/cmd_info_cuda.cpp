// `kiln info --cuda`: the chosen GPU's spec row and Little's law, then every CUDA kernel launch of
// this build for a problem shape with its ptxas resources, occupancy, limiter and waves. Printing
// only: the join and the model are perf/gpu_model.h.
#include <fmt/format.h>

#include <memory>
#include <string>

#include "apps/kiln/commands.h"
#include "kiln/kernels/cuda_catalog.h"
#include "kiln/perf/gpu_model.h"

namespace kiln::app {
namespace {

struct CudaInfoArgs {
  bool enabled = false;
  std::string gpu = "h200";
  std::string shape;                                    // "m,n,k"; empty: ProblemShape's defaults
  double latency_ns = perf::kAssumedHbmLatencyS * 1e9;  // Little's law
  const CLI::Option* seq = nullptr;                     // info's --seq, shared with --memory
};

// What a warp keeps in flight for Little's law: one 16-byte vector load per lane.
constexpr double kBytesPerWarpInFlight = 16.0 * perf::kWarpSize;

[[noreturn]] void fail(const std::string& message) {
  fmt::print(stderr, "kiln info --cuda: {}\n", message);
  throw CLI::RuntimeError(kUserError);
}

// "m,n,k", each 1 .. 2^24.
void parse_gemm_shape(const std::string& s, cuda::ProblemShape& shape) {
  int64_t v[3] = {0, 0, 0};
  size_t pos = 0;
  for (int i = 0; i < 3; ++i) {
    const size_t comma = s.find(',', pos);
    if ((i < 2) == (comma == std::string::npos))
      fail(fmt::format("--shape '{}': expected m,n,k", s));
    const std::string part =
        s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t used = 0;
    try {
      v[i] = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != part.size() || v[i] < 1 || v[i] > (int64_t{1} << 24))
      fail(fmt::format("--shape '{}': '{}' is not a size in 1..16777216", s, part));
    pos = comma + 1;
  }
  shape.m = v[0], shape.n = v[1], shape.k = v[2];
}

std::string si(double x, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int p = 0;
  while (x >= 1000 && p < 5) x /= 1000, ++p;
  return fmt::format("{:.{}f} {}{}", x, x < 10 ? 2 : 1, prefixes[p], unit);
}

// `label` then `text` in lines of at most 100 columns, continuation lines indented under it.
void print_wrapped(std::string_view label, std::string_view text) {
  std::string line(label);
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find(' ', at);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view word = text.substr(at, end - at);
    if (line.size() > label.size() && line.size() + 1 + word.size() > 100) {
      fmt::print("{}\n", line);
      line.assign(label.size(), ' ');
    } else if (line.size() > label.size()) {
      line += ' ';
    }
    line += word;
    at = end + 1;
  }
  fmt::print("{}\n", line);
}

void print_gpu(const perf::GpuSpec& g, double latency_s) {
  fmt::print("gpu        : {} ({}), {} SMs, boost {:.0f} MHz\n", g.full_name, g.arch(), g.num_sms,
             g.boost_clock_hz / 1e6);
  fmt::print(
      "per SM     : {} K registers ({} per thread at most), {} threads = {} warps, {} blocks;\n"
      "             shared memory {} KiB (carveouts",
      g.registers_per_sm / 1024, g.max_registers_per_thread, g.max_threads_per_sm,
      g.max_warps_per_sm(), g.max_blocks_per_sm, g.smem_per_sm_bytes / 1024);
  for (const int c : g.smem_carveouts_kib) fmt::print(" {}", c);
  fmt::print(" KiB), {} KiB per block + {} KiB reserved\n", g.smem_per_block_bytes / 1024,
             g.smem_reserved_per_block_bytes / 1024);
  fmt::print("memory     : HBM {} GB at {}, L2 {} MiB\n", g.hbm_capacity_bytes / 1000000000,
             si(g.hbm_bytes_per_s, "B/s"), g.l2_bytes >> 20);
  fmt::print("peaks      : fp32 {}  tf32 {}  bf16/fp16 {}  fp8 {}  int8 {} (dense)\n",
             si(g.peaks.fp32, "FLOP/s"), si(g.peaks.tf32, "FLOP/s"), si(g.peaks.bf16, "FLOP/s"),
             g.peaks.fp8 > 0 ? si(g.peaks.fp8, "FLOP/s") : std::string("none"),
             si(g.peaks.int8, "OP/s"));
  print_wrapped("source     : ", g.source);
  const perf::LittlesLaw l = perf::littles_law(g, latency_s, kBytesPerWarpInFlight);
  fmt::print(
      "little     : {} × {:.0f} ns = {} in flight to saturate HBM, {} per SM: {:.1f} warps per SM\n"
      "             with 16 B per lane ({:.0f} B per warp) in flight, {:.0f}% of the SM's {} "
      "warps\n"
      "             ({:.0f} ns: the load latency assumed, --latency-ns; see "
      "perf::kAssumedHbmLatencyS)\n",
      si(g.hbm_bytes_per_s, "B/s"), l.latency_s * 1e9, si(l.bytes_in_flight, "B"),
      si(l.bytes_in_flight_per_sm, "B"), l.warps_per_sm, l.bytes_per_warp,
      100 * l.fraction_of_max_warps, g.max_warps_per_sm(), l.latency_s * 1e9);
}

void run_info_cuda(const CudaInfoArgs& a) {
  auto g = perf::find_gpu(a.gpu);
  if (!g.ok()) fail(g.status().message());
  cuda::ProblemShape shape;
  if (!a.shape.empty()) parse_gemm_shape(a.shape, shape);
  if (a.seq && a.seq->count() > 0) shape.seq = a.seq->as<int64_t>();

  print_gpu(**g, a.latency_ns * 1e-9);
  const bool built = cuda::built();
  if (built) {
    fmt::print("cuda build : archs {}\n", cuda::archs());
  } else {
    fmt::print(
        "cuda build : this binary was built without the CUDA backend: registers unknown,\n"
        "             occupancy below leaves out the register limit (marked *)\n");
  }
  fmt::print(
      "shape      : gemm m,n,k = {},{},{}; attention batch {}, heads {} (kv {}), seq {},\n"
      "             head dim {}; rows {} x {}\n",
      shape.m, shape.n, shape.k, shape.batch, shape.heads, shape.kv_heads, shape.seq,
      shape.head_dim, shape.rows, shape.cols);

  const std::vector<cuda::KernelLaunch> launches = cuda::kernel_launches(shape);
  const std::vector<perf::KernelResourceUsage> usage =
      perf::parse_resource_usage(cuda::ptxas_log());
  const perf::LaunchReport r = perf::explain_launches(**g, launches, usage);
  if (r.rows.empty()) {
    fmt::print("launches   : none (the CUDA catalog lists no kernel launches in this build)\n");
    return;
  }
  fmt::print("\n{}", perf::format_launch_report(r));
}

}  // namespace

std::function<bool()> add_info_cuda(CLI::App* info) {
  auto a = std::make_shared<CudaInfoArgs>();
  info->add_flag(
      "--cuda", a->enabled,
      "Print the GPU execution model of each CUDA kernel launch (with --gpu, --shape, --seq)");
  info->add_option("--gpu", a->gpu, "--cuda: a100 | h100 | h200 | b200")
      ->check(CLI::IsMember({"a100", "h100", "h200", "b200"}));
  info->add_option("--shape", a->shape, "--cuda: GEMM problem m,n,k (default 4096,4096,4096)");
  info->add_option("--latency-ns", a->latency_ns,
                   "--cuda: HBM load latency for Little's law (default 600, an assumption)")
      ->check(CLI::Range(1.0, 1e6));
  a->seq = info->get_option_no_throw("--seq");
  return [a] {
    if (!a->enabled) return false;
    run_info_cuda(*a);
    return true;
  };
}

}  // namespace kiln::app
