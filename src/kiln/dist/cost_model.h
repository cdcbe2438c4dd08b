// The alpha-beta model of the collectives: T = alpha * steps + beta * bytes per rank (+ gamma
// * bytes reduced), the terms of each algorithm, `auto` selection, and the calibration cache
// that `kiln bench comm --calibrate` writes (KILN_COMM_CALIBRATION or ~/.cache/kiln).
#pragma once

#include <array>
#include <string>

#include "kiln/core/status.h"
#include "kiln/dist/types.h"

namespace kiln::dist {

class Communicator;

// The terms of one call. `nbytes` is the nccl-tests size: the all-reduce / broadcast vector,
// the all-gather output, the reduce-scatter input, the all-to-all send buffer.
struct AlgoCost {
  double steps = 0;         // latency term: messages in sequence, each costing alpha
  double bw_bytes = 0;      // bandwidth term: bytes a rank sends in sequence, each costing beta
  double reduce_bytes = 0;  // bytes a rank reduces in sequence, each costing gamma
};
// `ranks_per_node` only matters for the hierarchical algorithm (0: one node).
// Returns all-zero terms for Algo::kAuto / kMpi (not modelled).
AlgoCost algo_cost(CollOp op, Algo algo, int p, double nbytes, int ranks_per_node = 0);

struct AlphaBeta {
  double alpha_s = -1;          // seconds per step (negative: not measured)
  double beta_s_per_byte = -1;  // seconds per byte
  bool valid() const { return alpha_s >= 0 && beta_s_per_byte >= 0; }
};

struct AlphaBetaTable {
  // One message between two ranks (ping-pong fit). The defaults are what this 2-core VM
  // measured with OpenMPI's vader BTL, used until a calibration exists.
  AlphaBeta link{1.0e-6, 1.0 / 8.0e9};
  double gamma_s_per_byte = 1.0 / 12.0e9;  // f32 reduction, bytes of the vector
  // Per (op, algorithm) fits at p = fitted_p: alpha per step, beta per byte of bandwidth term,
  // in two regimes, because on a CPU the time per byte changes once the buffers leave the
  // caches: `fit` for calls below kLargeCallBytes, `fit_large` from it up.
  int fitted_p = 0;
  std::array<std::array<AlphaBeta, kNumAlgos>, kNumCollOps> fit{};
  std::array<std::array<AlphaBeta, kNumAlgos>, kNumCollOps> fit_large{};
  const AlphaBeta& fit_of(CollOp op, Algo a, double nbytes = 0) const {
    const auto& f = nbytes >= kLargeCallBytes ? fit_large : fit;
    return f[static_cast<int>(op)][static_cast<int>(a)];
  }
  // Where the two regimes meet: 2 MiB. On the 2-core Zen 5 VM the per-byte cost of the
  // pipelined algorithms rises from about there (buffers leave the 1 MiB L2 per core); a
  // boundary at 512 KiB let the tree's pipeline-fill term skew its large-call fit.
  static constexpr double kLargeCallBytes = 2.0 * 1024 * 1024;
};

// Predicted seconds of one call: the per-algorithm fit when one exists for this p, else the
// link's alpha and beta with gamma for the reduction.
double predict_seconds(const AlphaBetaTable& t, CollOp op, Algo algo, int p, double nbytes,
                       int ranks_per_node = 0);
// The algorithm with the least predicted time (never kAuto or kMpi; hierarchical only when
// `ranks_per_node` > 0 splits the ranks into more than one node).
Algo select_algo(const AlphaBetaTable& t, CollOp op, int p, double nbytes, int ranks_per_node = 0);

// Weighted least squares for T = alpha * steps + beta * bytes with relative errors (weights
// 1 / T^2), alpha and beta clamped at zero. `n` samples.
AlphaBeta fit_alpha_beta(const double* steps, const double* bytes, const double* seconds, int n);

// The cache file: $KILN_COMM_CALIBRATION, else $HOME/.cache/kiln/comm_calibration.json.
std::string calibration_path();
// Collective: rank 0 reads the file (missing file: defaults) and broadcasts, so every rank
// makes the same `auto` choice. Fits recorded for other p are ignored.
AlphaBetaTable load_cost_table(Communicator& comm);
// Rank 0 only: writes `t` into the file, keeping fits recorded for other p.
Status save_cost_table(const AlphaBetaTable& t, const std::string& path);

}  // namespace kiln::dist
