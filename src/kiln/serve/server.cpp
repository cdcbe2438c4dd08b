// Server: requests parsed by parse_request (request.h; errors as {"error": {...}}), incremental
// detokenization with stop strings (text that may begin a stop string or a UTF-8 character is
// held back), echo and logprobs in OpenAI's two formats, JSON replies and SSE streams.
#include "kiln/serve/server.h"

#include "kiln/model/gguf.h"
#include "kiln/quant/gguf_weights.h"

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
#include "kiln/serve/request.h"
#include "kiln/core/utf8.h"

namespace kiln {

using json = nlohmann::json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

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

// One reported token of a reply with logprobs: where its text starts in the sample's text and
// how long it is (0 for a special token), and its logprob entry (none: the first prompt token).
struct TokenRecord {
  int32_t token = 0;
  size_t offset = 0, length = 0;
  std::optional<LogprobEntry> lp;
};

// The text side of one sample: bytes so far, what was sent, stop-string matching.
struct SampleText {
  std::string bytes;
  size_t sent = 0;
  int64_t num_tokens = 0;
  bool done = false;
  std::string finish_reason;
  std::vector<TokenRecord> records;  // with logprobs: the sampled tokens in order
  size_t records_sent = 0;           // streaming: records already in a chunk
  bool echo_sent = false;            // streaming with echo: the prompt's chunk went out
};

// A reply's delta for one sample: text, finish reason ("" while running), and the end of the
// sample's text sent so far (the tokens that start before it go with this delta).
struct Delta {
  int64_t index = 0;
  std::string text;
  std::string finish;
  size_t end = 0;
};

// A token's text for a logprobs reply: its bytes when they are UTF-8, else OpenAI's
// "bytes:\xNN..." spelling of them.
std::string token_string(std::string_view b) {
  if (valid_utf8(b)) return std::string(b);
  std::string out = "bytes:";
  for (const char c : b) out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
  return out;
}

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

  RequestContext request_context() const {
    return RequestContext{config.model_name, engine.context_len(), engine.model_config().vocab_size, &tokenizer, &chat};
  }

  // A token's text in the reply (special tokens and ids past the tokenizer have none) and its
  // name in a logprobs entry.
  std::string_view token_text(int32_t t) const {
    if (t < 0 || t >= tokenizer.vocab_size() || std::find(special_ids.begin(), special_ids.end(), t) != special_ids.end())
      return {};
    return tokenizer.token_bytes(t);
  }
  std::string_view token_name(int32_t t) const {
    return t >= 0 && t < tokenizer.vocab_size() ? tokenizer.token_bytes(t) : std::string_view();
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
    int64_t num_logprobs = -1;     // -1: no logprobs in the reply
    bool echo = false;             // completions: the prompt's text (and logprobs) first
    bool discard_output = false;   // echo with max_tokens 0: the generated token is dropped
    std::vector<int32_t> prompt;   // echo: its tokens
    std::string prompt_text;       // echo: their text
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

  // Applies events; returns a Delta per event that changed a sample's text or ended it.
  std::vector<Delta> apply(Generation& g, const std::vector<TokenEvent>& events) {
    std::vector<Delta> out;
    for (const TokenEvent& e : events) {
      SampleText& s = g.samples[static_cast<size_t>(e.index)];
      if (s.done) continue;
      if (e.token >= 0 && !g.discard_output) {
        ++s.num_tokens;
        // Special tokens, and ids past the tokenizer (a model vocabulary padded beyond it), have no text.
        const std::string_view text = token_text(e.token);
        if (g.num_logprobs >= 0) s.records.push_back({e.token, s.bytes.size(), text.size(), e.logprobs});
        s.bytes += text;
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
      if (!delta.empty() || !finish.empty()) out.push_back({e.index, std::move(delta), finish, s.sent});
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

  // ---- logprobs -------------------------------------------------------------------------------
  // The records of the echoed prompt (its text starts at offset 0; the first token has no
  // logprob). Called once the engine has set the prompt's logprobs (before any token event).
  std::vector<TokenRecord> prompt_records(const Generation& g) const {
    std::vector<TokenRecord> r;
    const std::vector<LogprobEntry> lp = g.num_logprobs >= 0 ? g.stream->prompt_logprobs() : std::vector<LogprobEntry>{};
    size_t offset = 0;
    for (size_t i = 0; i < g.prompt.size(); ++i) {
      const std::string_view name = token_name(g.prompt[i]);
      TokenRecord rec{g.prompt[i], offset, name.size(), std::nullopt};
      if (i > 0 && i < lp.size()) rec.lp = lp[i];
      r.push_back(std::move(rec));
      offset += name.size();
    }
    return r;
  }

  // Whether a record's token belongs to the text sent up to `end`: it starts before it (or is
  // an empty special token at it). Tokens of a stop string that was cut off start after it.
  static bool record_within(const TokenRecord& r, size_t end) {
    return r.offset < end || (r.length == 0 && r.offset <= end);
  }

  // The completions `logprobs` object of records, offsets shifted by `base` (the prompt's
  // text before the sample's with echo). top_logprobs holds the k most likely and the token
  // itself, as OpenAI's (so up to k + 1 entries).
  json completion_logprobs(const std::vector<TokenRecord>& recs, size_t base) const {
    json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
    for (const TokenRecord& r : recs) {
      tokens.push_back(token_string(token_name(r.token)));
      offsets.push_back(r.offset + base);
      if (!r.lp) {
        token_lps.push_back(nullptr);
        tops.push_back(nullptr);
        continue;
      }
      token_lps.push_back(r.lp->logprob);
      json top = json::object();
      for (const TokenLogprob& t : r.lp->top) {
        const std::string name = token_string(token_name(t.token));
        if (!top.contains(name)) top[name] = t.logprob;
      }
      const std::string self = token_string(token_name(r.token));
      if (!top.contains(self)) top[self] = r.lp->logprob;
      tops.push_back(std::move(top));
    }
    return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  json chat_token(int32_t token, float logprob) const {
    const std::string_view b = token_name(token);
    json bytes = json::array();
    for (const char c : b) bytes.push_back(static_cast<unsigned char>(c));
    return {{"token", token_string(b)}, {"logprob", logprob}, {"bytes", bytes}};
  }

  // Chat's `logprobs`: {"content": [{token, logprob, bytes, top_logprobs: [k most likely]}]}.
  json chat_logprobs(const std::vector<TokenRecord>& recs) const {
    json content = json::array();
    for (const TokenRecord& r : recs) {
      if (!r.lp) continue;
      json c = chat_token(r.token, r.lp->logprob);
      json top = json::array();
      for (const TokenLogprob& t : r.lp->top) top.push_back(chat_token(t.token, t.logprob));
      c["top_logprobs"] = std::move(top);
      content.push_back(std::move(c));
    }
    return {{"content", content}, {"refusal", nullptr}};
  }

  // The records of sample s that go with text sent up to `end`, from the first not yet sent.
  std::vector<TokenRecord> take_records(SampleText& s, size_t end) const {
    std::vector<TokenRecord> out;
    while (s.records_sent < s.records.size() && record_within(s.records[s.records_sent], end))
      out.push_back(s.records[s.records_sent++]);
    return out;
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

  json choice_delta(Generation& g, const Delta& d) const {
    json fr = d.finish.empty() ? json(nullptr) : json(d.finish);
    json lp = nullptr;
    SampleText& s = g.samples[static_cast<size_t>(d.index)];
    if (g.num_logprobs >= 0) {
      const std::vector<TokenRecord> recs = take_records(s, d.end);
      lp = g.chat ? chat_logprobs(recs) : completion_logprobs(recs, g.echo ? g.prompt_text.size() : 0);
    }
    if (g.chat) {
      json delta = json::object();
      if (!d.text.empty()) delta["content"] = d.text;
      return {{"index", d.index}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", fr}};
    }
    return {{"index", d.index}, {"text", d.text}, {"logprobs", lp}, {"finish_reason", fr}};
  }

  // ---- handlers -------------------------------------------------------------------------------
  void handle_generate(const httplib::Request& req, httplib::Response& res, bool is_chat) {
    const ApiError shutting_down{503, "The server is shutting down.", "", "", "server_error"};
    if (draining) return send_error(res, shutting_down);
    ParseResult parsed = parse_request(req.body, is_chat, request_context());
    if (const ApiError* err = std::get_if<ApiError>(&parsed)) return send_error(res, *err);
    ParsedRequest& p = std::get<ParsedRequest>(parsed);
    auto g = std::make_shared<Generation>();
    if (p.echo) {
      g->prompt = p.prompt;
      for (const int32_t t : p.prompt) g->prompt_text += token_name(t);
    }
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
    g->stream = *stream;
    g->samples.resize(static_cast<size_t>(p.gen.n));
    g->stop = p.stop;
    for (const auto& s : g->stop) g->max_stop = std::max(g->max_stop, s.size());
    g->id = fmt::format("{}-{}", is_chat ? "chatcmpl" : "cmpl", next_id++);
    g->created = static_cast<int64_t>(std::time(nullptr));
    g->chat = is_chat;
    g->include_usage = p.include_usage;
    g->num_logprobs = p.num_logprobs;
    g->echo = p.echo;
    g->discard_output = p.discard_output;
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
    const std::vector<TokenRecord> echo_records =
        g.echo && g.num_logprobs >= 0 ? prompt_records(g) : std::vector<TokenRecord>{};
    for (size_t i = 0; i < g.samples.size(); ++i) {
      SampleText& s = g.samples[i];
      json fr = s.finish_reason.empty() ? json(nullptr) : json(s.finish_reason);
      json lp = nullptr;
      if (g.num_logprobs >= 0) {
        const std::vector<TokenRecord> recs = take_records(s, s.bytes.size());
        if (g.chat) {
          lp = chat_logprobs(recs);
        } else {
          lp = completion_logprobs(echo_records, 0);
          const json gen = completion_logprobs(recs, g.echo ? g.prompt_text.size() : 0);
          for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
            for (const json& x : gen[key]) lp[key].push_back(x);
        }
      }
      if (g.chat) {
        choices.push_back({{"index", i}, {"message", {{"role", "assistant"}, {"content", s.bytes}}},
                           {"logprobs", lp}, {"finish_reason", fr}});
      } else {
        choices.push_back({{"index", i}, {"text", (g.echo ? g.prompt_text : std::string()) + s.bytes},
                           {"logprobs", lp}, {"finish_reason", fr}});
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
    if (g.echo && (!events.empty() || all_done(g))) {
      // The prompt first, one chunk per sample (its logprobs are set before any token event).
      const std::vector<TokenRecord> recs = g.num_logprobs >= 0 ? prompt_records(g) : std::vector<TokenRecord>{};
      for (size_t i = 0; i < g.samples.size(); ++i) {
        if (g.samples[i].echo_sent) continue;
        g.samples[i].echo_sent = true;
        json c = {{"index", i}, {"text", g.prompt_text},
                  {"logprobs", g.num_logprobs >= 0 ? completion_logprobs(recs, 0) : json(nullptr)},
                  {"finish_reason", nullptr}};
        if (!send(chunk(g, json::array({c})))) return false;
      }
    }
    for (const Delta& d : apply(g, events)) {
      if (d.finish == "error") continue;  // the error event below ends the stream
      if (!send(chunk(g, json::array({choice_delta(g, d)})))) return false;
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

Expected<ServedModel> load_served_model(const std::string& path) {
  ServedModel m;
  if (path.ends_with(".gguf")) {
    KILN_ASSIGN_OR_RETURN(gguf::LoadedModel g, quant::load_gguf_model(path, &m.quantized));
    if (g.tokenizer_json.empty())
      return failed_precondition("{} has no tokenizer kiln can run ({}); convert it to a model directory with a "
                                 "tokenizer.json (kiln convert) instead", path, g.tokenizer_note);
    auto tk = tok::Tokenizer::parse_hf_json(g.tokenizer_json);
    if (!tk.ok()) return Status(tk.status().code(), fmt::format("{}: its tokenizer: {}", path, tk.status().message()));
    m.model = std::move(g.model);  // Q8_0 / Q4_0 run as stored
    m.tokenizer = std::move(*tk);
    return m;  // the default chat template
  }
  KILN_ASSIGN_OR_RETURN(m.model, quant::load_any_model(path, &m.quantized));
  KILN_ASSIGN_OR_RETURN(m.tokenizer, tok::Tokenizer::load_hf_json((std::filesystem::path(path) / "tokenizer.json").string()));
  KILN_ASSIGN_OR_RETURN(m.chat, load_chat_template(path));
  return m;
}

}  // namespace kiln
