// OpenAI request bodies (/v1/completions, /v1/chat/completions) -> what the engine runs. Every
// field's type and range is checked before it is read (no nlohmann call that can throw), every
// parameter kiln does not implement is refused by name, and a client error comes back as an
// ApiError (HTTP status, message, param, code). No server needed: tests and fuzzers call it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/serve/chat_template.h"
#include "kiln/serve/engine.h"
#include "kiln/tokenizer/bpe.h"

namespace kiln {

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

// What the parser checks a request against.
struct RequestContext {
  std::string model_name;   // "model" may be absent (then this one) or must name it (else 404)
  int64_t context_len = 0;  // prompt + max_tokens must fit
  int64_t vocab_size = 0;   // the model's: token ids and logit_bias keys are below it
  const tok::Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat = nullptr;
};

inline constexpr int64_t kMaxCompletionLogprobs = 5;  // completions: logprobs in [0, 5] (OpenAI's bound)
inline constexpr int64_t kMaxStopStrings = 16;

struct ParsedRequest {
  std::vector<int32_t> prompt;
  GenerationParams gen;  // max_tokens >= 1 (echo with max_tokens 0 runs 1 and drops it)
  std::vector<std::string> stop;
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;            // completions: the prompt's text (and logprobs) before each choice's
  bool discard_output = false;  // echo with max_tokens 0: the one token generated is not reported
  // The reply's logprobs: completions' object (logprobs: k) or chat's content list (logprobs:
  // true, top_logprobs: k) with k alternatives per token; -1: none.
  int64_t num_logprobs = -1;
};

using ParseResult = std::variant<ParsedRequest, ApiError>;

// Parses and validates one request body (JSON, at most kiln::parse_json's bounded depth and
// size). Errors are 400 naming the parameter, except a model that is not the served one (404).
ParseResult parse_request(std::string_view body, bool chat, const RequestContext& ctx);

}  // namespace kiln
