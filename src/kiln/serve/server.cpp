// Server: request parsing and validation (OpenAI fields, errors as {"error": {...}}), prompt
// tokenization and chat rendering, incremental detokenization with stop strings (text that may
// begin a stop string or a UTF-8 character is held back), JSON replies and SSE streams.
#include "kiln/serve/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "kiln/core/json.h"
#include "kiln/model/weights.h"
#include "kiln/serve/http_gate.h"
#include "kiln/serve/http_listen.h"

namespace kiln {

using json = nlohmann::json;

namespace {

// A request body is at most 64 MiB and 32 levels deep (a chat request with content parts
// needs 5); the HTTP layer already refuses larger payloads (payload_max_length).
constexpr JsonLimits kRequestJsonLimits{.max_depth = 32, .max_bytes = int64_t{64} << 20};

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// An error a client caused, answered as HTTP `status` with OpenAI's error object.
struct ApiError {
  ApiError(int s, std::string m, std::string p = "", std::string c = "", std::string t = "invalid_request_error")
      : status(s), message(std::move(m)), param(std::move(p)), code(std::move(c)), type(std::move(t)) {}
  int status;
  std::string message;
  std::string param;  // empty: null
  std::string code;   // empty: null
  std::string type;
};

void send_error(httplib::Response& res, const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  res.status = e.status;
  res.set_content(dump(json{{"error", err}}), "application/json");
}

// The length of the longest prefix of s[0, end) that does not cut a UTF-8 character.
size_t utf8_safe_end(const std::string& s, size_t end) {
  for (size_t back = 1; back <= 3 && back <= end; ++back) {
    const auto c = static_cast<unsigned char>(s[end - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? end - back : end;
  }
  return end;
}

// Sampling and output options common to both endpoints.
struct ParsedRequest {
  std::vector<int32_t> prompt;
  GenerationParams gen;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  bool chat = false;
};

// The text side of one sample: bytes so far, what was sent, stop-string matching.
struct SampleText {
  std::string bytes;
  size_t sent = 0;
  int64_t num_tokens = 0;
  bool done = false;
  std::string finish_reason;
};

}  // namespace

struct Server::Impl {
  Engine& engine;
  tok::Tokenizer tokenizer;
  ChatTemplate chat;
  ServerConfig config;
  std::atomic<int64_t> next_id{0};
  std::vector<int32_t> special_ids;  // never rendered as text
  std::atomic<bool> draining{false};  // Server::drain: no new generation

  Impl(Engine& e, tok::Tokenizer t, ChatTemplate c, ServerConfig cfg)
      : engine(e), tokenizer(std::move(t)), chat(std::move(c)), config(std::move(cfg)) {
    if (tokenizer.eot_id() >= 0) special_ids.push_back(tokenizer.eot_id());
  }

  // ---- parsing --------------------------------------------------------------------------------
  static std::optional<ApiError> get_number(const json& body, const char* key, double lo, double hi, double& out) {
    if (!body.contains(key) || body[key].is_null()) return std::nullopt;
    if (!body[key].is_number()) return ApiError{400, fmt::format("'{}' must be a number", key), key};
    const double v = body[key].get<double>();
    if (!(v >= lo && v <= hi))
      return ApiError{400, fmt::format("'{}' is {}; it must be in [{}, {}]", key, v, lo, hi), key};
    out = v;
    return std::nullopt;
  }
  static std::optional<ApiError> get_int(const json& body, const char* key, int64_t lo, int64_t hi, int64_t& out) {
    if (!body.contains(key) || body[key].is_null()) return std::nullopt;
    if (!body[key].is_number_integer()) return ApiError{400, fmt::format("'{}' must be an integer", key), key};
    const auto v = body[key].get<int64_t>();
    if (v < lo || v > hi) return ApiError{400, fmt::format("'{}' is {}; it must be in [{}, {}]", key, v, lo, hi), key};
    out = v;
    return std::nullopt;
  }

  std::optional<ApiError> parse(const httplib::Request& req, bool is_chat, ParsedRequest& out) {
    auto parsed = parse_json(req.body, "The request body", kRequestJsonLimits);
    if (!parsed.ok()) return ApiError{400, std::string(parsed.status().message()) + "."};
    const json body = std::move(*parsed);
    if (!body.is_object()) return ApiError{400, "The request body must be a JSON object."};
    out.chat = is_chat;
    if (!body.contains("model") || !body["model"].is_string())
      return ApiError{400, "'model' is required and must be a string", "model"};
    if (body["model"].get<std::string>() != config.model_name)
      return ApiError{404, fmt::format("The model '{}' does not exist; this server serves '{}'.",
                                       body["model"].get<std::string>(), config.model_name),
                      "model", "model_not_found"};
    const int64_t ctx = engine.model_config().max_seq_len;
    // The prompt.
    std::string text;
    if (is_chat) {
      if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
        return ApiError{400, "'messages' must be a non-empty array", "messages"};
      std::vector<ChatMessage> msgs;
      for (size_t i = 0; i < body["messages"].size(); ++i) {
        const json& m = body["messages"][i];
        const std::string where = fmt::format("messages[{}]", i);
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
          return ApiError{400, where + " must be an object with a string 'role'", where};
        ChatMessage cm{m["role"].get<std::string>(), ""};
        const json& c = m.contains("content") ? m["content"] : json();
        if (c.is_string()) {
          cm.content = c.get<std::string>();
        } else if (c.is_array()) {  // content parts: only text
          for (const json& part : c) {
            if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
              return ApiError{400, where + ".content parts must be {\"type\": \"text\", \"text\": ...}", where + ".content"};
            cm.content += part["text"].get<std::string>();
          }
        } else if (!c.is_null()) {
          return ApiError{400, where + ".content must be a string or an array of text parts", where + ".content"};
        }
        msgs.push_back(std::move(cm));
      }
      auto rendered = chat.render(msgs);
      if (!rendered.ok()) return ApiError{400, std::string(rendered.status().message()), "messages"};
      text = *rendered;
      out.prompt = tokenizer.encode(text);
    } else {
      if (!body.contains("prompt")) return ApiError{400, "'prompt' is required", "prompt"};
      json p = body["prompt"];
      if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) p = p[0];
      if (p.is_string()) {
        out.prompt = tokenizer.encode(p.get<std::string>());
      } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_number_integer(); })) {
        for (const json& x : p) {
          const auto id = x.get<int64_t>();
          if (id < 0 || id >= engine.model_config().vocab_size)
            return ApiError{400, fmt::format("token id {} is outside the vocabulary of {}", id, engine.model_config().vocab_size), "prompt"};
          out.prompt.push_back(static_cast<int32_t>(id));
        }
      } else {
        return ApiError{400, "'prompt' must be a string, a list of token ids, or a list with one of them (one prompt per request)", "prompt"};
      }
    }
    const auto len = static_cast<int64_t>(out.prompt.size());
    if (len == 0) return ApiError{400, "The prompt is empty.", is_chat ? "messages" : "prompt"};
    if (len >= ctx)
      return ApiError{400, fmt::format("This model's maximum context length is {} tokens; the prompt has {}.", ctx, len),
                      is_chat ? "messages" : "prompt", "context_length_exceeded"};
    // Lengths and sampling.
    GenerationParams& g = out.gen;
    g.max_tokens = is_chat ? ctx - len : 16;
    const char* max_key = is_chat && body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (body.contains(max_key) && !body[max_key].is_null()) {
      if (!body[max_key].is_number_integer()) return ApiError{400, fmt::format("'{}' must be an integer", max_key), max_key};
      const auto m = body[max_key].get<int64_t>();
      if (m < 1) return ApiError{400, fmt::format("'{}' is {}; it must be at least 1", max_key, m), max_key};
      if (m > ctx - len)  // (len < ctx here; len + m could overflow)
        return ApiError{400, fmt::format("This model's maximum context length is {} tokens; the prompt has {} and "
                                         "'{}' asks for {} more.", ctx, len, max_key, m),
                        max_key, "context_length_exceeded"};
      g.max_tokens = m;
    }
    double temperature = 1.0, top_p = 1.0;
    int64_t top_k = 0, n = 1, seed = 0;
    if (auto e = get_number(body, "temperature", 0.0, 2.0, temperature)) return e;
    if (auto e = get_number(body, "top_p", 1e-9, 1.0, top_p)) return e;
    if (auto e = get_int(body, "top_k", -1, int64_t{1} << 30, top_k)) return e;
    if (auto e = get_int(body, "n", 1, kMaxParallelSamples, n)) return e;
    if (body.contains("seed") && !body["seed"].is_null()) {
      if (auto e = get_int(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), seed))
        return e;
      g.seed = static_cast<uint64_t>(seed);
    }
    g.sampling.temperature = static_cast<float>(temperature);
    g.sampling.top_p = static_cast<float>(top_p);
    g.sampling.top_k = std::max<int64_t>(top_k, 0);
    g.n = n;
    if (body.contains("best_of") && !body["best_of"].is_null() && body["best_of"] != n)
      return ApiError{400, "'best_of' other than n is not supported", "best_of"};
    if (body.contains("logprobs") && !body["logprobs"].is_null() && body["logprobs"] != false && body["logprobs"] != 0)
      return ApiError{400, "'logprobs' is not supported", "logprobs"};
    // Stop strings and the end-of-text token.
    if (body.contains("stop") && !body["stop"].is_null()) {
      const json& s = body["stop"];
      if (s.is_string()) {
        out.stop.push_back(s.get<std::string>());
      } else if (s.is_array() && s.size() <= 16 && std::all_of(s.begin(), s.end(), [](const json& x) { return x.is_string(); })) {
        for (const json& x : s) out.stop.push_back(x.get<std::string>());
      } else {
        return ApiError{400, "'stop' must be a string or an array of at most 16 strings", "stop"};
      }
      for (const auto& st : out.stop)
        if (st.empty()) return ApiError{400, "'stop' strings must not be empty", "stop"};
    }
    if (is_chat) out.stop.insert(out.stop.end(), chat.stop.begin(), chat.stop.end());
    const bool ignore_eos = body.contains("ignore_eos") && body["ignore_eos"].is_boolean() && body["ignore_eos"].get<bool>();
    if (!ignore_eos && tokenizer.eot_id() >= 0) g.stop_token_ids.push_back(tokenizer.eot_id());
    if (body.contains("stream") && !body["stream"].is_null()) {
      if (!body["stream"].is_boolean()) return ApiError{400, "'stream' must be a boolean", "stream"};
      out.stream = body["stream"].get<bool>();
    }
    if (body.contains("stream_options") && body["stream_options"].is_object())
      out.include_usage = body["stream_options"].value("include_usage", false);
    return std::nullopt;
  }

  // ---- generation state of one HTTP request ---------------------------------------------------
  struct Generation {
    std::shared_ptr<RequestStream> stream;
    std::vector<SampleText> samples;
    std::vector<std::string> stop;
    size_t max_stop = 0;
    std::string id;
    int64_t created = 0;
    bool chat = false;
    bool include_usage = false;
    bool role_sent = false;
    bool finished_sent = false;
  };

  static const char* reason_name(FinishReason r) {
    switch (r) {
      case FinishReason::kLength: return "length";
      case FinishReason::kStop: return "stop";
      case FinishReason::kAborted: return "abort";
      case FinishReason::kError: return "error";
      default: return nullptr;
    }
  }

  // Applies events; returns (index, text delta, finish reason or "") per sample that changed.
  std::vector<std::tuple<int64_t, std::string, std::string>> apply(Generation& g, const std::vector<TokenEvent>& events) {
    std::vector<std::tuple<int64_t, std::string, std::string>> out;
    for (const TokenEvent& e : events) {
      SampleText& s = g.samples[static_cast<size_t>(e.index)];
      if (s.done) continue;
      if (e.token >= 0) {
        ++s.num_tokens;
        // Special tokens, and ids past the tokenizer (a model vocabulary padded beyond it), have no text.
        if (e.token < tokenizer.vocab_size() &&
            std::find(special_ids.begin(), special_ids.end(), e.token) == special_ids.end())
          s.bytes += tokenizer.token_bytes(e.token);
      }
      std::string finish = e.finish != FinishReason::kNone ? reason_name(e.finish) : "";
      // Stop strings: the earliest match ends the sample, its text cut before the match.
      size_t cut = std::string::npos;
      const size_t from = s.sent > g.max_stop ? s.sent - g.max_stop : 0;
      for (const std::string& st : g.stop) {
        const size_t at = s.bytes.find(st, from);
        if (at != std::string::npos && at >= s.sent && at < cut) cut = at;
      }
      size_t end;
      if (cut != std::string::npos) {
        end = cut;
        s.bytes.resize(cut);
        if (finish.empty()) engine.finish_sample(g.stream->id(), e.index, FinishReason::kStop);
        finish = "stop";
      } else if (!finish.empty()) {
        end = s.bytes.size();
      } else {  // hold back what could still become a stop string or a UTF-8 character
        const size_t hold = g.max_stop > 0 ? g.max_stop - 1 : 0;
        end = s.bytes.size() > s.sent + hold ? s.bytes.size() - hold : s.sent;
        end = std::max(s.sent, utf8_safe_end(s.bytes, end));
      }
      std::string delta = s.bytes.substr(s.sent, end - s.sent);
      s.sent = end;
      if (!finish.empty()) {
        s.done = true;
        s.finish_reason = finish;
      }
      if (!delta.empty() || !finish.empty()) out.emplace_back(e.index, std::move(delta), finish);
    }
    return out;
  }

  // The engine failed the request (FinishReason::kError): OpenAI's error object, with the
  // engine's reason, replaces the reply (or ends the stream).
  static bool failed(const Generation& g) {
    return std::any_of(g.samples.begin(), g.samples.end(), [](const SampleText& s) { return s.finish_reason == "error"; });
  }
  static json engine_error(const Generation& g) {
    return {{"error", {{"message", g.stream->error()}, {"type", "server_error"}, {"param", nullptr}, {"code", "engine_error"}}}};
  }

  bool all_done(const Generation& g) const {
    return std::all_of(g.samples.begin(), g.samples.end(), [](const SampleText& s) { return s.done; });
  }

  json usage(const Generation& g) const {
    int64_t completion = 0;
    for (const SampleText& s : g.samples) completion += s.num_tokens;
    const int64_t prompt = g.stream->prompt_len();
    return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
  }

  json chunk(const Generation& g, json choices) const {
    return {{"id", g.id}, {"object", g.chat ? "chat.completion.chunk" : "text_completion"}, {"created", g.created},
            {"model", config.model_name}, {"choices", std::move(choices)}};
  }

  json choice_delta(const Generation& g, int64_t index, const std::string& text, const std::string& finish) const {
    json fr = finish.empty() ? json(nullptr) : json(finish);
    if (g.chat) {
      json delta = json::object();
      if (!text.empty()) delta["content"] = text;
      return {{"index", index}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", fr}};
    }
    return {{"index", index}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", fr}};
  }

  // ---- handlers -------------------------------------------------------------------------------
  void handle_generate(const httplib::Request& req, httplib::Response& res, bool is_chat) {
    const ApiError shutting_down{503, "The server is shutting down.", "", "", "server_error"};
    if (draining) return send_error(res, shutting_down);
    ParsedRequest p;
    if (auto err = parse(req, is_chat, p)) return send_error(res, *err);
    auto stream = engine.add_request(p.prompt, p.gen);
    if (stream.ok() && draining) {  // drain's fail_all may have run before this request was added
      engine.abort((*stream)->id());
      return send_error(res, shutting_down);
    }
    if (!stream.ok()) {
      const Status& st = stream.status();
      const bool ctx = st.code() == StatusCode::kOutOfRange;
      return send_error(res, ApiError{400, std::string(st.message()), ctx ? "max_tokens" : "",
                                      ctx ? "context_length_exceeded" : ""});
    }
    auto g = std::make_shared<Generation>();
    g->stream = *stream;
    g->samples.resize(static_cast<size_t>(p.gen.n));
    g->stop = p.stop;
    for (const auto& s : g->stop) g->max_stop = std::max(g->max_stop, s.size());
    g->id = fmt::format("{}-{}", is_chat ? "chatcmpl" : "cmpl", next_id++);
    g->created = static_cast<int64_t>(std::time(nullptr));
    g->chat = is_chat;
    g->include_usage = p.include_usage;
    if (!p.stream) {
      // The whole reply is one JSON object, written when the request completes. Until then a
      // space (JSON allows leading whitespace) every 250 ms probes the connection, so a client
      // that went away aborts its request here too (cpp-httplib 0.11 has no other signal).
      res.set_chunked_content_provider(
          "application/json", [this, g](size_t, httplib::DataSink& sink) { return whole_some(*g, sink); },
          [this, g](bool) {
            if (!g->stream->finished()) engine.abort(g->stream->id());
          });
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, g](size_t, httplib::DataSink& sink) { return stream_some(*g, sink); },
        [this, g](bool) {
          // Whatever happened to the connection: free the sequences of an unfinished request.
          if (!g->stream->finished()) engine.abort(g->stream->id());
        });
  }

  // One call of the non-streamed reply's provider: takes the tokens that came within ~250 ms
  // (as they come, so that a stop string ends its sample at once); writes the reply when done,
  // else one space. A failed write means the client left: the releaser aborts the request.
  bool whole_some(Generation& g, httplib::DataSink& sink) {
    std::vector<TokenEvent> events;
    const auto t0 = std::chrono::steady_clock::now();
    while (!all_done(g) && std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(250)) {
      if (!g.stream->wait(events, std::chrono::milliseconds(50)) && events.empty()) break;
      apply(g, events);
      events.clear();
    }
    apply(g, events);
    if (!all_done(g)) return sink.write(" ", 1);  // (every sample's stream ends with a finish event)
    const std::string body = failed(g) ? dump(engine_error(g)) : whole_body(g);
    if (!sink.write(body.data(), body.size())) return false;
    sink.done();
    return true;
  }

  std::string whole_body(Generation& g) {
    json choices = json::array();
    for (size_t i = 0; i < g.samples.size(); ++i) {
      const SampleText& s = g.samples[i];
      json fr = s.finish_reason.empty() ? json(nullptr) : json(s.finish_reason);
      if (g.chat) {
        choices.push_back({{"index", i}, {"message", {{"role", "assistant"}, {"content", s.bytes}}},
                           {"logprobs", nullptr}, {"finish_reason", fr}});
      } else {
        choices.push_back({{"index", i}, {"text", s.bytes}, {"logprobs", nullptr}, {"finish_reason", fr}});
      }
    }
    json r = {{"id", g.id}, {"object", g.chat ? "chat.completion" : "text_completion"}, {"created", g.created},
              {"model", config.model_name}, {"choices", choices}, {"usage", usage(g)}};
    return dump(r);
  }

  // One call of the chunked provider: waits briefly for tokens, sends them as SSE events. A
  // failed write means the client left: the releaser aborts the request.
  bool stream_some(Generation& g, httplib::DataSink& sink) {
    auto send = [&](const json& j) {
      const std::string line = "data: " + dump(j) + "\n\n";
      return sink.write(line.data(), line.size());
    };
    if (g.chat && !g.role_sent) {
      g.role_sent = true;
      json choices = json::array();
      for (size_t i = 0; i < g.samples.size(); ++i)
        choices.push_back({{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                           {"finish_reason", nullptr}});
      if (!send(chunk(g, choices))) return false;
    }
    std::vector<TokenEvent> events;
    const auto t0 = std::chrono::steady_clock::now();
    // Wait up to ~1 s for events; then a comment line probes the connection.
    while (events.empty() && !all_done(g) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1)) {
      if (!g.stream->wait(events, std::chrono::milliseconds(50)) && events.empty()) break;
    }
    if (events.empty() && !all_done(g) && !g.stream->finished()) {
      static const std::string ping = ": ping\n\n";
      return sink.write(ping.data(), ping.size());
    }
    for (auto& [index, text, finish] : apply(g, events)) {
      if (finish == "error") continue;  // the error event below ends the stream
      if (!send(chunk(g, json::array({choice_delta(g, index, text, finish)})))) return false;
    }
    if (all_done(g) && failed(g)) {
      static const std::string done = "data: [DONE]\n\n";
      if (!send(engine_error(g)) || !sink.write(done.data(), done.size())) return false;
      sink.done();
      return true;
    }
    if (all_done(g)) {
      if (g.include_usage) {
        json u = chunk(g, json::array());
        u["usage"] = usage(g);
        if (!send(u)) return false;
      }
      static const std::string done = "data: [DONE]\n\n";
      if (!sink.write(done.data(), done.size())) return false;
      sink.done();
    }
    return true;
  }

  bool authorized(const httplib::Request& req) const {
    if (config.api_key.empty()) return true;
    return req.get_header_value("Authorization") == "Bearer " + config.api_key;
  }

  void install(httplib::Server& s) {
    s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (req.path.rfind("/v1/", 0) == 0 && !authorized(req)) {
        send_error(res, ApiError{401, "Incorrect API key provided.", "", "invalid_api_key"});
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    s.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_generate(q, r, false); });
    s.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_generate(q, r, true); });
    s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& r) {
      json m = {{"id", config.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "kiln"},
                {"max_model_len", engine.model_config().max_seq_len}};
      r.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
    });
    s.Get("/health", [](const httplib::Request&, httplib::Response& r) {
      r.set_content("{\"status\":\"ok\"}", "application/json");
    });
    s.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
      r.set_content(engine.metrics_text(), "text/plain; version=0.0.4");
    });
    s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const std::string msg = res.status == 404 ? fmt::format("Unknown path {} {}.", req.method, req.path)
                                                : fmt::format("HTTP {} for {} {}.", res.status, req.method, req.path);
      send_error(res, ApiError{res.status, msg, "", res.status == 404 ? "not_found" : ""});
    });
    // The last line of defence: a JSON type error can only come from the request's values (a
    // client error, 400); anything else is the server's (500). Either way the server goes on.
    s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      try {
        if (ep) std::rethrow_exception(ep);
        send_error(res, ApiError{500, "internal error", "", "", "server_error"});
      } catch (const nlohmann::json::exception& e) {
        send_error(res, ApiError{400, fmt::format("The request has a value of the wrong type ({}).", e.what())});
      } catch (const std::bad_alloc&) {
        send_error(res, ApiError{503, "The server is out of memory for this request.", "", "", "server_error"});
      } catch (const std::exception& e) {
        send_error(res, ApiError{500, e.what(), "", "", "server_error"});
      } catch (...) {
        send_error(res, ApiError{500, "internal error", "", "", "server_error"});
      }
    });
  }
};

Expected<std::unique_ptr<Server>> Server::create(Engine& engine, tok::Tokenizer tokenizer, ChatTemplate chat,
                                                 const ServerConfig& config) {
  if (tokenizer.vocab_size() > engine.model_config().vocab_size)
    return invalid_argument("[serve] the tokenizer has {} tokens, the model's vocabulary {}", tokenizer.vocab_size(),
                            engine.model_config().vocab_size);
  if (config.num_http_threads < 1) return invalid_argument("[serve] --http-threads must be >= 1");
  std::unique_ptr<Server> s(new Server());
  s->impl_ = std::make_unique<Impl>(engine, std::move(tokenizer), std::move(chat), config);
  if (config.max_connections < 1) return invalid_argument("[serve] --max-connections must be >= 1");
  if (config.request_timeout.count() < 1 || config.keep_alive_timeout.count() < 1)
    return invalid_argument("[serve] the request and keep-alive timeouts must be positive");
  HttpGateConfig gate;
  gate.num_workers = config.num_http_threads;
  gate.max_connections = config.max_connections;
  gate.request_timeout = config.request_timeout;
  gate.keep_alive_timeout = config.keep_alive_timeout;
  s->http_ = std::make_unique<GatedHttpServer>(gate);
  s->impl_->install(*s->http_);
  engine.start();
  return s;
}

Server::~Server() { stop(); }

Status Server::bind() {
  const ServerConfig& c = impl_->config;
  KILN_ASSIGN_OR_RETURN(port_, bind_http_server(*http_, c.host, c.port));
  return {};
}

void Server::listen() { http_->listen_after_bind(); }

bool Server::running() const { return http_ && http_->is_running(); }

void Server::start() {
  thread_ = std::thread([this] { listen(); });
  for (int i = 0; i < 5000 && !http_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void Server::stop() { drain(std::chrono::milliseconds(0)); }

void Server::drain(std::chrono::milliseconds grace) {
  if (!http_) return;
  impl_->draining = true;  // handlers answer 503 from here on
  impl_->engine.fail_all("The server is shutting down.");
  http_->shutdown_gate(grace);
  if (thread_.joinable()) thread_.join();
}

Expected<ServedModel> load_served_model(const std::string& dir) {
  ServedModel m;
  KILN_ASSIGN_OR_RETURN(m.model, load_model(dir));
  KILN_ASSIGN_OR_RETURN(m.tokenizer, tok::Tokenizer::load_hf_json((std::filesystem::path(dir) / "tokenizer.json").string()));
  KILN_ASSIGN_OR_RETURN(m.chat, load_chat_template(dir));
  return m;
}

}  // namespace kiln
