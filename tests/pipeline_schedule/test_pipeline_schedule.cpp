// Pipeline schedules as data (parallel/pipeline_schedule.h), no MPI: every generator's lists pass
// the checker for P = 1..4 and M = 1..8; the simulated bubble and peak activations equal the
// textbook formulas; hand-broken lists are refused with a message naming the fault; the names,
// the message tags, the stage split and the timeline SVG.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "kiln/parallel/pipeline_schedule.h"

namespace kiln::pipeline {
namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::kGpipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved1F1B,
                                   ScheduleKind::kZeroBubbleH1};

// Every spec the tests sweep: P = 1..4, M = 1..8; interleaved with V = 2, 3 where M % P == 0.
std::vector<ScheduleSpec> all_specs() {
  std::vector<ScheduleSpec> specs;
  for (const ScheduleKind kind : kKinds)
    for (int P = 1; P <= 4; ++P)
      for (int M = 1; M <= 8; ++M) {
        if (kind != ScheduleKind::kInterleaved1F1B) {
          specs.push_back({kind, P, M, 1});
          continue;
        }
        if (M % P != 0) continue;
        for (const int V : {2, 3}) specs.push_back({kind, P, M, V});
      }
  return specs;
}

std::string name(const ScheduleSpec& s) {
  return std::string(schedule_name(s.kind)) + " P=" + std::to_string(s.ranks) + " M=" +
         std::to_string(s.micro_batches) + " V=" + std::to_string(s.virtual_stages);
}

// The uniform costs of the formulas: F = 1, BI = 1, W = 1 (so kBackward = 2), no communication.
ActionCosts uniform() { return ActionCosts{1, 1, 1, 0}; }

ScheduleStats simulated(const ScheduleSpec& spec, const ActionCosts& costs = uniform()) {
  const Schedule s = make_schedule(spec).value();
  return schedule_stats(s, simulate_schedule(s, costs));
}

Schedule schedule(ScheduleKind kind, int P, int M, int V = 1) { return make_schedule({kind, P, M, V}).value(); }

// Removes the one action `a` from rank r's list (the test fails if it is not there).
void remove(Schedule& s, int r, const Action& a) {
  auto& list = s.ranks[r];
  const auto it = std::find(list.begin(), list.end(), a);
  ASSERT_NE(it, list.end()) << "rank " << r << " has no " << action_name(a.kind) << " mb " << a.micro_batch;
  list.erase(it);
}

// The message of a schedule the checker must refuse; empty (and a test failure) if it accepts.
std::string refusal(const Schedule& s) {
  const Status st = check_schedule(s);
  EXPECT_FALSE(st.ok()) << "the checker accepted a broken schedule";
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  return st.message();
}

// The message names `part` (a failure reports the caller's line: __builtin_LINE, which GCC and
// Debian's clang 14 both have; libstdc++'s std::source_location needs a newer clang).
void expect_mentions(const std::string& text, const std::string& part, int line = __builtin_LINE()) {
  EXPECT_NE(text.find(part), std::string::npos) << "line " << line << ": '" << part << "' not in: " << text;
}
#define EXPECT_MENTIONS(text, part) expect_mentions(text, part)

// The checker refuses `s` with a message naming every one of `parts`.
void expect_refused(const Schedule& s, const std::vector<std::string>& parts, int line = __builtin_LINE()) {
  const std::string message = refusal(s);
  for (const std::string& part : parts) expect_mentions(message, part, line);
}

TEST(PipelineSchedule, EveryGeneratedScheduleIsValid) {
  for (const ScheduleSpec& spec : all_specs()) {
    SCOPED_TRACE(name(spec));
    const auto s = make_schedule(spec);
    ASSERT_TRUE(s.ok()) << s.status().message();
    ASSERT_EQ(static_cast<int>(s->ranks.size()), spec.ranks);
    const Status st = check_schedule(*s);
    EXPECT_TRUE(st.ok()) << st.message();
    // Each rank computes M forwards and M backwards (B, or BI and W) per stage it holds.
    for (int r = 0; r < spec.ranks; ++r) {
      int computes = 0;
      for (const Action& a : s->ranks[r]) computes += is_compute(a.kind);
      const int per_backward = spec.kind == ScheduleKind::kZeroBubbleH1 ? 2 : 1;
      EXPECT_EQ(computes, spec.micro_batches * spec.virtual_stages * (1 + per_backward)) << "rank " << r;
    }
  }
}

TEST(PipelineSchedule, OneRankHasNoCommunication) {
  for (const ScheduleSpec& spec : all_specs()) {
    if (spec.ranks != 1) continue;
    SCOPED_TRACE(name(spec));
    const Schedule s = make_schedule(spec).value();
    for (const Action& a : s.ranks[0]) EXPECT_TRUE(is_compute(a.kind)) << action_name(a.kind);
  }
  // GPipe on one stage: all forwards, then all backwards.
  const Schedule g = schedule(ScheduleKind::kGpipe, 1, 3);
  const std::vector<Action> want = {{ActionKind::kForward, 0, 0},  {ActionKind::kForward, 1, 0},
                                    {ActionKind::kForward, 2, 0},  {ActionKind::kBackward, 0, 0},
                                    {ActionKind::kBackward, 1, 0}, {ActionKind::kBackward, 2, 0}};
  EXPECT_EQ(g.ranks[0], want);
}

TEST(PipelineSchedule, SendsFollowTheirComputeAndReceivesPrecedeTheirConsumer) {
  // 1F1B on 2 ranks, 2 micro-batches, with each receive posted one compute ahead.
  const Schedule s = schedule(ScheduleKind::k1F1B, 2, 2);
  using K = ActionKind;
  const std::vector<Action> rank0 = {{K::kForward, 0, 0},      {K::kSendActivation, 0, 0}, {K::kRecvGrad, 0, 0},
                                     {K::kForward, 1, 0},      {K::kSendActivation, 1, 0}, {K::kRecvGrad, 1, 0},
                                     {K::kBackward, 0, 0},     {K::kBackward, 1, 0}};
  const std::vector<Action> rank1 = {{K::kRecvActivation, 0, 1}, {K::kForward, 0, 1},  {K::kRecvActivation, 1, 1},
                                     {K::kBackward, 0, 1},       {K::kSendGrad, 0, 1}, {K::kForward, 1, 1},
                                     {K::kBackward, 1, 1},       {K::kSendGrad, 1, 1}};
  EXPECT_EQ(s.ranks[0], rank0);
  EXPECT_EQ(s.ranks[1], rank1);
}

TEST(PipelineSchedule, SimulatedBubbleEqualsTheFormula) {
  for (const ScheduleSpec& spec : all_specs()) {
    SCOPED_TRACE(name(spec));
    const double sim = simulated(spec).bubble_fraction, formula = bubble_formula(spec, uniform());
    switch (spec.kind) {
      case ScheduleKind::kGpipe:
      case ScheduleKind::k1F1B:
        EXPECT_NEAR(sim, formula, 1e-9);
        break;
      case ScheduleKind::kInterleaved1F1B:
        // Megatron's order meets ((P-1)/V) / (M + (P-1)/V) exactly at every M divisible by P
        // (the only M it accepts), with F = 1 and B = 2 per virtual stage.
        EXPECT_NEAR(sim, formula, 1e-9);
        break;
      case ScheduleKind::kZeroBubbleH1: {
        // ZB-H1's formula needs a steady phase: M >= P. Below it the drain's W's cannot fill the
        // bubble; ZB-H1 is still no worse than 1F1B, which is no worse than GPipe.
        if (spec.micro_batches >= spec.ranks) {
          EXPECT_NEAR(sim, formula, 1e-9);
        }
        const double one_f_one_b = simulated({ScheduleKind::k1F1B, spec.ranks, spec.micro_batches, 1}).bubble_fraction;
        const double gpipe = simulated({ScheduleKind::kGpipe, spec.ranks, spec.micro_batches, 1}).bubble_fraction;
        EXPECT_LE(sim, one_f_one_b + 1e-12);
        EXPECT_LE(one_f_one_b, gpipe + 1e-12);
        if (spec.ranks > 1) {
          EXPECT_LT(sim, one_f_one_b);
        }
        break;
      }
    }
  }
  // The numbers themselves at P = 4, M = 8: 3/11, 3/11, 3/19 (V = 2) and 3/27 = 1/9.
  EXPECT_NEAR(simulated({ScheduleKind::kGpipe, 4, 8, 1}).bubble_fraction, 3.0 / 11, 1e-12);
  EXPECT_NEAR(simulated({ScheduleKind::k1F1B, 4, 8, 1}).bubble_fraction, 3.0 / 11, 1e-12);
  EXPECT_NEAR(simulated({ScheduleKind::kInterleaved1F1B, 4, 8, 2}).bubble_fraction, 3.0 / 19, 1e-12);
  EXPECT_NEAR(simulated({ScheduleKind::kZeroBubbleH1, 4, 8, 1}).bubble_fraction, 1.0 / 9, 1e-12);
}

TEST(PipelineSchedule, ZeroBubbleFormulaHoldsForUnequalCosts) {
  // F = 2, B = 1.5, W = 1: (P-1)(F+B-W) / (M(F+B+W) + (P-1)(F+B-W)) at M >= P.
  const ActionCosts c{2, 1.5, 1, 0};
  for (int P = 2; P <= 4; ++P)
    for (int M = P; M <= 8; ++M) {
      const ScheduleSpec spec{ScheduleKind::kZeroBubbleH1, P, M, 1};
      SCOPED_TRACE(name(spec));
      EXPECT_NEAR(simulated(spec, c).bubble_fraction, bubble_formula(spec, c), 1e-9);
    }
}

TEST(PipelineSchedule, PeakActivationsEqualTheBound) {
  for (const ScheduleSpec& spec : all_specs()) {
    SCOPED_TRACE(name(spec));
    EXPECT_EQ(simulated(spec).peak_activations, activation_bound(spec));
  }
  EXPECT_EQ(activation_bound({ScheduleKind::kGpipe, 4, 8, 1}), (std::vector<int>{8, 8, 8, 8}));
  EXPECT_EQ(activation_bound({ScheduleKind::k1F1B, 4, 8, 1}), (std::vector<int>{4, 3, 2, 1}));
  EXPECT_EQ(activation_bound({ScheduleKind::k1F1B, 4, 2, 1}), (std::vector<int>{2, 2, 2, 1}));
  // ZB-H1 keeps rank r's W's r micro-batches late: every rank holds 1F1B's peak, that of rank 0.
  EXPECT_EQ(activation_bound({ScheduleKind::kZeroBubbleH1, 4, 8, 1}), (std::vector<int>{4, 4, 4, 4}));
  // Megatron: 2 (P - r - 1) + (V - 1) P warm-up chunks, plus the one in flight.
  EXPECT_EQ(activation_bound({ScheduleKind::kInterleaved1F1B, 4, 8, 2}), (std::vector<int>{11, 9, 7, 5}));
}

TEST(PipelineSchedule, CommunicationTimeDelaysTheConsumer) {
  // 1F1B, P = 2, M = 1, comm 0.5: F0 [0,1] on rank 0, F0 [1.5,2.5] and B0 [2.5,4.5] on rank 1,
  // B0 [5,7] on rank 0; sends and receives are zero-length entries.
  const Schedule s = schedule(ScheduleKind::k1F1B, 2, 1);
  const auto timeline = simulate_schedule(s, ActionCosts{1, 1, 1, 0.5});
  ASSERT_EQ(timeline.size(), 8u);
  double rank0_backward_start = -1;
  for (const TimedAction& t : timeline) {
    if (!is_compute(t.action.kind)) {
      EXPECT_EQ(t.start, t.end) << action_name(t.action.kind);
    }
    if (t.rank == 0 && t.action.kind == ActionKind::kBackward) rank0_backward_start = t.start;
  }
  EXPECT_DOUBLE_EQ(rank0_backward_start, 5);
  EXPECT_DOUBLE_EQ(schedule_stats(s, timeline).makespan, 7);
}

TEST(PipelineSchedule, StatsOfAMeasuredTimeline) {
  // Two ranks, one micro-batch split into BI and W on rank 0: held from F's start to W's end.
  Schedule s;
  s.spec = {ScheduleKind::kZeroBubbleH1, 2, 2, 1};
  using K = ActionKind;
  const std::vector<TimedAction> t = {
      {{K::kForward, 0, 0}, 0, 0, 1},        {{K::kForward, 1, 0}, 0, 1, 2},
      {{K::kBackwardInput, 0, 0}, 0, 4, 5},  {{K::kBackwardWeight, 0, 0}, 0, 7, 8},
      {{K::kBackwardInput, 1, 0}, 0, 5, 6},  {{K::kBackwardWeight, 1, 0}, 0, 6, 7},
      {{K::kForward, 0, 1}, 1, 1, 2},        {{K::kBackwardInput, 0, 1}, 1, 2, 3},
      {{K::kBackwardWeight, 0, 1}, 1, 3, 4}, {{K::kForward, 1, 1}, 1, 4, 5},
      {{K::kBackwardInput, 1, 1}, 1, 5, 6},  {{K::kBackwardWeight, 1, 1}, 1, 6, 7},
  };
  const ScheduleStats st = schedule_stats(s, t);
  EXPECT_DOUBLE_EQ(st.makespan, 8);
  EXPECT_DOUBLE_EQ(st.bubble_fraction, 1 - 12.0 / 16);
  EXPECT_EQ(st.peak_activations, (std::vector<int>{2, 1}));  // rank 1 frees mb 0 (W ends at 4) as mb 1 starts
}

// ---- the checker refuses hand-broken schedules ---------------------------------------------------
using K = ActionKind;

// A generated schedule with one action taken out (or one more put in): refused, by name.
struct OneActionOff {
  const char* fault;
  ScheduleSpec spec;
  int rank;
  Action action;
  bool extra;  // appended to the rank's list, not taken out of it
  std::vector<std::string> message;
};

TEST(PipelineScheduleChecker, OneActionMissingOrExtra) {
  const ScheduleSpec one_f_one_b{ScheduleKind::k1F1B, 2, 3, 1}, zb{ScheduleKind::kZeroBubbleH1, 2, 3, 1};
  const ScheduleSpec gpipe{ScheduleKind::kGpipe, 2, 3, 1};
  const OneActionOff cases[] = {
      {"missing backward", one_f_one_b, 1, {K::kBackward, 2, 1}, false,
       {"rank 1", "backward of mb 2 stage 1 is missing"}},
      {"missing W", zb, 0, {K::kBackwardWeight, 1, 0}, false, {"rank 0", "W mb 1 stage 0 is missing"}},
      {"missing forward", gpipe, 0, {K::kForward, 1, 0}, false, {"rank 0", "F mb 1 stage 0 is missing"}},
      {"duplicated forward", gpipe, 0, {K::kForward, 1, 0}, true, {"rank 0", "F mb 1 stage 0", "appears twice"}},
      {"send without its receive", one_f_one_b, 1, {K::kRecvActivation, 1, 1}, false,
       {"rank 0", "SA mb 1 stage 0", "no matching RA mb 1 stage 1 on rank 1"}},
      {"receive without its send", one_f_one_b, 1, {K::kSendGrad, 0, 1}, false,
       {"rank 0", "RG mb 0 stage 0", "no matching SG mb 0 stage 1 on rank 1"}},
      {"action on the wrong rank", gpipe, 0, {K::kForward, 0, 1}, true,
       {"rank 0", "F mb 0 stage 1", "stage 1 runs on rank 1, not rank 0"}},
      {"micro-batch past M", gpipe, 0, {K::kForward, 3, 0}, true, {"rank 0", "micro-batch 3 is outside 0..2"}},
      {"B beside BI", one_f_one_b, 0, {K::kBackwardInput, 1, 0}, true, {"mb 1 stage 0 has both B and BI"}},
  };
  for (const OneActionOff& c : cases) {
    SCOPED_TRACE(c.fault);
    Schedule s = make_schedule(c.spec).value();
    if (c.extra) {
      s.ranks[c.rank].push_back(c.action);
    } else {
      remove(s, c.rank, c.action);
    }
    expect_refused(s, c.message);
  }
}

TEST(PipelineScheduleChecker, ComputeBeforeItsDependency) {
  // The backward moved in front of its own forward.
  Schedule s = schedule(ScheduleKind::k1F1B, 2, 2);
  remove(s, 1, {K::kBackward, 0, 1});
  s.ranks[1].insert(s.ranks[1].begin(), Action{K::kBackward, 0, 1});
  expect_refused(s, {"rank 1, #0 (B mb 0 stage 1)", "needs F mb 0 stage 1 earlier on rank 1, but it comes at"});
  // A forward in front of the receive it consumes.
  s = schedule(ScheduleKind::k1F1B, 2, 2);
  remove(s, 1, {K::kRecvActivation, 1, 1});
  s.ranks[1].push_back({K::kRecvActivation, 1, 1});
  expect_refused(s, {"F mb 1 stage 1", "needs RA mb 1 stage 1 earlier on rank 1"});
  // A W before its BI; a send before the compute that produces it.
  s = schedule(ScheduleKind::kZeroBubbleH1, 1, 2);
  std::swap(s.ranks[0][1], s.ranks[0][2]);  // F0 BI0 W0 … -> F0 W0 BI0 …
  expect_refused(s, {"W mb 0 stage 0): needs BI mb 0 stage 0 earlier"});
  s = schedule(ScheduleKind::kGpipe, 2, 1);
  ASSERT_EQ(s.ranks[0][1], (Action{K::kForward, 0, 0}));
  std::swap(s.ranks[0][1], s.ranks[0][2]);  // RG0 F0 SA0 B0 -> RG0 SA0 F0 B0
  expect_refused(s, {"SA mb 0 stage 0): needs F mb 0 stage 0 earlier"});
  // Stage 1 of an interleaved rank without the stage-0 forward it reads in memory before it.
  s = schedule(ScheduleKind::kInterleaved1F1B, 1, 1, 2);
  std::swap(s.ranks[0][0], s.ranks[0][1]);  // F0@1 F0@0 …
  expect_refused(s, {"F mb 0 stage 1): needs F mb 0 stage 0 earlier on rank 0"});
}

TEST(PipelineScheduleChecker, Deadlock) {
  // Each rank blocks in a compute whose input the other sends only after its own blocked compute:
  // rank 0 waits in B0 for rank 1's SG0, which follows rank 1's F1, which waits for SA1, which
  // follows rank 0's B0. Every per-rank order is fine; only running the lists shows it.
  Schedule s;
  s.spec = {ScheduleKind::k1F1B, 2, 2, 1};
  s.ranks = {{{K::kForward, 0, 0}, {K::kSendActivation, 0, 0}, {K::kRecvGrad, 0, 0}, {K::kBackward, 0, 0},
              {K::kForward, 1, 0}, {K::kSendActivation, 1, 0}, {K::kRecvGrad, 1, 0}, {K::kBackward, 1, 0}},
             {{K::kRecvActivation, 1, 1}, {K::kForward, 1, 1}, {K::kBackward, 1, 1}, {K::kSendGrad, 1, 1},
              {K::kRecvActivation, 0, 1}, {K::kForward, 0, 1}, {K::kBackward, 0, 1}, {K::kSendGrad, 0, 1}}};
  expect_refused(s, {"deadlock", "rank 0 at #3 (B mb 0 stage 0) waits for SG mb 0 stage 1 of rank 1",
                 "rank 1 at #1 (F mb 1 stage 1) waits for SA mb 1 stage 0 of rank 0"});
  // The same lists in a consistent order pass.
  std::swap(s.ranks[1][0], s.ranks[1][4]);
  std::swap(s.ranks[1][1], s.ranks[1][5]);
  std::swap(s.ranks[1][2], s.ranks[1][6]);
  std::swap(s.ranks[1][3], s.ranks[1][7]);
  EXPECT_TRUE(check_schedule(s).ok()) << check_schedule(s).message();
}

TEST(PipelineScheduleChecker, OtherFaults) {
  // A send between two stages of one rank (the value passes in memory).
  Schedule s = schedule(ScheduleKind::kInterleaved1F1B, 1, 1, 2);
  s.ranks[0].insert(s.ranks[0].begin() + 1, Action{K::kSendActivation, 0, 0});
  expect_refused(s, {"stages 0 and 1 are both on rank 0"});
  // A rank's list missing.
  s = schedule(ScheduleKind::kGpipe, 2, 2);
  s.ranks.pop_back();
  expect_refused(s, {"lists for 1 ranks, its spec 2"});
}

// ---- spec, names, tags -------------------------------------------------------------------------
TEST(PipelineScheduleSpec, RefusesBadSpecs) {
  const auto msg = [](const ScheduleSpec& s) { return check_schedule_spec(s).message(); };
  EXPECT_MENTIONS(msg({ScheduleKind::k1F1B, 0, 4, 1}), "P = 0");
  EXPECT_MENTIONS(msg({ScheduleKind::k1F1B, 2, 0, 1}), "M = 0");
  EXPECT_MENTIONS(msg({ScheduleKind::k1F1B, 2, 4, 2}), "V = 2 need the interleaved schedule");
  EXPECT_MENTIONS(msg({ScheduleKind::kInterleaved1F1B, 2, 4, 1}), "V >= 2");
  EXPECT_MENTIONS(msg({ScheduleKind::kInterleaved1F1B, 4, 6, 2}), "M = 6 divisible by ranks P = 4");
  // 2 · M · S tags: 2 · 4096 · 4 = 32768 fit MPI's guaranteed 0..32767, one more micro-batch does not.
  EXPECT_TRUE(check_schedule_spec({ScheduleKind::k1F1B, 4, 4096, 1}).ok());
  EXPECT_MENTIONS(msg({ScheduleKind::k1F1B, 4, 4097, 1}), "2 M S = 32776 message tags");
  EXPECT_FALSE(make_schedule({ScheduleKind::k1F1B, 4, 4097, 1}).ok());
}

TEST(PipelineScheduleSpec, TagsAreUniqueAndMatchAcrossRanks) {
  for (const ScheduleSpec& spec : all_specs()) {
    SCOPED_TRACE(name(spec));
    const Schedule s = make_schedule(spec).value();
    std::set<int> send_tags, recv_tags;
    for (const auto& list : s.ranks)
      for (const Action& a : list) {
        if (is_compute(a.kind)) continue;
        const int tag = tag_for(a, spec);
        EXPECT_GE(tag, 0);
        EXPECT_LT(tag, 32768);
        const bool send = a.kind == K::kSendActivation || a.kind == K::kSendGrad;
        EXPECT_TRUE((send ? send_tags : recv_tags).insert(tag).second) << "tag " << tag << " twice";
      }
    EXPECT_EQ(send_tags, recv_tags);  // each send's tag is its receive's
  }
  const ScheduleSpec spec{ScheduleKind::k1F1B, 4, 8, 1};
  EXPECT_EQ(tag_for({K::kSendActivation, 3, 1}, spec), tag_for({K::kRecvActivation, 3, 2}, spec));
  EXPECT_EQ(tag_for({K::kSendGrad, 3, 2}, spec), tag_for({K::kRecvGrad, 3, 1}, spec));
  EXPECT_NE(tag_for({K::kSendActivation, 3, 1}, spec), tag_for({K::kSendGrad, 3, 1}, spec));
}

TEST(PipelineScheduleSpec, Names) {
  for (const ScheduleKind k : kKinds) EXPECT_EQ(parse_schedule(schedule_name(k)).value(), k);
  EXPECT_EQ(schedule_name(ScheduleKind::kZeroBubbleH1), "zb-h1");
  const auto bad = parse_schedule("foo");
  ASSERT_FALSE(bad.ok());
  EXPECT_MENTIONS(bad.status().message(), "'foo'");
  EXPECT_MENTIONS(bad.status().message(), "gpipe, 1f1b, interleaved, zb-h1");
  const std::vector<std::string> names = {"F", "B", "BI", "W", "SA", "RA", "SG", "RG"};
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(action_name(static_cast<ActionKind>(k)), names[k]);
    EXPECT_EQ(is_compute(static_cast<ActionKind>(k)), k < 4) << names[k];
  }
}

TEST(PipelineScheduleSpec, FormulaCorners) {
  EXPECT_EQ(bubble_formula({ScheduleKind::kGpipe, 1, 4, 1}, uniform()), 0);
  EXPECT_EQ(bubble_formula({ScheduleKind::kZeroBubbleH1, 1, 4, 1}, uniform()), 0);
  EXPECT_NEAR(bubble_formula({ScheduleKind::kZeroBubbleH1, 4, 8, 1}, uniform()), 3.0 / 27, 1e-12);
  EXPECT_NEAR(bubble_formula({ScheduleKind::kInterleaved1F1B, 4, 8, 2}, uniform()), 1.5 / 9.5, 1e-12);
  // W longer than F + B: no bubble left for the formula.
  EXPECT_EQ(bubble_formula({ScheduleKind::kZeroBubbleH1, 4, 8, 1}, ActionCosts{1, 1, 3, 0}), 0);
}

// ---- stage split -------------------------------------------------------------------------------
TEST(PipelineSplit, ExplicitSplitIsCheckedAndReturned) {
  EXPECT_EQ(split_layers(8, 3, {3, 3, 2}, {}).value(), (std::vector<int>{3, 3, 2}));
  auto bad = split_layers(8, 3, {2, 3, 2}, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_MENTIONS(bad.status().message(), "2+3+2 sums to 7");
  EXPECT_MENTIONS(bad.status().message(), "8 layers");
  bad = split_layers(8, 3, {4, 4}, {});
  EXPECT_MENTIONS(bad.status().message(), "2 entries for 3 pipeline stages");
  bad = split_layers(8, 3, {4, 4, 0}, {});
  EXPECT_MENTIONS(bad.status().message(), "stage 2 0 blocks");
}

TEST(PipelineSplit, BalancedSplitMinimisesTheLargestStage) {
  EXPECT_EQ(split_layers(8, 3, {}, {}).value(), (std::vector<int>{3, 3, 2}));
  EXPECT_EQ(split_layers(8, 4, {}, {}).value(), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(split_layers(5, 1, {}, {}).value(), (std::vector<int>{5}));
  // A head costing three blocks: the last stage gets fewer blocks (3+2+2+1: largest cost 4).
  const std::vector<int> heavy_head = split_layers(8, 4, {}, StageCosts{1, 0, 3}).value();
  EXPECT_EQ(heavy_head, (std::vector<int>{3, 2, 2, 1}));
  // An embedding costing two blocks: the first stage gets fewer.
  EXPECT_EQ(split_layers(9, 3, {}, StageCosts{1, 2, 0}).value(), (std::vector<int>{2, 4, 3}));
  // Every stage keeps a block however heavy the head, and the blocks add up.
  for (int n = 4; n <= 12; ++n) {
    const std::vector<int> split = split_layers(n, 4, {}, StageCosts{1, 0, 100}).value();
    int sum = 0;
    for (const int b : split) {
      EXPECT_GE(b, 1);
      sum += b;
    }
    EXPECT_EQ(sum, n);
    EXPECT_EQ(split.back(), 1);
  }
}

TEST(PipelineSplit, TooFewLayersIsAnError) {
  const auto s = split_layers(3, 4, {}, {});
  ASSERT_FALSE(s.ok());
  EXPECT_MENTIONS(s.status().message(), "3 layers cannot fill 4 pipeline stages");
  EXPECT_FALSE(split_layers(4, 4, {}, StageCosts{0, 0, 0}).ok());
}

// ---- pictures ----------------------------------------------------------------------------------
size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(PipelineTimeline, SvgHasOneBoxPerComputeAction) {
  const Schedule s = schedule(ScheduleKind::kZeroBubbleH1, 4, 8);
  const auto timeline = simulate_schedule(s, ActionCosts{1e-3, 1e-3, 1e-3, 0});
  size_t computes = 0;
  for (const TimedAction& t : timeline) computes += is_compute(t.action.kind);
  ASSERT_EQ(computes, 4u * 8 * 3);
  const std::string svg = timeline_svg({{"ideal <zb-h1> & co", timeline, 4}}, "P = 4 \"M\" = 8");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count(svg, "<rect class=\"action\""), computes);
  EXPECT_EQ(count(svg, "<rect class=\"wait\""), 0u);  // simulated sends and receives take no time
  EXPECT_MENTIONS(svg, "ideal &lt;zb-h1&gt; &amp; co: bubble 11.1%");
  EXPECT_MENTIONS(svg, "P = 4 &quot;M&quot; = 8");
  EXPECT_EQ(count(svg, "<svg"), 1u);
  EXPECT_EQ(count(svg, "</rect>"), computes);  // each box closes (it holds its tooltip)
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
  for (const char* colour : {"#1f77b4", "#98df8a", "#ff7f0e"}) EXPECT_MENTIONS(svg, colour);
  // A measured timeline's receive wait is drawn grey; two panels share one axis.
  std::vector<TimedAction> measured = timeline;
  measured.push_back({{K::kRecvActivation, 0, 1}, 1, 0, 1e-3});
  const std::string two = timeline_svg({{"measured", measured, 4}, {"ideal", timeline, 4}}, "two");
  EXPECT_EQ(count(two, "<rect class=\"wait\""), 1u);
  EXPECT_EQ(count(two, "<rect class=\"action\""), 2 * computes);
  EXPECT_MENTIONS(two, "#9e9e9e");
}

}  // namespace
}  // namespace kiln::pipeline
