// Integer arithmetic on sizes read from users and files: every limit check on a product or
// sum of such values goes through these, so a value at the edge of its type cannot wrap past
// the check (a request with max_tokens = 2^63 - 1, a tensor with a shape of 2^62 x 4).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace kiln {

// a + b and a * b, or nothing when the result does not fit in T.
template <class T>
std::optional<T> checked_add(T a, T b) {
  T r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
template <class T>
std::optional<T> checked_mul(T a, T b) {
  T r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The product of dims (each >= 0), times elem_bytes; nothing when a dim is negative or the
// product overflows int64.
inline std::optional<int64_t> checked_numel_bytes(std::span<const int64_t> dims, int64_t elem_bytes = 1) {
  std::optional<int64_t> r = elem_bytes;
  for (const int64_t d : dims) {
    if (d < 0 || !r) return std::nullopt;
    r = checked_mul(*r, d);
  }
  return r;
}

}  // namespace kiln
