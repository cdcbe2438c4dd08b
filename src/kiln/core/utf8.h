// UTF-8 decoding, strict about what is valid: overlong forms, surrogates, code points past
// U+10FFFF and truncated sequences are invalid. The tokenizer's pre-tokenizer walks text with
// it (an invalid byte is one "character" of its own); readers of files check strings with it.
#pragma once

#include <cstdint>
#include <string_view>

namespace kiln {

struct CodePoint {
  uint32_t cp;   // the code point, or kInvalidCodePoint for an invalid byte
  int nbytes;    // bytes it took in the input (1 for an invalid byte)
};
inline constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFFu;

// Decodes the code point at the start of `s` (non-empty); an invalid sequence decodes one byte.
CodePoint decode_utf8(std::string_view s);

// Every byte of `s` belongs to a valid UTF-8 sequence.
bool valid_utf8(std::string_view s);

}  // namespace kiln
