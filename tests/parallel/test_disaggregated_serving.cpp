// Disaggregated prefill and decode (serve/disaggregated.h) against one process: rank 0 runs the
// decode engine, ranks 1..P-1 prefill (CTest: P = 2..4, so 1:1, 2:1 and 3:1). With a tiny random
// model whose logits are far from ties (tests/serve/serve_test_util.h), greedy requests give the
// batch-1 reference's tokens and seeded sampled ones (n = 2) a colocated engine's; a second wave
// shares prefixes with the first (prefix-cache hits on the prefill ranks, whose rows are sent
// too); the K/V bytes received are exactly (prompt − 1) · layers · row floats (K and V; latent
// attention K only) · 4 per request; a decode cache too small for the running set preempts and
// the outputs stay the same.
#include <gtest/gtest.h>

#include <cstdio>

#include "kiln/comm/communicator.h"
#include "kiln/core/thread_pool.h"
#include "kiln/serve/disaggregated.h"
#include "tests/serve/serve_test_util.h"

namespace kiln {
namespace {

using test::Collected;
using test::drain;

comm::Communicator& world() { return comm::Communicator::world(); }

ModelConfig latent_config() {
  ModelConfig c = test::tiny_config(ModelFamily::kLlama);
  c.n_kv_heads = c.n_heads;
  c.kv_lora_rank = 8;
  c.q_lora_rank = 6;
  c.qk_nope_head_dim = 8;
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 6;
  return c;
}

struct Case {
  const char* name;
  ModelConfig config;
  int64_t decode_blocks;  // the decode rank's pool (the prefill ranks get 64)
};

std::vector<Case> cases() {
  return {{"llama", test::tiny_config(ModelFamily::kLlama), 64},
          {"gpt2", test::tiny_config(ModelFamily::kGpt2), 64},
          {"latent attention", latent_config(), 64},
          {"llama, decode cache of 12 blocks (preempts)", test::tiny_config(ModelFamily::kLlama), 12}};
}

EngineConfig engine_config(const ModelConfig& c, int64_t blocks) {
  EngineConfig ec;
  ec.kv_cache_mem_bytes = blocks * 16 * kv_bytes_per_token(c, DType::kF32);
  ec.scheduler.max_batched_tokens = 40;
  ec.scheduler.prefill_chunk = 16;  // several chunks per prompt on the prefill ranks
  return ec;
}

TEST(DisaggregatedServing, OutputsEqualOneProcess) {
  if (world().size() < 2) GTEST_SKIP() << "needs a decode and a prefill rank";
  set_num_threads(1);
  auto split = world().split(0, world().rank());
  ASSERT_TRUE(split.ok());
  comm::Communicator& comm = **split;
  for (const Case& k : cases()) {
    const ModelConfig& cfg = k.config;
    if (comm.rank() != 0) {
      auto model = test::tiny_model(cfg);
      const Status st = run_prefill_rank(*model, engine_config(cfg, 64), comm);
      EXPECT_TRUE(st.ok()) << k.name << ": " << st.message();
      continue;
    }
    auto model = test::tiny_model(cfg);
    const int64_t row = model->kv_row_width();
    MpiPrefillClient client(comm, cfg.n_layers, row, !cfg.is_mla(), 60.0);
    EngineConfig ec = engine_config(cfg, k.decode_blocks);
    if (k.decode_blocks < 64) ec.scheduler.max_running = 3;
    EngineConfig colocated_ec = ec;
    ec.remote_prefill = &client;
    auto engine = Engine::create(std::move(model), ec).value();
    auto colocated = Engine::create(test::tiny_model(cfg), colocated_ec).value();
    auto ref = test::tiny_model(cfg);

    Rng rng(5);
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t len : {50, 7, 33, 1, 64, 2}) prompts.push_back(test::random_prompt(rng, len, cfg.vocab_size));
    const int64_t max_tokens = k.decode_blocks < 64 ? 40 : 12;
    int64_t want_bytes = 0, remote_requests = 0;
    for (int wave = 0; wave < 2; ++wave) {
      std::vector<std::vector<int32_t>> sent;
      std::vector<std::shared_ptr<RequestStream>> greedy, sampled, sampled_here;
      for (const std::vector<int32_t>& head : prompts) {
        std::vector<int32_t> p = head;
        if (wave == 1) {  // the first 48 tokens of wave 0's prompt, a new tail: prefix-cache hits
          p.resize(std::min<size_t>(p.size(), 48));
          const auto tail = test::random_prompt(rng, 5, cfg.vocab_size);
          p.insert(p.end(), tail.begin(), tail.end());
        }
        sent.push_back(p);
        greedy.push_back(engine->add_request(p, test::greedy(max_tokens)).value());
        GenerationParams s = test::greedy(6, 2);
        s.sampling.temperature = 0.9f;
        s.seed = 11 + sent.size();
        sampled.push_back(engine->add_request(p, s).value());
        sampled_here.push_back(colocated->add_request(p, s).value());
        if (p.size() >= 2) {
          remote_requests += 2;
          want_bytes += 2 * static_cast<int64_t>(p.size() - 1) * cfg.n_layers * row * (cfg.is_mla() ? 1 : 2) * 4;
        }
      }
      engine->run_until_idle();
      colocated->run_until_idle();
      for (size_t i = 0; i < sent.size(); ++i) {
        const Collected g = drain(*greedy[i]);
        EXPECT_EQ(g.tokens[0], test::reference_generate(*ref, sent[i], max_tokens))
            << k.name << " wave " << wave << " request " << i;
        EXPECT_EQ(g.finish[0], FinishReason::kLength) << k.name;
        EXPECT_EQ(drain(*sampled[i]).tokens, drain(*sampled_here[i]).tokens) << k.name << " sampled request " << i;
      }
    }
    const EngineMetrics m = engine->metrics();
    EXPECT_EQ(m.remote.submitted, remote_requests) << k.name;
    EXPECT_EQ(m.remote.completed, remote_requests) << k.name;
    EXPECT_EQ(m.remote.failed, 0) << k.name;
    EXPECT_EQ(m.remote.bytes, want_bytes) << k.name;
    EXPECT_EQ(m.kv_transfer.count, remote_requests) << k.name;
    EXPECT_EQ(m.requests_failed, 0) << k.name;
    EXPECT_EQ(m.kv_blocks.num_used, 0) << k.name;
    // Whether the small decode cache fills depends on when the prefills come back: with one
    // prefill rank they arrive in sequence and it always has (every run so far); with several,
    // a slow rank (ASan at 4 ranks) can pace admissions so that none is needed. The outputs
    // above are checked either way.
    if (k.decode_blocks < 64 && world().size() == 2) {
      EXPECT_GT(m.num_preemptions, 0) << k.name;
    } else if (k.decode_blocks < 64 && m.num_preemptions == 0) {
      std::printf("note: %s at %d ranks: no preemption this run (prefill timing)\n", k.name, world().size());
    }
    EXPECT_TRUE(client.shutdown());
  }
}

TEST(DisaggregatedServing, BadSpecsAreRefusedAlike) {
  EXPECT_TRUE(parse_disaggregate("1:1", 2).ok());
  EXPECT_TRUE(parse_disaggregate("3:1", 4).ok());
  for (const char* bad : {"", "1", "1:", ":1", "0:1", "1:0", "a:b", "1:1:1", "-1:2"})
    EXPECT_NE(parse_disaggregate(bad, 2).status().message().find("must be P:D"), std::string::npos) << bad;
  EXPECT_NE(parse_disaggregate("1:2", 3).status().message().find("one decode rank"), std::string::npos);
  EXPECT_NE(parse_disaggregate("2:1", 2).status().message().find("needs 3 ranks"), std::string::npos);
}

}  // namespace
}  // namespace kiln
