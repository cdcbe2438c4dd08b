// libFuzzer target: Hugging Face tokenizer.json text (Tokenizer::parse_hf_json); a tokenizer
// that loads must encode and decode any bytes (here: the input itself) without crashing.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/tokenizer/bpe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto tk = kiln::tok::Tokenizer::parse_hf_json(text);
  if (!tk.ok()) return 0;
  const std::string_view sample = text.substr(0, 256);  // bounded: encoding is not what is fuzzed
  (void)tk->decode(tk->encode(sample));
  return 0;
}
