// Tensor (and sequence) parallelism against the single-process run (the oracle): the same
// model, data, global batch and seed give, at every tp that divides this mpirun's P (CTest:
// P = 1..4, so tp = 1, 2, 4 and dp × tp = 2 × 2), with and without --sp, both families:
//   * the same gradients after one step, every parameter once gathered from the shards;
//   * the same loss at each of 20 steps and the same final weights;
//   * a checkpoint written at dp × tp that one process (and another layout) reads back.
// The tiny models split every way: 4 heads and d_ff 32 over 1, 2, 4 ranks; Llama has 2 KV heads,
// so tp = 4 replicates each KV head over 2 ranks (vLLM's rule) and their gradients are summed.
//
// Tolerance. tp = 1 runs the single-process code: bitwise. At tp > 1 the same products are
// summed in another order: a row-parallel Linear's output is the sum over ranks of partial
// dot products of length in / tp (then the all-reduce), the vocab-parallel loss sums exp over
// the shards, and the gradient norm sums shard squares. Each is a reassociation of n terms,
// |δ| <= γ_n Σ|terms| with γ_n ≈ n·u (u = 2^-24), in practice a random walk of ~sqrt(n)·u ≈
// 1e-6 relative; a gradient inherits it through the backward's chain (depth ~ layers), so
// relative gradient errors stay near 1e-6 where a gradient is not itself a cancellation.
// Bounds, about 10x what P = 1..4 gave on the 2-core EPYC (session 10: gradients relative RMS
// 2.9e-7, max 6.0e-7 of max |g|; losses 6.5e-8 relative; weights relative RMS 7.0e-6, max
// 4.1e-5 of max |w|): one-step gradients relative RMS (‖δg‖ / ‖g‖) 5e-6 and max |δg| 1e-5 ·
// max |g|; 20-step losses 1e-6 relative; final weights (AdamW, lr 1e-2: ~S·lr·ε, looser where
// a gradient is near zero and m/√v sign-like, as in test_data_parallel) relative RMS 1e-4, max
// 5e-4. A wrong shard, a missing reduction or a doubled bias moves these by orders of
// magnitude more.
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/comm/communicator.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/cross_entropy.h"
#include "kiln/parallel/tensor_parallel.h"
#include "kiln/quant/qat.h"
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
  c.vocab_size = 40; c.d_model = 16; c.n_layers = 2; c.n_heads = 4;
  c.n_kv_heads = f == ModelFamily::kLlama ? 2 : 4;
  c.d_ff = 32; c.max_seq_len = 16; c.tied_embeddings = f == ModelFamily::kGpt2;
  if (f == ModelFamily::kLlama) c.attention_bias = c.mlp_bias = true;  // row-parallel biases too
  return c;
}

TokenShard random_data() { return testing::random_tokens(40, 11, 4000); }

TrainOptions options() {
  TrainOptions o;
  o.batch = 12;  // divides over dp = 1, 2, 3, 4
  o.seq_len = 16;
  o.max_steps = 20;
  o.lr = 1e-2;
  o.warmup_steps = 3;
  o.eval_every = 0;
  return o;
}

struct Layout {
  int tp;
  bool sp;
  std::string name() const { return fmt::format("dp {} × tp {}{}", world().size() / tp, tp, sp ? " + sp" : ""); }
};

std::vector<Layout> layouts() {
  std::vector<Layout> out;
  for (int tp : {1, 2, 4})
    if (world().size() % tp == 0)
      for (bool sp : {false, true})
        if (tp > 1 || !sp) out.push_back({tp, sp});
  return out;
}

std::unique_ptr<TensorParallelPlan> make_plan(const Layout& l, const ModelConfig& c, const TrainOptions& o) {
  TensorParallelOptions tpo;
  tpo.tp = l.tp;
  tpo.sequence_parallel = l.sp;
  auto plan = TensorParallelPlan::create(world(), tpo, DataParallelOptions{}, c, o);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? std::move(plan).value() : nullptr;
}


TEST(TensorParallel, OneStepGradientsEqualTheSingleProcess) {
  set_num_threads(1);
  const TokenShard data = random_data();
  const TrainOptions o = options();
  std::vector<int32_t> x(o.batch * o.seq_len), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = data.tokens[i];
    y[i] = data.tokens[i + 1];
  }
  // An ignored target in every row: each data-parallel rank's rows keep the same count of
  // targets, so the average of the ranks' mean losses is the global mean (DDP's semantics).
  for (int64_t r = 0; r < o.batch; ++r) y[static_cast<size_t>(r * o.seq_len + 5)] = kIgnoreTarget;
  for (ModelFamily f : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    auto ref = Transformer::create(tiny(f), 5).value();
    const float ref_loss = ref->forward(x.data(), y.data(), o.batch, o.seq_len).value();
    ref->backward();
    for (const Layout& l : layouts()) {
      const std::string what = l.name() + (f == ModelFamily::kGpt2 ? " gpt2" : " llama");
      auto plan = make_plan(l, tiny(f), o);
      ASSERT_TRUE(plan) << what;
      auto m = Transformer::create(tiny(f), 5, plan->shard()).value();
      plan->attach(*m);
      m->set_hooks(plan.get());
      // The initial weights are the single process's, sliced.
      const std::vector<float> w0 = plan->gather_full(m->params());
      EXPECT_EQ(diff(w0, ref->params()).max_rel, 0.0) << what;
      plan->begin_step();
      plan->begin_micro_batch(true);
      const int64_t rows = o.batch / plan->data_size(), first = plan->data_rank() * rows * o.seq_len;
      const float loss = m->forward(x.data() + first, y.data() + first, rows, o.seq_len).value();
      m->backward();
      plan->finish_gradients();
      const std::vector<float> g = plan->gather_full(m->grads());
      const Diff d = diff(g, ref->grads());
      if (getenv("KILN_TEST_PRINT") && world().rank() == 0)
        fprintf(stderr, "%s: grad rel rms %.3g max %.3g\n", what.c_str(), d.rel_rms, d.max_rel);
      if (l.tp == 1 && plan->data_size() == 1) {
        EXPECT_EQ(loss, ref_loss) << what;
        EXPECT_EQ(d.max_rel, 0.0) << what;
      } else {
        EXPECT_NEAR(plan->mean_over_data(loss), ref_loss, 1e-6 * ref_loss) << what;
        EXPECT_LE(d.rel_rms, 5e-6) << what;
        EXPECT_LE(d.max_rel, 1e-5) << what;
      }
      m->set_hooks(nullptr);
    }
  }
}

TEST(TensorParallel, TwentyStepsGiveTheSingleProcessRun) {
  set_num_threads(1);
  const TokenShard data = random_data();
  const TrainOptions o = options();
  for (ModelFamily f : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    auto ref = Transformer::create(tiny(f), 5).value();
    std::vector<float> ref_losses;
    {
      Trainer t(*ref, data, nullptr, o);
      while (!t.done()) ref_losses.push_back(t.step().loss);
    }
    for (const Layout& l : layouts()) {
      const std::string what = l.name() + (f == ModelFamily::kGpt2 ? " gpt2" : " llama");
      auto plan = make_plan(l, tiny(f), o);
      ASSERT_TRUE(plan) << what;
      auto m = Transformer::create(tiny(f), 5, plan->shard()).value();
      Trainer t(*m, data, nullptr, o, plan.get());
      double worst = 0;
      for (size_t s = 0; !t.done(); ++s) {
        const float loss = t.step().loss;
        worst = std::max(worst, std::abs(static_cast<double>(loss) - ref_losses[s]) / ref_losses[s]);
      }
      const Diff d = diff(plan->gather_full(m->params()), ref->params());
      if (getenv("KILN_TEST_PRINT") && world().rank() == 0)
        fprintf(stderr, "%s: loss rel %.3g weights rel rms %.3g max %.3g\n", what.c_str(), worst, d.rel_rms, d.max_rel);
      EXPECT_LE(worst, 1e-6) << what;
      EXPECT_LE(d.rel_rms, 1e-4) << what;
      EXPECT_LE(d.max_rel, 5e-4) << what;
    }
  }
}

// The precision backends compose with the shards: each shard's Linears keep their own bf16
// (or fp8) copies (train/precision.h), refreshed from the sharded fp32 masters after every
// step; fp8 reduces each tensor's amax over every rank (tp shards and dp rows), so each takes
// the whole tensor's scale over the whole batch. The oracle is the single process at the same
// precision. Tolerance: the same rounded values summed in another order (~1e-6 relative),
// except where a value the backend rounds lands, through that reordering, on the other side of
// a rounding boundary: one ulp of its format for that element (2^-8 relative in bf16, 2^-3 in
// E4M3). On the 2-core EPYC (session 10), over 10 steps the losses stayed within 3.6e-6 (bf16)
// and 1.2e-5 (fp8, dp 2 × tp 2) relative, and step 1's gradient norm within 4.1e-8: bounds
// 1e-4 and 1e-6. Per-rank fp8 scales (no amax reduction) miss them: 4.4e-4 and 1.4e-2.
TEST(TensorParallel, LowPrecisionTrainingComposesWithTheShards) {
  if (world().size() % 2 != 0) GTEST_SKIP() << "tp 2 needs an even P";
  set_num_threads(1);
  const TokenShard data = random_data();
  for (Precision prec : {Precision::kBF16, Precision::kFP8}) {
    TrainOptions o = options();
    o.max_steps = 10;
    o.precision = prec;
    auto ref = Transformer::create(tiny(ModelFamily::kLlama), 5).value();
    std::vector<float> ref_losses;
    double ref_norm = 0;
    {
      Trainer t(*ref, data, nullptr, o);
      while (!t.done()) {
        const StepStats st = t.step();
        ref_losses.push_back(st.loss);
        if (st.step == 1) ref_norm = st.grad_norm;
      }
    }
    for (bool sp : {false, true}) {
      auto plan = make_plan({2, sp}, tiny(ModelFamily::kLlama), o);
      ASSERT_TRUE(plan);
      auto m = Transformer::create(tiny(ModelFamily::kLlama), 5, plan->shard()).value();
      Trainer t(*m, data, nullptr, o, plan.get());
      double worst = 0, first_norm = 0;
      for (size_t s = 0; !t.done(); ++s) {
        const StepStats st = t.step();
        worst = std::max(worst, std::abs(static_cast<double>(st.loss) - ref_losses[s]) / ref_losses[s]);
        if (st.step == 1) first_norm = std::abs(st.grad_norm - ref_norm) / ref_norm;
      }
      const std::string what = fmt::format("{} tp 2 sp {}", precision_name(prec), sp);
      if (getenv("KILN_TEST_PRINT") && world().rank() == 0)
        fprintf(stderr, "%s: loss rel %.3g, step-1 gradient norm rel %.3g\n", what.c_str(), worst, first_norm);
      EXPECT_LE(worst, 1e-4) << what;
      EXPECT_LE(first_norm, 1e-6) << what;
    }
  }
}

// QAT composes with the shards: a row-parallel weight's columns on each rank hold whole groups
// (check_qat_tensor_split), so each shard's fake quantization is the single process's grid,
// sliced. Tolerance as for bf16: the same grid values summed in another order, except where a
// master weight that differs by ~1e-7 relative sits on a rounding boundary of the int4 grid
// and moves a whole grid step; the 10-step losses stayed within 6.5e-8 relative on the 2-core
// EPYC (session 10): bound 1e-4, room for such flips.
TEST(TensorParallel, QatComposesWithTheShards) {
  set_num_threads(1);
  const TokenShard data = random_data();
  TrainOptions o = options();
  o.max_steps = 10;
  const quant::QatConfig qat = quant::parse_qat("w4g4").value();
  auto ref = Transformer::create(tiny(ModelFamily::kLlama), 5).value();
  ASSERT_TRUE(quant::install_qat(*ref, qat).ok());
  std::vector<float> ref_losses;
  {
    Trainer t(*ref, data, nullptr, o);
    while (!t.done()) ref_losses.push_back(t.step().loss);
  }
  for (const Layout& l : layouts()) {
    if (l.tp == 1) continue;
    ASSERT_TRUE(quant::check_qat_tensor_split(qat, tiny(ModelFamily::kLlama), l.tp).ok()) << l.name();
    auto plan = make_plan(l, tiny(ModelFamily::kLlama), o);
    ASSERT_TRUE(plan);
    auto m = Transformer::create(tiny(ModelFamily::kLlama), 5, plan->shard()).value();
    ASSERT_TRUE(quant::install_qat(*m, qat).ok());
    Trainer t(*m, data, nullptr, o, plan.get());
    double worst = 0;
    for (size_t s = 0; !t.done(); ++s)
      worst = std::max(worst, std::abs(static_cast<double>(t.step().loss) - ref_losses[s]) / ref_losses[s]);
    if (getenv("KILN_TEST_PRINT") && world().rank() == 0) fprintf(stderr, "qat %s: loss rel %.3g\n", l.name().c_str(), worst);
    EXPECT_LE(worst, 1e-4) << l.name();
  }
  // Groups of 8 straddle the 4 columns per rank of o_proj at tp 4.
  EXPECT_FALSE(quant::check_qat_tensor_split(quant::parse_qat("w4g8").value(), tiny(ModelFamily::kLlama), 4).ok());
  EXPECT_FALSE(quant::check_qat_tensor_split(quant::parse_qat("w8a8").value(), tiny(ModelFamily::kLlama), 2).ok());
}

// A unique directory per P (CTest runs the np variants as parallel processes).
std::string checkpoint_dir() { return testing::checkpoint_dir("tp_ckpt"); }

// The checkpoint of a dp × tp run holds the single-process model: one process reads the same
// weights, and the run resumes from it at another tp with the same next loss as the run that
// did not stop (within the tolerance above: the layouts sum in other orders).
TEST(TensorParallel, CheckpointsHoldTheSingleProcessModel) {
  set_num_threads(1);
  const TokenShard data = random_data();
  TrainOptions o = options();
  o.max_steps = 6;
  const int tp = world().size() % 2 == 0 ? 2 : 1;
  auto plan = make_plan({tp, tp > 1}, tiny(ModelFamily::kLlama), o);
  ASSERT_TRUE(plan);
  auto m = Transformer::create(tiny(ModelFamily::kLlama), 5, plan->shard()).value();
  Trainer t(*m, data, nullptr, o, plan.get());
  for (int i = 0; i < 3; ++i) t.step();
  const std::string dir = checkpoint_dir();
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
  // Resume on the other layout (tp 1 where this ran tp 2, and the reverse where it can).
  const int other = tp == 2 ? 1 : (world().size() % 2 == 0 ? 2 : 1);
  auto plan2 = make_plan({other, false}, tiny(ModelFamily::kLlama), o);
  ASSERT_TRUE(plan2);
  auto m2 = Transformer::create(tiny(ModelFamily::kLlama), 99, plan2->shard()).value();
  Trainer t2(*m2, data, nullptr, o, plan2.get());
  ASSERT_TRUE(t2.load_checkpoint(dir).ok());
  EXPECT_EQ(diff(plan2->gather_full(m2->params()), full).max_rel, 0.0);
  for (size_t i = 0; !t2.done(); ++i) EXPECT_NEAR(t2.step().loss, losses[i], 1e-6 * losses[i]) << "step " << i + 4;
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

// The time budget's step count comes from mean_over_data of each rank's clock: every rank of
// the world, tp ranks included, must get the same value (else one rank stops a step early and
// the others wait for it forever).
TEST(TensorParallel, EveryRankAgreesOnTheMeanOfItsClock) {
  for (const Layout& l : layouts()) {
    auto plan = make_plan(l, tiny(ModelFamily::kLlama), options());
    ASSERT_TRUE(plan);
    auto m = Transformer::create(tiny(ModelFamily::kLlama), 5, plan->shard()).value();
    plan->attach(*m);
    const double mine = plan->mean_over_data(1.0 + world().rank());  // a different clock per rank
    double lo = mine, hi = mine;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, world().handle());
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, world().handle());
    EXPECT_EQ(lo, hi) << l.name();
    EXPECT_DOUBLE_EQ(mine, 1.0 + (world().size() - 1) / 2.0) << l.name();
  }
}

// Splits that cannot work fail before any communication, with the same message on every rank.
TEST(TensorParallel, SplitsThatDoNotFitAreRefusedOnEveryRank) {
  const TrainOptions o = options();
  ModelConfig c = tiny(ModelFamily::kLlama);
  c.n_heads = 4;
  c.n_kv_heads = 4;
  auto check = [&](const TensorParallelOptions& t, const ModelConfig& cfg, const DataParallelOptions& d,
                   const char* needle, int world_size) {
    const Status s = check_tensor_parallel(t, cfg, world_size, d, o);
    EXPECT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  check({3, false}, c, {}, "n_heads (4)", 3);         // 3 does not divide 4 heads
  check({2, false}, c, {}, "does not divide the 3 ranks", 3);
  ModelConfig kv = c;
  kv.n_heads = 6; kv.n_kv_heads = 3; kv.d_ff = 36; kv.vocab_size = 36; kv.d_model = 24;
  check({2, false}, kv, {}, "n_kv_heads (3)", 2);    // neither 2 | 3 nor 3 | 2
  TrainOptions odd = o;
  odd.seq_len = 15;
  EXPECT_FALSE(check_tensor_parallel({2, true}, c, 2, {}, odd).ok());
  DataParallelOptions z;
  z.zero = 3;
  check({2, false}, c, z, "ZeRO/FSDP", 2);
  // And create() agrees, collectively, on every rank of this world.
  TensorParallelOptions bad;
  bad.tp = world().size() + 1;
  EXPECT_FALSE(TensorParallelPlan::create(world(), bad, {}, c, o).ok());
}

}  // namespace
}  // namespace kiln::parallel
