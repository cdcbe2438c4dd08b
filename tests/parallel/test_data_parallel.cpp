// Every data-parallel layout against the single-process run (the oracle): the same model,
// data, global batch and seed give the same loss at each of 20 steps and the same final
// weights, both families, at whatever P this mpirun has (CTest: 1..4).
//
// Tolerance. At P = 1 every layout computes in the single process's order (one rank's rows
// are the whole batch; an average over one rank divides by 1): bitwise, except ZeRO-2/3 with
// gradient accumulation (see below). At P > 1 the forward
// of a row is the same computation, but gradients sum over rows in another order (each rank's
// GEMM over its rows, then the all-reduce or reduce-scatter across ranks), so a gradient
// differs by a few units in the last place: |δg| <= γ_n Σ|terms| with γ_n = n·u, u = 2^-24,
// n the rows summed (here ~200), in practice a random walk of sqrt(n)·u ≈ 1e-6 relative.
// AdamW turns a relative gradient error ε into a relative update error of about ε (m/√v is
// scale-free), so after S = 20 steps of lr = 1e-2 a weight differs by at most ~S·lr·ε ≈ 2e-7
// where the gradient is well away from zero; where it is near zero, m/√v is sign-like and
// the difference grows faster, so the max is looser than the mean. Bounds, each about 10x
// what P = 2..4 gave on the 2-core EPYC (session 9: loss 6.7e-8 relative, weights RMS
// 5.2e-7, max 2.2e-5): losses 1e-6 relative, weights RMS 5e-6 and max 3e-4. A dropped bucket
// element or shard moves the RMS by orders of magnitude more.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/comm/communicator.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/parallel/data_parallel.h"
#include "kiln/train/sharded_checkpoint.h"
#include "kiln/train/trainer.h"
#include "tests/parallel/fixtures.h"

namespace kiln::parallel {
namespace {

comm::Communicator& world() { return comm::Communicator::world(); }

ModelConfig tiny(ModelFamily f) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 37; c.d_model = 16; c.n_layers = 3; c.n_heads = 2;
  c.n_kv_heads = f == ModelFamily::kLlama ? 1 : 2;
  c.d_ff = 32; c.max_seq_len = 16; c.tied_embeddings = f == ModelFamily::kGpt2;
  return c;
}

TokenShard random_data() { return testing::random_tokens(37, 7, 4000); }

TrainOptions options(int64_t grad_accum = 1) {
  TrainOptions o;
  o.batch = 12;  // divides over 1, 2, 3 and 4 ranks
  o.seq_len = 16;
  o.max_steps = 20;
  o.lr = 1e-2;
  o.warmup_steps = 3;
  o.eval_every = 0;
  o.grad_accum = grad_accum;
  return o;
}

struct RunResult {
  std::vector<float> losses;
  std::vector<double> norms;
  std::vector<float> weights;
};

RunResult single_process(ModelFamily f, const TrainOptions& o) {
  const TokenShard data = random_data();
  auto m = Transformer::create(tiny(f), 5).value();
  Trainer t(*m, data, nullptr, o);
  RunResult r;
  while (!t.done()) {
    const StepStats s = t.step();
    r.losses.push_back(s.loss);
    r.norms.push_back(s.grad_norm);
  }
  r.weights.assign(m->params().begin(), m->params().end());
  return r;
}

RunResult layout(ModelFamily f, const TrainOptions& o, const DataParallelOptions& dpo) {
  const TokenShard data = random_data();
  auto m = Transformer::create(tiny(f), 5).value();
  auto plan = DataParallelPlan::create(world(), dpo, o);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  if (!plan.ok()) return {};
  Trainer t(*m, data, nullptr, o, plan->get());
  RunResult r;
  while (!t.done()) {
    const StepStats s = t.step();
    r.losses.push_back(s.loss);
    r.norms.push_back(s.grad_norm);
  }
  r.weights = (*plan)->gather_full_params();
  return r;
}

// `bitwise`: the layout sums in the single process's order.
void expect_matches(const RunResult& ref, const RunResult& got, bool bitwise, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  ASSERT_EQ(got.weights.size(), ref.weights.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    if (bitwise) EXPECT_EQ(got.losses[i], ref.losses[i]) << what << " step " << i + 1;
    else EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-6 * std::abs(ref.losses[i])) << what << " step " << i + 1;
  }
  double sq = 0, most = 0;
  for (size_t i = 0; i < ref.weights.size(); ++i) {
    const double d = std::abs(static_cast<double>(got.weights[i]) - ref.weights[i]);
    sq += d * d;
    most = std::max(most, d);
  }
  const double rms = std::sqrt(sq / static_cast<double>(ref.weights.size()));
  if (getenv("KILN_TEST_PRINT") && world().rank() == 0) { double dl = 0; for (size_t i = 0; i < ref.losses.size(); ++i) dl = std::max(dl, std::abs((double)got.losses[i] - ref.losses[i]) / std::abs(ref.losses[i])); fprintf(stderr, "%s: loss rel %.3g  rms %.3g  max %.3g\n", what.c_str(), dl, rms, most); }
  if (bitwise) {
    EXPECT_EQ(most, 0.0) << what;
  } else {
    EXPECT_LE(rms, 5e-6) << what;
    EXPECT_LE(most, 3e-4) << what;
  }
}

struct Case {
  const char* name;
  DataParallelOptions o;
  int64_t grad_accum = 1;
  CheckpointMode ckpt = CheckpointMode::kNone;
};

std::vector<Case> cases() {
  const int p = world().size();
  std::vector<Case> c;
  DataParallelOptions ddp;
  ddp.bucket_mb = 0.004;  // ~1000 floats: several buckets, some parameters alone in one
  c.push_back({"ddp", ddp});
  DataParallelOptions no_overlap = ddp;
  no_overlap.overlap = false;
  c.push_back({"ddp no overlap", no_overlap});
  c.push_back({"ddp grad-accum 2 (no_sync)", ddp, 2});
  for (int z = 1; z <= 3; ++z) {
    DataParallelOptions zo;
    zo.zero = z;
    c.push_back({z == 1 ? "zero1" : z == 2 ? "zero2" : "zero3", zo});
  }
  DataParallelOptions fsdp;
  fsdp.zero = 3;
  fsdp.prefetch = 0;
  c.push_back({"fsdp no prefetch", fsdp});
  fsdp.prefetch = 2;
  fsdp.fsdp_unit_blocks = 2;
  c.push_back({"fsdp unit 2 blocks, prefetch 2", fsdp});
  fsdp.reshard_after_forward = false;
  fsdp.fsdp_unit_blocks = 1;
  fsdp.prefetch = 1;
  c.push_back({"fsdp keep after forward", fsdp});
  DataParallelOptions z3;
  z3.zero = 3;
  c.push_back({"fsdp grad-accum 2", z3, 2});
  c.push_back({"fsdp + full activation checkpointing", z3, 1, CheckpointMode::kFull});
  if (p % 2 == 0 && p > 2) {
    DataParallelOptions h;
    h.zero = 3;
    h.shard_group = 2;
    c.push_back({"hsdp zero3 shard 2", h});
    h.zero = 2;
    c.push_back({"hsdp zero2 shard 2", h});
  }
  return c;
}

TEST(DataParallel, EveryLayoutGivesTheSingleProcessRun) {
  set_num_threads(1);
  for (ModelFamily f : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    for (const Case& c : cases()) {
      TrainOptions o = options(c.grad_accum);
      o.checkpoint = c.ckpt;
      const RunResult ref = single_process(f, o);
      const RunResult got = layout(f, o, c.o);
      // ZeRO-2/3 add each micro-batch's reduced gradient to the shard; the single process adds
      // it inside the weight-gradient GEMM (beta = 1): another rounding order, even at P = 1.
      const bool bitwise = world().size() == 1 && !(c.o.zero >= 2 && c.grad_accum > 1);
      expect_matches(ref, got, bitwise, std::string(c.name) + (f == ModelFamily::kGpt2 ? " gpt2" : " llama"));
    }
  }
}

std::string checkpoint_dir(const std::string& name) { return testing::checkpoint_dir("dp_" + name); }

// Sharded checkpoints: resuming at the same layout is bitwise the uninterrupted run; another
// layout, and one process, read the same state (resharding); a single-process file resumes
// on P ranks.
TEST(DataParallel, ShardedCheckpointsResumeAndReshard) {
  set_num_threads(1);
  const TokenShard data = random_data();
  TrainOptions o = options();
  o.max_steps = 8;
  DataParallelOptions z3;
  z3.zero = 3;
  auto straight_model = Transformer::create(tiny(ModelFamily::kLlama), 5).value();
  auto straight_plan = DataParallelPlan::create(world(), z3, o).value();
  Trainer straight(*straight_model, data, nullptr, o, straight_plan.get());
  std::vector<float> losses;
  while (!straight.done()) losses.push_back(straight.step().loss);
  const std::string dir = checkpoint_dir("resume");
  std::vector<float> at4;
  {
    auto m = Transformer::create(tiny(ModelFamily::kLlama), 5).value();
    auto plan = DataParallelPlan::create(world(), z3, o).value();
    Trainer t(*m, data, nullptr, o, plan.get());
    for (int i = 0; i < 4; ++i) EXPECT_EQ(t.step().loss, losses[static_cast<size_t>(i)]);
    ASSERT_TRUE(t.save_checkpoint(dir).ok());
    at4 = plan->gather_full_params();
  }
  for (int zero : {3, 1, 0}) {  // the same layout, then resharded into others
    auto m = Transformer::create(tiny(ModelFamily::kLlama), 99).value();  // other initial weights
    DataParallelOptions d;
    d.zero = zero;
    auto plan = DataParallelPlan::create(world(), d, o).value();
    Trainer t(*m, data, nullptr, o, plan.get());
    const Status s = t.load_checkpoint(dir);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(t.steps_done(), 4);
    EXPECT_EQ(plan->gather_full_params(), at4) << "zero " << zero;
    const float next = t.step().loss;
    if (zero == 3) EXPECT_EQ(next, losses[4]);  // same layout: bitwise
    else EXPECT_NEAR(next, losses[4], 1e-6 * std::abs(losses[4]));
  }
  if (world().rank() == 0) {  // one process reads the sharded directory whole
    auto m = Transformer::create(tiny(ModelFamily::kLlama), 99).value();
    Trainer t(*m, data, nullptr, o);
    const Status s = t.load_checkpoint(dir);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_TRUE(std::equal(at4.begin(), at4.end(), m->params().begin()));
    // ... and writes the single-file format, which P ranks then resume from.
    ASSERT_TRUE(t.save_checkpoint(dir + ".bin").ok());
  }
  world().barrier();
  auto m = Transformer::create(tiny(ModelFamily::kLlama), 99).value();
  auto plan = DataParallelPlan::create(world(), z3, o).value();
  Trainer t(*m, data, nullptr, o, plan.get());
  const Status s = t.load_checkpoint(dir + ".bin");
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(plan->gather_full_params(), at4);
  // A shard missing: every rank refuses, naming the file.
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove(dir + "/" + shard_file_name(0, world().size()));
  world().barrier();
  const Status bad = t.load_checkpoint(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find(shard_file_name(0, world().size())), std::string::npos) << bad.message();
}

// Gradients reduced as bf16 (fp32 master weights and optimizer): each value is rounded to 8
// significant bits before and after each reduction step (2^-9 relative, u_bf16), instead of
// fp32's 2^-24. AdamW passes a relative gradient error ε to the update (m/√v is scale-free),
// so over S = 20 steps of lr = 1e-2 a weight moves by up to ~S·lr·u_bf16 ≈ 4e-4 from the
// fp32 trajectory where the gradient is well away from zero. Bounds, ~4x what P = 1..4 gave
// on the 2-core EPYC (session 9: loss 1.0e-4 relative, weights RMS 7.3e-4): losses 5e-4
// relative, weights RMS 3e-3. The run also differs from the fp32 layout's (the rounding is
// real) at every P.
TEST(DataParallel, Bf16GradientReductionStaysCloseToTheSingleProcessRun) {
  set_num_threads(1);
  const TrainOptions o = options();
  const RunResult ref = single_process(ModelFamily::kLlama, o);
  for (int zero : {0, 3}) {
    DataParallelOptions d;
    d.zero = zero;
    const RunResult f32 = layout(ModelFamily::kLlama, o, d);
    d.reduce_dtype = DType::kBF16;
    const RunResult bf16 = layout(ModelFamily::kLlama, o, d);
    ASSERT_EQ(bf16.weights.size(), ref.weights.size());
    double sq = 0, dl = 0;
    for (size_t i = 0; i < ref.weights.size(); ++i) sq += std::pow(static_cast<double>(bf16.weights[i]) - ref.weights[i], 2);
    for (size_t i = 0; i < ref.losses.size(); ++i) dl = std::max(dl, std::abs(static_cast<double>(bf16.losses[i]) - ref.losses[i]) / ref.losses[i]);
    const double rms = std::sqrt(sq / static_cast<double>(ref.weights.size()));
    if (getenv("KILN_TEST_PRINT") && world().rank() == 0) fprintf(stderr, "bf16 zero %d: loss rel %.3g rms %.3g\n", zero, dl, rms);
    EXPECT_LE(dl, 5e-4) << "zero " << zero;
    EXPECT_LE(rms, 3e-3) << "zero " << zero;
    EXPECT_NE(bf16.weights, f32.weights) << "zero " << zero << ": no bf16 rounding happened";
  }
  DataParallelOptions bad;
  bad.reduce_dtype = DType::kI8;
  EXPECT_FALSE(check_data_parallel(bad, world().size(), o).ok());
}

TEST(DataParallel, FlagsThatDoNotFitFailBeforeAnyStep) {
  const int p = world().size();
  TrainOptions o = options();
  DataParallelOptions d;
  o.batch = 12 * p + 1;  // never divides over p > 1
  if (p > 1) {
    EXPECT_FALSE(check_data_parallel(d, p, o).ok());
  }
  o = options();
  d.zero = 3;
  d.shard_group = p + 1;
  auto s = check_data_parallel(d, p, o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--hsdp"), std::string::npos) << s.message();
  d.shard_group = 0;
  o.precision = Precision::kBF16;
  s = check_data_parallel(d, p, o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("fp32"), std::string::npos) << s.message();
  d.zero = 4;
  EXPECT_FALSE(check_data_parallel(d, p, options()).ok());
}

}  // namespace
}  // namespace kiln::parallel
