// JSON from untrusted text (requests, config.json, tokenizer.json, safetensors and checkpoint
// headers) with bounded depth and size: nlohmann's parser and its copies recurse once per
// level, so a body nested tens of thousands deep would overflow the stack. One place parses.
#pragma once

#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kiln/core/status.h"

namespace kiln {

struct JsonLimits {
  int64_t max_depth = 64;               // deepest nesting of arrays and objects
  int64_t max_bytes = int64_t{1} << 30;  // the text itself
};

// Parses `text`; an error (InvalidArgument) names `what`, the limit or the parse error and
// its byte offset. Never throws.
Expected<nlohmann::json> parse_json(std::string_view text, std::string_view what, const JsonLimits& limits = {});

// The deepest nesting of arrays and objects in `text`, ignoring brackets inside strings; stops
// counting (and returns) once it passes `stop_after`. Text that is not JSON gets some count.
int64_t json_depth(std::string_view text, int64_t stop_after);

}  // namespace kiln
