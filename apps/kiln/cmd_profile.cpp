// `kiln profile CMD ...` (runs `kiln CMD ... --profile FILE`, then prints the summary of FILE) and
// `kiln roofline` (this CPU's hierarchical roofline; with --profile FILE, the summary of a trace
// and its ops plotted on the ceilings). The work lives in src/kiln/perf/profiler.h.
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include <fmt/format.h>

#include "apps/kiln/commands.h"
#include "kiln/core/file_io.h"
#include "kiln/core/thread_pool.h"
#include "kiln/perf/graph_fusion.h"
#include "kiln/perf/peak.h"
#include "kiln/perf/profiler.h"

namespace kiln::app {

graph::GraphPass graph_fusion_pass() {
  return perf::fusion_pass([](const perf::FusionReport& r) {
    if (!r.fallback.empty()) return;  // fusion.h warned once
    std::map<std::string, int> kinds;  // each distinct chain once, with its count
    for (const std::string& c : r.fused) ++kinds[c];
    std::string list;
    for (const auto& [c, n] : kinds) list += fmt::format("{}{}x {}", list.empty() ? ": " : ", ", n, c);
    fmt::print("fusion pass: {} elementwise chain{} fused ({} nodes){}\n", r.chains, r.chains == 1 ? "" : "s",
               r.nodes_fused, list);
  });
}

void apply_graph_mode(const std::string& mode, bool& capture, graph::GraphPass& pass) {
  capture = mode != "eager";
  if (mode == "fused") pass = graph_fusion_pass();
}

namespace {
// The commands that take --profile.
bool profiles(const std::vector<std::string>& words, size_t at) {
  const std::string& w = words[at];
  if (w == "train" || w == "generate" || w == "serve") return true;
  return w == "bench" && at + 1 < words.size() && words[at + 1] == "train";
}
}  // namespace

ProfileCommand take_profile_command(int argc, char** argv) {
  ProfileCommand pc;
  std::vector<std::string> words(argv, argv + argc);
  // Global flags may come first (kiln --threads 2 profile train ...).
  size_t at = 1;
  while (at < words.size() && words[at] != "profile" && words[at].rfind("-", 0) == 0) at += 2;
  if (at >= words.size() || words[at] != "profile") {
    pc.args = std::move(words);
    return pc;
  }
  std::vector<std::string> out(words.begin(), words.begin() + static_cast<std::ptrdiff_t>(at));
  size_t i = at + 1;
  bool graph = false;  // --graph: training and decode steps replay captured graphs; their breaks are listed
  while (i < words.size()) {
    if (words[i] == "--graph") {
      graph = true;
      ++i;
    } else if (i + 1 < words.size() && (words[i] == "--out" || words[i] == "--svg")) {
      (words[i] == "--out" ? pc.trace_path : pc.svg_path) = words[i + 1];
      i += 2;
    } else {
      break;
    }
  }
  if (i < words.size() && (words[i] == "--help" || words[i] == "-h")) {  // CLI11 prints the help
    pc.args = std::move(words);
    return pc;
  }
  if (i >= words.size() || !profiles(words, i)) {
    pc.error = "kiln profile: name the command to profile: kiln profile [--out FILE.json] [--svg FILE.svg] [--graph] "
               "train | generate | serve | bench train ...";
    pc.args = std::move(words);
    return pc;
  }
  if (graph && words[i] != "generate" && words[i] != "serve" && words[i] != "train") {
    pc.error = "kiln profile --graph: graphs are captured for the steps of train and the decode steps of generate and "
               "serve";
    pc.args = std::move(words);
    return pc;
  }
  out.insert(out.end(), words.begin() + static_cast<std::ptrdiff_t>(i), words.end());
  if (graph) {
    out.push_back("--graph");
    out.push_back("capture");
  }
  out.push_back("--profile");
  out.push_back(pc.trace_path);
  pc.active = true;
  pc.args = std::move(out);
  return pc;
}

int print_profile_summary(const ProfileCommand& pc) {
  // Under mpirun the merged trace is rank 0's; the others are done.
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"})
    if (const char* r = std::getenv(v); r && std::strcmp(r, "0") != 0) return 0;
  auto report = perf::profile_report(pc.trace_path, pc.svg_path);
  if (!report.ok()) {
    fmt::print(stderr, "kiln profile: {}\n", report.status().message());
    return kUserError;
  }
  fmt::print("{}", *report);
  return 0;
}

void register_profile(CLI::App& app) {
  CLI::App* p = app.add_subcommand(
      "profile", "Run a command with --profile and print its summary: kiln profile [--out FILE.json] [--svg FILE.svg] "
                 "[--graph] train | generate | serve | bench train ... (--graph: captured step graphs, breaks listed)");
  p->allow_extras();
  // Reached only when take_profile_command found nothing to run (main rewrites the others).
  p->callback([] {
    fmt::print(stderr, "kiln profile: name the command to profile (train, generate, serve, bench train)\n");
    throw CLI::RuntimeError(kUserError);
  });

  struct RooflineArgs {
    int threads = 0;
    std::string profile, svg;
  };
  auto a = std::make_shared<RooflineArgs>();
  CLI::App* r = app.add_subcommand("roofline", "This CPU's hierarchical roofline (FMA peak; L1, L2, L3, DRAM read "
                                               "bandwidth); with --profile, a trace's ops placed on it");
  r->add_option("--threads", a->threads, "Threads (default: the trace's threads per rank, else kiln's)")
      ->check(CLI::Range(1, 1024));
  r->add_option("--profile", a->profile, "A trace written by --profile: print its summary and plot its ops");
  r->add_option("--svg", a->svg, "Write the roofline plot here");
  r->callback([a] {
    if (!a->profile.empty()) {
      if (a->threads > 0) set_num_threads(a->threads);
      auto report = perf::profile_report(a->profile, a->svg);
      if (!report.ok()) {
        fmt::print(stderr, "kiln roofline: {}\n", report.status().message());
        throw CLI::RuntimeError(kUserError);
      }
      fmt::print("{}", *report);
      return;
    }
    const int threads = a->threads > 0 ? a->threads : num_threads();
    const perf::HierarchicalRoofline roof = perf::measure_hierarchical_roofline(threads);
    fmt::print("roofline on {} threads: f32 FMA peak {:.1f} GFLOP/s\n", threads, roof.peak_gflops);
    for (const perf::MemoryCeiling& c : roof.memory)
      fmt::print("  {:<5} {:>8.1f} GB/s  ridge {:>6.2f} FLOP/B{}\n", c.name, c.gbs,
                 c.gbs > 0 ? roof.peak_gflops / c.gbs : 0.0,
                 c.capacity_bytes > 0 ? fmt::format("  (holds {} KiB on {} threads)", c.capacity_bytes >> 10, threads) : "");
    if (!a->svg.empty()) {
      const Status st = write_file_atomic(a->svg, {perf::roofline_svg({}, roof, "measured roofline")});
      if (!st.ok()) {
        fmt::print(stderr, "kiln roofline: {}\n", st.message());
        throw CLI::RuntimeError(kUserError);
      }
      fmt::print("roofline: {}\n", a->svg);
    }
  });
}

}  // namespace kiln::app
