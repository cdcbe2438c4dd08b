// A failing step of the serving engine fails the requests it scheduled with the reason and
// keeps serving: the requests that come later (and those not in the failed step) are served as
// if nothing happened. Sizes at the edge of their type are errors, never an overflowed check.
#include <gtest/gtest.h>

#include <limits>

#include "kiln/core/dtype.h"
#include "kiln/serve/engine.h"
#include "tests/serve/serve_test_util.h"

namespace kiln {
namespace {

using test::Collected;
using test::drain;
using test::greedy;
using test::reference_generate;
using test::tiny_config;
using test::tiny_model;

std::unique_ptr<Engine> engine_for(const ModelConfig& cfg) {
  EngineConfig ec;
  ec.kv_cache_mem_bytes = 32 * 16 * kv_bytes_per_token(cfg, DType::kF32);  // 32 blocks of 16
  auto e = Engine::create(tiny_model(cfg), ec);
  KILN_CHECK_MSG(e.ok(), "{}", e.status().to_string());
  return std::move(e).value();
}

TEST(EngineFailure, FailedStepFailsItsRequestsAndTheEngineGoesOn) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  auto engine = engine_for(cfg);
  auto ref = tiny_model(cfg);
  const std::vector<int32_t> p1 = {3, 1, 4, 1, 5}, p2 = {9, 2, 6};
  auto s1 = engine->add_request(p1, greedy(6)).value();
  auto s2 = engine->add_request(p2, greedy(6, 2)).value();
  engine->fail_next_step(internal_error("injected fault"));
  EXPECT_TRUE(engine->step());  // both prefills are in the first step: both fail
  for (auto* s : {s1.get(), s2.get()}) {
    const Collected c = drain(*s);
    for (size_t i = 0; i < c.finish.size(); ++i) EXPECT_EQ(c.finish[i], FinishReason::kError) << "sample " << i;
    EXPECT_TRUE(s->finished());
    EXPECT_NE(s->error().find("injected fault"), std::string::npos) << s->error();
  }
  const EngineMetrics m = engine->metrics();
  EXPECT_EQ(m.requests_failed, 2);
  EXPECT_EQ(m.kv_blocks.num_used, 0) << "the failed requests' blocks are freed";
  EXPECT_NE(engine->metrics_text().find("kiln_requests_failed_total 2"), std::string::npos);

  // The next requests (the same prompt too: nothing of the failed step was cached) are served.
  auto s3 = engine->add_request(p1, greedy(6)).value();
  engine->run_until_idle();
  const Collected c3 = drain(*s3);
  EXPECT_EQ(c3.finish[0], FinishReason::kLength);
  EXPECT_EQ(c3.tokens[0], reference_generate(*ref, p1, 6));
  EXPECT_TRUE(s3->error().empty());
}

// A request still decoding when another's step fails only fails if it was in that step; the
// background loop survives the fault too.
TEST(EngineFailure, BackgroundLoopSurvivesAFailedStep) {
  const ModelConfig cfg = tiny_config(ModelFamily::kGpt2);
  auto engine = engine_for(cfg);
  auto ref = tiny_model(cfg);
  engine->start();
  engine->fail_next_step(internal_error("injected fault"));
  auto s1 = engine->add_request({5, 6, 7}, greedy(4)).value();
  std::vector<TokenEvent> ev;
  while (s1->wait(ev, std::chrono::milliseconds(100))) {
  }
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().finish, FinishReason::kError);
  auto s2 = engine->add_request({5, 6, 7}, greedy(4)).value();
  ev.clear();
  while (s2->wait(ev, std::chrono::milliseconds(100))) {
  }
  std::vector<int32_t> got;
  for (const TokenEvent& e : ev)
    if (e.token >= 0) got.push_back(e.token);
  EXPECT_EQ(got, reference_generate(*ref, {5, 6, 7}, 4));
  EXPECT_EQ(ev.back().finish, FinishReason::kLength);
  engine->stop();
}

TEST(EngineFailure, FailAllEndsEveryOpenRequestWithTheMessage) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  auto engine = engine_for(cfg);
  auto s1 = engine->add_request({1, 2, 3}, greedy(50)).value();
  EXPECT_TRUE(engine->step());
  engine->fail_all("server is shutting down");
  engine->run_until_idle();
  const Collected c = drain(*s1);
  EXPECT_EQ(c.finish[0], FinishReason::kError);
  EXPECT_EQ(s1->error(), "server is shutting down");
}

// max_tokens at the edge of int64 must not pass `len + max_tokens > ctx` by wrapping.
TEST(EngineFailure, EdgeSizesAreErrorsNotOverflows) {
  const ModelConfig cfg = tiny_config(ModelFamily::kLlama);
  auto engine = engine_for(cfg);
  for (int64_t m : {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max() - 1,
                    std::numeric_limits<int64_t>::max() - 2}) {
    auto r = engine->add_request({1, 2, 3}, greedy(m));
    ASSERT_FALSE(r.ok()) << m;
    EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange) << r.status().to_string();
  }
  GenerationParams p = greedy(4);
  p.n = std::numeric_limits<int64_t>::max();
  EXPECT_FALSE(engine->add_request({1, 2, 3}, p).ok());
  EXPECT_FALSE(engine->step()) << "nothing was queued";
}

}  // namespace
}  // namespace kiln
