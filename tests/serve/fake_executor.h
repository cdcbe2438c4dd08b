// A fake executor for scheduler tests: the "KV cache" holds, per physical slot, a fingerprint
// of the whole prefix ending at that position (what real K/V depends on), so a step checks
// that every position a sequence attends to holds exactly its own prefix, then writes the new
// ones. "Sampling" is a deterministic function of the sequence's tokens, so a request's output
// does not depend on how it was scheduled (batching mode, preemption, prefix hits).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "kiln/serve/scheduler.h"

namespace kiln::test {

inline uint64_t fp_mix(uint64_t h, int32_t t) {
  h ^= static_cast<uint32_t>(t) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 31);
}

class FakeExecutor {
 public:
  FakeExecutor(int64_t num_blocks, int64_t block_size, int32_t vocab = 1000)
      : bs_(block_size), vocab_(vocab), kv_(static_cast<size_t>(num_blocks * block_size), 0) {}

  // Runs one step; returns the sampled tokens in the order update() expects.
  std::vector<int32_t> run(const SchedulerOutput& out) {
    for (const BlockCopy& c : out.block_copies) {
      EXPECT_GT(c.num_tokens, 0);
      EXPECT_LT(c.num_tokens, bs_);
      for (int64_t j = 0; j < c.num_tokens; ++j) kv_[c.dst * bs_ + j] = kv_[c.src * bs_ + j];
    }
    // Reads first: every position before the new tokens holds this sequence's prefix.
    std::set<int64_t> written;
    for (const ScheduledSeq& e : out.seqs) {
      const auto fps = prefix_fps(e);
      EXPECT_GE(static_cast<int64_t>(e.block_ids.size()) * bs_,
                e.num_computed_tokens + e.num_new_tokens);
      for (int64_t p = 0; p < e.num_computed_tokens; ++p) {
        if (kv_[slot(e, p)] != fps[p]) {
          ADD_FAILURE() << "step " << out.step << " seq " << e.seq_id
                        << " reads a wrong K/V at position " << p;
          return {};
        }
      }
      for (int64_t p = e.num_computed_tokens; p < e.num_computed_tokens + e.num_new_tokens; ++p) {
        EXPECT_TRUE(written.insert(slot(e, p)).second)
            << "two writes to one slot in step " << out.step;
      }
    }
    std::vector<int32_t> sampled;
    for (const ScheduledSeq& e : out.seqs) {
      const auto fps = prefix_fps(e);
      const int64_t end = e.num_computed_tokens + e.num_new_tokens;
      for (int64_t p = e.num_computed_tokens; p < end; ++p) kv_[slot(e, p)] = fps[p];
      tokens_computed_ += e.num_new_tokens;
      for (int64_t j = 0; j < e.num_samples; ++j) sampled.push_back(token_after(fps[end - 1], j));
    }
    return sampled;
  }

  // The token sampled (sample j) after a prefix with fingerprint fp.
  int32_t token_after(uint64_t fp, int64_t j) const {
    return static_cast<int32_t>(fp_mix(fp, static_cast<int32_t>(j)) %
                                static_cast<uint64_t>(vocab_));
  }
  int64_t tokens_computed() const { return tokens_computed_; }

 private:
  int64_t slot(const ScheduledSeq& e, int64_t p) const {
    return int64_t{e.block_ids[static_cast<size_t>(p / bs_)]} * bs_ + p % bs_;
  }
  static std::vector<uint64_t> prefix_fps(const ScheduledSeq& e) {
    std::vector<uint64_t> fps(e.tokens.size());
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < e.tokens.size(); ++i) fps[i] = h = fp_mix(h, e.tokens[i]);
    return fps;
  }

  int64_t bs_;
  int32_t vocab_;
  std::vector<uint64_t> kv_;  // (num_blocks * block_size,) prefix fingerprint per slot
  int64_t tokens_computed_ = 0;
};

struct RunResult {
  int64_t steps = 0;
  int64_t tokens_computed = 0;
  std::map<int64_t, std::vector<std::vector<int32_t>>>
      outputs;                              // request -> its sequences' outputs
  std::map<int64_t, FinishReason> reasons;  // seq -> why it finished
};

// Runs the scheduler until every request finished, checking the step invariants.
template <class OnStep>
RunResult run_to_completion(Scheduler& sched, FakeExecutor& exec, OnStep&& on_step,
                            int64_t max_steps = 100000) {
  RunResult r;
  while (sched.has_unfinished()) {
    if (r.steps >= max_steps) {
      ADD_FAILURE() << "no completion after " << max_steps << " steps";
      break;
    }
    SchedulerOutput out = sched.schedule();
    EXPECT_LE(out.num_batched_tokens, sched.config().max_batched_tokens);
    EXPECT_FALSE(out.empty()) << "a step with nothing to do at step " << out.step;
    int64_t sum = 0;
    for (const ScheduledSeq& e : out.seqs) {
      EXPECT_GE(e.num_new_tokens, 1);
      sum += e.num_new_tokens;
    }
    EXPECT_EQ(sum, out.num_batched_tokens);
    on_step(out);
    std::vector<int32_t> sampled = exec.run(out);
    if (::testing::Test::HasFailure()) break;
    UpdateResult u = sched.update(out, sampled);
    for (FinishedSeq& f : u.finished) {
      r.outputs[f.request_id].push_back(f.output_tokens);
      r.reasons[f.seq_id] = f.reason;
    }
    sched.kv().pool().check_invariants();
    ++r.steps;
  }
  for (auto& [id, outs] : r.outputs) std::sort(outs.begin(), outs.end());
  r.tokens_computed = exec.tokens_computed();
  return r;
}

inline RunResult run_to_completion(Scheduler& sched, FakeExecutor& exec) {
  return run_to_completion(sched, exec, [](const SchedulerOutput&) {});
}

}  // namespace kiln::test
