// The alpha-beta model of the collectives: T = alpha * steps + beta * bytes per rank (+ gamma
// * bytes reduced), the terms of each algorithm, `auto` selection, and the calibration cache
// that `kiln bench comm --calibrate` writes (KILN_COMM_CALIBRATION or ~/.cache/kiln).
#pragma once

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/comm/types.h"

namespace kiln::comm {

class Communicator;

// The terms of one call. `nbytes` is the nccl-tests size: the all-reduce / broadcast vector,
// the all-gather output, the reduce-scatter input, the all-to-all send buffer.
struct AlgoCost {
  double steps = 0;         // latency term: messages in sequence, each costing alpha
  double bw_bytes = 0;      // bandwidth term: bytes a rank sends in sequence, each costing beta
  double reduce_bytes = 0;  // bytes a rank reduces in sequence, each costing gamma
};
// `ranks_per_node` only matters for the hierarchical algorithm (0 or >= p: one node).
// Returns all-zero terms for Algo::kAuto / kMpi (not modelled) and for an algorithm that does
// not implement op; an algorithm that implements op without terms here aborts (file:line).
AlgoCost algo_cost(CollOp op, Algo algo, int p, double nbytes, int ranks_per_node = 0);

struct AlphaBeta {
  double alpha_s = -1;          // seconds per step (negative: not measured)
  double beta_s_per_byte = -1;  // seconds per byte
  bool valid() const { return alpha_s >= 0 && beta_s_per_byte >= 0; }
};

// One algorithm's calibrated model: (alpha, beta) at each calibration size ("knot", the
// bench's sizes 8 B, 32 B, ... by factors of 4). On a CPU the time per byte is not one
// number: it changes as buffers leave L1, L2 and the LLC, and as OpenMPI switches protocol
// (eager, then single-copy). So beta is fitted per size: between two knots alpha and beta
// are interpolated linearly in log2(size), below the first and above the last the end knot
// holds. The knots are fitted so that the model reproduces every measured time exactly
// (fit_piecewise), hence it ranks algorithms at the calibration sizes as they measured.
struct PiecewiseAlphaBeta {
  static constexpr int kMaxKnots = 16;
  struct Knot {
    double bytes = 0;  // the call size (nccl-tests size) of this knot
    AlphaBeta ab;
  };
  std::array<Knot, kMaxKnots> knots{};
  int num_knots = 0;  // 0: not calibrated
  bool valid() const { return num_knots > 0; }
  // alpha and beta at `nbytes` (interpolated).
  AlphaBeta at(double nbytes) const;
};

// Fits a piecewise model through n >= 1 measurements (sizes ascending, at most kMaxKnots):
// one alpha for the algorithm from the latency-bound sizes (<= 16 KiB; weighted least
// squares, fit_alpha_beta), then at each knot beta = (T - alpha steps) / bw_bytes, with alpha
// lowered to T / steps where the measured time is below alpha * steps (noise), so the model
// reproduces each measured T exactly.
PiecewiseAlphaBeta fit_piecewise(const double* sizes, const double* steps, const double* bw_bytes,
                                 const double* seconds, int n);

struct AlphaBetaTable {
  // One message between two ranks (ping-pong fit). The defaults are what this 2-core VM
  // measured with OpenMPI's vader BTL, used until a calibration exists.
  AlphaBeta link{1.0e-6, 1.0 / 8.0e9};
  double gamma_s_per_byte = 1.0 / 12.0e9;  // f32 reduction, bytes of the vector
  // Per (op, algorithm) piecewise fits at p = fitted_p (the reduction's cost is part of each
  // fitted beta). `hier_ranks_per_node`: the node size the hierarchical fit was measured with.
  int fitted_p = 0;
  int hier_ranks_per_node = 0;
  // describe_placement of the ranks the fits were measured with ("" unknown).
  std::string placement;
  std::array<std::array<PiecewiseAlphaBeta, kNumAlgos>, kNumCollOps> fits{};
  const PiecewiseAlphaBeta& fit_of(CollOp op, Algo a) const {
    return fits[static_cast<int>(op)][static_cast<int>(a)];
  }
  PiecewiseAlphaBeta& fit_of(CollOp op, Algo a) {
    return fits[static_cast<int>(op)][static_cast<int>(a)];
  }
};

// Predicted seconds of one call: the algorithm's piecewise fit when one exists for this p
// (and, for hierarchical, this node size), else the link's alpha and beta with gamma for the
// reduction.
double predict_seconds(const AlphaBetaTable& t, CollOp op, Algo algo, int p, double nbytes,
                       int ranks_per_node = 0);
// The algorithm with the least predicted time (never kAuto or kMpi; hierarchical only when
// `ranks_per_node` splits the ranks into several nodes of more than one rank).
Algo select_algo(const AlphaBetaTable& t, CollOp op, int p, double nbytes, int ranks_per_node = 0);
// Every algorithm select_algo considers, with its predicted seconds, least first (ties keep
// the kAlgoInfos order, so front() is select_algo's pick); the `auto` probe's candidates.
std::vector<std::pair<Algo, double>> rank_algos(const AlphaBetaTable& t, CollOp op, int p,
                                                double nbytes, int ranks_per_node = 0);

// Paired statistics of interleaved timing rounds, for the calibration and the bench:
// rounds[a][r] is algorithm a's time in round r, and within a round every algorithm ran once,
// back to back, so they saw the same machine state (other jobs, the scheduler's placement of
// the ranks, the clock). A state that slows the whole round cancels in a ratio taken inside
// the round, where medians of each algorithm taken apart can rank them by the noise.
// median over r of num[r] / den[r] (num and den of equal, nonzero length).
double median_ratio(const std::vector<double>& num, const std::vector<double>& den);
// Per-algorithm times: the algorithm with the least median time is the reference; every
// algorithm's time is the reference's median times the median of its ratio to the reference
// in the same round (so the reference keeps its median). Every rounds[a] has the same length.
std::vector<double> paired_times(const std::vector<std::vector<double>>& rounds);

// Weighted least squares for T = alpha * steps + beta * bytes with relative errors (weights
// 1 / T^2), alpha and beta clamped at zero. `n` samples.
AlphaBeta fit_alpha_beta(const double* steps, const double* bytes, const double* seconds, int n);

// Where the ranks run, from each rank's allowed CPUs (sched_getaffinity): "0|1|0|1" when rank
// r may run on the CPUs of field r (a field lists several as "0,1"), "unbound" when every
// rank may run on the same several CPUs, "" for no ranks. With more ranks than cores the
// placement decides which ranks share a core, and with it the ranking of the algorithms:
// 2-core VM, p = 4, 32 KiB all-gather: ring 0.78x recursive doubling bound 0|1|0|1, 1.00x
// bound 0|0|1|1 or 0|1|1|0; unbound, the scheduler's placement seems to hold for a process's
// life and varies from one to the next, times 1-4x (docs/results/collectives-2026-11-30-b.txt). So a
// calibration only holds for the placement it was measured with.
std::string describe_placement(const std::vector<std::vector<int>>& cpus_of_rank);
// Collective: every rank's allowed CPUs gathered; the same description on every rank.
std::string rank_placement(Communicator& comm);

// Pooled calibration (`kiln bench comm --calibrate --pool`): one launch's per-size paired
// times, kept in the cache file for the last kMaxPooledLaunches launches of the same p and
// placement. A process at p = 2 runs in a fast or a slow state for its whole life (2-core VM,
// ping-pong alpha 0.17 vs 0.43 us; docs/results/collectives-2026-11-30-b.txt), so one launch's
// calibration can rank algorithms for the other state; the per-size median over launches lets
// no single launch decide.
struct CalibrationLaunch {
  std::string placement;        // describe_placement of the launch's ranks
  int hier_ranks_per_node = 0;  // the node size its hierarchical times were measured with
  // times[op][algo]: (nccl-tests size in bytes, paired seconds) per calibration size, ascending.
  std::array<std::array<std::vector<std::pair<double, double>>, kNumAlgos>, kNumCollOps> times{};
};
constexpr int kMaxPooledLaunches = 3;
// The launches to pool with `now`: the stored ones measured with now's placement and node size,
// oldest first, then `now`, at most kMaxPooledLaunches (the newest).
std::vector<CalibrationLaunch> pool_launches(const std::vector<CalibrationLaunch>& stored,
                                             const CalibrationLaunch& now);
// The piecewise fit of (op, algo) at p through, at each size of the LAST launch, the median of
// the paired times over the launches that measured that size. Invalid when the last launch has
// no times for (op, algo).
PiecewiseAlphaBeta fit_pooled(const std::vector<CalibrationLaunch>& launches, CollOp op, Algo algo,
                              int p);
// Rank 0 only: the launches stored for p in the cache file (oldest first; none when missing).
std::vector<CalibrationLaunch> read_calibration_launches(const std::string& path, int p);

// The cache file: $KILN_COMM_CALIBRATION, else $HOME/.cache/kiln/comm_calibration.json.
std::string calibration_path();
// Collective: rank 0 reads the file (missing file: defaults) and broadcasts, so every rank
// makes the same `auto` choice. Fits recorded for other p are ignored.
AlphaBetaTable load_cost_table(Communicator& comm);
// Rank 0 only: writes `t` into the file, keeping fits recorded for other p; `launches` (if any)
// are stored with the fits at t.fitted_p as "launches" (a key the readers of fits skip).
Status save_cost_table(const AlphaBetaTable& t, const std::string& path,
                       const std::vector<CalibrationLaunch>& launches = {});

}  // namespace kiln::comm
