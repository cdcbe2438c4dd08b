// See utf8.h.
#include "kiln/core/utf8.h"

namespace kiln {

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

bool valid_utf8(std::string_view s) {
  while (!s.empty()) {
    const CodePoint c = decode_utf8(s);
    if (c.cp == kInvalidCodePoint) return false;
    s.remove_prefix(static_cast<size_t>(c.nbytes));
  }
  return true;
}

}  // namespace kiln
