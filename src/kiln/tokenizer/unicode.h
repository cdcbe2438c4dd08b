// The bits of Unicode the GPT-2 pre-tokenizer needs: UTF-8 decoding where an invalid byte
// becomes one "character" of its own (so any byte string can be tokenized), and the classes
// \p{L} (letters), \p{N} (numbers) and \s (White_Space).
#pragma once

#include <cstdint>
#include <string_view>

#include "kiln/core/utf8.h"

namespace kiln::tok {

// UTF-8 decoding lives in core (kiln/core/utf8.h); the pre-tokenizer walks text with it.
using kiln::CodePoint;
using kiln::decode_utf8;
using kiln::kInvalidCodePoint;

bool is_letter(uint32_t cp);
bool is_number(uint32_t cp);
bool is_whitespace(uint32_t cp);

}  // namespace kiln::tok
