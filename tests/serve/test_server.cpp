// The HTTP server end to end on loopback: a tiny random model saved to a temporary directory the
// way `kiln train` writes it, served in-process on a free port. Concurrent streamed requests
// give the text of batch-1 greedy generation; every bad request gets its 4xx error object and
// the server keeps serving; a client that disconnects mid-stream has its blocks freed;
// /metrics parses as Prometheus text.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "kiln/model/gguf.h"
#include "kiln/model/packed_linear.h"
#include "kiln/model/weights.h"
#include "kiln/quant/gguf_weights.h"
#include "kiln/quant/qlinear.h"
#include "kiln/serve/server.h"
#include "tests/serve/serve_test_util.h"

namespace kiln {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kCorpus =
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
    "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God "
    "said, Let there be light: and there was light. And God saw the light, that it was good: and God divided "
    "the light from the darkness. Caf\xc3\xa9 na\xc3\xafve \xe2\x80\x94 \xf0\x9f\x99\x82.";

// The one loader of serve and generate: a kiln-quantized directory serves on its quantized
// backends (the same tokens as the quantized model in memory), a .gguf file with its tokenizer
// from the file (F32: the same tokens as the fp32 model), and a .gguf without a tokenizer is
// refused by name.
TEST(ServedModel, LoadsQuantizedDirectoriesAndGgufFiles) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln_served_model_test_{}", ::getpid());
  fs::create_directories(dir / "fp32");
  tok::TrainOptions to;
  to.vocab_size = 300;
  const tok::Tokenizer tk = tok::Tokenizer::train(kCorpus, to).value();
  ModelConfig cfg = test::tiny_config(ModelFamily::kLlama, tk.vocab_size(), 128);
  cfg.tied_embeddings = false;
  auto model = test::tiny_model(cfg);
  const std::vector<int32_t> prompt = tk.encode("In the beginning God");
  const std::vector<int32_t> want = test::reference_generate(*model, prompt, 10);

  ASSERT_TRUE(tk.save_hf_json((dir / "fp32" / "tokenizer.json").string()).ok());
  const gguf::File f = gguf::llama_to_gguf(*model, tk.to_hf_json(), gguf::TensorType::kF32, "tiny").value();
  ASSERT_TRUE(gguf::write((dir / "tiny.gguf").string(), f).ok());
  auto from_gguf = load_served_model((dir / "tiny.gguf").string());
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status().message();
  EXPECT_EQ(from_gguf->tokenizer.encode("In the beginning God"), prompt);
  EXPECT_EQ(test::reference_generate(*from_gguf->model, prompt, 10), want);
  const gguf::File bare = gguf::llama_to_gguf(*model, "", gguf::TensorType::kF32, "tiny").value();
  ASSERT_TRUE(gguf::write((dir / "bare.gguf").string(), bare).ok());
  auto refused = load_served_model((dir / "bare.gguf").string());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("bare.gguf has no tokenizer"), std::string::npos) << refused.status().message();

  quant::QuantizeOptions qo;
  qo.scheme.group = 16;
  std::string log;
  const quant::QuantizedState state = quant::quantize_model(*model, nullptr, qo, &log).value();
  const std::vector<int32_t> want_q = test::reference_generate(*model, prompt, 10);  // on the quantized backends
  ASSERT_TRUE(quant::save_quantized_model((dir / "q4").string(), *model, state).ok());
  ASSERT_TRUE(tk.save_hf_json((dir / "q4" / "tokenizer.json").string()).ok());
  auto q = load_served_model((dir / "q4").string());
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_FALSE(q->quantized.weights.empty());
  EXPECT_EQ(test::reference_generate(*q->model, prompt, 10), want_q);
  fs::remove_all(dir);
}

// A Q8_0 or Q4_0 GGUF serves on the quantized backends with the file's own values: every
// quantized matrix is a QTensor (int8 / int4 symmetric, group 32) whose dequantized values are
// bitwise the loader's fp32 decode (q/k rows un-permuted alike), and the prompt's logits agree
// with the fp32-decoded model's to summation order (nmse ≤ 1e-10: the same products, the
// quantized kernels' order).
// Normalized squared distance of m's prompt logits from want's.
double prompt_logits_nmse(Transformer& m, Transformer& want, const std::vector<int32_t>& prompt) {
  const int64_t T = static_cast<int64_t>(prompt.size()), V = want.config().vocab_size;
  const int64_t ctx = want.config().max_seq_len;
  KVCache a = m.make_kv_cache(ctx), b = want.make_kv_cache(ctx);
  const float* la = m.forward_cached(prompt.data(), T, a).value();
  const std::vector<float> got(la, la + T * V);
  const float* lb = want.forward_cached(prompt.data(), T, b).value();
  double num = 0, den = 0;
  for (int64_t i = 0; i < T * V; ++i) {
    num += (got[i] - lb[i]) * (got[i] - lb[i]);
    den += lb[i] * lb[i];
  }
  return num / den;
}

// y = round_per_block(x) · Wᵀ + b (+ residual) in f32 with the model's own (fp32) weights.
class BlockRoundedInputs : public LinearBackend {
 public:
  void forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const override {
    const int64_t nb = l.in / kQuantBlock;
    std::vector<int8_t> q(static_cast<size_t>(n * l.in));
    std::vector<float> da(static_cast<size_t>(n * nb));
    std::vector<int32_t> sums(da.size());
    ref::quantize_blocks_int8(x, n, l.in, l.in, q.data(), l.in, da.data(), sums.data());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < l.out; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < l.in; ++k)
          acc += static_cast<double>(l.w[j * l.in + k]) * (da[i * nb + k / kQuantBlock] * q[i * l.in + k]);
        float v = static_cast<float>(acc);
        if (l.b) v += l.b[j];
        if (residual) v += residual[i * l.out + j];
        y[i * l.out + j] = v;
      }
  }
};

TEST(ServedModel, GgufQ8AndQ4MatricesRunQuantized) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln_gguf_quant_test_{}", ::getpid());
  fs::create_directories(dir);
  tok::TrainOptions to;
  to.vocab_size = 300;
  const tok::Tokenizer tk = tok::Tokenizer::train(kCorpus, to).value();
  ModelConfig cfg = test::tiny_config(ModelFamily::kLlama, tk.vocab_size(), 128);
  cfg.d_model = 64;  // rows of 32-element blocks; 2 heads of 32: the q/k row permutation is exercised
  cfg.n_heads = 2;
  cfg.n_kv_heads = 1;
  cfg.d_ff = 128;
  cfg.tied_embeddings = false;
  auto model = test::tiny_model(cfg);
  const std::vector<int32_t> prompt = tk.encode("In the beginning God created");
  for (gguf::TensorType type : {gguf::TensorType::kQ8_0, gguf::TensorType::kQ4_0}) {
    const bool q8 = type == gguf::TensorType::kQ8_0;
    const std::string path = (dir / (q8 ? "q8.gguf" : "q4.gguf")).string();
    ASSERT_TRUE(gguf::write(path, gguf::llama_to_gguf(*model, tk.to_hf_json(), type, "tiny").value()).ok());
    auto served = load_served_model(path);
    ASSERT_TRUE(served.ok()) << served.status().message();
    auto fp32 = gguf::load_llama(path).value().model;  // the same file decoded to fp32
    int quantized = 0;
    for (Linear* l : served->model->linears()) {
      auto it = served->quantized.weights.find(l->name);
      ASSERT_NE(it, served->quantized.weights.end()) << l->name << " is not kept quantized";
      EXPECT_NE(dynamic_cast<const quant::QuantizedLinear*>(l->backend.get()), nullptr) << l->name;
      EXPECT_EQ(it->second.scheme.bits, q8 ? 8 : 4) << l->name;
      EXPECT_EQ(it->second.scheme.group, 32) << l->name;
      const std::vector<float> deq = it->second.dequantize();
      const float* want = fp32->param(l->name);
      EXPECT_TRUE(std::equal(deq.begin(), deq.end(), want)) << l->name << ": not the file's values";
      ++quantized;
    }
    EXPECT_EQ(quantized, 7 * cfg.n_layers + 1) << "q, k, v, o, gate, up, down per layer, and the head";
    // Served: int8 activations per block of 32 (the block kernels, as llama.cpp runs these
    // types); the weight-only kernels (f32 activations) on request. Both against the fp32 model.
    auto weight_only = quant::load_gguf_model(path, nullptr, quant::ActQuant::kNone);
    ASSERT_TRUE(weight_only.ok()) << weight_only.status().message();
    const auto* first = dynamic_cast<const quant::QuantizedLinear*>(served->model->linears()[0]->backend.get());
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(first->act(), quant::ActQuant::kInt8Block);
    auto logits_nmse = [&](Transformer& m, Transformer& want) { return prompt_logits_nmse(m, want, prompt); };
    EXPECT_LE(logits_nmse(*weight_only->model, *fp32), 1e-10) << (q8 ? "Q8_0" : "Q4_0") << " weight-only";
    // The oracle for int8 activations: the fp32 model with each Linear's input rounded per block
    // of 32 (ref::quantize_blocks_int8, then back to f32) before an f32 product. Left: the order
    // of f32 sums (blocks in f32 vs the oracle's one dot), nmse ~ in·u² per matmul.
    auto fp32_a8 = gguf::load_llama(path).value().model;
    for (Linear* l : fp32_a8->linears()) l->backend = std::make_shared<BlockRoundedInputs>();
    const double a8 = logits_nmse(*served->model, *fp32_a8);
    EXPECT_LE(a8, 1e-9) << (q8 ? "Q8_0" : "Q4_0") << " int8 activations";
    // And the rounding is real: the served logits are not the f32-activation ones.
    EXPECT_GT(logits_nmse(*served->model, *fp32), 1e-7) << "the block kernels ran: the activations were rounded";
  }
  fs::remove_all(dir);
}

TEST(ServedModel, GgufF16MatricesStayHalves) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln_gguf_f16_test_{}", ::getpid());
  fs::create_directories(dir);
  tok::TrainOptions to;
  to.vocab_size = 300;
  const tok::Tokenizer tk = tok::Tokenizer::train(kCorpus, to).value();
  ModelConfig cfg = test::tiny_config(ModelFamily::kLlama, tk.vocab_size(), 128);
  cfg.tied_embeddings = false;
  auto model = test::tiny_model(cfg);
  const std::string path = (dir / "f16.gguf").string();
  ASSERT_TRUE(gguf::write(path, gguf::llama_to_gguf(*model, tk.to_hf_json(), gguf::TensorType::kF16, "tiny").value()).ok());
  auto served = load_served_model(path);
  ASSERT_TRUE(served.ok()) << served.status().message();
  auto fp32 = gguf::load_llama(path).value().model;  // the same halves widened to fp32
  for (Linear* l : served->model->linears()) {
    const auto* packed = dynamic_cast<const PackedLinear*>(l->backend.get());
    EXPECT_TRUE(packed && packed->packed().weight_dtype() == DType::kF16) << l->name << " is not kept in f16";
  }
  EXPECT_EQ(quant::weight_bytes_per_token(*served->model), quant::weight_bytes_per_token(*fp32) -
                                                              [&] {
                                                                int64_t b = 0;
                                                                for (Linear* l : fp32->linears()) b += 2 * l->in * l->out;
                                                                return b;
                                                              }());
  const std::vector<int32_t> prompt = tk.encode("In the beginning God created");
  EXPECT_LE(prompt_logits_nmse(*served->model, *fp32, prompt), 1e-10) << "the same values, f32 sums in another order";
  fs::remove_all(dir);
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / fmt::format("kiln_serve_test_{}", ::getpid()));
    fs::create_directories(*dir_);
    tok::TrainOptions to;
    to.vocab_size = 300;
    auto tk = tok::Tokenizer::train(kCorpus, to).value();
    ModelConfig cfg = test::tiny_config(ModelFamily::kLlama, tk.vocab_size(), 128);
    cfg.tied_embeddings = false;
    auto model = test::tiny_model(cfg);
    // Greedy text stays ASCII (so it is valid UTF-8 token by token): tokens holding a byte
    // >= 0x80 get a zero LM-head row, which never wins the argmax against the other tokens.
    float* head = model->param("lm_head.weight");
    for (int32_t t = 0; t < tk.vocab_size(); ++t) {
      const std::string_view b = tk.token_bytes(t);
      if (std::any_of(b.begin(), b.end(), [](char ch) { return static_cast<unsigned char>(ch) >= 0x80; }))
        std::fill_n(head + int64_t{t} * cfg.d_model, cfg.d_model, 0.0f);
    }
    ASSERT_TRUE(save_model(dir_->string(), *model).ok());
    ASSERT_TRUE(tk.save_hf_json((*dir_ / "tokenizer.json").string()).ok());
    ASSERT_TRUE(save_chat_template(dir_->string(), ChatTemplate{}).ok());
    // Serve what was saved, as `kiln serve --model DIR` does.
    auto served = load_served_model(dir_->string()).value();
    EngineConfig ec;
    ec.kv_cache_mem_bytes = 64 * 16 * kv_bytes_per_token(cfg, DType::kF32);
    ec.scheduler.max_batched_tokens = 64;
    ec.scheduler.prefill_chunk = 32;
    engine_ = Engine::create(std::move(served.model), ec).value().release();
    tokenizer_ = new tok::Tokenizer(served.tokenizer);
    ServerConfig sc;
    sc.port = 0;
    sc.model_name = "tiny";
    sc.num_http_threads = 16;
    server_ = Server::create(*engine_, std::move(served.tokenizer), served.chat, sc).value().release();
    ASSERT_TRUE(server_->bind().ok());
    server_->start();
    ref_model_ = load_model(dir_->string()).value().release();
  }
  static void TearDownTestSuite() {
    delete server_;  // stops listening
    delete engine_;
    delete ref_model_;
    delete tokenizer_;
    fs::remove_all(*dir_);
    delete dir_;
  }

  static httplib::Client client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(30, 0);
    return c;
  }
  static httplib::Result post(const std::string& path, const std::string& body, const httplib::Headers& h = {}) {
    return client().Post(path.c_str(), h, body, "application/json");
  }
  // Batch-1 greedy text of a prompt (what `kiln generate --temperature 0` prints).
  static std::string reference_text(const std::string& prompt, int64_t max_tokens) {
    const int32_t eot = tokenizer_->eot_id();
    auto ids = test::reference_generate(*ref_model_, tokenizer_->encode(prompt), max_tokens, {0.0f, 0, 1.0f}, 0, {eot});
    std::string text;
    for (int32_t t : ids)
      if (t != eot) text += tokenizer_->token_bytes(t);
    return text;
  }
  static int64_t metric(const std::string& name) {
    auto r = client().Get("/metrics");
    if (!r || r->status != 200) return -1;
    std::istringstream in(r->body);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(name + " ", 0) == 0) return static_cast<int64_t>(std::stod(line.substr(name.size() + 1)));
    }
    return -1;
  }
  // The metric once it reaches `want` (up to ~2 s): a reply can reach the client a moment
  // before the engine loop retires the finished sequence and frees its blocks.
  static int64_t metric_settled(const std::string& name, int64_t want) {
    int64_t v = metric(name);
    for (int i = 0; i < 200 && v != want; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      v = metric(name);
    }
    return v;
  }

  static fs::path* dir_;
  static Engine* engine_;
  static Server* server_;
  static Transformer* ref_model_;
  static tok::Tokenizer* tokenizer_;
};

fs::path* ServerTest::dir_ = nullptr;
Engine* ServerTest::engine_ = nullptr;
Server* ServerTest::server_ = nullptr;
Transformer* ServerTest::ref_model_ = nullptr;
tok::Tokenizer* ServerTest::tokenizer_ = nullptr;

// Reads an SSE stream: the JSON of every `data:` line until [DONE]; false when it never came.
struct SseResult {
  std::vector<json> chunks;
  bool done = false;
  int status = 0;
};
SseResult post_stream(int port, const std::string& path, const json& body, int64_t stop_after_chunks = -1) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  SseResult out;
  std::string buf;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    for (size_t at; (at = buf.find("\n\n")) != std::string::npos;) {
      const std::string ev = buf.substr(0, at);
      buf.erase(0, at + 2);
      if (ev.rfind("data: ", 0) != 0) continue;  // comments (": ping")
      if (ev == "data: [DONE]") {
        out.done = true;
        continue;
      }
      out.chunks.push_back(json::parse(ev.substr(6)));
      if (stop_after_chunks >= 0 && static_cast<int64_t>(out.chunks.size()) >= stop_after_chunks) return false;
    }
    return true;
  };
  auto r = c.send(req);
  if (r) out.status = r->status;
  return out;
}

TEST_F(ServerTest, HealthModelsAndMetrics) {
  auto h = client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = client().Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(json::parse(m->body)["data"][0]["id"], "tiny");
  // Every non-comment line of /metrics is `name[{labels}] number`, and the KV bytes per token
  // are 2 · layers · kv_heads · head_dim · 4.
  auto r = client().Get("/metrics");
  ASSERT_TRUE(r);
  std::istringstream in(r->body);
  int samples = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    ASSERT_NE(sp, std::string::npos) << line;
    size_t used = 0;
    (void)std::stod(line.substr(sp + 1), &used);
    EXPECT_EQ(used, line.size() - sp - 1) << line;
    const std::string name = line.substr(0, line.find_first_of("{ "));
    EXPECT_TRUE(std::all_of(name.begin(), name.end(), [](char ch) { return std::isalnum(ch) || ch == '_' || ch == ':'; }))
        << line;
    ++samples;
  }
  EXPECT_GT(samples, 20);
  const ModelConfig& c = ref_model_->config();
  EXPECT_EQ(metric("kiln_kv_cache_bytes_per_token"), 2 * c.n_layers * c.n_kv_heads * c.head_dim() * 4);
  // Beside it, multi-head attention of the same width (every head a KV head) and grouped-query
  // attention with a quarter of the heads as KV heads (the model's own has half: 2 of 4).
  ASSERT_EQ(c.n_heads, 4);
  ASSERT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(metric("kiln_kv_cache_mha_bytes_per_token"), 2 * c.n_layers * 4 * c.head_dim() * 4);
  EXPECT_EQ(metric("kiln_kv_cache_gqa_bytes_per_token"), 2 * c.n_layers * 1 * c.head_dim() * 4);
  EXPECT_EQ(metric("kiln_kv_blocks_total"), 64);
}

// Four concurrent streamed completions (greedy, with seeds) and one non-streamed: each text
// equals batch-1 greedy generation of its prompt; usage counts the tokens.
TEST_F(ServerTest, ConcurrentStreamsMatchBatchOneGreedy) {
  const std::vector<std::string> prompts = {"In the beginning", "And God said, Let there", "darkness was upon",
                                            "Caf\xc3\xa9 na\xc3\xafve and the light"};
  std::vector<SseResult> results(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      json body = {{"model", "tiny"}, {"prompt", prompts[i]}, {"max_tokens", 24}, {"temperature", 0},
                   {"seed", 42 + static_cast<int>(i)}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
      results[i] = post_stream(server_->port(), "/v1/completions", body);
    });
  }
  auto whole = post("/v1/completions", json{{"model", "tiny"}, {"prompt", prompts[0]}, {"max_tokens", 24},
                                            {"temperature", 0}}.dump());
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const SseResult& r = results[i];
    EXPECT_EQ(r.status, 200);
    EXPECT_TRUE(r.done) << "no [DONE] for prompt " << i;
    std::string text;
    std::string finish;
    for (const json& ch : r.chunks) {
      if (ch.contains("usage")) {
        EXPECT_EQ(ch["usage"]["prompt_tokens"], tokenizer_->encode(prompts[i]).size());
        continue;
      }
      EXPECT_EQ(ch["object"], "text_completion");
      text += ch["choices"][0]["text"].get<std::string>();
      if (!ch["choices"][0]["finish_reason"].is_null()) finish = ch["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(text, reference_text(prompts[i], 24)) << "prompt " << i;
    EXPECT_FALSE(finish.empty());
  }
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json w = json::parse(whole->body);
  EXPECT_EQ(w["choices"][0]["text"], reference_text(prompts[0], 24));
  EXPECT_EQ(w["usage"]["total_tokens"].get<int64_t>(),
            w["usage"]["prompt_tokens"].get<int64_t>() + w["usage"]["completion_tokens"].get<int64_t>());
}

// Chat: the template renders the messages; n = 2 greedy samples agree; stop strings cut text.
TEST_F(ServerTest, ChatStopStringsAndParallelSamples) {
  json body = {{"model", "tiny"},
               {"messages", json::array({{{"role", "system"}, {"content", "Be brief."}},
                                         {{"role", "user"}, {"content", "And God said"}}})},
               {"max_tokens", 20}, {"temperature", 0}, {"n", 2}};
  auto r = post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["content"], j["choices"][1]["message"]["content"]);
  const std::string prompt = ChatTemplate{}.render({{"system", "Be brief."}, {"user", "And God said"}}).value();
  std::string want = reference_text(prompt, 20);
  if (auto at = want.find("\nUser:"); at != std::string::npos) want.resize(at);
  EXPECT_EQ(j["choices"][0]["message"]["content"], want);
  // A stop string taken from the greedy continuation of a completion cuts it right there.
  const std::string full = reference_text("the face of", 30);
  ASSERT_GE(full.size(), 8u);
  const std::string stop = full.substr(full.size() / 2, 3);
  auto s = post("/v1/completions",
                json{{"model", "tiny"}, {"prompt", "the face of"}, {"max_tokens", 30}, {"temperature", 0}, {"stop", stop}}
                    .dump());
  ASSERT_TRUE(s);
  json sj = json::parse(s->body);
  EXPECT_EQ(sj["choices"][0]["text"], full.substr(0, full.find(stop)));
  EXPECT_EQ(sj["choices"][0]["finish_reason"], "stop");
  // Streamed chat: a role delta first, then content deltas, then [DONE].
  body["stream"] = true;
  body["n"] = 1;
  SseResult st = post_stream(server_->port(), "/v1/chat/completions", body);
  ASSERT_TRUE(st.done);
  EXPECT_EQ(st.chunks.front()["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (const json& ch : st.chunks) text += ch["choices"][0]["delta"].value("content", "");
  EXPECT_EQ(text, want);
}

// Each bad request gets its 4xx and an OpenAI-style error object; the server stays up.
TEST_F(ServerTest, BadRequestsGet4xxAndServerStaysUp) {
  const int64_t ctx = ref_model_->config().max_seq_len;
  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += "light ";
  const std::vector<std::pair<std::string, int>> cases = {
      {"{not json", 400},
      {"[1, 2]", 400},
      {json{{"model", "gpt-9"}, {"prompt", "x"}}.dump(), 404},
      {json{{"model", 5}, {"prompt", "x"}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", "In"}, {"max_tokens", std::numeric_limits<int64_t>::max()}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", "In"}, {"max_tokens", std::numeric_limits<uint64_t>::max()}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", "In"}, {"stream", true}, {"stream_options", {{"include_usage", "yes"}}}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", "In"}, {"suffix", "x"}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", "In"}, {"logprobs", 6}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", "In"}, {"logit_bias", {{"100000", 1}}}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", "In"}, {"frequency_penalty", 1e308}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", "In"}, {"not_a_parameter", 1}}.dump(), 400},
      {std::string(100000, '['), 400},
      {json{{"model", "tiny"}, {"prompt", "In"}, {"max_tokens", -5}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", "In"}, {"max_tokens", 0}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", "In"}, {"max_tokens", 1000000000}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", "In"}, {"max_tokens", "ten"}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", long_prompt}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", "In"}, {"temperature", -1}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", "In"}, {"top_p", 0}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", "In"}, {"n", 0}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", ""}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", json::array({1, 2, 100000})}}.dump(), 400},
      {json{{"model", "tiny"}, {"prompt", "In"}, {"stop", 5}}.dump(), 400},
  };
  for (const auto& [body, status] : cases) {
    auto r = post("/v1/completions", body);
    ASSERT_TRUE(r) << body;
    EXPECT_EQ(r->status, status) << body << " -> " << r->body;
    const json e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.contains("error")) << r->body;
    for (const char* k : {"message", "type", "param", "code"}) EXPECT_TRUE(e["error"].contains(k)) << k;
    EXPECT_TRUE(e["error"]["message"].is_string());
  }
  auto chat = post("/v1/chat/completions", json{{"model", "tiny"}, {"messages", json::array({{{"role", "wizard"}, {"content", "x"}}})}}.dump());
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->status, 400);
  auto missing = client().Get("/v1/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_TRUE(json::parse(missing->body).contains("error"));
  (void)ctx;
  auto ok = post("/v1/completions", json{{"model", "tiny"}, {"prompt", "In"}, {"max_tokens", 3}}.dump());
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(metric_settled("kiln_kv_blocks_used", 0), 0);
}

// No "model": the served one (as vLLM and llama-server).
TEST_F(ServerTest, ModelIsOptional) {
  auto r = post("/v1/completions", json{{"prompt", "In the"}, {"max_tokens", 2}}.dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["model"], "tiny");
}

// echo + logprobs, the request lm-evaluation-harness sends for a loglikelihood: the reply's
// text is the prompt's then the completion's; token_logprobs has one entry per prompt token
// (the first null) and one per generated token; top_logprobs holds the token itself; streamed
// chunks carry the same tokens and logprobs.
TEST_F(ServerTest, EchoLogprobsStreamedAndNot) {
  const std::string prompt = "And God said, Let there be light";
  const auto ids = tokenizer_->encode(prompt);
  const json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 3}, {"temperature", 0},
                     {"logprobs", 2}, {"echo", true}};
  auto r = post("/v1/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json c = json::parse(r->body)["choices"][0];
  const size_t n_gen = json::parse(r->body)["usage"]["completion_tokens"].get<size_t>();
  ASSERT_GE(n_gen, 1u);
  const json& lp = c["logprobs"];
  const std::string text = c["text"].get<std::string>();
  EXPECT_EQ(text.rfind(prompt, 0), 0u) << text;
  EXPECT_EQ(text.substr(prompt.size()), reference_text(prompt, 3));
  ASSERT_EQ(lp["tokens"].size(), ids.size() + n_gen);
  ASSERT_EQ(lp["token_logprobs"].size(), ids.size() + n_gen);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  std::string joined;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), joined.size()) << i;
    joined += lp["tokens"][i].get<std::string>();
    if (i == 0) continue;
    const double v = lp["token_logprobs"][i].get<double>();
    EXPECT_LE(v, 0.0);
    const json& top = lp["top_logprobs"][i];
    EXPECT_TRUE(top.contains(lp["tokens"][i].get<std::string>())) << top.dump();
    EXPECT_GE(top.size(), 2u);
    EXPECT_LE(top.size(), 3u);
    if (i >= ids.size() && lp["tokens"][i] != "<|endoftext|>") {  // greedy: the generated token is the most likely
      double best = -1e9;
      for (auto it = top.begin(); it != top.end(); ++it) best = std::max(best, it->get<double>());
      EXPECT_DOUBLE_EQ(v, best) << i;
    }
  }
  EXPECT_EQ(joined.substr(0, text.size()), text);
  // Streamed: the prompt's chunk first, then the completion; the same tokens and logprobs.
  json sb = body;
  sb["stream"] = true;
  SseResult st = post_stream(server_->port(), "/v1/completions", sb);
  ASSERT_TRUE(st.done);
  std::string stext;
  json stokens = json::array(), slps = json::array();
  for (const json& ch : st.chunks) {
    for (const json& choice : ch["choices"]) {
      stext += choice["text"].get<std::string>();
      if (choice["logprobs"].is_null()) continue;
      for (const json& t : choice["logprobs"]["tokens"]) stokens.push_back(t);
      for (const json& t : choice["logprobs"]["token_logprobs"]) slps.push_back(t);
    }
  }
  EXPECT_EQ(stext, text);
  EXPECT_EQ(stokens, lp["tokens"]);
  ASSERT_EQ(slps.size(), lp["token_logprobs"].size());
  for (size_t i = 1; i < slps.size(); ++i) EXPECT_NEAR(slps[i].get<double>(), lp["token_logprobs"][i].get<double>(), 1e-4);
  // max_tokens 0 with echo scores the prompt alone.
  json zero = body;
  zero["max_tokens"] = 0;
  auto z = post("/v1/completions", zero.dump());
  ASSERT_TRUE(z);
  ASSERT_EQ(z->status, 200) << z->body;
  const json zc = json::parse(z->body);
  EXPECT_EQ(zc["choices"][0]["text"], prompt);
  EXPECT_EQ(zc["choices"][0]["logprobs"]["tokens"].size(), ids.size());
  EXPECT_EQ(zc["usage"]["completion_tokens"], 0);
  for (size_t i = 1; i < ids.size(); ++i)
    EXPECT_NEAR(zc["choices"][0]["logprobs"]["token_logprobs"][i].get<double>(), lp["token_logprobs"][i].get<double>(), 1e-4);
}

TEST_F(ServerTest, ChatLogprobsStreamedAndNot) {
  const json body = {{"messages", json::array({{{"role", "user"}, {"content", "Who made light?"}}})},
                     {"max_tokens", 4}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 3}, {"ignore_eos", true}};
  auto r = post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json c = json::parse(r->body)["choices"][0];
  const json& content = c["logprobs"]["content"];
  std::string joined;
  for (const json& t : content) {
    joined += t["token"].get<std::string>();
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    EXPECT_EQ(t["top_logprobs"][0]["token"], t["token"]);  // greedy
    EXPECT_DOUBLE_EQ(t["top_logprobs"][0]["logprob"].get<double>(), t["logprob"].get<double>());
    std::string bytes;
    for (const json& b : t["bytes"]) bytes += static_cast<char>(b.get<int>());
    EXPECT_EQ(bytes, t["token"].get<std::string>());
  }
  const std::string text = c["message"]["content"].get<std::string>();
  EXPECT_EQ(joined.substr(0, text.size()), text);
  json sb = body;
  sb["stream"] = true;
  SseResult st = post_stream(server_->port(), "/v1/chat/completions", sb);
  ASSERT_TRUE(st.done);
  json scontent = json::array();
  for (const json& ch : st.chunks)
    for (const json& choice : ch["choices"])
      if (!choice["logprobs"].is_null())
        for (const json& t : choice["logprobs"]["content"]) scontent.push_back(t["token"]);
  json want = json::array();
  for (const json& t : content) want.push_back(t["token"]);
  EXPECT_EQ(scontent, want);
}

// A client that reads two chunks and hangs up: its sequence is freed long before max_tokens.
// The engine is stepped by hand here so the request is certainly still running when the
// client leaves; then the background loop serves the next request as usual.
TEST_F(ServerTest, DisconnectMidStreamFreesBlocks) {
  engine_->stop();
  const int64_t tokens_before = engine_->metrics().generation_tokens;
  const int64_t aborted_before = engine_->metrics().requests_aborted;
  json body = {{"model", "tiny"}, {"prompt", "And the earth"}, {"max_tokens", 100}, {"temperature", 0},
               {"stream", true}, {"ignore_eos", true}};
  std::atomic<bool> client_done{false};
  SseResult cut;
  std::thread t([&] {
    cut = post_stream(server_->port(), "/v1/completions", body, 2);
    client_done = true;
  });
  int64_t max_used = 0;
  // The engine is paced by the client: at most 24 steps before the client has cut its stream
  // (2 chunks need 2 tokens), so a slow or starved client thread on a loaded machine cannot let
  // the request run to its 100 tokens first; then steps go on until the server notices.
  int steps = 0, waits = 0;
  while (steps < 400 && waits < 5000 && engine_->metrics().requests_aborted == aborted_before) {
    if (!client_done && steps >= 24) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ++waits;
      continue;
    }
    engine_->step();
    ++steps;
    max_used = std::max(max_used, engine_->metrics().kv_blocks.num_used);
    std::this_thread::sleep_for(std::chrono::milliseconds(client_done ? 10 : 2));
  }
  t.join();
  EXPECT_FALSE(cut.done);
  EXPECT_EQ(cut.chunks.size(), 2u);
  EXPECT_GT(max_used, 0);
  EXPECT_EQ(engine_->metrics().requests_aborted, aborted_before + 1);
  EXPECT_LT(engine_->metrics().generation_tokens - tokens_before, 60);  // cut long before its 100 tokens
  EXPECT_EQ(engine_->metrics().kv_blocks.num_used, 0);
  EXPECT_EQ(engine_->metrics().num_running, 0);
  engine_->start();
  auto ok = post("/v1/completions", json{{"model", "tiny"}, {"prompt", "In"}, {"max_tokens", 3}}.dump());
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(metric_settled("kiln_kv_blocks_used", 0), 0);
}

// A client that goes away during a non-streamed request gets its request aborted: the
// server probes the connection with JSON whitespace while it waits.
TEST_F(ServerTest, DisconnectDuringNonStreamedRequestAborts) {
  engine_->stop();
  const int64_t aborted_before = engine_->metrics().requests_aborted;
  std::atomic<bool> client_done{false};
  std::thread t([&] {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(30, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"model", "tiny"}, {"prompt", "And the earth"}, {"max_tokens", 100}, {"temperature", 0},
                    {"ignore_eos", true}}.dump();
    req.set_header("Content-Type", "application/json");
    std::string got;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      got.append(data, n);
      return false;  // gone after the first bytes (the first probe)
    };
    (void)c.send(req);
    EXPECT_EQ(got.find("choices"), std::string::npos);
    client_done = true;
  });
  // 10 steps while the client is there (it cannot have its 100 tokens), then slow steps (20 ms:
  // 2 s for the rest) until the server notices the closed connection (a probe per 250 ms).
  int steps = 0;
  for (int i = 0; i < 3000 && engine_->metrics().requests_aborted == aborted_before; ++i) {
    if (!client_done && steps >= 10) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    if (engine_->step()) ++steps;
    std::this_thread::sleep_for(std::chrono::milliseconds(client_done ? 20 : 2));
  }
  t.join();
  EXPECT_EQ(engine_->metrics().requests_aborted, aborted_before + 1);
  EXPECT_EQ(engine_->metrics().kv_blocks.num_used, 0);
  engine_->start();
  // Non-streamed replies still parse (leading whitespace included) and complete.
  auto ok = post("/v1/completions", json{{"model", "tiny"}, {"prompt", "In"}, {"max_tokens", 3}}.dump());
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(json::parse(ok->body)["usage"]["completion_tokens"], 3);
}

// Also: a model vocabulary larger than the tokenizer's (ids past it render as no text).
TEST(ServerAuth, WrongApiKeyIs401) {
  const ModelConfig cfg = test::tiny_config(ModelFamily::kLlama, 400, 64);
  tok::TrainOptions to;
  to.vocab_size = 300;
  auto tk = tok::Tokenizer::train(kCorpus, to).value();
  auto engine = Engine::create(test::tiny_model(cfg), EngineConfig{}).value();
  ServerConfig sc;
  sc.port = 0;
  sc.api_key = "sekrit";
  sc.model_name = "tiny";
  auto server = Server::create(*engine, tk, ChatTemplate{}, sc).value();
  ASSERT_TRUE(server->bind().ok());
  server->start();
  httplib::Client c("127.0.0.1", server->port());
  const std::string body = json{{"model", "tiny"}, {"prompt", "In"}, {"max_tokens", 40}, {"ignore_eos", true}}.dump();
  auto none = c.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(json::parse(none->body)["error"]["code"], "invalid_api_key");
  auto wrong = c.Post("/v1/completions", {{"Authorization", "Bearer nope"}}, body, "application/json");
  EXPECT_EQ(wrong->status, 401);
  auto right = c.Post("/v1/completions", {{"Authorization", "Bearer sekrit"}}, body, "application/json");
  EXPECT_EQ(right->status, 200);
  EXPECT_EQ(json::parse(right->body)["usage"]["completion_tokens"], 40);
  EXPECT_EQ(c.Get("/health")->status, 200);  // probes need no key
  server->stop();
}

}  // namespace
}  // namespace kiln
