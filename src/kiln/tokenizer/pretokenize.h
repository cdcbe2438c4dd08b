// GPT-2 pre-tokenization: splits text into the pieces BPE works inside, exactly as the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// does (the Hugging Face ByteLevel pre-tokenizer uses the same one). Written by hand, so no
// regex engine is needed; invalid UTF-8 bytes count as "other" characters.
#pragma once

#include <string_view>
#include <vector>

namespace kiln::tok {

// Pieces are views into `text` and together cover it exactly, in order.
std::vector<std::string_view> pretokenize(std::string_view text);

}  // namespace kiln::tok
