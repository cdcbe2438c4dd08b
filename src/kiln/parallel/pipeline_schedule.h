// Pipeline schedules as data (lesson 9): for each rank, the ordered list of actions it runs in
// one training step. Every schedule (GPipe, 1F1B, interleaved 1F1B, zero-bubble ZB-H1) is a
// generator of such lists; one checker proves a list valid; one executor
// (parallel/pipeline.h) runs any valid list; simulate_schedule() times a list with given action
// costs (the ideal timeline `kiln plan pp` draws and the bubble formulas are checked against).
//
// Stages: the model's blocks are cut into ranks · virtual_stages contiguous ranges, the
// virtual stages 0 … S-1 in model order (S = ranks · virtual_stages); virtual stage s runs on
// rank s % ranks (Megatron's interleaving: rank r holds chunks r, r + P, r + 2P, …). Stage 0
// also holds the embedding, stage S-1 the final norm, the head and the loss.
//
// Semantics the checker and the executor share:
//   * kSend* posts a nonblocking send of the stage's output activation (or input gradient) to
//     the rank of the next (previous) stage and never blocks; every send completes by the end
//     of the step.
//   * kRecv* posts a nonblocking receive; the compute action that consumes it waits for it.
//   * Between two stages on the same rank (one rank, or a schedule that places neighbours
//     together) the value passes in memory: no send or receive appears.
//   * A compute action on stage s of micro-batch i needs: kForward: the activation of stage
//     s-1 (received, or computed on this rank earlier); kBackward / kBackwardInput: its own
//     forward earlier on this rank and the gradient of stage s+1 (received, or local); the
//     last stage's backward needs only its forward (the loss); kBackwardWeight: its own
//     kBackwardInput earlier. A micro-batch's activations on a stage are held from its forward
//     until its backward (kBackward) or its weight gradient (kBackwardWeight) has run.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/status.h"

namespace kiln::pipeline {

enum class ActionKind : uint8_t {
  kForward,         // F: forward of the micro-batch through the stage
  kBackward,        // B and W together: input and weight gradients
  kBackwardInput,   // B: the input gradient only (zero-bubble schedules)
  kBackwardWeight,  // W: the weight gradients, from what B left
  kSendActivation,  // the stage's output to stage + 1
  kRecvActivation,  // stage - 1's output, this stage's input
  kSendGrad,        // the stage's input gradient to stage - 1
  kRecvGrad,        // stage + 1's input gradient, this stage's output gradient
};

// "F", "B", "BI", "W", "SA", "RA", "SG", "RG".
std::string_view action_name(ActionKind k);
bool is_compute(ActionKind k);

struct Action {
  ActionKind kind = ActionKind::kForward;
  int micro_batch = 0;  // 0 … M-1
  int stage = 0;        // virtual stage 0 … S-1: the one computing (F/B/BI/W), sending, or receiving
  bool operator==(const Action&) const = default;
};

enum class ScheduleKind : uint8_t { kGpipe, k1F1B, kInterleaved1F1B, kZeroBubbleH1 };

// "gpipe", "1f1b", "interleaved", "zb-h1" (the --schedule names).
std::string_view schedule_name(ScheduleKind k);
Expected<ScheduleKind> parse_schedule(std::string_view name);  // the error lists the names

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int ranks = 1;           // P
  int micro_batches = 1;   // M
  int virtual_stages = 1;  // V: > 1 only for interleaved 1F1B
  int stages() const { return ranks * virtual_stages; }
};

// InvalidArgument naming the value: P >= 1, M >= 1, V >= 1, V > 1 only with interleaved (and
// interleaved needs V >= 2 and M divisible by P, Megatron's rule), and the message tags fit
// (tag_for below stays under 32768, MPI's guaranteed minimum of MPI_TAG_UB).
Status check_schedule_spec(const ScheduleSpec& spec);

struct Schedule {
  ScheduleSpec spec;
  std::vector<std::vector<Action>> ranks;  // (P,) ordered actions
  int rank_of(int stage) const { return stage % spec.ranks; }
};

// The generators. GPipe: all forwards, then all backwards (fill–drain, one flush at the end).
// 1F1B (PipeDream-flush): rank r runs P - r - 1 warm-up forwards, then alternates one forward
// and one backward, then drains; it holds at most P - r micro-batches' activations.
// Interleaved 1F1B: the same over V model chunks per rank (Megatron's order: micro-batches in
// groups of P per chunk). ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): backward
// split into B and W, B first on the critical path, W deferred to fill the bubble, within 1F1B's
// peak activations (its rank 0's min(M, P), which ZB-H1 reaches on every rank: rank r runs its
// W's r micro-batches late). Sends and receives are placed so that the list is deadlock-free:
// each send right after the compute producing it, each receive one compute before the one
// consuming it.
Expected<Schedule> make_schedule(const ScheduleSpec& spec);

// Proves a schedule valid, or says the first thing wrong (naming rank, action and
// micro-batch): every (micro-batch, stage) has exactly one F and either one B or one BI and one
// W, each on the stage's rank; every compute action's dependencies come earlier (see the
// semantics above); every send has exactly one matching receive on the peer and vice versa;
// and running the lists under those semantics finishes (no rank waits forever).
Status check_schedule(const Schedule& s);

// The MPI tag of a send/receive: unique per (kind of value, micro-batch, stage).
int tag_for(const Action& a, const ScheduleSpec& spec);

// ---- timing --------------------------------------------------------------------------------
// Seconds of each compute action of one stage, the same on every stage (an ideal balanced
// pipeline); kBackward costs backward_input + backward_weight. comm: seconds from a send's start
// to the receive's end.
struct ActionCosts {
  double forward = 1, backward_input = 1, backward_weight = 1, comm = 0;
};

struct TimedAction {
  Action action;
  int rank = 0;
  double start = 0, end = 0;  // seconds from the step's start
};

struct ScheduleStats {
  double makespan = 0;         // seconds from the first start to the last end
  double bubble_fraction = 0;  // idle compute time over P · makespan
  std::vector<int> peak_activations;  // (P,) micro-batch activations held at once, per rank
};

// Each rank runs its list in order; an action starts when the rank is free and its inputs are
// there. Returns the compute actions' intervals (sends/receives as zero-length entries).
std::vector<TimedAction> simulate_schedule(const Schedule& s, const ActionCosts& costs);
// The same with each stage's own costs (S entries: a measured pipeline whose stages differ).
std::vector<TimedAction> simulate_schedule(const Schedule& s, const std::vector<ActionCosts>& per_stage);
// From any timeline (simulated or measured): makespan, bubble and peak activations.
ScheduleStats schedule_stats(const Schedule& s, const std::vector<TimedAction>& timeline);
// The textbook bubble fraction: (P - 1) / (M + P - 1) for GPipe and 1F1B, that divided by V
// for interleaved ((P-1)/V over M + (P-1)/V), and for ZB-H1 with costs F, B, W:
// (P - 1)(F + B - W) / (M (F + B + W) + (P - 1)(F + B - W)), which ZB-H1's lists meet from
// M >= P on (with fewer micro-batches the drain has too few W's to fill its bubble).
double bubble_formula(const ScheduleSpec& spec, const ActionCosts& costs);
// The activation bound of each rank's schedule (micro-batch-stages held at once, counted as
// schedule_stats counts them): M for GPipe, min(M, P - r) for 1F1B, min(M, P) for ZB-H1 (1F1B's
// rank 0 bound on every rank: held until W, and rank r defers r W's; no list can reach ZB-H1's
// bubble holding only P - r on rank r), and interleaved's min(M V, Megatron's warm-up count + 1)
// (chunks of a micro-batch, each 1/V of the rank's layers).
std::vector<int> activation_bound(const ScheduleSpec& spec);

// ---- pictures ------------------------------------------------------------------------------
// An SVG: one row per rank, each compute action a box on a real time axis (F, B, BI, W and
// communication waits in distinct colours, the micro-batch number inside when it fits), one
// panel per timeline (e.g. "measured" above "ideal"), each with its bubble fraction in the title.
struct TimelinePanel {
  std::string title;
  std::vector<TimedAction> actions;
  int ranks = 1;
};
std::string timeline_svg(const std::vector<TimelinePanel>& panels, const std::string& title);

// ---- stage split ---------------------------------------------------------------------------
// Blocks per stage (S entries summing to n_layers, each >= 1). `explicit_split` non-empty: it
// is checked (S entries, each >= 1, sum == n_layers; the error names the sum and the layers:
// layers are never dropped silently) and returned. Otherwise a balanced contiguous split that
// minimises the largest stage cost, a block costing block_flops, the first stage also
// embedding_flops, the last also head_flops.
struct StageCosts {
  double block_flops = 1, embedding_flops = 0, head_flops = 0;
};
Expected<std::vector<int>> split_layers(int n_layers, int stages, const std::vector<int>& explicit_split,
                                        const StageCosts& costs);

}  // namespace kiln::pipeline
