// The scheduler without a model, driven by a fake executor that checks every K/V read: token
// budget, chunked prefill, decodes not starved by a long prompt, FCFS and max-running,
// preemption by recompute under a tiny pool, prefix-cache hits, parallel sampling with
// copy-on-write, stop tokens, aborts, static, classic and continuous batching, impossible requests.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <set>

#include "kiln/core/rng.h"
#include "kiln/serve/scheduler.h"
#include "tests/serve/fake_executor.h"

namespace kiln {
namespace {

using test::FakeExecutor;
using test::run_to_completion;
using test::RunResult;

std::unique_ptr<Scheduler> make(const SchedulerConfig& sc, const KvCacheConfig& kv) {
  auto s = Scheduler::create(sc, kv);
  KILN_CHECK_MSG(s.ok(), "{}", s.status().to_string());
  return std::move(s).value();
}

// A prompt of `len` tokens; different `family` values share nothing.
Request request(int64_t len, int64_t max_tokens, int32_t family, int64_t n = 1) {
  Request r;
  for (int64_t i = 0; i < len; ++i) r.prompt.push_back(family * 1000 + static_cast<int32_t>(i));
  r.max_tokens = max_tokens;
  r.n = n;
  return r;
}

struct StepShape {
  int64_t computed, num_new, samples;
  bool operator==(const StepShape&) const = default;
};

TEST(Scheduler, ChunkedPrefillSplitsALongPrompt) {
  auto sched = make({.max_batched_tokens = 64, .prefill_chunk = 32, .max_running = 4},
                    {.num_blocks = 64, .block_size = 16});
  FakeExecutor exec(64, 16);
  ASSERT_TRUE(sched->add_request(request(100, 3, 1)).ok());
  std::vector<StepShape> shapes;
  RunResult r = run_to_completion(*sched, exec, [&](const SchedulerOutput& out) {
    ASSERT_EQ(out.seqs.size(), 1u);
    shapes.push_back(
        {out.seqs[0].num_computed_tokens, out.seqs[0].num_new_tokens, out.seqs[0].num_samples});
  });
  const std::vector<StepShape> want = {{0, 32, 0}, {32, 32, 0}, {64, 32, 0},
                                       {96, 4, 1}, {100, 1, 1}, {101, 1, 1}};
  EXPECT_EQ(shapes, want);
  ASSERT_EQ(r.outputs[0].size(), 1u);
  EXPECT_EQ(r.outputs[0][0].size(), 3u);
  EXPECT_EQ(sched->kv_stats().pool.num_used, 0);
}

// Every sequence that is ready to decode at a step is scheduled in it (the budget is at least
// max_running, so only starvation could skip one).
struct NoStarvation {
  std::set<int64_t> ready;
  void check(const SchedulerOutput& out) {
    std::set<int64_t> seen(out.preempted_seq_ids.begin(), out.preempted_seq_ids.end());
    for (const ScheduledSeq& e : out.seqs) seen.insert(e.seq_id);
    for (int64_t id : ready)
      EXPECT_TRUE(seen.count(id)) << "seq " << id << " starved at step " << out.step;
  }
  void after(const SchedulerOutput& out, const UpdateResult& u) {
    ready.clear();
    for (const ScheduledSeq& e : out.seqs)
      if (e.num_samples > 0) ready.insert(e.seq_id);
    for (auto [parent, child] : u.forked) ready.insert(child);
    for (const FinishedSeq& f : u.finished) ready.erase(f.seq_id);
  }
};

// Runs the requests (the long one, id long_id, added after `delay` steps) and checks that
// every ready decode is scheduled at every step; returns the steps where the long prompt's
// chunk shared the budget with decodes, as (decodes, chunk).
std::vector<std::pair<int64_t, int64_t>> run_long_prompt_scenario(
    Scheduler& sched, const std::vector<Request>& shorts, const Request& long_req, int64_t delay) {
  FakeExecutor exec(sched.kv().pool().num_blocks(), sched.kv().config().block_size);
  int64_t long_id = -1;
  if (delay == 0) long_id = sched.add_request(long_req).value();
  for (const Request& r : shorts) KILN_CHECK(sched.add_request(r).ok());
  NoStarvation ns;
  std::vector<std::pair<int64_t, int64_t>> mixed;
  for (int64_t step = 0; sched.has_unfinished(); ++step) {
    if (step == delay && long_id < 0) long_id = sched.add_request(long_req).value();
    SchedulerOutput out = sched.schedule();
    EXPECT_LE(out.num_batched_tokens, sched.config().max_batched_tokens);
    ns.check(out);
    int64_t decodes = 0, chunk = 0;
    for (const ScheduledSeq& e : out.seqs) {
      if (e.seq_id == long_id && e.num_samples == 0) chunk = e.num_new_tokens;
      if (e.seq_id != long_id && e.num_computed_tokens > 0 && e.num_new_tokens == 1) ++decodes;
    }
    if (chunk > 0 && decodes > 0) mixed.emplace_back(decodes, chunk);
    auto sampled = exec.run(out);
    if (::testing::Test::HasFailure()) break;
    ns.after(out, sched.update(out, sampled));
    if (step > 2000) {
      ADD_FAILURE() << "no completion";
      break;
    }
  }
  return mixed;
}

TEST(Scheduler, DecodesNeverStarvedByALongPrompt) {
  // 8 short requests decode; a 400-token prompt arrives and its chunks (budget-sized) take
  // only what the 8 decodes leave.
  {
    auto sched = make({.max_batched_tokens = 16, .prefill_chunk = 16, .max_running = 16},
                      {.num_blocks = 128, .block_size = 16});
    std::vector<Request> shorts;
    for (int i = 0; i < 8; ++i) shorts.push_back(request(2, 40, 10 + i));
    auto mixed = run_long_prompt_scenario(*sched, shorts, request(400, 2, 1), 3);
    ASSERT_FALSE(mixed.empty());
    for (auto [decodes, chunk] : mixed) EXPECT_EQ(chunk, 16 - decodes);
    EXPECT_EQ(mixed[0].first, 8);
  }
  // The long prompt is older than the decodes (forks of n = 4 requests admitted beside it),
  // so its chunk of 12 alone would leave room for only 4 of 16 decodes: a prefill chunk gets
  // the budget that the decodes still to come leave.
  {
    auto sched = make({.max_batched_tokens = 16, .prefill_chunk = 12, .max_running = 32},
                      {.num_blocks = 128, .block_size = 16});
    std::vector<Request> shorts;
    for (int i = 0; i < 4; ++i) shorts.push_back(request(1, 10 + 5 * i, 10 + i, 4));
    auto mixed = run_long_prompt_scenario(*sched, shorts, request(400, 2, 1), 0);
    ASSERT_FALSE(mixed.empty());
    for (auto [decodes, chunk] : mixed) EXPECT_LE(chunk, 16 - decodes);
  }
}

TEST(Scheduler, FcfsAdmissionAndMaxRunning) {
  auto sched = make({.max_batched_tokens = 256, .prefill_chunk = 256, .max_running = 2},
                    {.num_blocks = 64, .block_size = 16});
  FakeExecutor exec(64, 16);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(sched->add_request(request(10 + i, 3 + i, i)).ok());
  std::vector<int64_t> admitted;
  RunResult r = run_to_completion(*sched, exec, [&](const SchedulerOutput& out) {
    EXPECT_LE(static_cast<int64_t>(out.seqs.size()), 2);
    for (const ScheduledSeq& e : out.seqs) {
      if (e.num_computed_tokens == 0) admitted.push_back(e.seq_id);
    }
  });
  EXPECT_EQ(admitted, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(r.outputs[i][0].size(), static_cast<size_t>(3 + i));
}

// Reference outputs: a pool large enough that nothing is ever preempted.
RunResult reference_run(const std::vector<Request>& reqs) {
  auto sched = make({.max_batched_tokens = 4096, .prefill_chunk = 4096, .max_running = 256},
                    {.num_blocks = 4096, .block_size = 4, .enable_prefix_caching = false});
  FakeExecutor exec(4096, 4);
  for (const Request& r : reqs) KILN_CHECK(sched->add_request(r).ok());
  RunResult r = run_to_completion(*sched, exec);
  KILN_CHECK(sched->num_preemptions() == 0);
  return r;
}

TEST(Scheduler, PreemptionUnderATinyPoolCompletesEveryRequest) {
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i)
    reqs.push_back(request(10, 10, i % 3 == 0 ? 7 : i));  // some share a prompt
  const RunResult want = reference_run(reqs);
  for (bool prefix_caching : {false, true}) {
    SCOPED_TRACE(prefix_caching ? "prefix caching" : "no prefix caching");
    // 6 blocks of 4 tokens; a request holds up to 19 tokens (5 blocks).
    auto sched = make({.max_batched_tokens = 32, .prefill_chunk = 8, .max_running = 8},
                      {.num_blocks = 6, .block_size = 4, .enable_prefix_caching = prefix_caching});
    FakeExecutor exec(6, 4);
    for (const Request& r : reqs) ASSERT_TRUE(sched->add_request(r).ok());
    RunResult r = run_to_completion(*sched, exec, [&](const SchedulerOutput& out) {
      for (int64_t id : out.preempted_seq_ids) {
        const Sequence* s = sched->find_sequence(id);
        ASSERT_NE(s, nullptr);
        EXPECT_EQ(s->status, SeqStatus::kWaiting);
        EXPECT_EQ(s->table.num_blocks(), 0);  // recompute mode: all its blocks are freed
      }
    });
    EXPECT_GT(sched->num_preemptions(), 0);
    EXPECT_EQ(r.outputs, want.outputs);  // every request, all 10 tokens, same tokens
    for (const auto& [id, outs] : r.outputs) EXPECT_EQ(outs[0].size(), 10u);
    EXPECT_EQ(sched->kv_stats().pool.num_used, 0);  // no leaks
    std::cout << "[ preempt ] prefix caching " << prefix_caching << ": " << r.steps << " steps, "
              << sched->num_preemptions() << " preemptions, " << r.tokens_computed
              << " tokens computed (reference " << want.tokens_computed << ")\n";
  }
}

TEST(Scheduler, ImpossibleRequestIsAClearError) {
  // 4 blocks of 16 = 64 slots; a sequence holds prompt + max_tokens - 1 tokens of K/V.
  auto sched = make({.max_batched_tokens = 64, .prefill_chunk = 64, .max_running = 4},
                    {.num_blocks = 4, .block_size = 16});
  auto too_big = sched->add_request(request(60, 6, 1));
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("needs 5 KV blocks"), std::string::npos)
      << too_big.status().message();
  EXPECT_EQ(sched->add_request(request(0, 6, 1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sched->add_request(request(4, 0, 1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sched->add_request(request(4, 4, 1, 0)).status().code(), StatusCode::kInvalidArgument);
  // Exactly fitting is fine, also next to another request that forces preemptions.
  const int64_t a = sched->add_request(request(20, 45, 1)).value();  // 64 tokens: all 4 blocks
  const int64_t b = sched->add_request(request(30, 20, 2)).value();
  FakeExecutor exec(4, 16);
  RunResult r = run_to_completion(*sched, exec);
  EXPECT_EQ(r.outputs[a][0].size(), 45u);
  EXPECT_EQ(r.outputs[b][0].size(), 20u);
  EXPECT_GT(sched->num_preemptions(), 0);
}

TEST(Scheduler, PrefixCachingSkipsTheCachedPartOfThePrompt) {
  auto sched = make({.max_batched_tokens = 512, .prefill_chunk = 512, .max_running = 8},
                    {.num_blocks = 64, .block_size = 16});
  FakeExecutor exec(64, 16);
  ASSERT_TRUE(sched->add_request(request(64, 2, 1)).ok());
  run_to_completion(*sched, exec);

  Request b = request(48, 2, 1);  // shares 48 tokens (3 blocks) with the first prompt
  for (int i = 0; i < 10; ++i) b.prompt.push_back(5000 + i);
  const int64_t id_b = sched->add_request(b).value();
  const int64_t id_c = sched->add_request(request(64, 2, 1)).value();  // the same prompt again
  std::vector<ScheduledSeq> first;
  RunResult r = run_to_completion(*sched, exec, [&](const SchedulerOutput& out) {
    if (out.step == 2) first = out.seqs;
  });
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].seq_id, id_b);
  EXPECT_EQ(first[0].num_cached_tokens, 48);
  EXPECT_EQ(first[0].num_computed_tokens, 48);
  EXPECT_EQ(first[0].num_new_tokens, 10);
  // A fully cached prompt still computes its last block (the last token's logits are needed).
  EXPECT_EQ(first[1].seq_id, id_c);
  EXPECT_EQ(first[1].num_cached_tokens, 48);
  EXPECT_EQ(first[1].num_new_tokens, 16);
  const KvCacheStats s = sched->kv_stats();
  EXPECT_EQ(s.prefix_query_tokens, 64 + 58 + 64);
  EXPECT_EQ(s.prefix_hit_tokens, 96);
  EXPECT_NEAR(s.hit_rate(), 96.0 / 186.0, 1e-12);
  EXPECT_EQ(r.outputs[id_c], reference_run({request(64, 2, 1)}).outputs[0]);
}

TEST(Scheduler, ParallelSamplingForksShareThePromptBlocks) {
  auto sched = make({.max_batched_tokens = 64, .prefill_chunk = 64, .max_running = 8},
                    {.num_blocks = 16, .block_size = 16});
  FakeExecutor exec(16, 16);
  const int64_t id = sched->add_request(request(20, 5, 1, 3)).value();
  SchedulerOutput out = sched->schedule();
  ASSERT_EQ(out.seqs.size(), 1u);
  EXPECT_EQ(out.seqs[0].num_samples, 3);
  std::vector<int32_t> sampled = exec.run(out);
  ASSERT_FALSE(HasFailure());
  UpdateResult u = sched->update(out, sampled);
  ASSERT_EQ(u.forked.size(), 2u);
  EXPECT_EQ(sched->num_running(), 3);
  EXPECT_EQ(sched->kv_stats().pool.num_used, 2);  // the prompt's 2 blocks, shared by 3

  out = sched->schedule();
  ASSERT_EQ(out.seqs.size(), 3u);
  // The first two writers copy the shared partial block (4 tokens); the last writes in place.
  ASSERT_EQ(out.block_copies.size(), 2u);
  EXPECT_EQ(out.block_copies[0].num_tokens, 4);
  EXPECT_EQ(out.block_copies[0].src, out.block_copies[1].src);
  EXPECT_EQ(sched->kv_stats().pool.num_used, 4);  // 1 shared full block + 3 tails (not 6)
  EXPECT_EQ(out.seqs[0].block_ids[0], out.seqs[2].block_ids[0]);
  sampled = exec.run(out);
  ASSERT_FALSE(HasFailure()) << "copy-on-write left a wrong K/V";
  sched->update(out, sampled);
  RunResult r = run_to_completion(*sched, exec);
  ASSERT_EQ(r.outputs[id].size(), 3u);
  std::set<int32_t> first_tokens;
  for (const auto& o : r.outputs[id]) {
    EXPECT_EQ(o.size(), 5u);
    first_tokens.insert(o[0]);
  }
  EXPECT_EQ(first_tokens.size(), 3u);  // three different samples of the same logits
  EXPECT_EQ(sched->kv_stats().pool.num_used, 0);
}

TEST(Scheduler, StopTokenFinishesEarly) {
  const RunResult ref = reference_run({request(9, 8, 3)});
  const std::vector<int32_t>& full = ref.outputs.at(0)[0];
  ASSERT_EQ(full.size(), 8u);
  auto sched = make({.max_batched_tokens = 64, .prefill_chunk = 64, .max_running = 4},
                    {.num_blocks = 16, .block_size = 4});
  Request req = request(9, 8, 3);
  req.stop_token_ids = {full[2]};
  ASSERT_TRUE(sched->add_request(req).ok());
  FakeExecutor exec(16, 4);
  RunResult r = run_to_completion(*sched, exec);
  EXPECT_EQ(r.outputs[0][0], std::vector<int32_t>(full.begin(), full.begin() + 3));
  EXPECT_EQ(r.reasons[0], FinishReason::kStop);
  EXPECT_EQ(ref.reasons.at(0), FinishReason::kLength);
}

TEST(Scheduler, AbortFreesTheRequestsBlocks) {
  auto sched = make({.max_batched_tokens = 64, .prefill_chunk = 64, .max_running = 4},
                    {.num_blocks = 32, .block_size = 4});
  FakeExecutor exec(32, 4);
  const int64_t a = sched->add_request(request(12, 30, 1, 2)).value();
  const int64_t b = sched->add_request(request(8, 5, 2)).value();
  for (int i = 0; i < 3; ++i) {
    SchedulerOutput out = sched->schedule();
    std::vector<int32_t> sampled = exec.run(out);
    ASSERT_FALSE(HasFailure());
    sched->update(out, sampled);
  }
  EXPECT_EQ(sched->num_running(), 3);
  const int64_t used = sched->kv_stats().pool.num_used;
  sched->abort_request(a);
  EXPECT_EQ(sched->num_running(), 1);
  EXPECT_LT(sched->kv_stats().pool.num_used, used);
  SchedulerOutput out = sched->schedule();
  EXPECT_EQ(out.finished_seq_ids.size(), 2u);  // the request's two sequences
  std::vector<int32_t> sampled = exec.run(out);
  ASSERT_FALSE(HasFailure());
  sched->update(out, sampled);
  RunResult r = run_to_completion(*sched, exec);
  EXPECT_EQ(r.outputs[b][0].size(), 5u);
  EXPECT_FALSE(r.outputs.count(a));
  EXPECT_EQ(sched->kv_stats().pool.num_used, 0);
}

TEST(Scheduler, StaticBatchingTakesMoreStepsThanContinuous) {
  // 16 requests, outputs of 4 or 64 tokens, 4 at a time: a static batch waits for its
  // longest member, continuous batching refills each finished slot at once.
  std::vector<Request> reqs;
  for (int i = 0; i < 16; ++i) reqs.push_back(request(8, i % 2 ? 64 : 4, i));
  const RunResult want = reference_run(reqs);
  int64_t steps[2] = {0, 0};
  for (BatchingMode mode : {BatchingMode::kContinuous, BatchingMode::kStatic}) {
    auto sched =
        make({.max_batched_tokens = 64, .prefill_chunk = 64, .max_running = 4, .batching = mode},
             {.num_blocks = 128, .block_size = 16});
    FakeExecutor exec(128, 16);
    for (const Request& r : reqs) ASSERT_TRUE(sched->add_request(r).ok());
    int64_t max_running = 0;
    RunResult r = run_to_completion(*sched, exec, [&](const SchedulerOutput& out) {
      max_running = std::max<int64_t>(max_running, static_cast<int64_t>(out.seqs.size()));
    });
    EXPECT_EQ(r.outputs, want.outputs);
    EXPECT_EQ(max_running, 4);
    steps[mode == BatchingMode::kStatic] = r.steps;
  }
  std::cout << "[ batching ] steps: continuous " << steps[0] << ", static " << steps[1] << "\n";
  // Static: 4 batches, each 1 prefill step + 63 more decode steps = 256.
  EXPECT_EQ(steps[1], 256);
  // Continuous: 8 long requests over 4 slots bound it below by 2 · 64 steps.
  EXPECT_LT(steps[0], steps[1] * 3 / 4);
  EXPECT_GE(steps[0], 128);
}

// How a batching mode ran a workload, step by step.
struct BatchTrace {
  RunResult run;
  std::vector<std::vector<int64_t>> batches;  // request ids, in admission order
  std::vector<int64_t> batch_start, batch_end;  // first step and the step its last member finished
  std::vector<int64_t> prefill_steps;           // steps of the batch that ran a prefill chunk
  int64_t mixed_steps = 0;                      // steps with a prefill chunk and a decode
  int64_t admitted_mid_batch = 0;               // requests admitted while another batch was unfinished
  int64_t num_preemptions = 0;
  int64_t padding_tokens = 0;  // classic batching's padded rows
  int64_t tokens_computed = 0;
};

BatchTrace trace_batches(BatchingMode mode, const std::vector<Request>& reqs, int64_t num_blocks) {
  auto sched = make({.max_batched_tokens = 32, .prefill_chunk = 16, .max_running = 3, .batching = mode},
                    {.num_blocks = num_blocks, .block_size = 4, .enable_prefix_caching = false});
  FakeExecutor exec(num_blocks, 4);
  for (const Request& r : reqs) KILN_CHECK(sched->add_request(r).ok());
  BatchTrace t;
  std::set<int64_t> seen, unfinished;
  std::map<int64_t, size_t> batch_of;
  for (int64_t step = 0; sched->has_unfinished(); ++step) {
    KILN_CHECK(step < 10000);
    SchedulerOutput out = sched->schedule();
    bool prefill = false, decode = false, padding = false;
    for (const ScheduledSeq& e : out.seqs) {
      if (e.padding) {  // classic: prompt pads (prefill steps) or finished rows (decode steps)
        EXPECT_EQ(e.request_id, -1);
        EXPECT_EQ(e.num_samples, 0);
        t.padding_tokens += e.num_new_tokens;
        padding = true;
        continue;
      }
      const auto prompt_len = static_cast<int64_t>(reqs[static_cast<size_t>(e.request_id)].prompt.size());
      (e.num_computed_tokens < prompt_len ? prefill : decode) = true;
      if (!seen.insert(e.request_id).second) continue;
      if (t.batch_start.empty() || t.batch_start.back() != step) {  // admitted in a new step: a new batch
        t.batches.emplace_back();
        t.batch_start.push_back(step);
        t.batch_end.push_back(-1);
        t.prefill_steps.push_back(0);
      }
      const size_t batch = t.batches.size() - 1;
      t.admitted_mid_batch += std::any_of(unfinished.begin(), unfinished.end(), [&](int64_t id) { return batch_of[id] != batch; });
      t.batches.back().push_back(e.request_id);
      batch_of[e.request_id] = t.batches.size() - 1;
      unfinished.insert(e.request_id);
    }
    t.mixed_steps += prefill && decode;
    // A step that computed pads alone (no member decodes then) is part of the padded prefill.
    if (prefill || (padding && !decode)) t.prefill_steps.back() += 1;
    std::vector<int32_t> sampled = exec.run(out);
    EXPECT_FALSE(::testing::Test::HasFailure());
    for (FinishedSeq& f : sched->update(out, sampled).finished) {
      t.run.outputs[f.request_id].push_back(f.output_tokens);
      unfinished.erase(f.request_id);
      t.batch_end[batch_of[f.request_id]] = step;
    }
    ++t.run.steps;
  }
  KILN_CHECK(sched->kv_stats().pool.num_used == 0);
  KILN_CHECK(sched->num_padding_rows() == 0);
  t.num_preemptions = sched->num_preemptions();
  t.tokens_computed = exec.tokens_computed();
  return t;
}

TEST(Scheduler, ClassicBatchingRunsEachBatchToItsLongestMember) {
  // Prompts of 6 to 40 tokens, outputs of 2 to 25; 3 at a time, a 32-token budget, 16-token chunks.
  const std::vector<std::pair<int64_t, int64_t>> shape = {{30, 4}, {6, 25}, {20, 2}, {12, 9},
                                                          {40, 3}, {8, 14}, {10, 6}};
  std::vector<Request> reqs;
  for (size_t i = 0; i < shape.size(); ++i)
    reqs.push_back(request(shape[i].first, shape[i].second, static_cast<int32_t>(i)));
  const RunResult want = reference_run(reqs);
  const BatchTrace classic = trace_batches(BatchingMode::kClassic, reqs, 256);
  EXPECT_EQ(classic.run.outputs, want.outputs);
  EXPECT_EQ(classic.admitted_mid_batch, 0);
  EXPECT_EQ(classic.mixed_steps, 0);  // the batch's prefill, then its decodes
  ASSERT_EQ(classic.batches, (std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}, {6}}));
  for (size_t b = 0; b < classic.batches.size(); ++b) {
    int64_t longest = 0;
    for (int64_t id : classic.batches[b]) longest = std::max(longest, shape[static_cast<size_t>(id)].second);
    // Padded: the batch lasts its prefill and then its longest member's decodes (the first
    // token comes with the prefill), whoever finished before; the next batch starts right after.
    EXPECT_EQ(classic.batch_end[b] - classic.batch_start[b] + 1, classic.prefill_steps[b] + longest - 1) << b;
    if (b + 1 < classic.batches.size()) {
      EXPECT_EQ(classic.batch_start[b + 1], classic.batch_end[b] + 1) << b;
    }
  }
  // Kiln's static batching keeps the batches but lets a short prompt decode during a long
  // one's prefill, so it takes fewer steps.
  const BatchTrace kiln_static = trace_batches(BatchingMode::kStatic, reqs, 256);
  EXPECT_EQ(kiln_static.run.outputs, want.outputs);
  EXPECT_EQ(kiln_static.admitted_mid_batch, 0);
  EXPECT_EQ(kiln_static.batches, classic.batches);
  EXPECT_GT(kiln_static.mixed_steps, 0);
  EXPECT_LT(kiln_static.run.steps, classic.run.steps);
  const BatchTrace continuous = trace_batches(BatchingMode::kContinuous, reqs, 256);
  EXPECT_GT(continuous.admitted_mid_batch, 0);
  EXPECT_LT(continuous.run.steps, kiln_static.run.steps);
  std::cout << "[ batching ] steps: continuous " << continuous.run.steps << ", static " << kiln_static.run.steps
            << ", classic " << classic.run.steps << "\n";
}

TEST(Scheduler, ClassicBatchingComputesThePaddedRectangle) {
  // Each batch computes B rows × (its longest prompt + its longest output - 1) positions: the
  // prompts padded to the longest, then B decode rows until the longest output is done (the
  // first output token comes with the prefill, the last is never fed back). Static batching
  // computes only the members' own tokens.
  const std::vector<std::pair<int64_t, int64_t>> shape = {{30, 4}, {6, 25}, {20, 2}, {12, 9},
                                                          {40, 3}, {8, 14}, {10, 6}};
  std::vector<Request> reqs;
  int64_t own = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    reqs.push_back(request(shape[i].first, shape[i].second, static_cast<int32_t>(i)));
    own += shape[i].first + shape[i].second - 1;
  }
  const BatchTrace classic = trace_batches(BatchingMode::kClassic, reqs, 256);
  ASSERT_EQ(classic.batches, (std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}, {6}}));
  int64_t rectangle = 0;
  for (const auto& batch : classic.batches) {
    int64_t longest_prompt = 0, longest_output = 0;
    for (int64_t id : batch) {
      longest_prompt = std::max(longest_prompt, shape[static_cast<size_t>(id)].first);
      longest_output = std::max(longest_output, shape[static_cast<size_t>(id)].second);
    }
    rectangle += static_cast<int64_t>(batch.size()) * (longest_prompt + longest_output - 1);
  }
  EXPECT_EQ(classic.tokens_computed, rectangle);
  EXPECT_EQ(classic.padding_tokens, rectangle - own);
  const BatchTrace kiln_static = trace_batches(BatchingMode::kStatic, reqs, 256);
  EXPECT_EQ(kiln_static.tokens_computed, own);
  EXPECT_EQ(kiln_static.padding_tokens, 0);
}

// The pads' blocks count in the reservation: two 4-token prompts fit beside each other, a
// 4-token and a 20-token prompt do not once the short one is padded.
TEST(Scheduler, ClassicBatchingReservesThePads) {
  // 10 blocks of 4. Each member needs blocks for prompt + 3 outputs - 1.
  const auto run = [](int64_t second_prompt) {
    return trace_batches(BatchingMode::kClassic, {request(4, 3, 0), request(second_prompt, 3, 1)}, 10);
  };
  // 4 + 2 -> 2 blocks each: 4 blocks, no pads.
  EXPECT_EQ(run(4).batches, (std::vector<std::vector<int64_t>>{{0, 1}}));
  // 2 + 6 member blocks + 4 pad blocks (16 pad tokens) = 12 > 10: one at a time. Without the
  // pads (8 blocks) they would have shared a batch.
  const BatchTrace apart = run(20);
  EXPECT_EQ(apart.batches, (std::vector<std::vector<int64_t>>{{0}, {1}}));
  EXPECT_EQ(apart.padding_tokens, 0);
  EXPECT_EQ(apart.num_preemptions, 0);
}

TEST(Scheduler, ClassicBatchingReservesEachMembersWholeLength) {
  // 12 blocks of 4 tokens; each request needs 8 + 23 = 31 tokens (8 blocks) at its end. Static
  // admits all three (their prompts fit) and preempts as they grow; classic admits one at a
  // time and never preempts.
  std::vector<Request> reqs;
  for (int i = 0; i < 3; ++i) reqs.push_back(request(8, 24, i));
  const RunResult want = reference_run(reqs);
  const BatchTrace classic = trace_batches(BatchingMode::kClassic, reqs, 12);
  EXPECT_EQ(classic.run.outputs, want.outputs);
  EXPECT_EQ(classic.num_preemptions, 0);
  EXPECT_EQ(classic.batches, (std::vector<std::vector<int64_t>>{{0}, {1}, {2}}));
  const BatchTrace kiln_static = trace_batches(BatchingMode::kStatic, reqs, 12);
  EXPECT_EQ(kiln_static.run.outputs, want.outputs);
  EXPECT_GT(kiln_static.num_preemptions, 0);
  EXPECT_EQ(kiln_static.batches.front().size(), 3u);
}

// Random arrivals, prompt families sharing prefixes, n up to 3, aborts, a small pool: every
// step the fake executor checks each K/V read and the pool its invariants; at the end every
// request that was not aborted has the outputs of the reference run and no block is held.
TEST(Scheduler, RandomWorkloadKeepsInvariants) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(seed);
    Rng rng(seed);
    const int64_t bs = 1 + static_cast<int64_t>(rng.below(8));
    std::vector<Request> reqs;
    for (int i = 0; i < 24; ++i) {
      Request r =
          request(1 + static_cast<int64_t>(rng.below(40)), 1 + static_cast<int64_t>(rng.below(20)),
                  static_cast<int32_t>(rng.below(3)), 1 + static_cast<int64_t>(rng.below(3)));
      for (uint64_t k = rng.below(10); k > 0; --k)
        r.prompt.push_back(static_cast<int32_t>(rng.below(50)));
      reqs.push_back(r);
    }
    const RunResult want = reference_run(reqs);
    SchedulerConfig sc{
        .max_batched_tokens = 4 + static_cast<int64_t>(rng.below(60)),
        .prefill_chunk = 1 + static_cast<int64_t>(rng.below(40)),
        .max_running = 1 + static_cast<int64_t>(rng.below(8)),
        .batching = rng.below(4) == 0   ? BatchingMode::kStatic
                    : rng.below(4) == 0 ? BatchingMode::kClassic
                                        : BatchingMode::kContinuous};
    const int64_t num_blocks =
        (70 + bs - 1) / bs + static_cast<int64_t>(rng.below(12));  // fits any one sequence
    auto sched = make(
        sc,
        {.num_blocks = num_blocks, .block_size = bs, .enable_prefix_caching = rng.below(2) == 0});
    FakeExecutor exec(num_blocks, bs);
    NoStarvation ns;
    std::set<int64_t> aborted;
    std::map<int64_t, int64_t> id_to_index;
    size_t next = 0;
    RunResult got;
    int64_t steps = 0;
    while (next < reqs.size() || sched->has_unfinished()) {
      while (next < reqs.size() && rng.below(3) == 0) {
        id_to_index[sched->add_request(reqs[next]).value()] = static_cast<int64_t>(next);
        ++next;
      }
      if (!sched->has_unfinished()) continue;
      if (rng.below(40) == 0) {
        auto it = id_to_index.begin();
        std::advance(it, static_cast<long>(rng.below(id_to_index.size())));
        sched->abort_request(it->first);
        aborted.insert(it->first);
        ns.ready.clear();  // aborted sequences vanish
      }
      SchedulerOutput out = sched->schedule();
      ASSERT_LE(out.num_batched_tokens, sc.max_batched_tokens);
      if (sc.batching == BatchingMode::kContinuous && sc.max_batched_tokens >= 3 * sc.max_running)
        ns.check(out);
      auto sampled = exec.run(out);
      ASSERT_FALSE(HasFailure());
      UpdateResult u = sched->update(out, sampled);
      ns.after(out, u);
      for (FinishedSeq& f : u.finished) got.outputs[f.request_id].push_back(f.output_tokens);
      sched->kv().pool().check_invariants();
      ASSERT_LT(++steps, 20000);
    }
    EXPECT_EQ(sched->kv_stats().pool.num_used, 0);
    for (const auto& [id, index] : id_to_index) {
      if (aborted.count(id)) continue;
      auto outs = got.outputs[id];
      std::sort(outs.begin(), outs.end());
      EXPECT_EQ(outs, want.outputs.at(index)) << "request " << id;
      EXPECT_EQ(static_cast<int64_t>(outs.size()), reqs[static_cast<size_t>(index)].n);
    }
  }
}

TEST(Scheduler, ConfigErrorsNameTheFlag) {
  auto bad = Scheduler::create({.max_batched_tokens = 0}, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--max-batched-tokens"), std::string::npos);
  EXPECT_FALSE(Scheduler::create({.max_running = 0}, {}).ok());
  EXPECT_FALSE(Scheduler::create({}, {.num_blocks = 0}).ok());
  EXPECT_EQ(parse_batching_mode("static"), BatchingMode::kStatic);
  EXPECT_EQ(parse_batching_mode("continuous"), BatchingMode::kContinuous);
  EXPECT_EQ(parse_batching_mode("classic"), BatchingMode::kClassic);
  for (BatchingMode m : {BatchingMode::kContinuous, BatchingMode::kStatic, BatchingMode::kClassic})
    EXPECT_EQ(parse_batching_mode(batching_mode_name(m)), m);
  EXPECT_FALSE(parse_batching_mode("dynamic").has_value());
}

}  // namespace
}  // namespace kiln
