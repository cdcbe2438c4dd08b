// UTF-8 decoding and Unicode class lookups (binary search over generated ranges).
#include "kiln/tokenizer/unicode.h"

#include <algorithm>
#include <iterator>

namespace kiln::tok {
namespace {

struct CodeRange {
  uint32_t lo, hi;
};
#include "kiln/tokenizer/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodeRange (&ranges)[N], uint32_t cp) {
  auto it = std::upper_bound(std::begin(ranges), std::end(ranges), cp,
                             [](uint32_t v, const CodeRange& r) { return v < r.lo; });
  return it != std::begin(ranges) && cp <= std::prev(it)->hi;
}

}  // namespace

bool is_letter(uint32_t cp) { return cp != kInvalidCodePoint && in_ranges(kLetterRanges, cp); }
bool is_number(uint32_t cp) { return cp != kInvalidCodePoint && in_ranges(kNumberRanges, cp); }

bool is_whitespace(uint32_t cp) {
  // The Unicode White_Space property (what \s means in the regex engines HF uses).
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace kiln::tok
