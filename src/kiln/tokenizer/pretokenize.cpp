// Hand-written matcher for the GPT-2 pre-tokenization pattern, alternative by alternative.
#include "kiln/tokenizer/pretokenize.h"

#include "kiln/tokenizer/unicode.h"

namespace kiln::tok {
namespace {

enum class Class { kLetter, kNumber, kSpace, kOther };

Class classify(uint32_t cp) {
  if (is_letter(cp)) return Class::kLetter;
  if (is_number(cp)) return Class::kNumber;
  if (is_whitespace(cp)) return Class::kSpace;
  return Class::kOther;
}

// Length in bytes of the contraction at the start of `s`, or 0.
size_t contraction(std::string_view s) {
  if (s.empty() || s[0] != '\'') return 0;
  for (std::string_view c : {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"})
    if (s.substr(0, c.size()) == c) return c.size();
  return 0;
}

}  // namespace

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  size_t i = 0;
  const size_t n = text.size();
  // Class and byte length of the character at byte offset p.
  auto at = [&](size_t p) {
    CodePoint c = decode_utf8(text.substr(p));
    return std::pair<Class, int>(classify(c.cp), c.nbytes);
  };
  // End of the run of characters of class `cls` starting at p.
  auto run_end = [&](size_t p, auto pred) {
    while (p < n) {
      auto [cls, len] = at(p);
      if (!pred(cls)) break;
      p += static_cast<size_t>(len);
    }
    return p;
  };
  while (i < n) {
    if (size_t len = contraction(text.substr(i)); len > 0) {
      pieces.push_back(text.substr(i, len));
      i += len;
      continue;
    }
    // ` ?X+` for X in letters, numbers, other: an optional U+0020 then a non-empty run.
    const size_t start = i;
    size_t p = i;
    if (text[p] == ' ' && p + 1 < n) {
      auto [next_cls, next_len] = at(p + 1);
      (void)next_len;
      if (next_cls != Class::kSpace) p += 1;
    }
    auto [cls, len] = at(p);
    (void)len;
    if (cls != Class::kSpace) {
      size_t end;
      if (cls == Class::kOther)
        end = run_end(p, [](Class c) { return c == Class::kOther; });
      else
        end = run_end(p, [cls = cls](Class c) { return c == cls; });
      pieces.push_back(text.substr(start, end - start));
      i = end;
      continue;
    }
    // Whitespace: `\s+(?!\S)` leaves the last whitespace character for the next piece when a
    // non-space follows; `\s+` takes a lone one.
    size_t end = i, last = i;
    while (end < n) {
      auto [c, l] = at(end);
      if (c != Class::kSpace) break;
      last = end;
      end += static_cast<size_t>(l);
    }
    if (end < n && last > i) end = last;  // followed by \S and more than one space char
    pieces.push_back(text.substr(i, end - i));
    i = end;
  }
  return pieces;
}

}  // namespace kiln::tok
