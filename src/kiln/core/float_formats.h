// The properties of each floating-point format kiln implements (f32, tf32, bf16, f16, fp8 E4M3
// and E5M2) — significant bits, machine epsilon, unit roundoff, range — COMPUTED from the
// conversion functions in dtype.h / fp8.h / tf32.h, never typed in. Behind `kiln info --formats`.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace kiln {

// A format as its implementation sees it: `bits`-wide patterns, encode (f32 -> pattern,
// rounding to nearest even) and decode (pattern -> f32, exact). Positive patterns are
// 0 .. 2^(bits-1) - 1, ordered by value.
struct FloatCodec {
  std::string_view name;
  int bits;
  uint32_t (*encode)(float);
  float (*decode)(uint32_t);
};

// f32, tf32, bf16, f16, f8e4m3, f8e5m2 (non-saturating conversions).
const std::vector<FloatCodec>& float_codecs();

struct FloatFormatInfo {
  std::string_view name;
  int storage_bits;
  int significant_bits;       // p = 1 - log2(epsilon)
  double epsilon;             // machine epsilon: the gap between 1 and the next value, 2^(1-p)
  double unit_roundoff;       // u = epsilon / 2 = 2^-p: the largest relative error of rounding
  double largest_finite;      // the largest positive pattern that decodes to a finite value
  double smallest_normal;     // the first value where the gap to the next is value·epsilon
  double smallest_subnormal;  // decode(pattern 1)
  bool has_infinity;          // some pattern decodes to +inf
};

// Derives every field by probing the codec:
//  epsilon            = decode(encode(1) + 1) - 1
//  largest finite     = decode of the highest positive pattern that is finite (scanning down)
//  smallest subnormal = decode(1)
//  smallest normal    = the smallest positive x whose successor is x·(1 + epsilon)
FloatFormatInfo measure_float_format(const FloatCodec& codec);
std::vector<FloatFormatInfo> float_format_infos();

}  // namespace kiln
