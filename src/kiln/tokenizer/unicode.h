// The bits of Unicode the GPT-2 pre-tokenizer needs: lenient UTF-8 decoding (an invalid byte
// becomes one "character" of its own, so any byte string can be tokenized) and the classes
// \p{L} (letters), \p{N} (numbers) and \s (White_Space).
#pragma once

#include <cstdint>
#include <string_view>

namespace kiln::tok {

struct CodePoint {
  uint32_t cp;   // the code point, or 0xFFFFFFFF for an invalid byte
  int nbytes;    // bytes it took in the input (1 for an invalid byte)
};
inline constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFFu;

// Decodes the code point at the start of `s` (non-empty). Overlong forms, surrogates and
// truncated sequences are invalid: they decode one byte at a time.
CodePoint decode_utf8(std::string_view s);

bool is_letter(uint32_t cp);
bool is_number(uint32_t cp);
bool is_whitespace(uint32_t cp);

}  // namespace kiln::tok
