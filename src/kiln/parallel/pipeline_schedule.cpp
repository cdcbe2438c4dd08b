// Pipeline schedules as data (pipeline_schedule.h): the generators (GPipe, 1F1B, Megatron's
// interleaved 1F1B, ZB-H1), the checker, the list-scheduling simulator with its statistics and
// textbook formulas, the timeline SVG, and the split of the model's blocks into stages.
#include "kiln/parallel/pipeline_schedule.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace kiln::pipeline {
namespace {

// ---- the tables of the two enumerated concepts ------------------------------------------------
struct ActionInfo {
  ActionKind kind;
  std::string_view name;
  bool compute;
};
constexpr ActionInfo kActions[] = {
    {ActionKind::kForward, "F", true},          {ActionKind::kBackward, "B", true},
    {ActionKind::kBackwardInput, "BI", true},   {ActionKind::kBackwardWeight, "W", true},
    {ActionKind::kSendActivation, "SA", false}, {ActionKind::kRecvActivation, "RA", false},
    {ActionKind::kSendGrad, "SG", false},       {ActionKind::kRecvGrad, "RG", false},
};
constexpr int kNumActionKinds = static_cast<int>(std::size(kActions));
constexpr bool actions_in_enum_order() {
  for (int i = 0; i < kNumActionKinds; ++i)
    if (static_cast<int>(kActions[i].kind) != i) return false;
  return true;
}
static_assert(kNumActionKinds == static_cast<int>(ActionKind::kRecvGrad) + 1, "one row per ActionKind");
static_assert(actions_in_enum_order(), "kActions rows in ActionKind order");

struct ScheduleInfo {
  ScheduleKind kind;
  std::string_view name;
};
constexpr ScheduleInfo kSchedules[] = {
    {ScheduleKind::kGpipe, "gpipe"},
    {ScheduleKind::k1F1B, "1f1b"},
    {ScheduleKind::kInterleaved1F1B, "interleaved"},
    {ScheduleKind::kZeroBubbleH1, "zb-h1"},
};
constexpr bool schedules_in_enum_order() {
  for (size_t i = 0; i < std::size(kSchedules); ++i)
    if (static_cast<size_t>(kSchedules[i].kind) != i) return false;
  return true;
}
static_assert(std::size(kSchedules) == static_cast<size_t>(ScheduleKind::kZeroBubbleH1) + 1,
              "one row per ScheduleKind");
static_assert(schedules_in_enum_order(), "kSchedules rows in ScheduleKind order");

int kind_index(ActionKind k) { return static_cast<int>(k); }

// MPI guarantees tags up to 32767 (MPI_TAG_UB >= 32767); tag_for uses 2 · M · S of them.
constexpr int64_t kMaxTags = 32768;

// "F mb 3 stage 1": how every message names an action.
std::string describe(const Action& a) {
  return fmt::format("{} mb {} stage {}", action_name(a.kind), a.micro_batch, a.stage);
}

// ---- generators ------------------------------------------------------------------------------
// How many compute actions ahead of its consumer a receive is posted: one, so the message can
// arrive while the rank computes the action before (Megatron posts the next receive beside the
// current send the same way). Receives never block, so this cannot deadlock.
constexpr int kReceiveLookahead = 1;

// The receive a compute action consumes, if its input comes from another rank.
bool receive_of(const Action& c, const ScheduleSpec& spec, Action* recv) {
  const int S = spec.stages(), P = spec.ranks;
  const auto remote = [&](int other) { return other >= 0 && other < S && other % P != c.stage % P; };
  if (c.kind == ActionKind::kForward && remote(c.stage - 1)) {
    *recv = {ActionKind::kRecvActivation, c.micro_batch, c.stage};
    return true;
  }
  if ((c.kind == ActionKind::kBackward || c.kind == ActionKind::kBackwardInput) && remote(c.stage + 1)) {
    *recv = {ActionKind::kRecvGrad, c.micro_batch, c.stage};
    return true;
  }
  return false;
}

// The send a compute action's output needs, if its consumer is on another rank.
bool send_of(const Action& c, const ScheduleSpec& spec, Action* send) {
  const int S = spec.stages(), P = spec.ranks;
  const auto remote = [&](int other) { return other >= 0 && other < S && other % P != c.stage % P; };
  if (c.kind == ActionKind::kForward && remote(c.stage + 1)) {
    *send = {ActionKind::kSendActivation, c.micro_batch, c.stage};
    return true;
  }
  if ((c.kind == ActionKind::kBackward || c.kind == ActionKind::kBackwardInput) && remote(c.stage - 1)) {
    *send = {ActionKind::kSendGrad, c.micro_batch, c.stage};
    return true;
  }
  return false;
}

// One rank's compute order with its communication added: each send right after the compute
// that produces it, each receive kReceiveLookahead computes before the one that consumes it.
std::vector<Action> with_communication(const std::vector<Action>& computes, const ScheduleSpec& spec) {
  std::vector<Action> out;
  const int n = static_cast<int>(computes.size());
  int next_receive = 0;  // the first compute whose receive is not posted yet
  for (int j = 0; j < n; ++j) {
    for (; next_receive < n && next_receive <= j + kReceiveLookahead; ++next_receive) {
      Action r;
      if (receive_of(computes[next_receive], spec, &r)) out.push_back(r);
    }
    out.push_back(computes[j]);
    Action s;
    if (send_of(computes[j], spec, &s)) out.push_back(s);
  }
  return out;
}

// GPipe: every forward, then every backward, in micro-batch order.
std::vector<Action> gpipe_rank(const ScheduleSpec& spec, int r) {
  std::vector<Action> c;
  for (int i = 0; i < spec.micro_batches; ++i) c.push_back({ActionKind::kForward, i, r});
  for (int i = 0; i < spec.micro_batches; ++i) c.push_back({ActionKind::kBackward, i, r});
  return c;
}

// 1F1B (PipeDream-flush): P - r - 1 warm-up forwards, then one forward and one backward at a
// time, then the remaining backwards.
std::vector<Action> one_f_one_b_rank(const ScheduleSpec& spec, int r) {
  const int M = spec.micro_batches, warmup = std::min(spec.ranks - r - 1, M);
  std::vector<Action> c;
  for (int i = 0; i < warmup; ++i) c.push_back({ActionKind::kForward, i, r});
  for (int i = 0; i < M; ++i) {
    if (warmup + i < M) c.push_back({ActionKind::kForward, warmup + i, r});
    c.push_back({ActionKind::kBackward, i, r});
  }
  return c;
}

// Megatron-LM's warm-up count of interleaved 1F1B: all M · V forwards when M == P, else
// 2 (P - r - 1) + (V - 1) P, at most M · V.
int interleaved_warmup(const ScheduleSpec& spec, int r) {
  const int P = spec.ranks, M = spec.micro_batches, V = spec.virtual_stages, total = M * V;
  if (M == P) return total;
  return std::min(total, 2 * (P - r - 1) + (V - 1) * P);
}

// The k-th forward (or backward) of rank r in Megatron's interleaved order: micro-batches go in
// groups of P through chunk 0, then the same group through chunk 1, …; backwards run the chunks
// in reverse. Chunk c of rank r is virtual stage c · P + r.
Action interleaved_action(const ScheduleSpec& spec, int r, int k, bool forward) {
  const int P = spec.ranks, V = spec.virtual_stages;
  const int group = k / (P * V), in_group = k % (P * V);
  int chunk = in_group / P;
  if (!forward) chunk = V - 1 - chunk;
  const int mb = group * P + in_group % P;
  return {forward ? ActionKind::kForward : ActionKind::kBackward, mb, chunk * P + r};
}

std::vector<Action> interleaved_rank(const ScheduleSpec& spec, int r) {
  const int total = spec.micro_batches * spec.virtual_stages, warmup = interleaved_warmup(spec, r);
  std::vector<Action> c;
  for (int k = 0; k < warmup; ++k) c.push_back(interleaved_action(spec, r, k, true));
  for (int k = 0; k < total - warmup; ++k) {
    c.push_back(interleaved_action(spec, r, warmup + k, true));
    c.push_back(interleaved_action(spec, r, k, false));
  }
  for (int k = total - warmup; k < total; ++k) c.push_back(interleaved_action(spec, r, k, false));
  return c;
}

// ZB-H1: 1F1B's order with each backward split into B (kBackwardInput, on the critical path:
// its gradient is sent before any W) and W (kBackwardWeight). Rank r runs its W's r micro-batches
// late: the last rank, whose drain waits longest for the gradients of the ranks before it,
// keeps the most W's to fill that wait; rank 0, which finishes last, keeps none. Every rank
// then holds min(M, P) micro-batches' activations at most (1F1B's peak, that of its rank 0).
std::vector<Action> zb_h1_rank(const ScheduleSpec& spec, int r) {
  const int M = spec.micro_batches, warmup = std::min(spec.ranks - r - 1, M), delay = r;
  std::vector<Action> c;
  for (int i = 0; i < warmup; ++i) c.push_back({ActionKind::kForward, i, r});
  int next_w = 0;
  for (int i = 0; i < M; ++i) {
    if (warmup + i < M) c.push_back({ActionKind::kForward, warmup + i, r});
    c.push_back({ActionKind::kBackwardInput, i, r});
    if (i >= delay) c.push_back({ActionKind::kBackwardWeight, next_w++, r});
  }
  for (; next_w < M; ++next_w) c.push_back({ActionKind::kBackwardWeight, next_w, r});
  return c;
}

// ---- running the lists under the shared semantics ----------------------------------------------
// Per (action kind, micro-batch, stage): where the action is, and when it ended (NaN: not yet).
struct Slots {
  int M = 0, S = 0;
  std::vector<int> rank, pos;
  std::vector<double> done;
  Slots(int m, int s)
      : M(m), S(s), rank(size_t(kNumActionKinds) * m * s, -1), pos(rank.size(), -1),
        done(rank.size(), std::numeric_limits<double>::quiet_NaN()) {}
  size_t at(ActionKind k, int mb, int stage) const { return (size_t(kind_index(k)) * M + mb) * S + stage; }
  bool in_range(int mb, int stage) const { return mb >= 0 && mb < M && stage >= 0 && stage < S; }
  bool present(ActionKind k, int mb, int stage) const { return in_range(mb, stage) && pos[at(k, mb, stage)] >= 0; }
  // The end time of an action, or NaN when it has not run (or does not exist).
  double end(ActionKind k, int mb, int stage) const {
    return in_range(mb, stage) ? done[at(k, mb, stage)] : std::numeric_limits<double>::quiet_NaN();
  }
};

double cost_of(ActionKind k, const ActionCosts& c) {
  switch (k) {
    case ActionKind::kForward: return c.forward;
    case ActionKind::kBackward: return c.backward_input + c.backward_weight;
    case ActionKind::kBackwardInput: return c.backward_input;
    case ActionKind::kBackwardWeight: return c.backward_weight;
    default: return 0;
  }
}

// What a compute action waits for: the time its inputs are there, or NaN (and what is missing,
// for the deadlock message) while one is not.
double inputs_ready(const Action& a, const Schedule& s, const Slots& slots, const ActionCosts& costs,
                    std::string* missing) {
  const int S = s.spec.stages(), i = a.micro_batch, st = a.stage, r = s.rank_of(st);
  double ready = 0;
  bool ok = true;
  const auto need = [&](double t, const Action& what) {
    if (std::isnan(t)) {
      if (ok && missing) *missing = describe(what) + fmt::format(" of rank {}", s.rank_of(what.stage));
      ok = false;
    } else {
      ready = std::max(ready, t);
    }
  };
  // A value from `producer_stage`: local (its compute's end) or through a send and a receive.
  const auto value = [&](ActionKind compute, ActionKind send, ActionKind recv, int producer_stage) {
    if (s.rank_of(producer_stage) == r) {
      need(slots.end(compute, i, producer_stage), {compute, i, producer_stage});
      return;
    }
    need(slots.end(recv, i, st), {recv, i, st});
    need(slots.end(send, i, producer_stage) + costs.comm, {send, i, producer_stage});
  };
  switch (a.kind) {
    case ActionKind::kForward:
      if (st > 0) value(ActionKind::kForward, ActionKind::kSendActivation, ActionKind::kRecvActivation, st - 1);
      break;
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      need(slots.end(ActionKind::kForward, i, st), {ActionKind::kForward, i, st});
      if (st < S - 1) {
        // The next stage's input gradient: from its B, or its BI when it splits the backward.
        const ActionKind producer = slots.present(ActionKind::kBackwardInput, i, st + 1)
                                        ? ActionKind::kBackwardInput
                                        : ActionKind::kBackward;
        value(producer, ActionKind::kSendGrad, ActionKind::kRecvGrad, st + 1);
      }
      break;
    case ActionKind::kBackwardWeight:
      need(slots.end(ActionKind::kBackwardInput, i, st), {ActionKind::kBackwardInput, i, st});
      break;
    case ActionKind::kSendActivation:
      need(slots.end(ActionKind::kForward, i, st), {ActionKind::kForward, i, st});
      break;
    case ActionKind::kSendGrad: {
      const bool split = slots.present(ActionKind::kBackwardInput, i, st);
      const ActionKind producer = split ? ActionKind::kBackwardInput : ActionKind::kBackward;
      need(slots.end(producer, i, st), {producer, i, st});
      break;
    }
    case ActionKind::kRecvActivation:
    case ActionKind::kRecvGrad:
      break;  // posting a receive waits for nothing
  }
  return ok ? ready : std::numeric_limits<double>::quiet_NaN();
}

// Runs every rank's list in order (list scheduling): an action starts when its rank is free and
// its inputs are there; sends and receives take no time on the rank. Fills `timeline` (in the
// order actions ran) and returns ok, or says which ranks wait forever and on what.
// `per_stage`: one ActionCosts for every stage, or one per stage (S entries).
Status run_lists(const Schedule& s, const std::vector<ActionCosts>& per_stage, std::vector<TimedAction>* timeline) {
  const auto costs_of = [&](int stage) -> const ActionCosts& {
    return per_stage.size() == 1 ? per_stage[0] : per_stage[static_cast<size_t>(stage)];
  };
  const int P = s.spec.ranks;
  Slots slots(s.spec.micro_batches, s.spec.stages());
  for (int r = 0; r < P; ++r)
    for (int p = 0; p < static_cast<int>(s.ranks[r].size()); ++p) {
      const Action& a = s.ranks[r][p];
      if (!slots.in_range(a.micro_batch, a.stage)) continue;
      slots.rank[slots.at(a.kind, a.micro_batch, a.stage)] = r;
      slots.pos[slots.at(a.kind, a.micro_batch, a.stage)] = p;
    }
  std::vector<size_t> next(P, 0);
  std::vector<double> free_at(P, 0);
  size_t left = 0;
  for (const auto& list : s.ranks) left += list.size();
  while (left > 0) {
    bool progressed = false;
    for (int r = 0; r < P; ++r) {
      while (next[r] < s.ranks[r].size()) {
        const Action& a = s.ranks[r][next[r]];
        if (!slots.in_range(a.micro_batch, a.stage)) return invalid_argument("rank {}: {} is out of range", r, describe(a));
        const ActionCosts& costs = costs_of(a.stage);
        const double ready = inputs_ready(a, s, slots, costs, nullptr);
        if (std::isnan(ready)) break;
        TimedAction t{a, r, free_at[r], free_at[r]};
        if (is_compute(a.kind)) {
          t.start = std::max(free_at[r], ready);
          t.end = t.start + cost_of(a.kind, costs);
          free_at[r] = t.end;
        }
        slots.done[slots.at(a.kind, a.micro_batch, a.stage)] = t.end;
        if (timeline) timeline->push_back(t);
        ++next[r];
        --left;
        progressed = true;
      }
    }
    if (progressed) continue;
    std::string waits;
    for (int r = 0; r < P; ++r) {
      if (next[r] >= s.ranks[r].size()) continue;
      const Action& a = s.ranks[r][next[r]];
      std::string missing;
      inputs_ready(a, s, slots, costs_of(a.stage), &missing);
      waits += fmt::format("{}rank {} at #{} ({}) waits for {}", waits.empty() ? "" : "; ", r, next[r], describe(a),
                           missing);
    }
    return invalid_argument("deadlock: no rank can go on: {}", waits);
  }
  return {};
}

// 1 - (compute busy time) / (ranks · makespan), the makespan over every entry.
double bubble_of(const std::vector<TimedAction>& timeline, int ranks, double* makespan_out = nullptr) {
  double first = std::numeric_limits<double>::infinity(), last = -first, busy = 0;
  for (const TimedAction& t : timeline) {
    first = std::min(first, t.start);
    last = std::max(last, t.end);
    if (is_compute(t.action.kind)) busy += t.end - t.start;
  }
  const double makespan = timeline.empty() ? 0 : last - first;
  if (makespan_out) *makespan_out = makespan;
  return makespan > 0 && ranks > 0 ? 1 - busy / (ranks * makespan) : 0;
}

}  // namespace

// ---- names -------------------------------------------------------------------------------------
std::string_view action_name(ActionKind k) { return kActions[kind_index(k)].name; }
bool is_compute(ActionKind k) { return kActions[kind_index(k)].compute; }
std::string_view schedule_name(ScheduleKind k) { return kSchedules[static_cast<size_t>(k)].name; }

Expected<ScheduleKind> parse_schedule(std::string_view name) {
  std::string known;
  for (const ScheduleInfo& s : kSchedules) {
    if (s.name == name) return s.kind;
    known += fmt::format("{}{}", known.empty() ? "" : ", ", s.name);
  }
  return invalid_argument("unknown pipeline schedule '{}' (known: {})", name, known);
}

Status check_schedule_spec(const ScheduleSpec& spec) {
  if (spec.ranks < 1) return invalid_argument("pipeline ranks P = {} must be >= 1", spec.ranks);
  if (spec.micro_batches < 1) return invalid_argument("micro-batches M = {} must be >= 1", spec.micro_batches);
  if (spec.virtual_stages < 1) return invalid_argument("virtual stages V = {} must be >= 1", spec.virtual_stages);
  const bool interleaved = spec.kind == ScheduleKind::kInterleaved1F1B;
  if (!interleaved && spec.virtual_stages != 1)
    return invalid_argument("virtual stages V = {} need the interleaved schedule (got {})", spec.virtual_stages,
                            schedule_name(spec.kind));
  if (interleaved && spec.virtual_stages < 2)
    return invalid_argument("the interleaved schedule needs virtual stages V >= 2 (got {})", spec.virtual_stages);
  if (interleaved && spec.micro_batches % spec.ranks != 0)
    return invalid_argument("the interleaved schedule needs micro-batches M = {} divisible by ranks P = {} "
                            "(Megatron's rule: micro-batches go through each chunk in groups of P)",
                            spec.micro_batches, spec.ranks);
  const int64_t tags = 2 * int64_t{spec.micro_batches} * spec.ranks * spec.virtual_stages;
  if (tags > kMaxTags)
    return invalid_argument("micro-batches M = {} with stages S = {} need 2 M S = {} message tags, more than the {} "
                            "MPI guarantees (tags 0 to 32767)",
                            spec.micro_batches, int64_t{spec.ranks} * spec.virtual_stages, tags, kMaxTags);
  return {};
}

int tag_for(const Action& a, const ScheduleSpec& spec) {
  // The value an action moves is named by its producer: the activation of stage s (SA of s, RA of
  // s + 1) or the input gradient of stage s (SG of s, RG of s - 1).
  int value = 0, producer = a.stage;
  switch (a.kind) {
    case ActionKind::kSendActivation: break;
    case ActionKind::kRecvActivation: producer = a.stage - 1; break;
    case ActionKind::kSendGrad: value = 1; break;
    case ActionKind::kRecvGrad: value = 1, producer = a.stage + 1; break;
    default: KILN_CHECK_MSG(false, "tag_for({}): a compute action has no tag", describe(a));
  }
  const int S = spec.stages();
  KILN_CHECK(producer >= 0 && producer < S && a.micro_batch >= 0 && a.micro_batch < spec.micro_batches);
  return (value * spec.micro_batches + a.micro_batch) * S + producer;
}

// ---- generators --------------------------------------------------------------------------------
Expected<Schedule> make_schedule(const ScheduleSpec& spec) {
  KILN_RETURN_IF_ERROR(check_schedule_spec(spec));
  Schedule s;
  s.spec = spec;
  for (int r = 0; r < spec.ranks; ++r) {
    std::vector<Action> computes;
    switch (spec.kind) {
      case ScheduleKind::kGpipe: computes = gpipe_rank(spec, r); break;
      case ScheduleKind::k1F1B: computes = one_f_one_b_rank(spec, r); break;
      case ScheduleKind::kInterleaved1F1B: computes = interleaved_rank(spec, r); break;
      case ScheduleKind::kZeroBubbleH1: computes = zb_h1_rank(spec, r); break;
    }
    s.ranks.push_back(with_communication(computes, spec));
  }
  return s;
}

// ---- checker -----------------------------------------------------------------------------------
Status check_schedule(const Schedule& s) {
  KILN_RETURN_IF_ERROR(check_schedule_spec(s.spec));
  const int P = s.spec.ranks, M = s.spec.micro_batches, S = s.spec.stages();
  if (static_cast<int>(s.ranks.size()) != P)
    return invalid_argument("the schedule has lists for {} ranks, its spec {}", s.ranks.size(), P);
  Slots slots(M, S);
  const auto where = [&](const Action& a) {
    return fmt::format("rank {}, #{} ({})", slots.rank[slots.at(a.kind, a.micro_batch, a.stage)],
                       slots.pos[slots.at(a.kind, a.micro_batch, a.stage)], describe(a));
  };

  // Each action in range, on its stage's rank, moving a value that crosses ranks; none twice.
  for (int r = 0; r < P; ++r) {
    for (int p = 0; p < static_cast<int>(s.ranks[r].size()); ++p) {
      const Action& a = s.ranks[r][p];
      const std::string here = fmt::format("rank {}, #{} ({})", r, p, describe(a));
      if (a.micro_batch < 0 || a.micro_batch >= M)
        return invalid_argument("{}: micro-batch {} is outside 0..{}", here, a.micro_batch, M - 1);
      if (a.stage < 0 || a.stage >= S) return invalid_argument("{}: stage {} is outside 0..{}", here, a.stage, S - 1);
      if (s.rank_of(a.stage) != r)
        return invalid_argument("{}: stage {} runs on rank {}, not rank {}", here, a.stage, s.rank_of(a.stage), r);
      int peer = -1;  // the stage a send goes to or a receive comes from
      if (a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kRecvGrad) peer = a.stage + 1;
      if (a.kind == ActionKind::kSendGrad || a.kind == ActionKind::kRecvActivation) peer = a.stage - 1;
      if (!is_compute(a.kind)) {
        if (peer < 0 || peer >= S) return invalid_argument("{}: there is no stage {} to talk to", here, peer);
        if (s.rank_of(peer) == r)
          return invalid_argument("{}: stages {} and {} are both on rank {}: the value passes in memory, "
                                  "with no send or receive", here, a.stage, peer, r);
      }
      const size_t k = slots.at(a.kind, a.micro_batch, a.stage);
      if (slots.pos[k] >= 0) return invalid_argument("{}: appears twice (first at #{})", here, slots.pos[k]);
      slots.rank[k] = r;
      slots.pos[k] = p;
    }
  }

  // Every (micro-batch, stage): one F, and one B or one BI and one W.
  for (int i = 0; i < M; ++i) {
    for (int st = 0; st < S; ++st) {
      const int r = s.rank_of(st);
      const bool f = slots.present(ActionKind::kForward, i, st), b = slots.present(ActionKind::kBackward, i, st);
      const bool bi = slots.present(ActionKind::kBackwardInput, i, st);
      const bool w = slots.present(ActionKind::kBackwardWeight, i, st);
      if (!f) return invalid_argument("rank {}: F mb {} stage {} is missing", r, i, st);
      if (b && (bi || w))
        return invalid_argument("rank {}: mb {} stage {} has both B and {} (a backward is B, or BI and W)", r, i, st,
                                bi ? "BI" : "W");
      if (!b && !bi && !w)
        return invalid_argument("rank {}: the backward of mb {} stage {} is missing (no B, and no BI and W)", r, i, st);
      if (bi && !w) return invalid_argument("rank {}: W mb {} stage {} is missing (its BI is there)", r, i, st);
      if (w && !bi) return invalid_argument("rank {}: BI mb {} stage {} is missing (its W is there)", r, i, st);
    }
  }

  // Every send has its receive on the peer, and every receive its send.
  struct Pair {
    ActionKind send, recv;
    int offset;  // receiver stage - sender stage
  };
  for (const Pair& pr : {Pair{ActionKind::kSendActivation, ActionKind::kRecvActivation, 1},
                         Pair{ActionKind::kSendGrad, ActionKind::kRecvGrad, -1}}) {
    for (int i = 0; i < M; ++i)
      for (int st = 0; st < S; ++st) {
        const Action send{pr.send, i, st}, recv{pr.recv, i, st + pr.offset};
        if (slots.present(send.kind, i, st) && !slots.present(recv.kind, i, recv.stage))
          return invalid_argument("{}: has no matching {} on rank {}", where(send), describe(recv),
                                  s.rank_of(recv.stage));
        const Action recv2{pr.recv, i, st}, send2{pr.send, i, st - pr.offset};
        if (slots.present(recv2.kind, i, st) && !slots.present(send2.kind, i, send2.stage))
          return invalid_argument("{}: has no matching {} on rank {}", where(recv2), describe(send2),
                                  s.rank_of(send2.stage));
      }
  }

  // Every action's dependencies on its own rank come earlier in its list.
  for (int r = 0; r < P; ++r) {
    for (int p = 0; p < static_cast<int>(s.ranks[r].size()); ++p) {
      const Action& a = s.ranks[r][p];
      const int i = a.micro_batch, st = a.stage;
      const auto before = [&](const Action& dep) -> Status {
        const int at = slots.present(dep.kind, i, dep.stage) ? slots.pos[slots.at(dep.kind, i, dep.stage)] : -1;
        if (at >= 0 && at < p && slots.rank[slots.at(dep.kind, i, dep.stage)] == r) return {};
        if (at < 0) return invalid_argument("rank {}, #{} ({}): needs {} earlier on rank {}, and there is none", r, p,
                                            describe(a), describe(dep), r);
        return invalid_argument("rank {}, #{} ({}): needs {} earlier on rank {}, but it comes at #{}", r, p,
                                describe(a), describe(dep), r, at);
      };
      const auto local = [&](int other) { return s.rank_of(other) == r; };
      const bool split = slots.present(ActionKind::kBackwardInput, i, st);
      switch (a.kind) {
        case ActionKind::kForward:
          if (st > 0)
            KILN_RETURN_IF_ERROR(before(local(st - 1) ? Action{ActionKind::kForward, i, st - 1}
                                                      : Action{ActionKind::kRecvActivation, i, st}));
          break;
        case ActionKind::kBackward:
        case ActionKind::kBackwardInput:
          KILN_RETURN_IF_ERROR(before({ActionKind::kForward, i, st}));
          if (st < S - 1) {
            const ActionKind next_b = slots.present(ActionKind::kBackwardInput, i, st + 1) ? ActionKind::kBackwardInput
                                                                                           : ActionKind::kBackward;
            KILN_RETURN_IF_ERROR(before(local(st + 1) ? Action{next_b, i, st + 1} : Action{ActionKind::kRecvGrad, i, st}));
          }
          break;
        case ActionKind::kBackwardWeight: KILN_RETURN_IF_ERROR(before({ActionKind::kBackwardInput, i, st})); break;
        case ActionKind::kSendActivation: KILN_RETURN_IF_ERROR(before({ActionKind::kForward, i, st})); break;
        case ActionKind::kSendGrad:
          KILN_RETURN_IF_ERROR(before({split ? ActionKind::kBackwardInput : ActionKind::kBackward, i, st}));
          break;
        default: break;
      }
    }
  }

  // Run under the semantics: a wait across ranks that never ends is a deadlock.
  return run_lists(s, {ActionCosts{}}, nullptr);
}

// ---- timing ------------------------------------------------------------------------------------
std::vector<TimedAction> simulate_schedule(const Schedule& s, const ActionCosts& costs) {
  return simulate_schedule(s, std::vector<ActionCosts>{costs});
}

std::vector<TimedAction> simulate_schedule(const Schedule& s, const std::vector<ActionCosts>& per_stage) {
  KILN_CHECK_MSG(per_stage.size() == 1 || static_cast<int>(per_stage.size()) == s.spec.stages(),
                 "simulate_schedule: {} stage costs for {} stages", per_stage.size(), s.spec.stages());
  std::vector<TimedAction> timeline;
  const Status st = run_lists(s, per_stage, &timeline);
  KILN_CHECK_MSG(st.ok(), "simulate_schedule needs a schedule check_schedule accepts: {}", st.message());
  return timeline;
}

ScheduleStats schedule_stats(const Schedule& s, const std::vector<TimedAction>& timeline) {
  ScheduleStats stats;
  const int P = s.spec.ranks, M = s.spec.micro_batches, S = s.spec.stages();
  stats.bubble_fraction = bubble_of(timeline, P, &stats.makespan);
  // A micro-batch's activations on a stage are held from its F's start to its B's (or W's) end.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> held_from(size_t(M) * S, nan), held_to(size_t(M) * S, nan);
  for (const TimedAction& t : timeline) {
    const Action& a = t.action;
    if (a.micro_batch < 0 || a.micro_batch >= M || a.stage < 0 || a.stage >= S) continue;
    const size_t k = size_t(a.micro_batch) * S + a.stage;
    if (a.kind == ActionKind::kForward) held_from[k] = t.start;
    if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) held_to[k] = t.end;
  }
  stats.peak_activations.assign(P, 0);
  for (int r = 0; r < P; ++r) {
    std::vector<std::pair<double, int>> events;  // (time, +1 held / -1 released)
    for (int st = r; st < S; st += P)
      for (int i = 0; i < M; ++i) {
        const size_t k = size_t(i) * S + st;
        if (std::isnan(held_from[k])) continue;
        events.push_back({held_from[k], +1});
        if (!std::isnan(held_to[k])) events.push_back({held_to[k], -1});
      }
    std::sort(events.begin(), events.end());  // a release at t before a hold at t
    int held = 0;
    for (const auto& e : events) stats.peak_activations[r] = std::max(stats.peak_activations[r], held += e.second);
  }
  return stats;
}

double bubble_formula(const ScheduleSpec& spec, const ActionCosts& c) {
  const double P = spec.ranks, M = spec.micro_batches, V = spec.virtual_stages;
  switch (spec.kind) {
    case ScheduleKind::kGpipe:
    case ScheduleKind::k1F1B: return (P - 1) / (M + P - 1);
    case ScheduleKind::kInterleaved1F1B: return (P - 1) / V / (M + (P - 1) / V);
    case ScheduleKind::kZeroBubbleH1: {
      // Negative when W > F + B: no bubble is left to fill then.
      const double idle = std::max(0.0, (P - 1) * (c.forward + c.backward_input - c.backward_weight));
      const double work = M * (c.forward + c.backward_input + c.backward_weight);
      return idle + work > 0 ? idle / (work + idle) : 0;
    }
  }
  return 0;
}

std::vector<int> activation_bound(const ScheduleSpec& spec) {
  const int P = spec.ranks, M = spec.micro_batches;
  std::vector<int> bound(P);
  for (int r = 0; r < P; ++r) {
    switch (spec.kind) {
      case ScheduleKind::kGpipe: bound[r] = M; break;
      case ScheduleKind::k1F1B: bound[r] = std::min(M, P - r); break;
      case ScheduleKind::kInterleaved1F1B:
        bound[r] = std::min(M * spec.virtual_stages, interleaved_warmup(spec, r) + 1);
        break;
      // Rank r's 1F1B bound P - r plus the r W's it runs late (zb_h1_rank), at most M.
      case ScheduleKind::kZeroBubbleH1: bound[r] = std::min(M, P); break;
    }
  }
  return bound;
}

// ---- pictures ----------------------------------------------------------------------------------
namespace {

std::string xml_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

// The fill of an action's box; comm waits (a receive or send entry with a duration) are grey.
const char* fill_of(ActionKind k) {
  switch (k) {
    case ActionKind::kForward: return "#1f77b4";         // blue
    case ActionKind::kBackward: return "#2ca02c";        // green
    case ActionKind::kBackwardInput: return "#98df8a";   // light green
    case ActionKind::kBackwardWeight: return "#ff7f0e";  // orange
    default: return "#9e9e9e";                           // grey
  }
}

// A time-axis step of 1, 2 or 5 times a power of ten giving at most ~8 ticks over `span`.
double tick_step(double span) {
  const double target = span / 8, decade = std::pow(10.0, std::floor(std::log10(target)));
  for (const double m : {1.0, 2.0, 5.0, 10.0})
    if (m * decade >= target) return m * decade;
  return 10 * decade;
}

}  // namespace

std::string timeline_svg(const std::vector<TimelinePanel>& panels, const std::string& title) {
  constexpr double kWidth = 1000, kLeft = 70, kRight = 20, kRow = 24, kPanelTitle = 26, kAxis = 34, kTop = 58;
  const double plot_w = kWidth - kLeft - kRight;
  double t_end = 0;  // one time axis for every panel, so a measured and an ideal run compare
  for (const TimelinePanel& p : panels)
    for (const TimedAction& t : p.actions) t_end = std::max(t_end, t.end);
  if (!(t_end > 0)) t_end = 1e-3;
  double height = kTop;
  for (const TimelinePanel& p : panels) height += kPanelTitle + std::max(p.ranks, 1) * kRow + kAxis;
  const auto x_of = [&](double t) { return kLeft + t / t_end * plot_w; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      kWidth, height + 10);
  svg += fmt::format("<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n", kWidth / 2,
                     xml_escape(title));
  // The legend.
  const std::pair<const char*, ActionKind> legend[] = {
      {"F forward", ActionKind::kForward},           {"B backward (input + weight)", ActionKind::kBackward},
      {"BI input gradient", ActionKind::kBackwardInput}, {"W weight gradient", ActionKind::kBackwardWeight},
      {"waiting on communication", ActionKind::kRecvActivation}};
  double lx = kLeft;
  for (const auto& [text, kind] : legend) {
    svg += fmt::format("<rect class=\"legend\" x=\"{:.1f}\" y=\"34\" width=\"12\" height=\"12\" fill=\"{}\"/>"
                       "<text x=\"{:.1f}\" y=\"44\">{}</text>\n",
                       lx, fill_of(kind), lx + 16, xml_escape(text));
    lx += 16 + 7.0 * std::string_view(text).size() + 18;
  }

  double y = kTop;
  const double step = tick_step(t_end);
  for (const TimelinePanel& p : panels) {
    const int rows = std::max(p.ranks, 1);
    const double bubble = bubble_of(p.actions, p.ranks);
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"13\">{}: bubble {:.1f}%</text>\n", kLeft, y + 17,
                       xml_escape(p.title), 100 * bubble);
    y += kPanelTitle;
    for (int r = 0; r < rows; ++r) {
      svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">rank {}</text>\n", kLeft - 8,
                         y + r * kRow + kRow / 2 + 4, r);
      svg += fmt::format("<rect x=\"{}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" fill=\"#f4f4f4\"/>\n", kLeft,
                         y + r * kRow + 1, plot_w, kRow - 2);
    }
    for (int k = 0; k * step <= t_end * (1 + 1e-9); ++k) {
      const double t = k * step, x = x_of(t);
      svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#ccc\"/>"
                         "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4:g}</text>\n",
                         x, y, y + rows * kRow, y + rows * kRow + 14, t * 1e3);
    }
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">ms</text>\n", kLeft + plot_w,
                       y + rows * kRow + 28);
    for (const TimedAction& t : p.actions) {
      const bool compute = is_compute(t.action.kind);
      if (t.rank < 0 || t.rank >= rows || (!compute && !(t.end > t.start))) continue;
      const double x = x_of(t.start), w = std::max(x_of(t.end) - x, 0.5);
      const double top = y + t.rank * kRow + (compute ? 2 : 8), h = compute ? kRow - 4 : kRow - 16;
      svg += fmt::format("<rect class=\"{}\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\" "
                         "stroke=\"white\" stroke-width=\"0.5\"><title>rank {}: {}, {:g}-{:g} ms</title></rect>\n",
                         compute ? "action" : "wait", x, top, w, h, fill_of(t.action.kind), t.rank,
                         describe(t.action), t.start * 1e3, t.end * 1e3);
      const std::string label = std::to_string(t.action.micro_batch);
      if (compute && w >= 7.0 * label.size() + 4)
        svg += fmt::format("<text x=\"{:.2f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"11\" "
                           "fill=\"{}\">{}</text>\n",
                           x + w / 2, top + h / 2 + 4,
                           t.action.kind == ActionKind::kBackwardInput ? "black" : "white", label);
    }
    y += rows * kRow + kAxis;
  }
  return svg + "</svg>\n";
}

// ---- stage split -------------------------------------------------------------------------------
Expected<std::vector<int>> split_layers(int n_layers, int stages, const std::vector<int>& explicit_split,
                                        const StageCosts& costs) {
  if (stages < 1) return invalid_argument("split_layers: stages {} must be >= 1", stages);
  if (!explicit_split.empty()) {
    if (static_cast<int>(explicit_split.size()) != stages)
      return invalid_argument("the layer split has {} entries for {} pipeline stages", explicit_split.size(), stages);
    int64_t sum = 0;
    std::string terms;
    for (size_t k = 0; k < explicit_split.size(); ++k) {
      if (explicit_split[k] < 1)
        return invalid_argument("the layer split gives stage {} {} blocks: every stage needs at least one", k,
                                explicit_split[k]);
      sum += explicit_split[k];
      terms += fmt::format("{}{}", k ? "+" : "", explicit_split[k]);
    }
    if (sum != n_layers)
      return invalid_argument("the layer split {} sums to {} blocks, but the model has {} layers", terms, sum,
                              n_layers);
    return explicit_split;
  }
  if (n_layers < stages)
    return invalid_argument("{} layers cannot fill {} pipeline stages (each needs at least one block)", n_layers,
                            stages);
  if (!(costs.block_flops > 0) || !std::isfinite(costs.block_flops))
    return invalid_argument("split_layers: block_flops {} must be positive", costs.block_flops);
  if (!(costs.embedding_flops >= 0) || !(costs.head_flops >= 0) || !std::isfinite(costs.embedding_flops) ||
      !std::isfinite(costs.head_flops))
    return invalid_argument("split_layers: embedding_flops {} and head_flops {} must be >= 0", costs.embedding_flops,
                            costs.head_flops);
  // Minimising the largest of the stage costs c_k · block + extra_k: start every stage at one
  // block and give each next block to the stage it leaves cheapest (the earliest on a tie).
  // Each stage's cost grows linearly in its blocks, so this greedy filling is optimal.
  std::vector<int> blocks(stages, 1);
  std::vector<double> extra(stages, 0);
  extra[0] += costs.embedding_flops;
  extra[stages - 1] += costs.head_flops;
  for (int left = n_layers - stages; left > 0; --left) {
    int best = 0;
    for (int k = 1; k < stages; ++k)
      if ((blocks[k] + 1) * costs.block_flops + extra[k] < (blocks[best] + 1) * costs.block_flops + extra[best])
        best = k;
    ++blocks[best];
  }
  return blocks;
}

}  // namespace kiln::pipeline
