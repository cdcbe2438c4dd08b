// Measures each float format's precision and range by probing its conversion functions
// (float_formats.h): nothing here knows a format's constants.
#include "kiln/core/float_formats.h"

#include <cmath>

#include "kiln/core/dtype.h"
#include "kiln/core/status.h"

namespace kiln {

const std::vector<FloatCodec>& float_codecs() {
  static const std::vector<FloatCodec> codecs = {
      {"f32", 32, [](float f) { return f32_bits(f); }, [](uint32_t u) { return f32_from_bits(u); }},
      {"tf32", 19, [](float f) { return f32_bits(round_to_tf32(f)) >> 13; },
       [](uint32_t u) { return f32_from_bits(u << 13); }},
      {"bf16", 16, [](float f) { return static_cast<uint32_t>(f32_to_bf16(f)); },
       [](uint32_t u) { return bf16_to_f32(static_cast<uint16_t>(u)); }},
      {"f16", 16, [](float f) { return static_cast<uint32_t>(f32_to_f16(f)); },
       [](uint32_t u) { return f16_to_f32(static_cast<uint16_t>(u)); }},
      {"f8e4m3", 8, [](float f) { return static_cast<uint32_t>(f32_to_f8e4m3(f)); },
       [](uint32_t u) { return f8e4m3_to_f32(static_cast<uint8_t>(u)); }},
      {"f8e5m2", 8, [](float f) { return static_cast<uint32_t>(f32_to_f8e5m2(f)); },
       [](uint32_t u) { return f8e5m2_to_f32(static_cast<uint8_t>(u)); }},
  };
  return codecs;
}

FloatFormatInfo measure_float_format(const FloatCodec& c) {
  FloatFormatInfo info{};
  info.name = c.name;
  info.storage_bits = c.bits;
  const uint32_t top = (1u << (c.bits - 1)) - 1;  // the highest positive pattern

  // Machine epsilon: the gap above 1 (1 itself must be representable).
  const uint32_t one = c.encode(1.0f);
  KILN_CHECK_MSG(c.decode(one) == 1.0f, "{}: 1 is not representable", c.name);
  info.epsilon = static_cast<double>(c.decode(one + 1)) - 1.0;
  int exp2 = 0;
  const double frac = std::frexp(info.epsilon, &exp2);  // epsilon = 0.5 · 2^exp2 = 2^(exp2-1)
  KILN_CHECK_MSG(frac == 0.5, "{}: epsilon {} is not a power of two", c.name, info.epsilon);
  info.significant_bits = 2 - exp2;  // epsilon = 2^(1-p)
  info.unit_roundoff = info.epsilon / 2;

  // Largest finite: scan down from the top pattern past NaNs and infinity.
  uint32_t k = top;
  while (k > 0 && !std::isfinite(c.decode(k))) {
    if (std::isinf(c.decode(k))) info.has_infinity = true;
    --k;
  }
  info.largest_finite = c.decode(k);

  info.smallest_subnormal = c.decode(1);

  // Smallest normal: below it the gap is the constant subnormal spacing, from it on the gap
  // is value·epsilon. Differences and products in double are exact here.
  for (uint32_t j = 1; j < top; ++j) {
    const double x = c.decode(j), next = c.decode(j + 1);
    if (next - x == x * info.epsilon) {
      info.smallest_normal = x;
      break;
    }
  }
  return info;
}

std::vector<FloatFormatInfo> float_format_infos() {
  std::vector<FloatFormatInfo> out;
  for (const FloatCodec& c : float_codecs()) out.push_back(measure_float_format(c));
  return out;
}

}  // namespace kiln
