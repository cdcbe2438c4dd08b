// parse_request without a server: a table of bad bodies (each field with each wrong type, numbers
// at the edge of their type, deep nesting, unimplemented OpenAI parameters, unknown keys) must
// each give a 4xx naming the parameter, never an exception; good bodies give the fields asked.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "kiln/serve/request.h"

namespace kiln {
namespace {

using json = nlohmann::json;

constexpr const char* kCorpus = "In the beginning God created the heaven and the earth. And the earth was without form.";
constexpr int64_t kVocab = 300, kContext = 128;

struct Fixture {
  tok::Tokenizer tk;
  ChatTemplate chat;
  RequestContext ctx;
  Fixture() {
    tok::TrainOptions to;
    to.vocab_size = 280;
    tk = tok::Tokenizer::train(kCorpus, to).value();
    ctx = RequestContext{"tiny", kContext, kVocab, &tk, &chat};
  }
};
const Fixture& fx() {
  static const Fixture f;
  return f;
}

// Parses `body` (raw text) on an endpoint; never throws (a throw fails the test).
ParseResult parse(const std::string& body, bool chat) {
  ParseResult r = ApiError{0, ""};
  EXPECT_NO_THROW(r = parse_request(body, chat, fx().ctx)) << body;
  return r;
}

ParsedRequest ok(const json& body, bool chat = false) {
  ParseResult r = parse(body.dump(), chat);
  if (const ApiError* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body.dump() << " -> " << e->status << " " << e->message;
    return {};
  }
  return std::get<ParsedRequest>(r);
}

json completion(json extra) {
  json b = {{"model", "tiny"}, {"prompt", "In the beginning"}};
  for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
  return b;
}
json chat_body(json extra) {
  json b = {{"model", "tiny"}, {"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}};
  for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
  return b;
}

struct BadCase {
  std::string body;  // raw text
  bool chat;
  int status;
  std::string param;  // the error must name it ("" : none required)
};

std::vector<BadCase> bad_cases() {
  std::vector<BadCase> v;
  auto c = [&](json extra, const std::string& param, int status = 400) {
    v.push_back({completion(std::move(extra)).dump(), false, status, param});
  };
  auto h = [&](json extra, const std::string& param, int status = 400) {
    v.push_back({chat_body(std::move(extra)).dump(), true, status, param});
  };
  const json kI64Max = std::numeric_limits<int64_t>::max();
  const json kI64Min = std::numeric_limits<int64_t>::min();
  const json kU64Max = std::numeric_limits<uint64_t>::max();
  // Values of every wrong type and every edge, per integer field.
  const std::vector<json> wrong_int = {"7", true, 1.5, 1.0, -0.0, 1e308, json::array({1}), json::object(), kI64Max, kI64Min, kU64Max};
  for (const char* key : {"max_tokens", "n", "top_k", "best_of", "logprobs"})
    for (const json& x : wrong_int) c({{key, x}}, key);
  for (const json& x : wrong_int) h({{"max_completion_tokens", x}}, "max_completion_tokens");
  for (const json& x : wrong_int) h({{"logprobs", true}, {"top_logprobs", x}}, "top_logprobs");
  // Numbers.
  for (const char* key : {"temperature", "top_p", "frequency_penalty", "presence_penalty"})
    for (const json& x : {json("1"), json(true), json(1e308), json(-1e308), json(kI64Max), json(kU64Max), json::array()})
      c({{key, x}}, key);
  c({{"top_p", 0}}, "top_p");
  c({{"top_p", -0.0}}, "top_p");
  c({{"temperature", -1e-300}}, "temperature");
  c({{"frequency_penalty", 2.0000001}}, "frequency_penalty");
  c({{"presence_penalty", -2.5}}, "presence_penalty");
  // Booleans.
  for (const char* key : {"stream", "echo", "ignore_eos"})
    for (const json& x : {json("true"), json(1), json(0), json::object()}) c({{key, x}}, key);
  h({{"logprobs", 1}}, "logprobs");
  h({{"logprobs", "yes"}}, "logprobs");
  // stream_options.
  v.push_back({completion({{"stream", true}, {"stream_options", {{"include_usage", "yes"}}}}).dump(), false, 400,
               "stream_options.include_usage"});
  v.push_back({completion({{"stream", true}, {"stream_options", {{"include_usage", 1}}}}).dump(), false, 400,
               "stream_options.include_usage"});
  v.push_back({completion({{"stream", true}, {"stream_options", "x"}}).dump(), false, 400, "stream_options"});
  v.push_back({completion({{"stream", true}, {"stream_options", {{"bogus", true}}}}).dump(), false, 400,
               "stream_options.bogus"});
  c({{"stream_options", {{"include_usage", true}}}}, "stream_options");  // without stream
  // Ranges and lengths.
  c({{"max_tokens", 0}}, "max_tokens");
  c({{"max_tokens", -5}}, "max_tokens");
  c({{"max_tokens", kContext}}, "max_tokens");
  c({{"n", 65}}, "n");
  c({{"n", 2}, {"best_of", 3}}, "best_of");
  c({{"logprobs", 6}}, "logprobs");
  c({{"logprobs", -1}}, "logprobs");
  h({{"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs");
  h({{"top_logprobs", 2}}, "top_logprobs");  // without logprobs
  h({{"logprobs", false}, {"top_logprobs", 2}}, "top_logprobs");
  h({{"max_tokens", 5}, {"max_completion_tokens", 6}}, "max_completion_tokens");
  // logit_bias.
  for (const json& lb : {json("x"), json::array({1}), json{{"abc", 1}}, json{{"-1", 1}}, json{{"+5", 1}}, json{{" 5", 1}},
                         json{{"5 ", 1}}, json{{"300", 1}}, json{{"99999999999999999999999", 1}}, json{{"", 1}},
                         json{{"5", "1"}}, json{{"5", 101}}, json{{"5", -100.5}}, json{{"5", 1e308}}, json{{"5", true}},
                         json{{"5", json::object()}}})
    c({{"logit_bias", lb}}, "logit_bias");
  // The prompt.
  for (const json& p : {json(""), json(5), json(true), json::array(), json::object(), json::array({1, 2, kVocab}),
                        json::array({1, -1}), json::array({1, 2.5}), json::array({1, kU64Max}), json::array({1, kI64Min}),
                        json::array({"a", "b"}), json::array({json::array({1}), json::array({2})}), json::array({1, "a"})})
    c({{"prompt", p}}, "prompt");
  v.push_back({json{{"model", "tiny"}}.dump(), false, 400, "prompt"});
  c({{"prompt", std::string(400, 'x')}}, "prompt");  // longer than the context
  // Messages.
  for (const json& m : {json("hi"), json::array(), json::array({1}), json::array({{{"content", "x"}}}),
                        json::array({{{"role", 5}, {"content", "x"}}}), json::array({{{"role", "user"}, {"content", 5}}}),
                        json::array({{{"role", "wizard"}, {"content", "x"}}}),
                        json::array({{{"role", "user"}, {"content", json::array({5})}}}),
                        json::array({{{"role", "user"}, {"content", json::array({{{"type", 5}, {"text", "x"}}})}}}),
                        json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}}),
                        json::array({{{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", 5}}})}}})})
    h({{"messages", m}}, "messages", 400);
  h({{"messages", json::array({{{"role", "user"}, {"content", "x"}, {"name", "bob"}}})}}, "messages[0].name");
  h({{"messages", json::array({{{"role", "assistant"}, {"tool_calls", json::array({{{"id", "1"}}})}}})}},
    "messages[0].tool_calls");
  // The model.
  c({{"model", 5}}, "model");
  c({{"model", "gpt-9"}}, "model", 404);
  // Stop strings.
  for (const json& s : {json(5), json(""), json::array({""}), json::array({1}), json(std::vector<std::string>(17, "x"))})
    c({{"stop", s}}, "stop");
  // Parameters kiln does not implement: a 400 naming each.
  c({{"suffix", "x"}}, "suffix");
  c({{"suffix", ""}}, "suffix");
  for (const char* key : {"tools", "tool_choice", "functions", "function_call", "audio", "prediction",
                          "reasoning_effort", "web_search_options", "verbosity"})
    h({{key, json::array({1})}}, key);
  h({{"tool_choice", "auto"}}, "tool_choice");
  h({{"response_format", {{"type", "json_object"}}}}, "response_format");
  h({{"response_format", {{"type", "json_schema"}, {"json_schema", json::object()}}}}, "response_format");
  h({{"response_format", "text"}}, "response_format");
  h({{"modalities", json::array({"text", "audio"})}}, "modalities");
  h({{"store", true}}, "store");
  h({{"service_tier", "flex"}}, "service_tier");
  h({{"user", 5}}, "user");
  h({{"metadata", "x"}}, "metadata");
  // Keys of the other endpoint, vLLM's extensions kiln lacks, typos: unrecognized.
  c({{"messages", json::array()}}, "messages");
  c({{"top_logprobs", 2}}, "top_logprobs");
  c({{"max_completion_tokens", 2}}, "max_completion_tokens");
  h({{"prompt", "x"}}, "prompt");
  h({{"echo", true}}, "echo");
  h({{"best_of", 1}}, "best_of");
  c({{"prompt_logprobs", 1}}, "prompt_logprobs");
  c({{"repetition_penalty", 1.1}}, "repetition_penalty");
  c({{"min_p", 0.1}}, "min_p");
  c({{"temprature", 0.5}}, "temprature");
  // Bodies that are not a JSON object, or nest deeper than the bound.
  for (const char* raw : {"", "null", "[]", "5", "\"x\"", "{", "{\"model\": \"tiny\",}", "\xff\xfe"})
    v.push_back({raw, false, 400, ""});
  v.push_back({std::string(100000, '['), false, 400, ""});
  v.push_back({"{\"model\": \"tiny\", \"prompt\": \"x\", \"user\": " + std::string(40, '[') + std::string(40, ']') + "}",
               false, 400, ""});
  v.push_back({"{\"model\": \"tiny\", \"prompt\": \"x\", \"logit_bias\": " + std::string(50000, '{'), false, 400, ""});
  return v;
}

TEST(ParseRequest, BadBodiesGet4xxNamingTheParameter) {
  int64_t checked = 0;
  for (const BadCase& b : bad_cases()) {
    ParseResult r = parse(b.body, b.chat);
    const ApiError* e = std::get_if<ApiError>(&r);
    const std::string shown = b.body.size() > 200 ? b.body.substr(0, 200) + "..." : b.body;
    ASSERT_NE(e, nullptr) << "accepted: " << shown;
    EXPECT_EQ(e->status, b.status) << shown << " -> " << e->message;
    EXPECT_FALSE(e->message.empty()) << shown;
    if (!b.param.empty()) {
      EXPECT_EQ(e->param.rfind(b.param, 0), 0u) << shown << " -> param " << e->param << ": " << e->message;
      // The message names the parameter too (the top-level key of a nested one).
      const std::string top = b.param.substr(0, b.param.find_first_of(".["));
      EXPECT_NE(e->message.find(top), std::string::npos) << shown << " -> " << e->message;
    }
    ++checked;
  }
  EXPECT_GT(checked, 200);
}

TEST(ParseRequest, NullMeansAbsentAndModelIsOptional) {
  ParsedRequest p = ok({{"prompt", "In the"}});  // no model: the served one
  EXPECT_EQ(p.gen.max_tokens, 16);
  EXPECT_FALSE(p.prompt.empty());
  p = ok(completion({{"model", nullptr}, {"suffix", nullptr}, {"logprobs", nullptr},
                     {"temperature", nullptr}, {"stream_options", nullptr}, {"user", "u1"}}));
  EXPECT_EQ(p.num_logprobs, -1);
  EXPECT_EQ(p.gen.sampling.temperature, 1.0f);
  p = ok(chat_body({{"tools", nullptr}, {"response_format", {{"type", "text"}}}, {"modalities", json::array({"text"})},
                    {"store", false}, {"service_tier", "auto"}, {"parallel_tool_calls", true},
                    {"metadata", {{"k", "v"}}}}),
         true);
  EXPECT_TRUE(p.chat);
  // An assistant message replayed from a reply carries null fields.
  p = ok(chat_body({{"messages", json::array({{{"role", "user"}, {"content", "Hi"}},
                                              {{"role", "assistant"}, {"content", "Yes"}, {"refusal", nullptr},
                                               {"tool_calls", nullptr}, {"annotations", json::array()}}})}}),
         true);
  EXPECT_FALSE(p.prompt.empty());
}

TEST(ParseRequest, FieldsAtTheEdgeOfTheirRangeAreRead) {
  const int64_t len = static_cast<int64_t>(fx().tk.encode("In the beginning").size());
  ParsedRequest p = ok(completion({{"max_tokens", kContext - len}, {"temperature", 2}, {"top_p", 1}, {"n", 64},
                                   {"best_of", 64}, {"logprobs", 5}, {"frequency_penalty", -2},
                                   {"presence_penalty", 2.0}, {"logit_bias", {{"0", -100}, {"299", 100}, {"7", 0.5}}},
                                   {"seed", std::numeric_limits<uint64_t>::max()}, {"top_k", -1}}));
  EXPECT_EQ(p.gen.max_tokens, kContext - len);
  EXPECT_EQ(p.gen.n, 64);
  EXPECT_EQ(p.num_logprobs, 5);
  EXPECT_EQ(p.gen.num_logprobs, 5);
  EXPECT_FALSE(p.gen.prompt_logprobs);
  EXPECT_EQ(p.gen.adjust.frequency_penalty, -2.0f);
  EXPECT_EQ(p.gen.adjust.presence_penalty, 2.0f);
  ASSERT_EQ(p.gen.adjust.logit_bias.size(), 3u);
  EXPECT_EQ(*p.gen.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(p.gen.sampling.top_k, 0);
  p = ok(completion({{"seed", std::numeric_limits<int64_t>::min()}, {"temperature", -0.0}}));
  EXPECT_EQ(*p.gen.seed, uint64_t{1} << 63);
  EXPECT_EQ(p.gen.sampling.temperature, 0.0f);
  EXPECT_FALSE(std::signbit(p.gen.sampling.temperature));
  // A prompt of token ids, one list inside a list.
  p = ok(completion({{"prompt", json::array({json::array({0, 5, kVocab - 1})})}}));
  EXPECT_EQ(p.prompt, (std::vector<int32_t>{0, 5, static_cast<int32_t>(kVocab - 1)}));
}

TEST(ParseRequest, EchoLogprobsAndChatLogprobs) {
  // lm-evaluation-harness's loglikelihood request.
  ParsedRequest p = ok(completion({{"temperature", 0}, {"max_tokens", 1}, {"logprobs", 1}, {"seed", 1234}, {"echo", true}}));
  EXPECT_TRUE(p.echo);
  EXPECT_TRUE(p.gen.prompt_logprobs);
  EXPECT_EQ(p.gen.num_logprobs, 1);
  EXPECT_FALSE(p.discard_output);
  // Echo scores the prompt with max_tokens 0: one token is run and dropped.
  p = ok(completion({{"max_tokens", 0}, {"logprobs", 0}, {"echo", true}}));
  EXPECT_TRUE(p.discard_output);
  EXPECT_EQ(p.gen.max_tokens, 1);
  EXPECT_EQ(p.gen.num_logprobs, 0);
  p = ok(chat_body({{"logprobs", true}, {"top_logprobs", 20}}), true);
  EXPECT_EQ(p.num_logprobs, 20);
  EXPECT_FALSE(p.gen.prompt_logprobs);
  p = ok(chat_body({{"logprobs", true}}), true);
  EXPECT_EQ(p.num_logprobs, 0);
  p = ok(chat_body({{"logprobs", false}, {"max_completion_tokens", 3}}), true);
  EXPECT_EQ(p.num_logprobs, -1);
  EXPECT_EQ(p.gen.max_tokens, 3);
  p = ok(completion({{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  EXPECT_TRUE(p.stream && p.include_usage);
}

}  // namespace
}  // namespace kiln
