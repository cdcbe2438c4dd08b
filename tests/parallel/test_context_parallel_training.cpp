// Context parallelism in training against the single-process run (the oracle): the same Llama,
// data, global batch and seed give, at every cp that divides this mpirun's P (CTest: P = 1..4,
// so cp = 1, 2, 4 with dp = P / cp; at P = 4 also the 2 × 2 hybrid and cp 2 × tp 2, with and
// without sequence parallelism), with ring attention over the zig-zag and contiguous layouts and
// with Ulysses where the heads divide:
//   * the same gradients after one step (DDP over dp × cp; a tp shard's gathered whole);
//   * the same loss at each of 20 steps and the same final weights.
// Every target is valid, so each rank's mean over its T / cp tokens averages to the global mean.
//
// Tolerance (as in tests/parallel/test_tensor_parallel.cpp). Everything but attention is the
// same row arithmetic as one process; attention merges its blocks through their logsumexps
// (~1e-6 relative, tests/parallel/test_context_parallel.cpp) and the gradients are summed over
// ranks in another order: one-step gradients relative RMS 5e-6, max 1e-5 · max |g|; 20-step
// losses 1e-6 relative; final weights relative RMS 1e-4, max 5e-4. Wrong RoPE positions (the
// local row index instead of the global position) or a missing ring step move them by orders of
// magnitude more.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/comm/communicator.h"
#include "kiln/core/thread_pool.h"
#include "kiln/parallel/context_parallel_plan.h"
#include "kiln/train/trainer.h"
#include "tests/parallel/fixtures.h"

namespace kiln::parallel {
namespace {

using testing::diff;
using testing::Diff;

comm::Communicator& world() { return comm::Communicator::world(); }

ModelConfig tiny() {
  ModelConfig c;
  c.vocab_size = 40; c.d_model = 16; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 4;
  c.d_ff = 32; c.max_seq_len = 16; c.tied_embeddings = false;
  return c;
}

TrainOptions options() {
  TrainOptions o;
  o.batch = 4;  // divides over dp = 1, 2, 4; P = 3 runs cp 1 at dp 3: batch 12
  if (world().size() == 3) o.batch = 12;
  o.seq_len = 16;  // zig-zag over 4 ranks: 8 chunks of 2
  o.max_steps = 20;
  o.lr = 1e-2;
  o.warmup_steps = 3;
  o.eval_every = 0;
  return o;
}

struct Layout {
  int cp;
  LayoutKind layout;
  CpMethod method;
  int tp = 1;
  bool sp = false;
  std::string name() const {
    return fmt::format("dp {} × cp {} × tp {}{} {} {}", world().size() / (cp * tp), cp, tp, sp ? " sp" : "",
                       cp_method_name(method), layout_kind_name(layout));
  }
};

std::vector<Layout> layouts() {
  std::vector<Layout> out;
  for (int cp : {1, 2, 4}) {
    if (world().size() % cp != 0) continue;
    out.push_back({cp, LayoutKind::kZigzag, CpMethod::kRing});
    if (cp == 1) continue;
    out.push_back({cp, LayoutKind::kContiguous, CpMethod::kRing});
    out.push_back({cp, LayoutKind::kZigzag, CpMethod::kUlysses});
  }
  if (world().size() == 4) {  // the 2 × 2 hybrid; with tensor parallelism: attention over the shard's 2 heads
    out.push_back({4, LayoutKind::kZigzag, CpMethod::kHybrid});
    out.push_back({4, LayoutKind::kContiguous, CpMethod::kHybrid});
    out.push_back({2, LayoutKind::kZigzag, CpMethod::kRing, 2});
    out.push_back({2, LayoutKind::kContiguous, CpMethod::kRing, 2, true});
    out.push_back({2, LayoutKind::kZigzag, CpMethod::kUlysses, 2});
  }
  return out;
}

std::unique_ptr<ContextParallelPlan> make_plan(const Layout& l, const TrainOptions& o) {
  ContextParallelOptions c;
  c.cp = l.cp;
  c.layout = l.layout;
  c.method = l.method;
  TensorParallelOptions t;
  t.tp = l.tp;
  t.sequence_parallel = l.sp;
  auto plan = ContextParallelPlan::create(world(), c, t, DataParallelOptions{}, tiny(), o);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? std::move(plan).value() : nullptr;
}

TEST(ContextParallelTraining, OneStepGradientsEqualTheSingleProcess) {
  set_num_threads(1);
  const TokenShard data = testing::random_tokens(40, 11, 4000);
  const TrainOptions o = options();
  std::vector<int32_t> x(o.batch * o.seq_len), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = data.tokens[i];
    y[i] = data.tokens[i + 1];
  }
  auto ref = Transformer::create(tiny(), 5).value();
  const float ref_loss = ref->forward(x.data(), y.data(), o.batch, o.seq_len).value();
  ref->backward();
  for (const Layout& l : layouts()) {
    const std::string what = l.name();
    auto plan = make_plan(l, o);
    ASSERT_TRUE(plan) << what;
    auto m = Transformer::create(tiny(), 5, plan->tensor_shard(), {}, {}, plan->shard()).value();
    plan->attach(*m);
    plan->begin_step();
    plan->begin_micro_batch(true);
    const int64_t rows = o.batch / plan->data_size(), first = plan->data_rank() * rows * o.seq_len;
    const double loss = plan->forward_backward(*m, x.data() + first, y.data() + first, rows, o.seq_len, 1.0f);
    plan->finish_gradients();
    const Diff d = diff(plan->gather_full(m->grads()), ref->grads());
    if (getenv("KILN_TEST_PRINT") && world().rank() == 0)
      fprintf(stderr, "%s: grad rel rms %.3g max %.3g\n", what.c_str(), d.rel_rms, d.max_rel);
    EXPECT_NEAR(plan->mean_over_data(loss), ref_loss, 1e-6 * ref_loss) << what;
    EXPECT_LE(d.rel_rms, 5e-6) << what;
    EXPECT_LE(d.max_rel, 1e-5) << what;
    m->set_hooks(nullptr);
  }
}

TEST(ContextParallelTraining, TwentyStepsGiveTheSingleProcessRun) {
  set_num_threads(1);
  const TokenShard data = testing::random_tokens(40, 11, 4000);
  const TrainOptions o = options();
  auto ref = Transformer::create(tiny(), 5).value();
  std::vector<float> ref_losses;
  {
    Trainer t(*ref, data, nullptr, o);
    while (!t.done()) ref_losses.push_back(t.step().loss);
  }
  for (const Layout& l : layouts()) {
    const std::string what = l.name();
    auto plan = make_plan(l, o);
    ASSERT_TRUE(plan) << what;
    auto m = Transformer::create(tiny(), 5, plan->tensor_shard(), {}, {}, plan->shard()).value();
    Trainer t(*m, data, nullptr, o, plan.get());
    double worst = 0;
    for (size_t s = 0; !t.done(); ++s)
      worst = std::max(worst, std::abs(static_cast<double>(t.step().loss) - ref_losses[s]) / ref_losses[s]);
    const Diff d = diff(plan->gather_full(m->params()), ref->params());
    if (getenv("KILN_TEST_PRINT") && world().rank() == 0)
      fprintf(stderr, "%s: loss rel %.3g weights rel rms %.3g max %.3g\n", what.c_str(), worst, d.rel_rms, d.max_rel);
    EXPECT_LE(worst, 1e-6) << what;
    EXPECT_LE(d.rel_rms, 1e-4) << what;
    EXPECT_LE(d.max_rel, 5e-4) << what;
  }
}

TEST(ContextParallelTraining, BadLayoutsAreRefusedAlike) {
  const TrainOptions o = options();
  auto msg = [&](ContextParallelOptions c, int world_size, TrainOptions t) {
    return check_context_parallel(c, {}, tiny(), world_size, {}, t).message();
  };
  EXPECT_NE(msg({3, LayoutKind::kZigzag, CpMethod::kRing}, 2, o).find("does not divide"), std::string::npos);
  TrainOptions odd = o;
  odd.seq_len = 12;
  EXPECT_NE(msg({4, LayoutKind::kZigzag, CpMethod::kRing}, 4, odd).find("multiple of 8"), std::string::npos);
  ModelConfig three = tiny();
  three.n_heads = three.n_kv_heads = 2;
  three.d_model = 16;
  EXPECT_NE(check_context_parallel({4, LayoutKind::kZigzag, CpMethod::kUlysses}, {}, three, 4, {}, o).message().find("ring"),
            std::string::npos);
  // With tp the heads Ulysses moves are the shard's: 4 heads over tp 2 × cp 4 do not divide.
  EXPECT_NE(check_context_parallel({4, LayoutKind::kZigzag, CpMethod::kUlysses}, {2, false}, tiny(), 8, {}, o)
                .message()
                .find("--tp 2 must divide"),
            std::string::npos);
  EXPECT_NE(msg({2, LayoutKind::kZigzag, CpMethod::kRing}, 3, o).find("does not divide"), std::string::npos);
  EXPECT_NE(msg({4, LayoutKind::kZigzag, CpMethod::kHybrid, 3}, 4, o).find("must be >= 2 and divide --cp 4"),
            std::string::npos);
  EXPECT_TRUE(msg({4, LayoutKind::kZigzag, CpMethod::kHybrid, 2}, 4, o).empty());
  // Sequence parallelism splits the T / cp local rows over tp: 16 / 2 = 8 rows over tp 3 do not.
  ModelConfig six = tiny();
  six.n_heads = six.n_kv_heads = 6;
  six.d_model = 24;
  six.d_ff = 36;
  six.vocab_size = 42;
  EXPECT_NE(check_context_parallel({2, LayoutKind::kZigzag, CpMethod::kRing}, {3, true}, six, 6, {}, o)
                .message()
                .find("--sp"),
            std::string::npos);
  TrainOptions ckpt = o;
  ckpt.checkpoint = CheckpointMode::kFull;
  EXPECT_NE(msg({2, LayoutKind::kZigzag, CpMethod::kRing}, 2, ckpt).find("checkpointing"), std::string::npos);
}

}  // namespace
}  // namespace kiln::parallel
