// libFuzzer target: an OpenAI request body (parse_request) for /v1/completions (first byte even)
// or /v1/chat/completions (odd), against a small tokenizer, the default chat template and a
// 64-token context: every body is a ParsedRequest or an ApiError, never a throw or a crash.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/core/status.h"
#include "kiln/serve/request.h"

namespace {
const kiln::RequestContext& context() {
  static const kiln::tok::Tokenizer tokenizer = [] {
    kiln::tok::TrainOptions o;
    o.vocab_size = 300;
    return kiln::tok::Tokenizer::train("the quick brown fox jumps over the lazy dog; the end. ", o).value();
  }();
  static const kiln::ChatTemplate chat;
  static const kiln::RequestContext ctx{"kiln", 64, tokenizer.vocab_size(), &tokenizer, &chat};
  return ctx;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool chat = data[0] & 1;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const kiln::ParseResult r = kiln::parse_request(body, chat, context());
  if (const auto* e = std::get_if<kiln::ApiError>(&r)) {
    // A client error is a 4xx; the parser never answers 5xx for a body it could not read.
    if (e->status < 400 || e->status > 499) __builtin_trap();
  }
  return 0;
}
