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

CodePoint decode_utf8(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t c0 = b(0);
  if (c0 < 0x80) return {c0, 1};
  int n;
  uint32_t cp, min;
  if ((c0 & 0xE0) == 0xC0) { n = 2; cp = c0 & 0x1F; min = 0x80; }
  else if ((c0 & 0xF0) == 0xE0) { n = 3; cp = c0 & 0x0F; min = 0x800; }
  else if ((c0 & 0xF8) == 0xF0) { n = 4; cp = c0 & 0x07; min = 0x10000; }
  else return {kInvalidCodePoint, 1};
  if (s.size() < static_cast<size_t>(n)) return {kInvalidCodePoint, 1};
  for (int i = 1; i < n; ++i) {
    if ((b(i) & 0xC0) != 0x80) return {kInvalidCodePoint, 1};
    cp = (cp << 6) | (b(i) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {kInvalidCodePoint, 1};
  return {cp, n};
}

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
