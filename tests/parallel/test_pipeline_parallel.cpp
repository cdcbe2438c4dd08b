// Pipeline parallelism against the single-process run (the oracle): the same model, data,
// global batch and seed give, for GPipe, 1F1B and ZB-H1 at every pp that divides this mpirun's
// P (CTest: P = 1..4, so pp = 2, 3, 4, dp 2 × pp 2 with DDP and ZeRO-1, pp 2 × tp 2 with and
// without sequence parallelism), M = 1…8 micro-batches,
// and interleaved 1F1B with 2 chunks per rank where M divides by pp, both families:
//   * the same gradients after one step, every parameter gathered from the stages;
//   * the same loss at each of 20 steps;
//   * each stage's activation slots in use at once equal the schedule's bound;
//   * a checkpoint written by the stages that one process reads back.
// The executor's receive waits end the job with a message after KILN_COMM_TIMEOUT, and the
// MPI test main's watchdog fails a hung test: a deadlock cannot pass silently.
//
// Tolerance. A stage runs the single-process layer code in the same order, so a pipeline of
// one micro-batch is the single-process step but for the tied embedding's gradient, summed
// from two stages (the whole model adds the embedding's rows onto the head's part: a
// reassociation of two partial sums, a few ulps). With M micro-batches the gradient is the
// mean over micro-batches of each one's mean-loss gradient instead of one mean over the batch:
// the same terms summed in M groups, |δ| ≲ γ_M · Σ|terms|, ~1e-7 relative. tp adds its own
// reassociations (test_tensor_parallel.cpp). Over 20 AdamW steps at lr 1e-2 these ulps grow
// (Adam's m/√v turns a tiny perturbation of a near-zero gradient into a different update; a
// non-power-of-two M also rounds the 1/M that averages the micro-batches). Measured on the
// 2-core EPYC at P = 1..4 with this 8-block model (session 11): one-step gradients relative RMS
// 3.7e-7, max 6.8e-7 of max |g|; 20-step losses 8.9e-6 relative (pp 2 × dp 2, M = 8, Llama;
// 2.6e-6 or less at dp 1). Bounds: gradients relative RMS 5e-6 and max 1e-5 of max |g| (10×);
// one-step loss 1e-6 relative; 20-step losses 1e-4 relative (10×, as the weights' bound of
// test_tensor_parallel.cpp). GPipe, 1F1B, interleaved 1F1B and ZB-H1 accumulate the
// micro-batches in the same order: they agree bitwise with each other. A dropped micro-batch,
// a stage that used the wrong input, a missing tied-embedding sum or a doubled one moves the
// one-step gradients by orders of magnitude more (1e-2 and up).
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/comm/communicator.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/cross_entropy.h"
#include "kiln/parallel/pipeline.h"
#include "kiln/train/sharded_checkpoint.h"
#include "kiln/train/trainer.h"
#include "tests/parallel/fixtures.h"

namespace kiln::parallel {
namespace {

using testing::diff;
using testing::Diff;

comm::Communicator& world() { return comm::Communicator::world(); }

ModelConfig tiny(ModelFamily f) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 40; c.d_model = 16; c.n_layers = 8; c.n_heads = 4;  // 2 chunks per rank at pp 4
  c.n_kv_heads = f == ModelFamily::kLlama ? 2 : 4;
  c.d_ff = 32; c.max_seq_len = 8;
  c.tied_embeddings = true;  // the last stage's copy of the embedding, summed with the first's
  return c;
}

TokenShard random_data() { return testing::random_tokens(40, 11, 6000); }

TrainOptions options(int64_t batch) {
  TrainOptions o;
  o.batch = batch;
  o.seq_len = 8;
  o.max_steps = 20;
  o.lr = 1e-2;
  o.warmup_steps = 3;
  o.eval_every = 0;
  return o;
}

struct Layout {
  int pp, tp;
  int zero = 0;
  bool sp = false;  // sequence parallelism in each stage's tp group
  int dp() const { return world().size() / (pp * tp); }
  std::string name() const {
    return fmt::format("pp {} × {} {} × tp {}{}", pp, zero ? "zero1" : "dp", dp(), tp, sp ? " + sp" : "");
  }
};

// The pipeline alone (dp = P / pp DDP ranks beside it), or composed with tensor parallelism
// (with and without sequence parallelism) and ZeRO-1 at P = 4. Each set is its own test, so
// each stays well inside the MPI test main's per-test watchdog (ASan builds run ~3x slower).
std::vector<Layout> layouts(bool composed) {
  std::vector<Layout> out;
  if (!composed) {
    for (int pp : {2, 3, 4})
      if (world().size() % pp == 0) out.push_back({pp, 1});
  } else if (world().size() == 4) {
    out.push_back({2, 2});
    out.push_back({2, 2, 0, true});
    out.push_back({2, 1, 1});  // ZeRO-1 over the data-parallel pair of each stage
  }
  return out;
}

// Every M = 1…8 for the pipeline alone; an odd, an even and a square M for the compositions.
std::vector<int> micro_batch_counts(bool composed) {
  return composed ? std::vector<int>{1, 3, 4} : std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8};
}

const pipeline::ScheduleKind kSchedules[] = {pipeline::ScheduleKind::kGpipe, pipeline::ScheduleKind::k1F1B,
                                             pipeline::ScheduleKind::kInterleaved1F1B,
                                             pipeline::ScheduleKind::kZeroBubbleH1};
// Interleaved runs 2 chunks per rank where Megatron's rule allows it (M divisible by pp); ZB-H1
// is refused with sequence parallelism (its W would read gathered scratch).
bool runs(pipeline::ScheduleKind s, const Layout& l, int M) {
  if (s == pipeline::ScheduleKind::kZeroBubbleH1 && l.sp) return false;
  return s != pipeline::ScheduleKind::kInterleaved1F1B || M % l.pp == 0;
}

std::unique_ptr<PipelineParallelPlan> make_plan(const Layout& l, pipeline::ScheduleKind s, int M, const ModelConfig& c,
                                                const TrainOptions& o) {
  PipelineOptions po;
  po.pp = l.pp;
  po.micro_batches = M;
  po.schedule = s;
  po.virtual_stages = s == pipeline::ScheduleKind::kInterleaved1F1B ? 2 : 1;
  TensorParallelOptions tpo;
  tpo.tp = l.tp;
  tpo.sequence_parallel = l.sp;
  DataParallelOptions dpo;
  dpo.zero = l.zero;
  auto plan = PipelineParallelPlan::create(world(), po, tpo, dpo, c, o);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? std::move(plan).value() : nullptr;
}


const char* family(ModelFamily f) { return f == ModelFamily::kGpt2 ? "gpt2" : "llama"; }

// The gathered timeline is on one clock: a stage's forward of a micro-batch starts after the
// previous stage's forward of it ended (its activation was sent after that end was stamped), and
// its backward after the next stage's backward. Causality, not timing: ranks stamping times from
// their own epochs break it by their start-up skew.
void expect_causal(const std::vector<pipeline::TimedAction>& timeline, int stages, int M, const std::string& what) {
  std::map<std::pair<int, int>, pipeline::TimedAction> fwd, bwd;  // (micro-batch, stage)
  for (const pipeline::TimedAction& t : timeline) {
    const pipeline::ActionKind k = t.action.kind;
    if (k == pipeline::ActionKind::kForward) fwd[{t.action.micro_batch, t.action.stage}] = t;
    if (k == pipeline::ActionKind::kBackward || k == pipeline::ActionKind::kBackwardInput)
      bwd[{t.action.micro_batch, t.action.stage}] = t;
  }
  ASSERT_EQ(fwd.size(), static_cast<size_t>(stages * M)) << what;
  ASSERT_EQ(bwd.size(), static_cast<size_t>(stages * M)) << what;
  for (int i = 0; i < M; ++i)
    for (int s = 1; s < stages; ++s) {
      const auto key = std::make_pair(i, s), before = std::make_pair(i, s - 1);
      EXPECT_GE(fwd[key].start, fwd[before].end) << what << " F of micro-batch " << i << " on stage " << s;
      EXPECT_GE(bwd[before].start, bwd[key].end) << what << " B of micro-batch " << i << " on stage " << s - 1;
    }
}

void one_step_gradients(bool composed, pipeline::ScheduleKind s) {
  set_num_threads(1);
  const TokenShard data = random_data();
  for (ModelFamily f : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    for (const Layout& l : layouts(composed)) {
      for (int M : micro_batch_counts(composed)) {
        const TrainOptions o = options(int64_t{l.dp()} * M);  // one row per micro-batch
        std::vector<int32_t> x(static_cast<size_t>(o.batch * o.seq_len)), y(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
          x[i] = data.tokens[i];
          y[i] = data.tokens[i + 1];
        }
        // An ignored target in every row: each micro-batch keeps the same count of targets, so
        // the mean of their mean losses is the batch's mean.
        for (int64_t r = 0; r < o.batch; ++r) y[static_cast<size_t>(r * o.seq_len + 3)] = kIgnoreTarget;
        auto ref = Transformer::create(tiny(f), 5).value();
        const float ref_loss = ref->forward(x.data(), y.data(), o.batch, o.seq_len).value();
        ref->backward();
        {
          if (!runs(s, l, M)) continue;
          const std::string what =
              fmt::format("{} {} M={} {}", l.name(), pipeline::schedule_name(s), M, family(f));
          auto plan = make_plan(l, s, M, tiny(f), o);
          ASSERT_TRUE(plan) << what;
          auto m = Transformer::create(tiny(f), 5, plan->shard(), plan->stage()).value();
          plan->attach(*m);
          m->set_hooks(plan.get());
          EXPECT_EQ(diff(plan->gather_full(m->params()), ref->params()).max_rel, 0.0) << what;
          plan->begin_step();
          plan->begin_micro_batch(true);
          const int64_t rows = o.batch / plan->data_size(), first = plan->data_rank() * rows * o.seq_len;
          const double loss = plan->forward_backward(*m, x.data() + first, y.data() + first, rows, o.seq_len, 1.0f) / M;
          plan->finish_gradients();
          std::vector<float> g = plan->gather_full(m->grads());
          for (float& v : g) v /= static_cast<float>(M);
          const Diff d = diff(g, ref->grads());
          if (getenv("KILN_TEST_PRINT") && world().rank() == 0)
            fprintf(stderr, "%s: grad rel rms %.3g max %.3g\n", what.c_str(), d.rel_rms, d.max_rel);
          EXPECT_NEAR(plan->mean_over_data(loss), ref_loss, 1e-6 * ref_loss) << what;
          EXPECT_LE(d.rel_rms, 5e-6) << what;
          EXPECT_LE(d.max_rel, 1e-5) << what;
          // Activations held at once: the schedule's bound on every stage.
          const std::vector<StagePeak> peaks = plan->gather_peaks();
          const std::vector<int> bound = pipeline::activation_bound(plan->schedule().spec);
          for (int r = 0; r < l.pp; ++r) EXPECT_EQ(peaks[static_cast<size_t>(r)].micro_batches, bound[static_cast<size_t>(r)]) << what << " stage " << r;
          expect_causal(plan->gather_timeline(), plan->schedule().spec.stages(), M, what);
          m->set_hooks(nullptr);
        }
      }
    }
  }
}


void twenty_steps(bool composed, pipeline::ScheduleKind s) {
  set_num_threads(1);
  const TokenShard data = random_data();
  for (ModelFamily f : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    for (const Layout& l : layouts(composed)) {
      std::map<int64_t, std::vector<float>> ref_losses;  // by batch
      for (int M : micro_batch_counts(composed)) {
        const TrainOptions o = options(int64_t{l.dp()} * M);
        if (!ref_losses.count(o.batch)) {
          auto ref = Transformer::create(tiny(f), 5).value();
          Trainer t(*ref, data, nullptr, o);
          while (!t.done()) ref_losses[o.batch].push_back(t.step().loss);
        }
        const std::vector<float>& want = ref_losses[o.batch];
        {
          if (!runs(s, l, M)) continue;
          const std::string what =
              fmt::format("{} {} M={} {}", l.name(), pipeline::schedule_name(s), M, family(f));
          auto plan = make_plan(l, s, M, tiny(f), o);
          ASSERT_TRUE(plan) << what;
          auto m = Transformer::create(tiny(f), 5, plan->shard(), plan->stage()).value();
          Trainer t(*m, data, nullptr, o, plan.get());
          double worst = 0;
          for (size_t i = 0; !t.done(); ++i) {
            const float loss = t.step().loss;
            worst = std::max(worst, std::abs(static_cast<double>(loss) - want[i]) / want[i]);
          }
          if (getenv("KILN_TEST_PRINT") && world().rank() == 0) fprintf(stderr, "%s: loss rel %.3g\n", what.c_str(), worst);
          EXPECT_LE(worst, 1e-4) << what;
        }
      }
    }
  }
}

// One test per schedule and layout set, each well inside the per-test watchdog (the 20-step
// runs are the suite's longest; ASan builds run ~3x slower than release).
class PipelineOracle : public ::testing::TestWithParam<std::tuple<pipeline::ScheduleKind, bool>> {};

TEST_P(PipelineOracle, OneStepGradientsEqualTheSingleProcess) {
  one_step_gradients(std::get<1>(GetParam()), std::get<0>(GetParam()));
}
TEST_P(PipelineOracle, TwentyStepsGiveTheSingleProcessRun) {
  twenty_steps(std::get<1>(GetParam()), std::get<0>(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineOracle,
                         ::testing::Combine(::testing::ValuesIn(kSchedules), ::testing::Bool()),
                         [](const auto& info) {
                           std::string name(pipeline::schedule_name(std::get<0>(info.param)));
                           std::erase(name, '-');
                           return name + (std::get<1>(info.param) ? "_composed" : "_alone");
                         });

TEST(PipelineParallel, CheckpointsHoldTheSingleProcessModel) {
  set_num_threads(1);
  if (world().size() % 2 != 0) GTEST_SKIP() << "pp 2 needs an even P";
  const TokenShard data = random_data();
  TrainOptions o = options(4 * world().size() / 2);
  o.max_steps = 6;
  // At P = 4 the data-parallel pair of each stage shards AdamW's state (ZeRO-1): the checkpoint
  // maps each rank's shard to the single-process offsets.
  auto plan = make_plan({2, 1, world().size() == 4 ? 1 : 0}, pipeline::ScheduleKind::k1F1B, 4,
                        tiny(ModelFamily::kLlama), o);
  ASSERT_TRUE(plan);
  auto m = Transformer::create(tiny(ModelFamily::kLlama), 5, plan->shard(), plan->stage()).value();
  Trainer t(*m, data, nullptr, o, plan.get());
  for (int i = 0; i < 3; ++i) t.step();
  const std::string dir = testing::checkpoint_dir("pp_ckpt");
  ASSERT_TRUE(t.save_checkpoint(dir).ok());
  const std::vector<float> full = plan->gather_full(m->params());
  std::vector<float> losses;
  while (!t.done()) losses.push_back(t.step().loss);
  world().barrier();
  auto whole = load_checkpoint_whole(dir);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  EXPECT_EQ(whole->meta.step, 3);
  ASSERT_EQ(whole->params.size(), full.size());
  EXPECT_EQ(diff(whole->params, full).max_rel, 0.0);
  // One process resumes the stages' checkpoint and continues with the same losses.
  auto single = Transformer::create(tiny(ModelFamily::kLlama), 99).value();
  TrainOptions o1 = o;
  Trainer t1(*single, data, nullptr, o1);
  ASSERT_TRUE(t1.load_checkpoint(dir).ok());
  EXPECT_EQ(diff(full, single->params()).max_rel, 0.0);
  for (size_t i = 0; !t1.done(); ++i) EXPECT_NEAR(t1.step().loss, losses[i], 1e-6 * losses[i]) << "step " << i + 4;
  // The stages resume it too, on another schedule (the last stage reads its embedding copy from
  // the first stage's offsets): the same losses.
  auto plan2 = make_plan({2, 1}, pipeline::ScheduleKind::kZeroBubbleH1, 2, tiny(ModelFamily::kLlama), o);
  ASSERT_TRUE(plan2);
  auto m2 = Transformer::create(tiny(ModelFamily::kLlama), 99, plan2->shard(), plan2->stage()).value();
  Trainer t2(*m2, data, nullptr, o, plan2.get());
  ASSERT_TRUE(t2.load_checkpoint(dir).ok());
  EXPECT_EQ(diff(plan2->gather_full(m2->params()), full).max_rel, 0.0);
  for (size_t i = 0; !t2.done(); ++i) EXPECT_NEAR(t2.step().loss, losses[i], 1e-6 * losses[i]) << "step " << i + 4;
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

// Flags that cannot work fail before any communication, with the same message on every rank.
TEST(PipelineParallel, LayoutsThatDoNotFitAreRefusedOnEveryRank) {
  const ModelConfig c = tiny(ModelFamily::kLlama);
  const TrainOptions o = options(8);
  auto refused = [&](PipelineOptions po, TensorParallelOptions tpo, TrainOptions t, const char* needle) {
    const Status s = check_pipeline_parallel(po, c, 4, tpo, DataParallelOptions{}, t);
    EXPECT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  PipelineOptions po;
  po.pp = 2;
  po.micro_batches = 4;
  PipelineOptions bad = po;
  bad.layers = {2, 1};  // 3 of the 4 blocks: never silently dropped
  refused(bad, {}, o, "sums to 3 blocks, but the model has 8");
  bad = po;
  bad.pp = 3;
  refused(bad, {}, o, "does not divide");
  bad = po;
  bad.micro_batches = 3;
  refused(bad, {}, o, "--micro-batches 3");
  bad = po;
  bad.schedule = pipeline::ScheduleKind::kZeroBubbleH1;
  TrainOptions bf16 = o;
  bf16.precision = Precision::kBF16;
  refused(bad, {}, bf16, "zb-h1");
  bad = po;
  bad.pp = 1;
  bad.schedule = pipeline::ScheduleKind::kInterleaved1F1B;
  bad.virtual_stages = 2;
  refused(bad, {}, o, "--virtual-stages 2");
  EXPECT_TRUE(check_pipeline_parallel(po, c, 4, {}, DataParallelOptions{}, o).ok());
}

}  // namespace
}  // namespace kiln::parallel
