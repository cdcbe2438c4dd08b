// The tensor-parallel communication formula (perf/tp_model.h, which `kiln bench tp` and
// `kiln plan tp` use) against what real tp > 1 steps report: the bytes the layers all-reduce,
// all-gather and reduce-scatter, and the vocab-parallel loss's, counted by take_tp_traffic()
// after one forward + backward, exactly (integers: any missing or extra collective is a
// whole buffer of rows × d_model floats). Both families, with and without sequence
// parallelism, no and full checkpointing, at every tp in {2, 4} that divides this mpirun's P
// (dp = P / tp: each rank's rows are its data-parallel part); skipped where none does
// (P = 1, 3). And through the Trainer: the bytes survive the plan's per-step comm times.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/comm/communicator.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/parallel/tensor_parallel.h"
#include "kiln/perf/tp_model.h"
#include "kiln/train/trainer.h"

namespace kiln::parallel {
namespace {

comm::Communicator& world() { return comm::Communicator::world(); }

ModelConfig tiny(ModelFamily f) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 40; c.d_model = 16; c.n_layers = 3; c.n_heads = 4;
  c.n_kv_heads = f == ModelFamily::kLlama ? 2 : 4;
  c.d_ff = 32; c.max_seq_len = 16; c.tied_embeddings = f == ModelFamily::kGpt2;
  return c;
}

TrainOptions options() {
  TrainOptions o;
  o.batch = 4;  // divides over dp = 1, 2
  o.seq_len = 8;
  o.max_steps = 2;
  o.eval_every = 0;
  return o;
}

std::vector<int> tps() {
  std::vector<int> out;
  for (int tp : {2, 4})
    if (world().size() % tp == 0) out.push_back(tp);
  return out;
}

std::unique_ptr<TensorParallelPlan> make_plan(int tp, bool sp, const ModelConfig& c, const TrainOptions& o) {
  auto plan = TensorParallelPlan::create(world(), {tp, sp}, DataParallelOptions{}, c, o);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? std::move(plan).value() : nullptr;
}

void expect_traffic(const TensorParallelTraffic& got, const TensorParallelTraffic& want, const std::string& what) {
  EXPECT_GT(want.all_reduce_bytes + want.all_gather_bytes + want.reduce_scatter_bytes, 0) << what;
  EXPECT_EQ(got.all_reduce_bytes, want.all_reduce_bytes) << what;
  EXPECT_EQ(got.all_gather_bytes, want.all_gather_bytes) << what;
  EXPECT_EQ(got.reduce_scatter_bytes, want.reduce_scatter_bytes) << what;
  EXPECT_EQ(got.cross_entropy_bytes, want.cross_entropy_bytes) << what;
  EXPECT_EQ(got.logits_bytes, 0) << what;
}

TEST(TensorParallelTraffic, OneForwardBackwardMovesWhatTheFormulaSays) {
  if (tps().empty()) GTEST_SKIP() << "no tp in {2, 4} divides P = " << world().size();
  set_num_threads(1);
  const TrainOptions o = options();
  std::vector<int32_t> x(o.batch * o.seq_len), y(x.size());
  Rng rng(3);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<int32_t>(rng.below(40));
    y[i] = static_cast<int32_t>(rng.below(40));
  }
  for (ModelFamily f : {ModelFamily::kGpt2, ModelFamily::kLlama})
    for (int tp : tps())
      for (bool sp : {false, true})
        for (CheckpointMode ckpt : {CheckpointMode::kNone, CheckpointMode::kFull}) {
          const std::string what = fmt::format("{} tp {} sp {} ckpt {}", f == ModelFamily::kGpt2 ? "gpt2" : "llama",
                                               tp, sp, ckpt == CheckpointMode::kFull ? "full" : "none");
          auto plan = make_plan(tp, sp, tiny(f), o);
          ASSERT_TRUE(plan) << what;
          auto m = Transformer::create(tiny(f), 5, plan->shard()).value();
          plan->attach(*m);
          m->set_hooks(plan.get());
          m->set_checkpointing(ckpt);
          plan->begin_step();
          plan->begin_micro_batch(true);
          const int64_t rows = o.batch / plan->data_size(), first = plan->data_rank() * rows * o.seq_len;
          ASSERT_TRUE(m->forward(x.data() + first, y.data() + first, rows, o.seq_len).ok()) << what;
          m->backward();
          plan->finish_gradients();
          expect_traffic(m->take_tp_traffic(), perf::tp_traffic_formula(tiny(f), tp, sp, rows * o.seq_len, ckpt),
                         what);
          m->set_hooks(nullptr);
        }
}

TEST(TensorParallelTraffic, TrainerStepsKeepTheBytesForThePlan) {
  if (tps().empty()) GTEST_SKIP() << "no tp in {2, 4} divides P = " << world().size();
  set_num_threads(1);
  TokenShard data;
  data.vocab_size = 40;
  Rng rng(11);
  for (int i = 0; i < 2000; ++i) data.tokens.push_back(static_cast<int32_t>(rng.below(40)));
  const TrainOptions o = options();
  for (bool sp : {false, true}) {
    const int tp = tps().front();
    auto plan = make_plan(tp, sp, tiny(ModelFamily::kGpt2), o);
    ASSERT_TRUE(plan);
    auto m = Transformer::create(tiny(ModelFamily::kGpt2), 5, plan->shard()).value();
    Trainer t(*m, data, nullptr, o, plan.get());
    while (!t.done()) (void)t.step();  // each step takes the plan's comm times
    TensorParallelTraffic want =
        perf::tp_traffic_formula(tiny(ModelFamily::kGpt2), tp, sp, o.batch / plan->data_size() * o.seq_len);
    for (int64_t* b : {&want.all_reduce_bytes, &want.all_gather_bytes, &want.reduce_scatter_bytes,
                       &want.cross_entropy_bytes})
      *b *= o.max_steps;
    expect_traffic(plan->take_tp_traffic(), want, fmt::format("trainer tp {} sp {}", tp, sp));
  }
}

}  // namespace
}  // namespace kiln::parallel
