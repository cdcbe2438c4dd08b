// See json.h. The depth is measured by one scan before parsing, so no recursion ever starts
// on text that is too deep.
#include "kiln/core/json.h"

namespace kiln {

int64_t json_depth(std::string_view text, int64_t stop_after) {
  int64_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > stop_after) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

Expected<nlohmann::json> parse_json(std::string_view text, std::string_view what, const JsonLimits& limits) {
  if (static_cast<int64_t>(text.size()) > limits.max_bytes)
    return invalid_argument("{}: {} bytes of JSON, more than the limit of {}", what, text.size(), limits.max_bytes);
  if (json_depth(text, limits.max_depth) > limits.max_depth)
    return invalid_argument("{}: JSON nested deeper than {} levels", what, limits.max_depth);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // e.what() reads "[json.exception.parse_error.101] parse error at line 1, column 3: ..."
    std::string_view msg = e.what();
    if (const size_t at = msg.find("] "); at != std::string_view::npos) msg.remove_prefix(at + 2);
    return invalid_argument("{}: not valid JSON ({})", what, msg);
  }
}

}  // namespace kiln
