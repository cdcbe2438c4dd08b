// `kiln bench comm`: every kiln collective algorithm and MPI's own collective, one after the
// other on the same buffers in the same run; nccl-tests columns, median of the repetitions.
// `--calibrate` fits the alpha-beta parameters (ping-pong, reduction, each algorithm).
#include "bench/comm_bench.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "bench/comm_rounds.h"
#include "kiln/comm/collectives.h"
#include "kiln/comm/cost_model.h"
#include "kiln/comm/reduce.h"

namespace kiln::bench {
namespace {

using comm::Algo;
using comm::CollOp;
using comm::Communicator;
using comm::ReduceOp;

// Element i of the data of `who`: a small integer, so every algorithm's result is exact.
float value_of(int who, int64_t i) { return static_cast<float>((i * 7 + who * 3 + i / 5) % 9 - 4); }

uint32_t to_bits(DType t, float v) {
  if (t == DType::kF32) return f32_bits(v);
  return t == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
}
void store(DType t, std::byte* base, int64_t i, float v) {
  const uint32_t b = to_bits(t, v);
  std::memcpy(base + i * (dtype_bits(t) / 8), &b, dtype_bits(t) / 8);
}
bool equals(DType t, const std::byte* base, int64_t i, float v) {
  uint32_t b = 0;
  std::memcpy(&b, base + i * (dtype_bits(t) / 8), dtype_bits(t) / 8);
  return b == to_bits(t, v);
}

double busbw_factor(CollOp op, int p) {
  switch (op) {
    case CollOp::kAllReduce: return 2.0 * (p - 1) / p;
    case CollOp::kAllGather:
    case CollOp::kReduceScatter:
    case CollOp::kAllToAll: return (p - 1.0) / p;
    default: return 1.0;
  }
}

// Elements per call argument: the vector for all-reduce / broadcast, per rank otherwise.
int64_t count_arg(CollOp op, int64_t size, int p, size_t es) {
  const int64_t total = size / static_cast<int64_t>(es);
  return (op == CollOp::kAllReduce || op == CollOp::kBroadcast) ? total : total / p;
}
// The size the collectives resolve `auto` with for `count` (count_arg): the nccl-tests size of
// the call, which is below the bench's size when p does not divide it.
int64_t auto_key_bytes(CollOp op, int64_t count, int p, size_t es) {
  const int64_t n = count * static_cast<int64_t>(es);
  return (op == CollOp::kAllReduce || op == CollOp::kBroadcast) ? n : n * p;
}
// Most `auto` calls the warm-up makes for the probe to pin (auto_probe.h: probe_calls).
constexpr int kMaxProbeWarmupCalls = 4 * comm::probe_calls(comm::kProbeMaxCandidates);

Status call(Communicator& c, CollOp op, Algo algo, const std::byte* send, std::byte* recv,
            int64_t count, DType t, ReduceOp rop) {
  switch (op) {
    case CollOp::kAllReduce: return comm::all_reduce(c, send, recv, count, t, rop, algo);
    case CollOp::kAllGather: return comm::all_gather(c, send, recv, count, t, algo);
    case CollOp::kReduceScatter: return comm::reduce_scatter(c, send, recv, count, t, rop, algo);
    case CollOp::kAllToAll: return comm::all_to_all(c, send, recv, count, t, algo);
    case CollOp::kBroadcast: return comm::broadcast(c, recv, count, t, 0, algo);
    default: return unimplemented("[bench comm] op");
  }
}

// Input pattern for `op` (count as in count_arg); bcast fills the root's buffer.
void fill_inputs(CollOp op, int p, int r, std::byte* send, std::byte* recv, int64_t count, DType t) {
  switch (op) {
    case CollOp::kAllReduce:
    case CollOp::kAllGather:
      for (int64_t i = 0; i < count; ++i) store(t, send, i, value_of(r, i));
      break;
    case CollOp::kReduceScatter:
      for (int64_t i = 0; i < count * p; ++i) store(t, send, i, value_of(r, i));
      break;
    case CollOp::kAllToAll:
      for (int j = 0; j < p; ++j)
        for (int64_t i = 0; i < count; ++i) store(t, send, j * count + i, value_of(r * p + j, i));
      break;
    case CollOp::kBroadcast:
      if (r == 0) for (int64_t i = 0; i < count; ++i) store(t, recv, i, value_of(0, i));
      break;
    default:
      break;
  }
}

float reduce_ref(ReduceOp op, int p, int64_t i) {
  float acc = op == ReduceOp::kMax ? -INFINITY : 0.0f;
  for (int q = 0; q < p; ++q) acc = op == ReduceOp::kMax ? std::max(acc, value_of(q, i)) : acc + value_of(q, i);
  return op == ReduceOp::kAvg ? acc / static_cast<float>(p) : acc;
}

int64_t count_wrong(CollOp op, int p, int r, const std::byte* recv, int64_t count, DType t,
                    ReduceOp rop) {
  int64_t wrong = 0;
  switch (op) {
    case CollOp::kAllReduce:
      for (int64_t i = 0; i < count; ++i) wrong += !equals(t, recv, i, reduce_ref(rop, p, i));
      break;
    case CollOp::kAllGather:
      for (int64_t i = 0; i < count * p; ++i) wrong += !equals(t, recv, i, value_of(static_cast<int>(i / count), i % count));
      break;
    case CollOp::kReduceScatter:
      for (int64_t i = 0; i < count; ++i) wrong += !equals(t, recv, i, reduce_ref(rop, p, r * count + i));
      break;
    case CollOp::kAllToAll:
      for (int64_t i = 0; i < count * p; ++i)
        wrong += !equals(t, recv, i, value_of(static_cast<int>(i / count) * p + r, i % count));
      break;
    case CollOp::kBroadcast:
      for (int64_t i = 0; i < count; ++i) wrong += !equals(t, recv, i, value_of(0, i));
      break;
    default:
      break;
  }
  return wrong;
}

double max_over_ranks(Communicator& c, double v) {
  double out = v;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, c.handle());
  return out;
}

// Timing. Every algorithm of `algos` runs in each round, one after the other, each for a
// turn of one untimed warm-up call and then a window of about kWindowSeconds (a call count
// fixed per algorithm, the same on every rank; the slowest rank's mean per timed call is the
// sample), in a shuffled order per round (comm_rounds.h). Short windows and many rounds: on
// this shared 2-core VM the machine state (other jobs; with p > 2, which ranks share a core)
// changes every few milliseconds to seconds, and all algorithms must sample the same states for
// their medians to compare (comm_final.txt: 10 ms windows and 5-7 rounds ranked the same code
// 13% apart).
constexpr double kWindowSeconds = 2e-3;
// The warm-up call of each turn: the first call after another algorithm ran costs up to 3x a
// warm one on this VM (2 MiB all-reduce, p = 2: 1.1 ms against 0.36 ms). Where one call is
// longer than the window (p = 4 all-reduce at 2 MiB: 2.2-2.7 ms a call), every sample used to be
// that cold call alone, and the bench ranked hierarchical above the rabenseifner that `auto`'s
// probe (warm calls only, auto_probe.h) pinned in every launch (auto 0.83 in 2 of 4 launches,
// collectives-2026-11-30-c.txt). Real use, and nccl-tests (warm-up, then many consecutive
// iterations), run the same collective repeatedly, so only the warm calls are timed.
constexpr int kWarmCallsPerTurn = 1;
// Rounds per size: as many as fit in kSizeBudgetSeconds (warm-up calls included), at least
// --reps, at most kMaxRounds.
constexpr double kSizeBudgetSeconds = 0.3;
constexpr int kMaxRounds = 41;

// Seconds per call, [algorithm][round].
std::vector<std::vector<double>> time_collectives(Communicator& c, CollOp op,
                                                  const std::vector<Algo>& algos,
                                                  const std::byte* send, std::byte* recv,
                                                  int64_t count, DType t, ReduceOp rop, int reps) {
  // `auto` first runs its probe to the end (the same calls on every rank), so the rounds time
  // the pinned algorithm, not the probe.
  if (std::find(algos.begin(), algos.end(), Algo::kAuto) != algos.end()) {
    const int64_t key = auto_key_bytes(op, count, c.size(), dtype_bits(t) / 8);
    for (int i = 0; i < kMaxProbeWarmupCalls && comm::auto_choice(c, op, key).probing(); ++i)
      call(c, op, Algo::kAuto, send, recv, count, t, rop).check_ok(__FILE__, __LINE__);
  }
  auto one_call = [&](size_t k) {
    call(c, op, algos[k], send, recv, count, t, rop).check_ok(__FILE__, __LINE__);
  };
  auto slowest = [&](double s) { return max_over_ranks(c, s); };
  auto run = [&](size_t k, int iters) {
    c.barrier();
    const double t0 = now_seconds();
    for (int i = 0; i < iters; ++i) one_call(k);
    return slowest((now_seconds() - t0) / iters);
  };
  // Every algorithm makes the same number of calls per turn, sized on the fastest one: windows
  // of different lengths sample different machine states (and, before the warm-up call, gave
  // the cold first call different weights: auto ran 3x slower than the algorithm it resolved to).
  double fastest = 1e30, sum = 0;
  for (size_t k = 0; k < algos.size(); ++k) {
    run(k, 1);
    const double one = run(k, 2);  // the slowest rank's: every rank derives the same counts
    fastest = std::min(fastest, one);
    sum += one;
  }
  RoundPlan plan;
  plan.warm_calls = kWarmCallsPerTurn;
  plan.timed_calls = static_cast<int>(std::clamp(kWindowSeconds / std::max(fastest, 1e-8), 1.0, 20000.0));
  const double round_s = (plan.timed_calls + plan.warm_calls) * sum;
  plan.rounds = std::clamp(static_cast<int>(kSizeBudgetSeconds / std::max(round_s, 1e-9)),
                           std::max(reps, 1), std::max(reps, kMaxRounds));
  return time_rounds(algos.size(), plan, one_call, [&] { c.barrier(); }, now_seconds, slowest);
}

struct Row {
  int64_t size = 0, count = 0;
  Algo algo = Algo::kMpi, resolved = Algo::kMpi;
  Summary t;
  int rounds = 0;
  double vs_mpi = 0, vs_best = 0;  // paired ratios (see the table loop)
  int64_t wrong = 0;
  comm::AutoChoice choice;  // the auto row: how auto chose
};

// The auto row's note: who pinned it, and the probe's agreed times.
std::string auto_note(const comm::AutoChoice& ch) {
  if (ch.probing())
    return fmt::format("probe (running again after a drift, {} calls in)", ch.calls_done);
  if (ch.source != comm::AutoSource::kProbe)
    return fmt::format("model ({})", ch.why.empty() ? "pinned" : ch.why);
  std::string s = fmt::format("probe, model's pick {}:", comm::algo_name(ch.model_pick));
  for (size_t i = 0; i < ch.candidates.size(); ++i)
    s += fmt::format(" {} {:.1f} us (model {:.1f})", comm::algo_name(ch.candidates[i]),
                     ch.measured_s[i] * 1e6, ch.predicted_s[i] * 1e6);
  if (ch.reprobes > 0) s += fmt::format("; probed again {} time(s) after a drift", ch.reprobes);
  return s;
}

// The ranks' placement (cost_model.h: with more ranks than cores it reorders the algorithms),
// and a warning when the calibration was measured with another one, or when unbound ranks
// share cores (the scheduler then places them anew in every process).
void print_placement_note(const std::string& now, const std::string& calibrated, int p) {
  fmt::print("# placement (CPUs of each rank): {}{}\n", now,
             calibrated.empty() ? "" : fmt::format("; calibrated with: {}", calibrated));
  if (now == "unbound" && p > static_cast<int>(std::thread::hardware_concurrency()))
    fmt::print("# warning: {} unbound ranks on {} CPUs: times and the algorithms' ranking vary "
               "from one process to the next; bind them (mpirun --bind-to core:overload-allowed "
               "--map-by core) for the calibration and for the runs that use it\n",
               p, std::thread::hardware_concurrency());
  if (!calibrated.empty() && now != calibrated)
    fmt::print("# warning: placement differs from the calibration's: `auto` may rank the "
               "algorithms wrongly\n");
}

// One message each way between ranks 0 and 1: alpha + n beta from a fit over 8 B .. 4 MiB.
comm::AlphaBeta ping_pong(Communicator& c, std::byte* buf) {
  std::vector<double> steps, bytes, secs;
  for (int64_t n = 8; n <= (int64_t{4} << 20); n *= 4) {
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const int iters = n < (64 << 10) ? 200 : 20;
      c.barrier();
      const double t0 = now_seconds();
      for (int i = 0; i < iters; ++i) {
        if (c.rank() == 0) {
          c.send(buf, n, 1, 99);
          c.recv(buf, n, 1, 99);
        } else if (c.rank() == 1) {
          c.recv(buf, n, 0, 99);
          c.send(buf, n, 0, 99);
        }
      }
      best = std::min(best, max_over_ranks(c, (now_seconds() - t0) / iters / 2));
    }
    steps.push_back(1);
    bytes.push_back(static_cast<double>(n));
    secs.push_back(best);
  }
  return comm::fit_alpha_beta(steps.data(), bytes.data(), secs.data(), static_cast<int>(secs.size()));
}

double reduction_gamma() {
  const size_t n = size_t{2} << 20;  // 8 MiB of f32: past the caches, as in a large all-reduce
  std::vector<float> a(n, 1.0f), b(n, 2.0f);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now_seconds();
    comm::combine(DType::kF32, ReduceOp::kSum, a.data(), a.data(), b.data(), n);
    best = std::min(best, now_seconds() - t0);
  }
  return best / (n * 4.0);
}

// The bench's sizes: 8 B, 32 B, ... by factors of 4 up to max_bytes, and max_bytes itself.
std::vector<int64_t> bench_sizes(int64_t min_bytes, int64_t max_bytes) {
  std::vector<int64_t> sizes;
  for (int64_t s = 8; s <= max_bytes; s *= 4)
    if (s >= min_bytes) sizes.push_back(s);
  if (sizes.empty() || sizes.back() != max_bytes) sizes.push_back(max_bytes);
  return sizes;
}

// Calibration: for each op, every kiln algorithm at every bench size, interleaved in one
// timing loop per size (the noise hits them alike), median of at least 5 repetitions, in
// kCalibrationPasses sweeps; then a piecewise alpha-beta fit per algorithm (cost_model.h)
// through the medians.
constexpr int kCalibrationPasses = 3;
int calibrate(Communicator& c, const CommBenchOptions& opt, std::byte* send, std::byte* recv) {
  const int p = c.size();
  comm::AlphaBetaTable table;
  if (p >= 2) table.link = ping_pong(c, recv);
  table.gamma_s_per_byte = reduction_gamma();
  table.gamma_s_per_byte = max_over_ranks(c, table.gamma_s_per_byte);
  table.fitted_p = p;
  table.hier_ranks_per_node = c.hierarchical_node_size();
  table.placement = comm::rank_placement(c);
  const int reps = std::max(opt.reps, 5);
  std::vector<int64_t> sizes = bench_sizes(8, opt.max_bytes);
  if (static_cast<int>(sizes.size()) > comm::PiecewiseAlphaBeta::kMaxKnots)
    sizes.resize(comm::PiecewiseAlphaBeta::kMaxKnots);
  if (c.rank() == 0)
    fmt::print("# calibrate, p = {}: ping-pong alpha = {:.2f} us, beta = {:.4f} ns/B ({:.2f} GB/s); "
               "reduction gamma = {:.4f} ns/B ({:.2f} GB/s); hierarchical node size {}; "
               "{} passes of at least {} interleaved rounds per size, paired times\n"
               "# per algorithm: alpha (us/step), then beta (ns/B of the bandwidth term) at "
               "32 KiB, 512 KiB, 8 MiB and the largest size\n",
               p, table.link.alpha_s * 1e6, table.link.beta_s_per_byte * 1e9,
               1e-9 / table.link.beta_s_per_byte, table.gamma_s_per_byte * 1e9,
               1e-9 / table.gamma_s_per_byte, table.hier_ranks_per_node, kCalibrationPasses, reps);
  if (c.rank() == 0) print_placement_note(table.placement, "", p);
  // This launch's paired times, stored in the cache (the last kMaxPooledLaunches of this
  // placement); with --pool the fits go through the per-size medians over those launches.
  comm::CalibrationLaunch launch;
  launch.placement = table.placement;
  launch.hier_ranks_per_node = table.hier_ranks_per_node;
  std::vector<comm::CalibrationLaunch> launches;
  int num_pooled = 1;
  if (c.rank() == 0)
    launches = comm::read_calibration_launches(comm::calibration_path(), p);
  for (int o = 0; o < comm::kNumCollOps && p >= 2; ++o) {
    const auto op = static_cast<CollOp>(o);
    std::vector<Algo> algos;
    for (const comm::AlgoInfo& info : comm::kAlgoInfos) {
      if (info.algo == Algo::kAuto || info.algo == Algo::kMpi || !comm::algo_implements(info.algo, op))
        continue;
      if (info.algo == Algo::kHierarchical && table.hier_ranks_per_node == 0) continue;
      algos.push_back(info.algo);
    }
    // MPI's own collective runs in the same loop, last, as in `--algo all` (not fitted): the
    // algorithms are then timed amid the same cache and scheduling state as in the bench.
    std::vector<Algo> timed = algos;
    timed.push_back(Algo::kMpi);
    // Per algorithm: the knots' sizes, terms and measured seconds.
    std::vector<std::vector<double>> ks(algos.size()), steps(algos.size()), bw(algos.size()),
        secs(algos.size());
    // kCalibrationPasses sweeps over the sizes (the machine's state drifts over minutes too:
    // other jobs, page cache, frequency); the rounds of all passes are pooled and each
    // algorithm's time is its paired time (cost_model.h): the reference algorithm's median
    // times the median ratio to it within a round, so the ranking that `auto` follows comes
    // from comparisons made in the same machine state.
    std::vector<std::vector<std::vector<double>>> pooled(
        sizes.size(), std::vector<std::vector<double>>(algos.size()));
    for (int pass = 0; pass < kCalibrationPasses; ++pass)
      for (size_t si = 0; si < sizes.size(); ++si) {
        const int64_t count = count_arg(op, sizes[si], p, 4);
        if (count == 0) continue;
        fill_inputs(op, p, c.rank(), send, recv, count, DType::kF32);
        const std::vector<std::vector<double>> t =
            time_collectives(c, op, timed, send, recv, count, DType::kF32, ReduceOp::kSum, reps);
        for (size_t k = 0; k < algos.size(); ++k)
          pooled[si][k].insert(pooled[si][k].end(), t[k].begin(), t[k].end());
      }
    for (size_t si = 0; si < sizes.size(); ++si) {
      const int64_t size = sizes[si];
      if (pooled[si][0].empty()) continue;
      const std::vector<double> paired = comm::paired_times(pooled[si]);
      for (size_t k = 0; k < algos.size(); ++k) {
        const comm::AlgoCost terms = comm::algo_cost(op, algos[k], p, static_cast<double>(size),
                                                     table.hier_ranks_per_node);
        ks[k].push_back(static_cast<double>(size));
        steps[k].push_back(terms.steps);
        bw[k].push_back(terms.bw_bytes);
        secs[k].push_back(paired[k]);
        launch.times[o][static_cast<int>(algos[k])].emplace_back(static_cast<double>(size), paired[k]);
      }
    }
    for (size_t k = 0; k < algos.size(); ++k) {
      if (ks[k].empty()) continue;
      const comm::PiecewiseAlphaBeta f = comm::fit_piecewise(
          ks[k].data(), steps[k].data(), bw[k].data(), secs[k].data(), static_cast<int>(ks[k].size()));
      table.fit_of(op, algos[k]) = f;
      if (c.rank() != 0 || opt.pool) continue;
      std::string betas;
      for (double at : {32.0 * 1024, 512.0 * 1024, 8.0 * 1024 * 1024, ks[k].back()})
        betas += fmt::format(" {:8.4f}", f.at(at).beta_s_per_byte * 1e9);
      fmt::print("#   {:<13} {:<19} alpha = {:6.2f} us/step  beta(ns/B) ={}\n", comm::coll_op_name(op),
                 comm::algo_name(algos[k]), f.knots[0].ab.alpha_s * 1e6, betas);
    }
  }
  if (c.rank() == 0 && p >= 2) {
    launches = comm::pool_launches(launches, launch);
    num_pooled = static_cast<int>(launches.size());
  }
  if (c.rank() == 0 && opt.pool && p >= 2) {
    // Only rank 0 saves the table; the others load it back below.
    fmt::print("# pooled: per-size median over {} launch(es) at p = {}, placement {}\n", num_pooled,
               p, table.placement);
    for (int o = 0; o < comm::kNumCollOps; ++o)
      for (int a = 0; a < comm::kNumAlgos; ++a) {
        if (launch.times[o][a].empty()) continue;
        const auto op = static_cast<CollOp>(o);
        const comm::PiecewiseAlphaBeta f = comm::fit_pooled(launches, op, static_cast<Algo>(a), p);
        table.fits[o][a] = f;
        std::string betas;
        for (double at : {32.0 * 1024, 512.0 * 1024, 8.0 * 1024 * 1024, launch.times[o][a].back().first})
          betas += fmt::format(" {:8.4f}", f.at(at).beta_s_per_byte * 1e9);
        fmt::print("#   {:<13} {:<19} alpha = {:6.2f} us/step  beta(ns/B) ={}\n", comm::coll_op_name(op),
                   comm::algo_name(static_cast<Algo>(a)), f.knots[0].ab.alpha_s * 1e6, betas);
      }
  }
  int rc = 0;
  if (c.rank() == 0) {
    const std::string path = comm::calibration_path();
    const Status st = comm::save_cost_table(table, path, launches);
    if (!st.ok()) {
      fmt::print(stderr, "kiln bench comm: {}\n", st.to_string());
      rc = 1;
    } else {
      fmt::print("# saved to {}\n", path);
    }
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, c.handle());
  if (rc == 0) c.set_cost_table(comm::load_cost_table(c));
  return rc;
}

}  // namespace

int run_comm_bench(const CommBenchOptions& opt) {
  comm::init();
  int rc = 0;
  {
    Communicator& c = Communicator::world();
    const int p = c.size(), r = c.rank();
    auto fail = [&](const std::string& msg) {
      if (r == 0) fmt::print(stderr, "kiln bench comm: {}\n", msg);
      return 2;
    };
    const auto op = comm::parse_coll_op(opt.op);
    const auto dtype = parse_dtype(opt.dtype);
    const auto rop = comm::parse_reduce_op(opt.redop);
    if (!op) rc = fail("unknown --op " + opt.op);
    else if (!dtype || !comm::is_collective_dtype(*dtype)) rc = fail("--dtype must be f32, bf16 or f16");
    else if (!rop) rc = fail("--redop must be sum, avg or max");
    else if (opt.min_bytes < 1 || opt.max_bytes < opt.min_bytes) rc = fail("need 1 <= --min-bytes <= --max-bytes");
    std::vector<Algo> algos;
    if (rc == 0) {
      if (opt.algo == "all") {
        for (const comm::AlgoInfo& a : comm::kAlgoInfos)
          if (a.algo != Algo::kMpi && comm::algo_implements(a.algo, *op)) algos.push_back(a.algo);
      } else {
        const auto a = comm::parse_algo(opt.algo);
        if (!a || !comm::algo_implements(*a, *op)) rc = fail(fmt::format("--algo {} does not implement {}", opt.algo, opt.op));
        else if (*a != Algo::kMpi) algos.push_back(*a);
      }
      algos.push_back(Algo::kMpi);  // the peer, always measured
    }
    c.set_ranks_per_node(opt.ranks_per_node);
    c.set_auto_probe(opt.auto_probe);
    comm::set_pipeline_chunk_override(static_cast<size_t>(opt.chunk_bytes));
    const size_t es = rc == 0 ? dtype_bits(*dtype) / 8 : 4;
    const size_t buf_bytes = static_cast<size_t>(std::max<int64_t>(opt.max_bytes, 64 << 20)) + 64;
    // Allocated and touched once; every algorithm and every size reuses them.
    auto send = std::make_unique_for_overwrite<std::byte[]>(buf_bytes);
    auto recv = std::make_unique_for_overwrite<std::byte[]>(buf_bytes);
    if (rc == 0) {
      std::memset(send.get(), 0, buf_bytes);
      std::memset(recv.get(), 0, buf_bytes);
    }
    if (rc == 0 && opt.calibrate) {
      rc = calibrate(c, opt, send.get(), recv.get());
    } else if (rc == 0) {
      const std::vector<int64_t> sizes = bench_sizes(opt.min_bytes, opt.max_bytes);
      const std::string placement = comm::rank_placement(c);
      const std::string calibrated = c.cost_table().fitted_p == p ? c.cost_table().placement : "";
      if (r == 0 && !opt.json) {
        fmt::print("# kiln bench comm: {} on p = {} ranks, {} {}, out-of-place; time = median over "
                   "interleaved rounds ({}..{} per size, ~{:.0f} ms windows after {} untimed warm-up call per turn; slowest rank); busbw factor "
                   "{:.3f}; peer = MPI's own collective; busbw/mpi and vs_best = MPI's and the best kiln "
                   "algorithm's time / this time, median of the ratios within a round{}\n",
                   opt.op, p, opt.dtype, is_reducing(*op) ? opt.redop : "-", std::max(opt.reps, 1),
                   std::max(opt.reps, kMaxRounds), kWindowSeconds * 1e3, kWarmCallsPerTurn,
                   busbw_factor(*op, p),
                   opt.chunk_bytes > 0 ? fmt::format("; pipeline chunk {} B", comm::pipeline_chunk_override()) : "");
        fmt::print("# auto: {}\n", opt.auto_probe
                                        ? fmt::format("the model's pick, or an in-process probe when runners-up are "
                                                      "predicted within {:.1f}x (>= {} B; --no-auto-probe: model only)",
                                                      comm::kProbeCandidateFactor, comm::kProbeMinBytes)
                                        : std::string("the model's pick only (--no-auto-probe)"));
        if (p > 1) print_placement_note(placement, calibrated, p);
        fmt::print("#{:>11} {:>11} {:>5} {:>5}  {:<24} {:>10} {:>17} {:>8} {:>8} {:>7} {:>9} {:>7}\n", "size", "count",
                   "type", "redop", "algo", "time(us)", "min-max(us)", "algbw", "busbw", "#wrong",
                   "busbw/mpi", "vs_best");
        fmt::print("#{:>11} {:>11} {:>5} {:>5}  {:<24} {:>10} {:>17} {:>8} {:>8} {:>7} {:>9} {:>7}\n", "(B)", "(elements)",
                   "", "", "", "", "", "(GB/s)", "(GB/s)", "", "", "");
      }
      for (int64_t size : sizes) {
        const int64_t count = count_arg(*op, size, p, es);
        if (count == 0) continue;
        fill_inputs(*op, p, r, send.get(), recv.get(), count, *dtype);
        const std::vector<std::vector<double>> rounds =
            time_collectives(c, *op, algos, send.get(), recv.get(), count, *dtype, *rop, opt.reps);
        std::vector<Row> rows;
        for (size_t k = 0; k < algos.size(); ++k) {
          Row row;
          row.size = size;
          row.count = count;
          row.algo = algos[k];
          if (algos[k] == Algo::kAuto) row.choice = comm::auto_choice(c, *op, auto_key_bytes(*op, count, p, es));
          row.resolved = algos[k] == Algo::kAuto ? row.choice.algo : algos[k];
          row.t = summarize(rounds[k]);
          row.rounds = static_cast<int>(rounds[k].size());
          // #wrong: one more call on a poisoned output, checked against the direct computation.
          if (*op != CollOp::kBroadcast || r != 0) {
            const bool per_rank = *op == CollOp::kAllGather || *op == CollOp::kAllToAll;
            std::memset(recv.get(), 0xff, count * es * (per_rank ? p : 1));
          }
          call(c, *op, algos[k], send.get(), recv.get(), count, *dtype, *rop).check_ok(__FILE__, __LINE__);
          int64_t wrong = count_wrong(*op, p, r, recv.get(), count, *dtype, *rop), total = 0;
          MPI_Allreduce(&wrong, &total, 1, MPI_INT64_T, MPI_SUM, c.handle());
          row.wrong = total;
          rows.push_back(row);
        }
        // busbw/mpi and vs_best are paired (median over rounds of the ratio within a round,
        // cost_model.h): MPI's time / this time, and the best named kiln algorithm's (least
        // median; not auto, not mpi) time / this time.
        int best = -1;
        for (size_t k = 0; k < rows.size(); ++k)
          if (rows[k].algo != Algo::kAuto && rows[k].algo != Algo::kMpi &&
              (best < 0 || rows[k].t.median < rows[best].t.median))
            best = static_cast<int>(k);
        for (size_t k = 0; k < rows.size(); ++k) {
          rows[k].vs_mpi = comm::median_ratio(rounds.back(), rounds[k]);
          rows[k].vs_best = best >= 0 ? comm::median_ratio(rounds[best], rounds[k]) : 0.0;
        }
        for (const Row& row : rows) {
          const double algbw = size / row.t.median / 1e9;
          const double busbw = algbw * busbw_factor(*op, p);
          const std::string name = row.algo == Algo::kAuto
                                       ? fmt::format("auto>{}", comm::algo_name(row.resolved))
                                       : std::string(comm::algo_name(row.algo));
          if (row.wrong != 0) rc = 1;
          if (r != 0) continue;
          if (opt.json) {
            nlohmann::json j = {{"op", opt.op}, {"p", p}, {"size", size}, {"count", count},
                                {"type", opt.dtype}, {"redop", is_reducing(*op) ? opt.redop : "none"},
                                {"algo", comm::algo_name(row.algo)}, {"resolved", comm::algo_name(row.resolved)},
                                {"time_us", row.t.median * 1e6}, {"time_us_min", row.t.min * 1e6},
                                {"time_us_max", row.t.max * 1e6}, {"algbw_GBps", algbw},
                                {"busbw_GBps", busbw}, {"wrong", row.wrong},
                                {"busbw_vs_mpi", row.vs_mpi}, {"vs_best", row.vs_best},
                                {"rounds", row.rounds}};
            if (row.algo == Algo::kAuto) {
              j["auto_by"] = comm::auto_source_name(row.choice.source);
              j["model_pick"] = comm::algo_name(row.choice.model_pick);
              if (!row.choice.why.empty()) j["auto_why"] = row.choice.why;
              nlohmann::json probe = nlohmann::json::object();
              for (size_t i = 0; i < row.choice.measured_s.size(); ++i)
                probe[std::string(comm::algo_name(row.choice.candidates[i]))] = row.choice.measured_s[i] * 1e6;
              if (!probe.empty()) j["probe_us"] = probe;
              if (row.choice.reprobes > 0) j["auto_reprobes"] = row.choice.reprobes;
            }
            fmt::print("{}\n", j.dump());
          } else {
            fmt::print("{:>12} {:>11} {:>5} {:>5}  {:<24} {:>10.2f} {:>8.2f}-{:<8.2f} {:>8.3f} {:>8.3f} {:>7} {:>9.2f} {:>7}\n",
                       size, count, opt.dtype, is_reducing(*op) ? opt.redop : "-", name,
                       row.t.median * 1e6, row.t.min * 1e6, row.t.max * 1e6, algbw, busbw,
                       row.wrong, row.vs_mpi,
                       best >= 0 ? fmt::format("{:.2f}", row.vs_best) : std::string("-"));
          }
        }
        for (const Row& row : rows)
          if (r == 0 && !opt.json && row.algo == Algo::kAuto)
            fmt::print("#   auto at {} B pinned by {}\n", size, auto_note(row.choice));
        if (r == 0) std::fflush(stdout);
      }
    }
  }
  comm::finalize();
  return rc;
}

}  // namespace kiln::bench
