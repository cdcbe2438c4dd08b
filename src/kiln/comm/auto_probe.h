// `auto` with an in-process probe: when the alpha-beta model's best algorithm for a call size
// has close runners-up, the first calls at that size run each candidate in turn, time them,
// agree on the times across ranks (MPI_Allreduce MAX) and pin the fastest for the
// communicator's life. Written for per-process "slow states" that reorder the algorithms.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/comm/communicator.h"
#include "kiln/comm/types.h"

namespace kiln::comm {

// Tuning constants, measured on the 2-core AMD EPYC (Zen 4) VM with OpenMPI's vader BTL
// (docs/results/collectives-2026-11-30-b.txt, -c.txt):
// A runner-up is probed when its predicted time is at most this factor of the model's best.
// The pooled calibration put the pairs that a slow-state process reorders 1.00x (512 KiB
// all-reduce ring vs recursive doubling) to 1.34x (2 MiB) apart in session 3, and 1.33x (p = 4,
// 2 MiB) to 1.54x (p = 2, 8 MiB: recursive doubling 2.3 ms against ring/rabenseifner moving
// between 1.7 and 3.5 ms) in session 4, while the measured reversals were up to 2.6x. 2.0 covers
// them with margin; it also takes in ring vs recursive doubling at small sizes (2(p-1) vs lg p
// steps, 2x at p = 2), which costs only a few cheap calls once per size.
inline constexpr double kProbeCandidateFactor = 2.0;
// At most this many candidates: every algorithm of the op within the factor (all-reduce has
// five). A cap of 3 left recursive doubling out at p = 4, 2 MiB all-reduce (predicted 1.33x of
// the pick, behind double binary tree at 1.32x), where in 3 of 5 launches of session 4 a slow
// process state made the ring-based algorithms 2.5x slower while recursive doubling kept its
// time (1.5-1.9 ms) and won by 1.3-1.4x.
inline constexpr int kProbeMaxCandidates = 5;
// Below this call size `auto` keeps the model's pick at once: calls of a few microseconds,
// where a few samples are within the timer's and the scheduler's noise, and where the
// pooled-calibration runs of -b.txt measured the model's pick within 0.97-1.00 of the best.
inline constexpr int64_t kProbeMinBytes = 4096;
// Each candidate runs in blocks of kProbeBlock consecutive calls; the first call after a
// switch of algorithm costs up to 3x a warm one here (2 MiB all-reduce, p = 2: 1.1 ms against
// 0.36 ms), so only the last kProbeKeep calls of a block are timed, as one window that starts
// at a barrier, the bench's way. A rank's own time per call, without the barrier, counts the
// skew the previous call left between the ranks, and it ranked the algorithms differently
// from the bench: p = 4, 2 MiB broadcast, binomial tree 2.4-2.8 ms per call in the probe
// against 1.6-1.7 in the bench, so the probe pinned the 20% slower chain in 6 of 10 size-runs
// at 512 KiB and 2 MiB; with windows, 0 of 10 (docs/results/collectives-2026-12-01-b.txt).
// kProbeRounds passes over the candidates, the first kProbeWarmRounds untimed, give each
// (kProbeRounds - kProbeWarmRounds) window samples taken at different moments: 4 rounds of
// blocks of 4, one of them warm-up, give each candidate 3 windows of 3 calls for 16 calls,
// once per size.
inline constexpr int kProbeBlock = 4;
inline constexpr int kProbeKeep = 3;
inline constexpr int kProbeRounds = 4;
// The first kProbeWarmRounds rounds are run but not timed: the first calls of the ring family
// at a new size are slower than later ones (p = 2, 8 MiB all-reduce: 2.7-3.1 ms in the probe's
// timed calls against bench medians of 2.1-2.5 ms later in the same process), which had pinned
// recursive doubling there; with the warm-up round it pinned rabenseifner in 2 of 3 launches
// (-c.txt, series E).
inline constexpr int kProbeWarmRounds = 1;
// The probe pins another candidate only when it beat the model's pick by more than this
// fraction; within it the model's pick stays (noise; keeping it costs < 5%, inside the 10%
// target of issue 6).
inline constexpr double kProbeTieTolerance = 0.05;
// After the probe pins, `auto` keeps timing the pinned algorithm at that key. Every
// watch-window calls the ranks agree (MPI_Allreduce MAX) on the median of the window; the
// first window after a pin is the reference (per call, no barrier: not the probe's windows),
// and when a later one is more than kDriftFactor slower or faster, the probe runs again:
// the VM moves between states that reorder the algorithms (docs/results/collectives-2026-12-01.txt:
// 8 KiB all-reduce at p = 2, rabenseifner 2.4-2.8 us and recursive doubling 4.1-4.9 in one
// state, 5.7-7.2 and 5.7-6.3 in the other), and a pin taken in one state misses in the other.
// The watch costs two clock reads and a hash lookup per call (not measured alone) and one 8-byte
// all-reduce per window (~2-3 us at p = 2: ~1% of 64 calls of 5 us, the smallest calls probed);
// each re-probe doubles the window, up to kWatchMaxWindow, so a state that keeps flipping costs a
// few probes per thousand calls at most.
inline constexpr int kWatchWindow = 64;
inline constexpr int kWatchMaxWindow = 1024;
inline constexpr double kDriftFactor = 1.5;
// Calls at one key until the probe pins, for `num_candidates` candidates.
constexpr int probe_calls(int num_candidates) { return kProbeRounds * num_candidates * kProbeBlock; }

enum class AutoSource : uint8_t {
  kModel,    // the model's pick, pinned at once (no close runner-up, small call, probe off, p < 2)
  kProbing,  // the probe runs: the next call runs `algo`, one of the candidates
  kProbe,    // pinned by the probe (possibly the model's pick, confirmed)
};
std::string_view auto_source_name(AutoSource s);

// What `auto` does at one (op, total bytes) key of a communicator; the same on every rank.
struct AutoChoice {
  Algo algo = Algo::kAuto;        // the algorithm the next call at this key runs
  Algo model_pick = Algo::kAuto;  // the alpha-beta model's least predicted time
  AutoSource source = AutoSource::kModel;
  std::string_view why;           // for kModel: why there was no probe
  std::vector<Algo> candidates;   // the probed candidates, model's pick first (empty: none)
  std::vector<double> predicted_s;  // the model's seconds per candidate
  std::vector<double> measured_s;   // after the probe: per candidate, max over ranks of each
                                    // rank's median window time per call (seconds)
  int calls_done = 0;             // probe calls made so far at this key
  int reprobes = 0;               // probes run again after a drift of the pinned algorithm
  bool probing() const { return source == AutoSource::kProbing; }
};

// Test hook: when set, the probe records hook(op, algo, measured seconds) as the time per call
// of a probe window, and the watch as a watched call's time, instead of the measured seconds
// (fake per-rank, per-algorithm costs). Per communicator; an empty function restores the clock.
using ProbeCostHook = std::function<double(CollOp, Algo, double)>;

// The probe's state of one communicator (Communicator::auto_probe_state). The pinned choices
// themselves live in Communicator::auto_cache (the hot path: one hash lookup per call).
struct AutoProbeState {
  struct Entry {
    Algo model_pick = Algo::kAuto;
    std::vector<Algo> candidates;
    std::vector<double> predicted_s;
    std::vector<std::vector<double>> samples;  // this rank's window times, per candidate
    std::vector<double> measured_s;            // agreed, after the last probe call
    int calls_done = 0;
    bool done = false;
    double window_t0 = 0;  // the start of the timed window under way (after its barrier)
    // After the pin: the watch's reference (the agreed median of the first window; 0 until
    // then), this rank's times of the calls since the last check, the current window and how
    // often the probe ran again.
    double watch_ref_s = 0;
    std::vector<double> watch;
    int window = kWatchWindow;
    int reprobes = 0;
  };
  ProbeCostHook cost_hook;
  // Keys under probe and keys the probe pinned (kept for auto_choice's report and the watch);
  // the model's immediate picks are not here.
  std::unordered_map<uint64_t, Entry> entries;
  // Keys the model pinned at once, with the reason (a static string).
  std::unordered_map<uint64_t, std::string_view> model_why;
};

void set_auto_probe_cost_hook(Communicator& comm, ProbeCostHook hook);

namespace detail {

// One `auto` call: resolved before the algorithm runs, finished after it (collectives.cpp).
struct AutoTicket {
  Algo algo = Algo::kAuto;
  uint64_t key = 0;
  bool probe = false;  // a probe call: auto_finish records its time and advances the probe
  bool watch = false;  // a call of an algorithm the probe pinned: auto_finish times it
  double t0 = 0;       // a watched call's start
};
// Communicator::auto_cache values: the algorithm, with kWatchedBit set when the probe pinned it.
inline constexpr uint8_t kWatchedBit = 0x80;
inline Algo cached_algo(uint8_t v) { return static_cast<Algo>(v & ~kWatchedBit); }
inline uint64_t auto_key(CollOp op, int64_t nbytes_total) {
  return static_cast<uint64_t>(nbytes_total) * kNumCollOps + static_cast<int>(op);
}
// The probe's and the watch's clock, in seconds.
inline double auto_clock() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
// A key not pinned yet: decides it, or runs the probe's next call (auto_probe.cpp); before
// the first timed call of a probe block every rank passes a barrier (collective).
AutoTicket auto_begin_unpinned(Communicator& comm, CollOp op, int64_t nbytes_total);
// One `auto` call's start. The hot path, a pinned key, is inline: one hash lookup (and a clock
// read when the watch times the key). Through a call into auto_probe.cpp, `auto` at 8-512 B
// took 1.02-1.06x the time of the same algorithm named directly (p = 2), inline 1.00-1.02x.
inline AutoTicket auto_begin(Communicator& comm, CollOp op, int64_t nbytes_total) {
  const uint64_t key = auto_key(op, nbytes_total);
  const auto& cache = comm.auto_cache();
  auto it = cache.find(key);
  if (it == cache.end()) return auto_begin_unpinned(comm, op, nbytes_total);
  AutoTicket t;
  t.key = key;
  t.algo = cached_algo(it->second);
  if (it->second & kWatchedBit) {
    t.watch = true;
    t.t0 = auto_clock();
  }
  return t;
}
void auto_finish_timed(Communicator& comm, CollOp op, const AutoTicket& t);
// After the call ran: a watched call's time goes to the watch; the last call of a timed probe
// block records the window's time per call, and the last probe call agrees on the times
// across ranks (collective) and pins the winner.
inline void auto_finish(Communicator& comm, CollOp op, const AutoTicket& t) {
  if (t.probe || t.watch) auto_finish_timed(comm, op, t);
}
AutoChoice auto_choice(Communicator& comm, CollOp op, int64_t nbytes_total);

}  // namespace detail
}  // namespace kiln::comm
