// Expert parallelism against the single-process run (the oracle): the same MoE model, data,
// global batch and seed give, at every ep that divides this mpirun's P (CTest: P = 1..4, so
// ep = 1, 2, 4 with edp = P / ep data-parallel replicas of each expert), in dropless and in
// capacity mode, with one dispatch chunk and with several:
//   * the same routing (tokens per expert, drops) and router losses as one process;
//   * the same gradients after one step, every parameter once gathered from the shards;
//   * the same loss at each of 20 steps and the same final weights;
//   * a checkpoint written at ep > 1 that one process reads back.
// The tiny model: 4 experts of width 12, top-2, a shared expert, every block MoE.
//
// Tolerance (the same derivation as tests/parallel/test_tensor_parallel.cpp). The forward of a
// token row is the same arithmetic on any rank, so the routing and the losses' statistics are
// those of one process (counts exactly; sums of probabilities reassociated over ranks, ~1e-7).
// Gradients are sums over tokens in another order (the data-parallel average, an expert's rows
// arriving from several ranks and chunks): reassociations of n terms, ~sqrt(n)·u ≈ 1e-6
// relative. Bounds as for tensor parallelism: one-step gradients relative RMS 5e-6, max 1e-5 ·
// max |g|; 20-step losses 1e-6 relative; final weights relative RMS 1e-4, max 5e-4. A lost
// expert shard, a gradient not summed over its edp replicas or local routing statistics
// (aux-loss gradients off by the rank count) move them by orders of magnitude more.
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/comm/communicator.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/cross_entropy.h"
#include "kiln/parallel/expert_parallel.h"
#include "kiln/train/sharded_checkpoint.h"
#include "kiln/train/trainer.h"
#include "tests/parallel/fixtures.h"

namespace kiln::parallel {
namespace {

using testing::diff;
using testing::Diff;

comm::Communicator& world() { return comm::Communicator::world(); }

ModelConfig tiny_moe(double capacity_factor) {
  ModelConfig c;
  c.vocab_size = 40; c.d_model = 16; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 2;
  c.d_ff = 32; c.max_seq_len = 16; c.tied_embeddings = false;
  c.num_experts = 4; c.num_experts_per_tok = 2; c.moe_d_ff = 12; c.num_shared_experts = 1;
  c.capacity_factor = capacity_factor;
  c.router_aux_loss_coef = 0.1; c.router_z_loss_coef = 0.01;
  return c;
}

TrainOptions options() {
  TrainOptions o;
  o.batch = 12;  // divides over 1, 2, 3, 4 data ranks
  o.seq_len = 16;
  o.max_steps = 20;
  o.lr = 1e-2;
  o.warmup_steps = 3;
  o.eval_every = 0;
  return o;
}

struct Layout {
  int ep, chunks;
  double capacity;
  std::string name() const {
    return fmt::format("edp {} × ep {}, {} chunk(s), {}", world().size() / ep, ep, chunks,
                       capacity > 0 ? fmt::format("capacity {:g}", capacity) : std::string("dropless"));
  }
};

std::vector<Layout> layouts() {
  std::vector<Layout> out;
  for (double cf : {0.0, 1.0})
    for (int ep : {1, 2, 4})
      if (world().size() % ep == 0)
        for (int chunks : {1, 3})
          if (ep > 1 || chunks == 1) out.push_back({ep, chunks, cf});
  return out;
}

std::unique_ptr<ExpertParallelPlan> make_plan(const Layout& l, const TrainOptions& o) {
  ExpertParallelOptions epo;
  epo.ep = l.ep;
  epo.chunks = l.chunks;
  auto plan = ExpertParallelPlan::create(world(), epo, DataParallelOptions{}, tiny_moe(l.capacity), o);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? std::move(plan).value() : nullptr;
}

TEST(ExpertParallel, OneStepRoutingAndGradientsEqualTheSingleProcess) {
  set_num_threads(1);
  const TokenShard data = testing::random_tokens(40, 11, 4000);
  const TrainOptions o = options();
  std::vector<int32_t> x(o.batch * o.seq_len), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = data.tokens[i];
    y[i] = data.tokens[i + 1];
  }
  for (int64_t r = 0; r < o.batch; ++r) y[static_cast<size_t>(r * o.seq_len + 5)] = kIgnoreTarget;
  for (const Layout& l : layouts()) {
    const std::string what = l.name();
    auto ref = Transformer::create(tiny_moe(l.capacity), 5).value();
    const float ref_loss = ref->forward(x.data(), y.data(), o.batch, o.seq_len).value();
    const MoeStats ref_stats = ref->take_moe_stats();
    ref->backward();
    auto plan = make_plan(l, o);
    ASSERT_TRUE(plan) << what;
    auto m = Transformer::create(tiny_moe(l.capacity), 5, {}, {}, plan->shard()).value();
    plan->attach(*m);
    EXPECT_EQ(diff(plan->gather_full(m->params()), ref->params()).max_rel, 0.0) << what << ": initial weights";
    plan->begin_step();
    plan->begin_micro_batch(true);
    const int64_t rows = o.batch / plan->data_size(), first = plan->data_rank() * rows * o.seq_len;
    const float loss = m->forward(x.data() + first, y.data() + first, rows, o.seq_len).value();
    const MoeStats st = m->take_moe_stats();
    m->backward();
    plan->finish_gradients();
    EXPECT_EQ(st.tokens_per_expert, ref_stats.tokens_per_expert) << what;
    EXPECT_EQ(st.dropped, ref_stats.dropped) << what;
    if (l.capacity > 0) {
      EXPECT_GT(ref_stats.dropped, 0) << what << ": the capacity case drops nothing";
    }
    EXPECT_NEAR(st.aux, ref_stats.aux, 1e-6 * ref_stats.aux) << what;
    EXPECT_NEAR(st.z, ref_stats.z, 1e-6 * ref_stats.z) << what;
    const Diff d = diff(plan->gather_full(m->grads()), ref->grads());
    if (getenv("KILN_TEST_PRINT") && world().rank() == 0)
      fprintf(stderr, "%s: grad rel rms %.3g max %.3g\n", what.c_str(), d.rel_rms, d.max_rel);
    EXPECT_NEAR(plan->mean_over_data(loss), ref_loss, 1e-6 * ref_loss) << what;
    EXPECT_LE(d.rel_rms, 5e-6) << what;
    EXPECT_LE(d.max_rel, 1e-5) << what;
    m->set_hooks(nullptr);
  }
}

TEST(ExpertParallel, TwentyStepsGiveTheSingleProcessRun) {
  set_num_threads(1);
  const TokenShard data = testing::random_tokens(40, 11, 4000);
  const TrainOptions o = options();
  for (const Layout& l : layouts()) {
    if (l.chunks > 1 && l.capacity > 0) continue;  // the one-step test covers chunks × capacity
    auto ref = Transformer::create(tiny_moe(l.capacity), 5).value();
    std::vector<float> ref_losses;
    {
      Trainer t(*ref, data, nullptr, o);
      while (!t.done()) ref_losses.push_back(t.step().loss);
    }
    const std::string what = l.name();
    auto plan = make_plan(l, o);
    ASSERT_TRUE(plan) << what;
    auto m = Transformer::create(tiny_moe(l.capacity), 5, {}, {}, plan->shard()).value();
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

// A checkpoint written by the expert shards holds the single-process model: one process reads
// it back (every rank does, alone) and continues with the same loss as the layout.
TEST(ExpertParallel, CheckpointReadsBackInOneProcess) {
  set_num_threads(1);
  const int ep = world().size() % 2 == 0 ? 2 : 1;
  const TokenShard data = testing::random_tokens(40, 11, 4000);
  TrainOptions o = options();
  o.max_steps = 4;
  auto plan = make_plan({ep, 2, 0.0}, o);
  ASSERT_TRUE(plan);
  auto m = Transformer::create(tiny_moe(0.0), 5, {}, {}, plan->shard()).value();
  Trainer t(*m, data, nullptr, o, plan.get());
  t.step();
  t.step();
  const std::string dir = testing::checkpoint_dir("expert_parallel");
  ASSERT_TRUE(t.save_checkpoint(dir).ok());
  const float next = t.step().loss;
  world().barrier();
  auto one = Transformer::create(tiny_moe(0.0), 99).value();  // other initial values: the load must replace them
  Trainer single(*one, data, nullptr, o);
  ASSERT_TRUE(single.load_checkpoint(dir).ok());
  EXPECT_EQ(single.steps_done(), 2);
  EXPECT_NEAR(single.step().loss, next, 1e-6 * next);
  world().barrier();
}

TEST(ExpertParallel, BadLayoutsAreRefusedAlike) {
  const TrainOptions o = options();
  const ModelConfig moe = tiny_moe(0.0);
  ModelConfig dense = moe;
  dense.num_experts = 0; dense.num_shared_experts = 0; dense.router_aux_loss_coef = dense.router_z_loss_coef = 0;
  auto msg = [&](const ExpertParallelOptions& e, const ModelConfig& c, int world_size, DataParallelOptions d = {}) {
    return check_expert_parallel(e, c, world_size, d, o).message();
  };
  EXPECT_NE(msg({2, 1}, dense, 2).find("num_experts 0"), std::string::npos);
  EXPECT_NE(msg({3, 1}, moe, 3).find("num_experts"), std::string::npos);  // 4 experts over 3
  EXPECT_NE(msg({2, 1}, moe, 3).find("does not divide"), std::string::npos);
  EXPECT_NE(msg({2, 0}, moe, 2).find("--ep-chunks"), std::string::npos);
  DataParallelOptions zero;
  zero.zero = 1;
  EXPECT_NE(msg({2, 1}, moe, 2, zero).find("ZeRO"), std::string::npos);
  EXPECT_TRUE(check_expert_parallel({2, 2}, moe, 4, {}, o).ok());
}

}  // namespace
}  // namespace kiln::parallel
