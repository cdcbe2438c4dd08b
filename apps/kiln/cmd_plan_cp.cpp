// `kiln plan cp`: context parallelism on a modelled topology (perf/cp_model.h over
// perf/comm_model.h): ring attention (contiguous and zig-zag), Ulysses and the Ulysses × ring
// hybrid per layer — the busiest rank's compute, the communication, how much of it is exposed,
// the imbalance and the memory per rank. --check FILE holds the model against a `kiln bench cp`
// run of this machine (its output saved in FILE), at this CPU's measured kernel rates. No MPI.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "apps/kiln/commands.h"
#include "kiln/core/thread_pool.h"
#include "kiln/model/config.h"
#include "kiln/perf/cp_model.h"
#include "kiln/perf/peak.h"

namespace kiln::app {
namespace {

using parallel::LayoutKind;

struct PlanCpOptions {
  std::string topology = "h100-node";
  std::string preset;
  perf::CpAttentionShape shape;
  std::vector<int64_t> seqs = {8192, 16384, 32768};
  std::vector<int> cps = {2, 4, 8};
  std::vector<std::string> methods = {"ring", "ulysses", "hybrid"};
  int ulysses = 2;
  int ranks_per_node = 0;  // 0: the topology's
  double dtype_bytes = 2, tflops = 0, efficiency = 1;
  std::string check;
};

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

// The variants a method runs as: ring in both layouts, Ulysses once, the hybrid zig-zag.
std::vector<perf::CpPlanOptions> variants_of(perf::CpMethod m, int c, int u) {
  perf::CpPlanOptions o;
  o.method = m, o.cp = c, o.ulysses = u;
  if (m == perf::CpMethod::kRing) {
    perf::CpPlanOptions z = o;
    o.layout = LayoutKind::kContiguous;
    return {o, z};
  }
  o.layout = m == perf::CpMethod::kUlysses ? LayoutKind::kContiguous : LayoutKind::kZigzag;
  return {o};
}

int run_plan(const PlanCpOptions& o, const perf::Topology& topo) {
  const double rate = (o.tflops > 0 ? o.tflops * 1e12 : topo.peak_flops) * o.efficiency;
  if (!(rate > 0)) {
    std::fprintf(stderr, "kiln plan cp: --topology %s names no device peak: give --tflops\n", o.topology.c_str());
    return kUserError;
  }
  const perf::CpAttentionShape& s = o.shape;
  fmt::print("# plan cp on {}: {}\n", topo.name, topo.description);
  if (o.ranks_per_node > 0)
    fmt::print("# --ranks-per-node {}: the CP group's ranks {} per node (the rest of each node runs other axes)\n",
               o.ranks_per_node, topo.ranks_per_node);
  fmt::print("# attention {}: {} heads, {} KV heads, head dim {}, {} layers, batch {}, {}; {} B per element; "
             "kernels at {:.0f} TFLOP/s ({:.0f} x efficiency {:.2f})\n",
             o.preset.empty() ? "shape" : o.preset, s.heads, s.kv_heads, s.head_dim, s.layers, s.batch,
             s.causal ? "causal" : "non-causal", o.dtype_bytes, rate / 1e12, rate / o.efficiency / 1e12,
             o.efficiency);
  fmt::print("# per layer, forward + backward, one rank: fwd/bwd = the busiest rank's attention kernels (FLOPs of "
             "attention_*_cost per visible pair: a diagonal block n(n+1)/2 of n^2); imbalance = busiest / mean; "
             "comm = every transfer; exposed = transfer not hidden by the busiest rank's block of the same step "
             "(ring) or all of it (Ulysses' all-to-alls block); wait = the worst rank's simulated waits, imbalance "
             "included; layer = the slowest rank's forward + backward; step = layer x {} layers\n", s.layers);
  fmt::print("# hop = one ring hop (fwd K/V, bwd K/V + dK/dV); a2a = Ulysses' send buffers per rank (fwd, bwd); "
             "mem = q, k, v, out, dout, dq, dk, dv, lse and the larger pass's buffers (kernel scratch excluded)\n");
  fmt::print("{:<8} {:<10} {:>2} {:>5} {:>7} {:>6} {:>9} {:>9} {:>6} {:>15} {:>15} {:>9} {:>9} {:>9} {:>9} {:>10} "
             "{:>8}  {}\n",
             "method", "layout", "C", "UxR", "T", "T/C", "fwd_ms", "bwd_ms", "imbal", "hop_MiB_fwd/bwd",
             "a2a_MiB_fwd/bwd", "comm_ms", "exposed", "wait_ms", "layer_ms", "step_ms", "mem_MiB", "link");
  for (const int c : o.cps)
    for (const std::string& name : o.methods) {
      const perf::CpMethod m = perf::parse_cp_method(name).value();  // checked by the flag
      for (perf::CpPlanOptions po : variants_of(m, c, o.ulysses)) {
        po.bytes_per_element = o.dtype_bytes;
        po.forward_flops_per_s = rate;
        const std::string layout =
            m == perf::CpMethod::kUlysses ? "-" : std::string(parallel::layout_kind_name(po.layout));
        if (m == perf::CpMethod::kHybrid && (o.ulysses >= c || c % o.ulysses != 0)) continue;  // no split
        if (const Status st = perf::check_cp_heads(s, po); !st.ok()) {
          fmt::print("{:<8} {:<10} {:>2}  does not apply: {}\n", name, layout, c, st.message());
          continue;
        }
        for (const int64_t seq : o.seqs) {
          auto p = perf::predict_cp_layer(topo, s, seq, po);
          if (!p.ok()) {
            std::fprintf(stderr, "kiln plan cp: --seq / --cp: %s\n", p.status().message().c_str());
            return kUserError;
          }
          fmt::print("{:<8} {:<10} {:>2} {:>5} {:>7} {:>6} {:>9.3f} {:>9.3f} {:>6.3f} {:>15} {:>15} {:>9.3f} {:>9.3f} "
                     "{:>9.3f} {:>9.3f} {:>10.1f} {:>8.1f}  {}\n",
                     name, layout, c, fmt::format("{}x{}", p->ulysses, p->ring), seq, seq / c, 1e3 * p->fwd_compute_s,
                     1e3 * p->bwd_compute_s, p->imbalance,
                     p->ring > 1 ? fmt::format("{:.2f}/{:.2f}", mib(p->ring_hop_bytes_fwd), mib(p->ring_hop_bytes_bwd))
                                 : "-",
                     p->ulysses > 1 ? fmt::format("{:.1f}/{:.1f}", mib(p->a2a_bytes_fwd), mib(p->a2a_bytes_bwd)) : "-",
                     1e3 * p->comm_s, 1e3 * p->exposed_s, 1e3 * p->wait_s, 1e3 * p->layer_s,
                     1e3 * p->layer_s * s.layers, mib(p->memory_bytes), p->comm_note);
        }
      }
    }
  return 0;
}

// ---- --check: a `kiln bench cp` run of this machine --------------------------------------------

// One row of bench cp's table: "| ring zigzag | 8192 | 4096 | 20.3..20.4 | 45.1..50.2 | 1.08 | 8.9 |
// 23.5 | 4.00 | 10.36 | 2652 | 77.9 | 1.00 |".
struct BenchRow {
  std::string variant;
  int64_t seq = 0;
  double fwd_max = 0, bwd_max = 0, imbalance = 0, exposed = 0, comm = 0, sent_mib = 0, mem_mib = 0, wall = 0;
};

std::vector<std::string> cells_of(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream in(line.substr(1));
  std::string cell;
  while (std::getline(in, cell, '|')) {
    const size_t a = cell.find_first_not_of(' '), b = cell.find_last_not_of(' ');
    cells.push_back(a == std::string::npos ? "" : cell.substr(a, b - a + 1));
  }
  return cells;
}

double upper_of(const std::string& range) {  // "10.7..29.9" → 29.9
  const size_t dots = range.find("..");
  return std::stod(dots == std::string::npos ? range : range.substr(dots + 2));
}

struct BenchRun {
  int c = 0, threads = 1;
  perf::CpAttentionShape shape;
  std::vector<BenchRow> rows;
};

Expected<BenchRun> read_bench(const std::string& path) {
  std::ifstream f(path);
  if (!f) return invalid_argument("cannot read {}", path);
  BenchRun run;
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("# bench cp C ", 0) == 0) {
      std::stringstream in(line);
      std::string word;
      std::map<std::string, std::string> kv;
      std::string prev;
      while (in >> word) {
        if (word == "causal" || word == "non-causal") run.shape.causal = word == "causal";
        kv[prev] = word;
        prev = word;
      }
      try {
        run.c = std::stoi(kv["C"]);
        run.shape.heads = std::stoll(kv["heads"]);
        run.shape.kv_heads = std::stoll(kv["kv_heads"]);
        run.shape.head_dim = std::stoll(kv["head_dim"]);
        run.threads = std::stoi(kv["threads/rank"]);
      } catch (...) {
        return invalid_argument("{}: a bench cp header line that does not parse: {}", path, line);
      }
      continue;
    }
    if (line.size() < 2 || line[0] != '|' || line.rfind("| method", 0) == 0 || line.rfind("|---", 0) == 0) continue;
    const std::vector<std::string> cell = cells_of(line);
    if (cell.size() < 12) continue;
    try {
      BenchRow r;
      r.variant = cell[0];
      r.seq = std::stoll(cell[1]);
      r.fwd_max = upper_of(cell[3]), r.bwd_max = upper_of(cell[4]), r.imbalance = std::stod(cell[5]);
      r.exposed = std::stod(cell[6]), r.comm = std::stod(cell[7]), r.sent_mib = std::stod(cell[8]);
      r.mem_mib = std::stod(cell[9]), r.wall = std::stod(cell[11]);
      run.rows.push_back(r);
    } catch (...) {
      return invalid_argument("{}: a table row that does not parse: {}", path, line);
    }
  }
  if (run.c < 1 || run.rows.empty())
    return invalid_argument("{}: no `kiln bench cp` header line and table (save its output to this file)", path);
  return run;
}

// "ring contiguous", "ring zigzag", "ulysses contiguous", "hybrid 2x2 zigzag" → the model's options.
Expected<perf::CpPlanOptions> options_of(const std::string& variant, int c) {
  perf::CpPlanOptions o;
  o.cp = c;
  o.layout = variant.find("zigzag") != std::string::npos ? LayoutKind::kZigzag : LayoutKind::kContiguous;
  if (variant.rfind("ring", 0) == 0) o.method = perf::CpMethod::kRing;
  else if (variant.rfind("ulysses", 0) == 0) o.method = perf::CpMethod::kUlysses;
  else if (variant.rfind("hybrid 2x2", 0) == 0) o.method = perf::CpMethod::kHybrid, o.ulysses = 2;
  else return invalid_argument("unknown bench cp variant '{}'", variant);
  return o;
}

// The kernel call shape of a variant's blocks: the ring's segment rows (at most kMaxRows, so the
// measurement stays short) with the ring's heads; Ulysses' whole sequence, causal, heads / C.
constexpr int64_t kMaxCalibrationRows = 2048;  // ~0.3 s per rate at 2 heads x 16 on this VM
AttentionParams block_of(const perf::CpAttentionShape& s, const perf::CpPlanOptions& o, int64_t seq) {
  const int u = o.method == perf::CpMethod::kRing ? 1 : o.method == perf::CpMethod::kUlysses ? o.cp : o.ulysses;
  const int r = o.cp / u;
  int64_t rows = seq / r / (o.layout == LayoutKind::kZigzag && r > 1 ? 2 : 1);
  AttentionParams p;
  p.q_len = p.kv_len = std::min(rows, kMaxCalibrationRows);
  p.n_heads = s.heads / u, p.n_kv_heads = s.kv_heads / u, p.head_dim = s.head_dim;
  p.causal = r == 1 && s.causal;  // ring blocks are timed full; Ulysses runs one causal call
  return p;
}

int run_check(const PlanCpOptions& o) {
  auto run = read_bench(o.check);
  if (!run.ok()) {
    fmt::print(stderr, "kiln plan cp: --check: {}\n", run.status().message());
    return kUserError;
  }
  const perf::Topology topo = *perf::find_topology("local-shm");
  set_num_threads(run->threads);
  run->shape.layers = 1;
  fmt::print("# plan cp --check {}: C {} heads {} kv_heads {} head_dim {} {}, fp32, {} kernel thread(s) per rank, "
             "on {}: {}\n",
             o.check, run->c, run->shape.heads, run->shape.kv_heads, run->shape.head_dim,
             run->shape.causal ? "causal" : "non-causal", run->threads, topo.name, topo.description);
  fmt::print("# rates: this CPU's flash kernels timed on one block of the variant's size (<= {} rows; ring blocks "
             "full, Ulysses' one causal call), beside the f32 FMA peak {:.1f} GFLOP/s; each cell is measured / "
             "predicted (ratio); bench 'exposed' is the model's 'wait' (the compute thread's waits); imbalance is "
             "max / min over ranks as the bench prints it; the bench's mem counts 5 K-sized buffers where the "
             "runtime has 4 (k, v, dk, dv) and the kernels' scratch\n",
             kMaxCalibrationRows, perf::fma_peak_gflops(run->threads));
  fmt::print("{:<20} {:>6} {:>9} {:>20} {:>20} {:>13} {:>20} {:>16} {:>16} {:>22}\n", "variant", "T", "GFLOP/s",
             "fwd_ms_max", "bwd_ms_max", "imbal_max/min", "exposed(wait)_ms", "sent_MiB", "mem_MiB", "wall_ms");
  std::map<std::string, perf::AttentionRate> rates;
  auto cell = [](double measured, double predicted, int decimals) {
    return fmt::format("{:.{}f}/{:.{}f} ({:.2f})", measured, decimals, predicted, decimals,
                       predicted > 0 ? measured / predicted : 0.0);
  };
  for (const BenchRow& row : run->rows) {
    auto po = options_of(row.variant, run->c);
    if (!po.ok()) {
      fmt::print(stderr, "kiln plan cp: --check: {}\n", po.status().message());
      return kUserError;
    }
    po->bytes_per_element = 4;
    const AttentionParams block = block_of(run->shape, *po, row.seq);
    const std::string key = fmt::format("{}x{}x{}x{}", block.q_len, block.n_heads, block.n_kv_heads, block.causal);
    if (!rates.count(key)) rates[key] = perf::measure_attention_rate(block);
    po->forward_flops_per_s = rates[key].forward_flops_per_s;
    po->backward_flops_per_s = rates[key].backward_flops_per_s;
    auto p = perf::predict_cp_layer(topo, run->shape, row.seq, *po);
    if (!p.ok()) {
      fmt::print(stderr, "kiln plan cp: --check: {}: {}\n", row.variant, p.status().message());
      return kUserError;
    }
    fmt::print("{:<20} {:>6} {:>9} {:>20} {:>20} {:>13} {:>20} {:>16} {:>16} {:>22}\n", row.variant, row.seq,
               fmt::format("{:.2f}/{:.2f}", rates[key].forward_flops_per_s / 1e9, rates[key].backward_flops_per_s / 1e9),
               cell(row.fwd_max, 1e3 * p->fwd_compute_s, 1), cell(row.bwd_max, 1e3 * p->bwd_compute_s, 1),
               fmt::format("{:.2f}/{:.2f}", row.imbalance, p->min_compute_s > 0 ? p->mean_compute_s * p->imbalance / p->min_compute_s : 0.0),
               cell(row.exposed, 1e3 * p->wait_s, 1), cell(row.sent_mib, mib(p->bytes_sent), 2),
               cell(row.mem_mib, mib(p->memory_bytes), 2), cell(row.wall, 1e3 * p->layer_s, 1));
    std::fflush(stdout);
  }
  return 0;
}

int run_plan_cp(PlanCpOptions o) {
  if (!o.check.empty()) return run_check(o);
  const auto topo = perf::find_topology_or_error(o.topology);
  if (!topo.ok()) {
    std::fprintf(stderr, "kiln plan cp: --topology: %s\n", topo.status().message().c_str());
    return kUserError;
  }
  for (const std::string& m : o.methods)
    if (!perf::parse_cp_method(m).ok()) {
      std::fprintf(stderr, "kiln plan cp: --method: unknown method %s (ring, ulysses, hybrid)\n", m.c_str());
      return kUserError;
    }
  for (const int c : o.cps)
    if (c > topo->max_ranks) {
      std::fprintf(stderr, "kiln plan cp: --cp: topology %s has at most %d ranks, got %d\n", o.topology.c_str(),
                   topo->max_ranks, c);
      return kUserError;
    }
  perf::Topology t = *topo;
  if (o.ranks_per_node > 0) {
    if (t.kind != perf::TopologyKind::kSwitched) {
      std::fprintf(stderr, "kiln plan cp: --ranks-per-node: topology %s is a torus\n", o.topology.c_str());
      return kUserError;
    }
    t.ranks_per_node = o.ranks_per_node;
  }
  return run_plan(o, t);
}

}  // namespace

void register_plan_cp(CLI::App& app) {
  CLI::App* plan = app.get_subcommand("plan");  // created by register_comm
  auto opt = std::make_shared<PlanCpOptions>();
  CLI::App* cmd = plan->add_subcommand(
      "cp", "Predicted context parallelism per layer on a modelled topology: ring attention (contiguous, "
            "zig-zag), Ulysses and the hybrid; busiest-rank compute, communication, exposed time, imbalance, "
            "memory per rank; --check FILE against a saved `kiln bench cp` run of this machine");
  cmd->add_option("--topology", opt->topology,
                  "h100-node (default), h100-ib, dgx2-v100, tpu-torus-2d, tpu-torus-3d, local-shm");
  CLI::Option* preset = cmd->add_option("--preset", opt->preset, "A model preset's attention (heads, KV heads, "
                                                                 "head dim, layers); flags below override it");
  CLI::Option* heads = cmd->add_option("--heads", opt->shape.heads, "Query heads (default 32: Llama-2-7B)")
                           ->check(CLI::Range(int64_t{1}, int64_t{1} << 12));
  CLI::Option* kv = cmd->add_option("--kv-heads", opt->shape.kv_heads, "KV heads, dividing --heads (default 32)")
                        ->check(CLI::Range(int64_t{1}, int64_t{1} << 12));
  CLI::Option* dim = cmd->add_option("--head-dim", opt->shape.head_dim, "Head dimension (default 128)")
                         ->check(CLI::Range(int64_t{1}, int64_t{1} << 12));
  CLI::Option* layers = cmd->add_option("--layers", opt->shape.layers, "Layers, for the step time (default 32)")
                            ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  cmd->add_option("--batch", opt->shape.batch, "Sequences per CP group (default 1)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  cmd->add_flag("!--no-causal", opt->shape.causal, "Full (non-causal) attention");
  cmd->add_option("--seq", opt->seqs, "Global sequence lengths T (default 8192,16384,32768)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 26));
  cmd->add_option("--cp", opt->cps, "Context-parallel sizes C (default 2,4,8)")->delimiter(',')->check(CLI::Range(1, 65536));
  cmd->add_option("--method", opt->methods, "ring, ulysses, hybrid (default all three)")->delimiter(',');
  cmd->add_option("--ranks-per-node", opt->ranks_per_node,
                  "The CP group's ranks in one node (default: the topology's node; 1: one per node, as when tensor "
                  "parallelism fills each node)")
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--ulysses", opt->ulysses, "The hybrid's Ulysses group U (ring over C / U; default 2)")
      ->check(CLI::Range(2, 65536));
  cmd->add_option("--dtype-bytes", opt->dtype_bytes, "Bytes per element in memory and on the wire (default 2: bf16)")
      ->check(CLI::Range(0.5, 8.0));
  cmd->add_option("--tflops", opt->tflops, "Device peak in TFLOP/s (default: the topology's)")
      ->check(CLI::Range(1e-3, 1e6));
  cmd->add_option("--efficiency", opt->efficiency, "Fraction of the peak the attention kernels reach (default 1)")
      ->check(CLI::Range(1e-3, 1.0));
  cmd->add_option("--check", opt->check,
                  "A file holding `mpirun -np C kiln bench cp` output: predict that run on local-shm at this CPU's "
                  "measured kernel rates and print measured / predicted");
  cmd->callback([opt, preset, heads, kv, dim, layers] {
    PlanCpOptions o = *opt;
    if (preset->count() > 0) {
      auto c = kiln::preset(o.preset);
      if (!c.ok()) {
        fmt::print(stderr, "kiln plan cp: --preset: {}\n", c.status().message());
        std::exit(kUserError);
      }
      if (c->is_mla()) {
        fmt::print(stderr, "kiln plan cp: --preset: {} uses latent attention; kiln's context parallelism runs "
                           "multi-head / grouped-query attention only\n", o.preset);
        std::exit(kUserError);
      }
      if (heads->count() == 0) o.shape.heads = c->n_heads;
      if (kv->count() == 0) o.shape.kv_heads = c->n_kv_heads;
      if (dim->count() == 0) o.shape.head_dim = c->head_dim();
      if (layers->count() == 0) o.shape.layers = c->n_layers;
    }
    if (o.shape.heads % o.shape.kv_heads != 0) {
      fmt::print(stderr, "kiln plan cp: --kv-heads: {} KV heads do not divide {} heads\n", o.shape.kv_heads,
                 o.shape.heads);
      std::exit(kUserError);
    }
    const int rc = run_plan_cp(o);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace kiln::app
