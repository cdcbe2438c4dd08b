// The profiler: the trace recorder's events (core/trace.h) of every MPI rank merged into one
// Chrome/Perfetto trace with the clocks aligned, read back, and summarized like torch.profiler's
// key_averages: per op calls, self time, % of step, GFLOP/s, GB/s and its place on the
// measured roofline; MFU and HFU from the FLOPs of the kernels that ran beside the analytic
// 6·N·tokens figure; per-rank exposed communication; a straggler report.
//
// File format: {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}, "ph": "X"
// complete events (ts and dur in µs, to the ns) with pid = rank and tid = the recorder's thread
// id, "M" metadata events naming each process "rank R" and each thread. Kernel events carry
// args flops, bytes, shape, dtype; comm events op, algo, bytes, peers (world ranks).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/perf/roofline.h"

namespace kiln {
struct ModelConfig;
struct TrainOptions;
}  // namespace kiln
namespace kiln::comm {
class Communicator;
}

namespace kiln::perf {

// One event of a profile, times in ns on rank 0's clock.
struct ProfileEvent {
  std::string name, cat;
  int pid = 0, tid = 0;  // rank, thread
  int64_t ts_ns = 0, dur_ns = 0;
  double flops = 0, bytes = 0;
  std::vector<int64_t> shape;
  std::string dtype, op, algo, peers;
  std::vector<std::pair<std::string, int64_t>> args;
  int64_t end_ns() const { return ts_ns + dur_ns; }
};

struct ProfileThread {
  int pid = 0, tid = 0;
  std::string name;
};

// A rank's clock against rank 0's: t_rank0 = t_rank − offset_ns, within ± error_ns (half the
// round trip of the best ping-pong round).
struct ClockOffset {
  int rank = 0;
  double offset_ns = 0, error_ns = 0;
};

// What the summary rates the run against, recorded by the run that traced it.
struct ProfileMeta {
  int ranks = 1;
  int threads_per_rank = 1;
  double peak_gflops_per_rank = 0;    // the FMA peak MFU and HFU are against
  double model_flops_per_step = 0;    // analytic, every rank: 6·N_matmul·tokens + 12·L·T·d·tokens
  double attention_flops_per_step = 0;  // its attention part, 12·L·T·d·tokens (full T×T)
  double tokens_per_step = 0;
  std::string description;  // e.g. the model and the command
};

struct Profile {
  std::vector<ProfileEvent> events;
  std::vector<ProfileThread> threads;
  std::vector<ClockOffset> offsets;  // ranks 1.. (rank 0's profile after a merge)
  ProfileMeta meta;
};

// This process's recorded events as rank `rank`'s profile (times on its own clock).
Profile local_profile(int rank);

// Collective over `world` (every rank calls; null or one rank: the local profile): estimates
// each rank's clock offset to rank 0 by ping-pong (`rounds` round trips, the fastest kept),
// gathers every rank's events to rank 0 and shifts them onto rank 0's clock. Rank 0 returns
// the merged profile; the others their own. Call with tracing stopped.
Profile gather_profile(comm::Communicator* world, int rounds = 32);

// The Chrome trace JSON of `p` (ts from the earliest event), and back.
std::string chrome_trace_json(const Profile& p);
Expected<Profile> parse_chrome_trace(std::string_view text);
Status write_chrome_trace(const Profile& p, const std::string& path);  // atomic (temp + rename)
Expected<Profile> read_chrome_trace(const std::string& path);

// The offsets line the merge prints: "clock offsets to rank 0: rank 1 +0.4 µs (± 1.1 µs), ...".
std::string format_offsets(const std::vector<ClockOffset>& offsets);

// ---- the summary -------------------------------------------------------------------------------

// key_averages-like statistics of one event name over every rank.
struct OpStats {
  std::string name, cat;
  int64_t calls = 0;
  double total_ns = 0, self_ns = 0;  // self: minus the events nested in it on its thread
  double flops = 0, bytes = 0;
  double recompute_flops = 0;  // of kernels inside a "recompute" event (activation checkpointing)
  double intensity() const { return bytes > 0 ? flops / bytes : 0; }
  double gflops() const { return self_ns > 0 ? flops / self_ns : 0; }  // FLOP/ns = GFLOP/s
  double gbs() const { return self_ns > 0 ? bytes / self_ns : 0; }
};

// Communication of one rank from its events: the union of its comm events' intervals, and the
// part of it not covered by any kernel event of the same rank (compute).
struct ExposedComm {
  int rank = 0;
  double comm_ns = 0, exposed_ns = 0;
};
std::vector<ExposedComm> exposed_communication(const Profile& p);

// Per-rank step times ("step" events of the trainer) and the rank and op that hold the others up.
struct RankSteps {
  int rank = 0;
  std::vector<double> step_ns;
  double median_ns = 0;
};
struct StragglerReport {
  std::vector<RankSteps> ranks;
  int slowest_rank = -1;
  std::string op;               // the op the slowest rank spends the most extra time in
  double op_ns_per_step = 0;    // on the slowest rank
  double others_ns_per_step = 0;  // mean over the other ranks
};
StragglerReport straggler_report(const Profile& p);

struct ProfileSummary {
  std::vector<OpStats> ops;  // by self time, largest first
  int64_t steps = 0;         // per rank
  double step_ns = 0;        // median "step" duration over every rank's steps (0: no steps)
  double span_ns = 0;        // first event to last
  double executed_flops = 0, recompute_flops = 0;  // every kernel on every rank, but evaluation's
  double eval_flops = 0;                            // kernels inside the trainer's "eval" scopes
  double attention_flops = 0, gemm_flops = 0;      // parts of executed_flops
  std::vector<ExposedComm> comm;
  StragglerReport stragglers;
};
ProfileSummary summarize(const Profile& p);

// MFU (model FLOPs executed: the kernels that ran, less recomputation), HFU (every kernel FLOP)
// and the analytic MFU from ProfileMeta, per step against ranks × peak; 0 where unknown.
struct Utilization {
  double mfu = 0, hfu = 0, analytic_mfu = 0;
  std::string explanation;  // one line: why executed and analytic differ
};
Utilization utilization(const ProfileSummary& s, const ProfileMeta& meta);

// The table and reports. `roof` places each kernel (its bound and % of the roof) against the
// compute peak and the DRAM ceiling; an empty roof leaves those columns out.
std::string format_summary(const ProfileSummary& s, const ProfileMeta& meta, const HierarchicalRoofline& roof,
                           int max_rows = 25);

// Every kernel op as a point (intensity, GFLOP/s) under the ceilings of `roof` (log-log SVG).
std::string roofline_svg(const ProfileSummary& s, const HierarchicalRoofline& roof, const std::string& title);

// ---- what the commands call -------------------------------------------------------------------

// This process's threads and FMA peak, for a run that is not a training step (generate, serve).
ProfileMeta run_profile_meta(std::string description);

// The analytic figures of one training step of `c` under `t` (global batch) for ProfileMeta.
ProfileMeta train_profile_meta(const ModelConfig& c, const TrainOptions& t, int ranks, double peak_gflops_per_rank);

// Ends a traced run: stops tracing, merges every rank's events on rank 0 (collective over
// `world`; null: this process alone) and writes `path` there. Returns, on rank 0, the lines to
// print (file, events, clock offsets and their error); elsewhere an empty string.
Expected<std::string> finish_profile(const std::string& path, comm::Communicator* world, const ProfileMeta& meta);

// `kiln profile` and `kiln roofline --profile`: reads a trace, measures this CPU's hierarchical
// roofline on the run's threads per rank, and returns the summary; writes the roofline plot of
// its ops to `svg_path` when given.
Expected<std::string> profile_report(const std::string& trace_path, const std::string& svg_path);

}  // namespace kiln::perf
