// parse_request: one pass over the body's keys (known, accepted without effect, refused by name,
// or unrecognized), then each field read through a type-checked helper. Integers are read in
// their own representation (nlohmann keeps non-negative ones unsigned: get<int64_t>() of
// 2^64 - 1 would be -1), so no value at the edge of its type can pass a range check by wrapping.
#include "kiln/serve/request.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>

#include "kiln/core/json.h"

namespace kiln {

using json = nlohmann::json;

namespace {

// A request body is at most 64 MiB and 32 levels deep (a chat request with content parts
// needs 5); the HTTP layer already refuses larger payloads (payload_max_length).
constexpr JsonLimits kRequestJsonLimits{.max_depth = 32, .max_bytes = int64_t{64} << 20};

using Error = std::optional<ApiError>;

ApiError bad(const std::string& param, std::string message) { return ApiError{400, std::move(message), param}; }

// The body's value for `key`, or null when it is absent or JSON null (OpenAI treats null as
// "not given" for every parameter).
const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// A JSON integer (signed or unsigned representation) in [lo, hi]; floats, booleans and
// strings are refused, and so is 2^64 - 1 rather than read as -1.
Error read_int(const json& v, const std::string& key, int64_t lo, int64_t hi, int64_t& out) {
  if (!v.is_number_integer()) return bad(key, fmt::format("'{}' must be an integer", key));
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (hi < 0 || u > static_cast<uint64_t>(hi))
      return bad(key, fmt::format("'{}' is {}; it must be in [{}, {}]", key, u, lo, hi));
    if (lo > 0 && u < static_cast<uint64_t>(lo))
      return bad(key, fmt::format("'{}' is {}; it must be in [{}, {}]", key, u, lo, hi));
    out = static_cast<int64_t>(u);
    return std::nullopt;
  }
  const auto x = v.get<int64_t>();
  if (x < lo || x > hi) return bad(key, fmt::format("'{}' is {}; it must be in [{}, {}]", key, x, lo, hi));
  out = x;
  return std::nullopt;
}

// A JSON number (integer or float) in [lo, hi]; -0.0 is 0.
Error read_number(const json& v, const std::string& key, double lo, double hi, double& out) {
  if (!v.is_number()) return bad(key, fmt::format("'{}' must be a number", key));
  const double x = v.get<double>();
  if (!std::isfinite(x) || !(x >= lo && x <= hi))
    return bad(key, fmt::format("'{}' is {}; it must be in [{}, {}]", key, x, lo, hi));
  out = x == 0.0 ? 0.0 : x;
  return std::nullopt;
}

Error read_bool(const json& v, const std::string& key, bool& out) {
  if (!v.is_boolean()) return bad(key, fmt::format("'{}' must be a boolean", key));
  out = v.get<bool>();
  return std::nullopt;
}

Error read_string(const json& v, const std::string& key, std::string& out) {
  if (!v.is_string()) return bad(key, fmt::format("'{}' must be a string", key));
  out = v.get<std::string>();
  return std::nullopt;
}

// How kiln treats each top-level key. Anything not listed is refused as unrecognized, as
// OpenAI's own API does ("Unrecognized request argument supplied"): a parameter a client thinks
// it set must never be silently ignored. (vLLM and llama-server ignore unknown keys instead.)
enum class Key { kRead, kInert, kRefused };
struct KeyRule {
  const char* name;
  Key how;
  bool completions, chat;  // which endpoints know it
};
// kRead: parsed below. kInert: accepted (type-checked) and without effect on the output
// (identifiers for the caller's own bookkeeping, hints). kRefused: OpenAI parameters kiln does
// not implement; any non-null value is a 400 naming it (response_format {"type": "text"},
// modalities ["text"], store false and service_tier "auto"/"default" are the defaults and pass).
constexpr KeyRule kKeys[] = {
    {"model", Key::kRead, true, true},
    {"prompt", Key::kRead, true, false},
    {"messages", Key::kRead, false, true},
    {"max_tokens", Key::kRead, true, true},
    {"max_completion_tokens", Key::kRead, false, true},
    {"temperature", Key::kRead, true, true},
    {"top_p", Key::kRead, true, true},
    {"n", Key::kRead, true, true},
    {"best_of", Key::kRead, true, false},
    {"stop", Key::kRead, true, true},
    {"stream", Key::kRead, true, true},
    {"stream_options", Key::kRead, true, true},
    {"seed", Key::kRead, true, true},
    {"frequency_penalty", Key::kRead, true, true},
    {"presence_penalty", Key::kRead, true, true},
    {"logit_bias", Key::kRead, true, true},
    {"logprobs", Key::kRead, true, true},
    {"top_logprobs", Key::kRead, false, true},
    {"echo", Key::kRead, true, false},
    {"response_format", Key::kRead, false, true},
    {"modalities", Key::kRead, false, true},
    {"store", Key::kRead, false, true},
    {"service_tier", Key::kRead, false, true},
    // kiln's extensions (vLLM's names)
    {"top_k", Key::kRead, true, true},
    {"ignore_eos", Key::kRead, true, true},
    // no effect on what is computed
    {"user", Key::kInert, true, true},
    {"safety_identifier", Key::kInert, false, true},
    {"prompt_cache_key", Key::kInert, false, true},
    {"metadata", Key::kInert, false, true},
    {"parallel_tool_calls", Key::kInert, false, true},  // only means something with tools
    // OpenAI parameters kiln does not implement
    {"suffix", Key::kRefused, true, false},
    {"tools", Key::kRefused, false, true},
    {"tool_choice", Key::kRefused, false, true},
    {"functions", Key::kRefused, false, true},
    {"function_call", Key::kRefused, false, true},
    {"audio", Key::kRefused, false, true},
    {"prediction", Key::kRefused, false, true},
    {"reasoning_effort", Key::kRefused, false, true},
    {"web_search_options", Key::kRefused, false, true},
    {"verbosity", Key::kRefused, false, true},
    {"prompt_cache_retention", Key::kRefused, false, true},
};

Error check_keys(const json& body, bool chat) {
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& key = it.key();
    const KeyRule* rule = nullptr;
    for (const KeyRule& k : kKeys)
      if (key == k.name && (chat ? k.chat : k.completions)) rule = &k;
    if (!rule)
      return ApiError{400, fmt::format("Unrecognized request argument supplied: '{}'", key), key,
                      "unrecognized_argument"};
    if (it->is_null()) continue;
    if (rule->how == Key::kRefused)
      return ApiError{400, fmt::format("'{}' is not supported by kiln", key), key, "unsupported_parameter"};
    if (rule->how == Key::kInert) {
      const bool ok = key == "metadata" ? it->is_object() : key == "parallel_tool_calls" ? it->is_boolean() : it->is_string();
      if (!ok)
        return bad(key, fmt::format("'{}' must be {}", key, key == "metadata" ? "an object" : key == "parallel_tool_calls" ? "a boolean" : "a string"));
    }
  }
  return std::nullopt;
}

// Token ids of a completions prompt: "text", [ids], or a list holding one of them.
Error parse_prompt(const json& body, const RequestContext& ctx, std::vector<int32_t>& out) {
  const json* p = field(body, "prompt");
  if (!p) return bad("prompt", "'prompt' is required");
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    out = ctx.tokenizer->encode(p->get_ref<const std::string&>());
    return std::nullopt;
  }
  if (p->is_array() && !p->empty() && std::all_of(p->begin(), p->end(), [](const json& x) { return x.is_number(); })) {
    out.reserve(p->size());
    for (const json& x : *p) {
      int64_t id = 0;
      if (auto e = read_int(x, "prompt", 0, ctx.vocab_size - 1, id))
        return bad("prompt", fmt::format("prompt token ids must be integers in [0, {}] (the vocabulary)", ctx.vocab_size - 1));
      out.push_back(static_cast<int32_t>(id));
    }
    return std::nullopt;
  }
  return bad("prompt",
             "'prompt' must be a string, a list of token ids, or a list with one of them (one prompt per request)");
}

Error parse_messages(const json& body, const RequestContext& ctx, std::vector<int32_t>& out) {
  const json* ms = field(body, "messages");
  if (!ms || !ms->is_array() || ms->empty()) return bad("messages", "'messages' must be a non-empty array");
  std::vector<ChatMessage> msgs;
  for (size_t i = 0; i < ms->size(); ++i) {
    const json& m = (*ms)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) return bad(where, where + " must be an object with a string 'role'");
    const json* role = field(m, "role");
    if (!role || !role->is_string()) return bad(where, where + " must be an object with a string 'role'");
    for (auto it = m.begin(); it != m.end(); ++it) {
      if (it.key() == "role" || it.key() == "content" || it->is_null()) continue;
      if ((it.key() == "tool_calls" || it.key() == "annotations") && it->is_array() && it->empty()) continue;
      // name, tool_calls, tool_call_id, function_call, audio, refusal: kiln's chat template
      // renders none of them, and ignoring one would change the prompt the client meant.
      return ApiError{400, fmt::format("{}.{} is not supported by kiln", where, it.key()), where + "." + it.key(),
                      "unsupported_parameter"};
    }
    ChatMessage cm{role->get<std::string>(), ""};
    const json* c = field(m, "content");
    if (c && c->is_string()) {
      cm.content = c->get<std::string>();
    } else if (c && c->is_array()) {  // content parts: only text
      for (const json& part : *c) {
        const json* type = part.is_object() ? field(part, "type") : nullptr;
        const json* text = part.is_object() ? field(part, "text") : nullptr;
        if (!type || !type->is_string() || type->get_ref<const std::string&>() != "text" || !text || !text->is_string())
          return bad(where + ".content", where + ".content parts must be {\"type\": \"text\", \"text\": ...}");
        cm.content += text->get_ref<const std::string&>();
      }
    } else if (c) {
      return bad(where + ".content", where + ".content must be a string or an array of text parts");
    }
    msgs.push_back(std::move(cm));
  }
  auto rendered = ctx.chat->render(msgs);
  if (!rendered.ok()) return bad("messages", "'messages': " + std::string(rendered.status().message()));
  out = ctx.tokenizer->encode(*rendered);
  return std::nullopt;
}

// logit_bias: {"<token id>": bias in [-100, 100], ...}.
Error parse_logit_bias(const json& v, const RequestContext& ctx, LogitAdjust& adjust) {
  if (!v.is_object()) return bad("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& key = it.key();
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    const bool digits = !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (!digits || ec != std::errc() || end != key.data() + key.size() || id >= ctx.vocab_size)
      return bad("logit_bias", fmt::format("logit_bias key '{}' must be a token id in [0, {}]", key, ctx.vocab_size - 1));
    double b = 0;
    if (auto e = read_number(*it, "logit_bias", -100, 100, b))
      return bad("logit_bias", fmt::format("logit_bias[{}] must be a number in [-100, 100]", key));
    adjust.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
  return std::nullopt;
}

Error parse_body(const json& body, bool chat, const RequestContext& ctx, ParsedRequest& out) {
  out.chat = chat;
  if (auto e = check_keys(body, chat)) return e;
  if (const json* m = field(body, "model")) {
    if (!m->is_string()) return bad("model", "'model' must be a string");
    if (m->get_ref<const std::string&>() != ctx.model_name)
      return ApiError{404, fmt::format("The model '{}' does not exist; this server serves '{}'.",
                                       m->get_ref<const std::string&>(), ctx.model_name),
                      "model", "model_not_found"};
  }
  const char* prompt_key = chat ? "messages" : "prompt";
  if (auto e = chat ? parse_messages(body, ctx, out.prompt) : parse_prompt(body, ctx, out.prompt)) return e;
  const auto len = static_cast<int64_t>(out.prompt.size());
  const int64_t ctx_len = ctx.context_len;
  if (len == 0) return bad(prompt_key, "The prompt is empty.");
  if (len >= ctx_len)
    return ApiError{400, fmt::format("This model's maximum context length is {} tokens; the prompt has {}.", ctx_len, len),
                    prompt_key, "context_length_exceeded"};

  // Output options first: echo allows max_tokens 0.
  if (const json* v = field(body, "echo"))
    if (auto e = read_bool(*v, "echo", out.echo)) return e;
  if (const json* v = field(body, "logprobs")) {
    if (chat) {
      bool on = false;
      if (auto e = read_bool(*v, "logprobs", on)) return e;
      if (on) out.num_logprobs = 0;
    } else if (auto e = read_int(*v, "logprobs", 0, kMaxCompletionLogprobs, out.num_logprobs)) {
      return e;
    }
  }
  if (const json* v = field(body, "top_logprobs")) {  // chat only (check_keys)
    int64_t k = 0;
    if (auto e = read_int(*v, "top_logprobs", 0, kMaxLogprobs, k)) return e;
    if (out.num_logprobs < 0) return bad("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
    out.num_logprobs = k;
  }
  GenerationParams& g = out.gen;
  g.num_logprobs = out.num_logprobs;
  g.prompt_logprobs = out.echo && out.num_logprobs >= 0;

  // Lengths. (len < ctx_len here, so ctx_len - len cannot overflow; len + max_tokens could.)
  g.max_tokens = chat ? ctx_len - len : std::min<int64_t>(16, ctx_len - len);
  const int64_t min_tokens = out.echo ? 0 : 1;
  const char* max_key = "max_tokens";
  std::optional<int64_t> max_tokens;
  if (const json* v = field(body, "max_tokens")) {
    int64_t m = 0;
    if (auto e = read_int(*v, "max_tokens", min_tokens, std::numeric_limits<int64_t>::max(), m)) return e;
    max_tokens = m;
  }
  if (const json* v = field(body, "max_completion_tokens")) {  // chat only (check_keys)
    int64_t m = 0;
    if (auto e = read_int(*v, "max_completion_tokens", min_tokens, std::numeric_limits<int64_t>::max(), m)) return e;
    if (max_tokens && *max_tokens != m)
      return bad("max_completion_tokens", "'max_tokens' and 'max_completion_tokens' differ; give one");
    max_tokens = m;
    max_key = "max_completion_tokens";
  }
  if (max_tokens) {
    int64_t m = *max_tokens;
    if (m > ctx_len - len)
      return ApiError{400, fmt::format("This model's maximum context length is {} tokens; the prompt has {} and "
                                       "'{}' asks for {} more.", ctx_len, len, max_key, m),
                      max_key, "context_length_exceeded"};
    if (m == 0) {  // echo only: score the prompt; one token is generated and dropped
      out.discard_output = true;
      m = 1;
    }
    g.max_tokens = m;
  }

  // Sampling.
  double temperature = 1.0, top_p = 1.0, freq = 0.0, pres = 0.0;
  int64_t top_k = 0, n = 1;
  if (const json* v = field(body, "temperature"))
    if (auto e = read_number(*v, "temperature", 0.0, 2.0, temperature)) return e;
  if (const json* v = field(body, "top_p")) {
    if (auto e = read_number(*v, "top_p", 0.0, 1.0, top_p)) return e;
    if (top_p <= 0.0) return bad("top_p", "'top_p' must be greater than 0");
  }
  if (const json* v = field(body, "top_k"))
    if (auto e = read_int(*v, "top_k", -1, int64_t{1} << 30, top_k)) return e;
  if (const json* v = field(body, "n"))
    if (auto e = read_int(*v, "n", 1, kMaxParallelSamples, n)) return e;
  if (const json* v = field(body, "best_of")) {
    int64_t best_of = 0;
    if (auto e = read_int(*v, "best_of", 1, kMaxParallelSamples, best_of)) return e;
    if (best_of != n) return bad("best_of", "'best_of' other than n is not supported by kiln");
  }
  if (const json* v = field(body, "seed")) {
    // Any 64-bit integer, signed or unsigned: its bits seed the generators.
    if (!v->is_number_integer()) return bad("seed", "'seed' must be an integer");
    g.seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  }
  if (const json* v = field(body, "frequency_penalty"))
    if (auto e = read_number(*v, "frequency_penalty", -2.0, 2.0, freq)) return e;
  if (const json* v = field(body, "presence_penalty"))
    if (auto e = read_number(*v, "presence_penalty", -2.0, 2.0, pres)) return e;
  if (const json* v = field(body, "logit_bias"))
    if (auto e = parse_logit_bias(*v, ctx, g.adjust)) return e;
  g.sampling.temperature = static_cast<float>(temperature);
  g.sampling.top_p = static_cast<float>(top_p);
  g.sampling.top_k = std::max<int64_t>(top_k, 0);
  g.adjust.frequency_penalty = static_cast<float>(freq);
  g.adjust.presence_penalty = static_cast<float>(pres);
  g.n = n;

  // Output format parameters whose defaults kiln implements.
  if (const json* v = field(body, "response_format")) {
    const json* type = v->is_object() ? field(*v, "type") : nullptr;
    if (!type || !type->is_string() || type->get_ref<const std::string&>() != "text" || v->size() != 1)
      return ApiError{400, "'response_format' other than {\"type\": \"text\"} is not supported by kiln",
                      "response_format", "unsupported_parameter"};
  }
  if (const json* v = field(body, "modalities")) {
    if (!v->is_array() || v->size() != 1 || !(*v)[0].is_string() || (*v)[0].get_ref<const std::string&>() != "text")
      return ApiError{400, "'modalities' other than [\"text\"] is not supported by kiln", "modalities",
                      "unsupported_parameter"};
  }
  if (const json* v = field(body, "store")) {
    bool store = false;
    if (auto e = read_bool(*v, "store", store)) return e;
    if (store) return ApiError{400, "'store': true is not supported by kiln", "store", "unsupported_parameter"};
  }
  if (const json* v = field(body, "service_tier")) {
    std::string tier;
    if (auto e = read_string(*v, "service_tier", tier)) return e;
    if (tier != "auto" && tier != "default")
      return ApiError{400, fmt::format("'service_tier' '{}' is not supported by kiln (only auto, default)", tier),
                      "service_tier", "unsupported_parameter"};
  }

  // Stop strings and the end-of-text token.
  if (const json* s = field(body, "stop")) {
    if (s->is_string()) {
      out.stop.push_back(s->get<std::string>());
    } else if (s->is_array() && static_cast<int64_t>(s->size()) <= kMaxStopStrings &&
               std::all_of(s->begin(), s->end(), [](const json& x) { return x.is_string(); })) {
      for (const json& x : *s) out.stop.push_back(x.get<std::string>());
    } else {
      return bad("stop", fmt::format("'stop' must be a string or an array of at most {} strings", kMaxStopStrings));
    }
    for (const auto& st : out.stop)
      if (st.empty()) return bad("stop", "'stop' strings must not be empty");
  }
  if (chat) out.stop.insert(out.stop.end(), ctx.chat->stop.begin(), ctx.chat->stop.end());
  bool ignore_eos = false;
  if (const json* v = field(body, "ignore_eos"))
    if (auto e = read_bool(*v, "ignore_eos", ignore_eos)) return e;
  if (!ignore_eos && ctx.tokenizer->eot_id() >= 0) g.stop_token_ids.push_back(ctx.tokenizer->eot_id());

  // Streaming.
  if (const json* v = field(body, "stream"))
    if (auto e = read_bool(*v, "stream", out.stream)) return e;
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) return bad("stream_options", "'stream_options' must be an object");
    if (!out.stream) return bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    for (auto it = so->begin(); it != so->end(); ++it) {
      const std::string where = "stream_options." + it.key();
      if (it->is_null()) continue;
      if (it.key() == "include_usage") {
        if (auto e = read_bool(*it, where, out.include_usage)) return e;
      } else if (it.key() == "include_obfuscation") {  // padding against side channels: none needed here
        bool unused = false;
        if (auto e = read_bool(*it, where, unused)) return e;
      } else {
        return ApiError{400, fmt::format("Unrecognized request argument supplied: '{}'", where), where,
                        "unrecognized_argument"};
      }
    }
  }
  return std::nullopt;
}

}  // namespace

ParseResult parse_request(std::string_view body, bool chat, const RequestContext& ctx) {
  auto parsed = parse_json(body, "The request body", kRequestJsonLimits);
  if (!parsed.ok()) return ApiError{400, std::string(parsed.status().message()) + "."};
  if (!parsed->is_object()) return ApiError{400, "The request body must be a JSON object."};
  ParsedRequest out;
  if (auto e = parse_body(*parsed, chat, ctx, out)) return std::move(*e);
  return out;
}

}  // namespace kiln
