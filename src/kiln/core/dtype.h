// Element types and their conversions. One table (kDTypeTraits) describes every dtype;
// conversions round to nearest, ties to even, keep subnormals, infinities and NaN.
// fp8 (E4M3, E5M2) and packed int4 have rows here; their arithmetic arrives with the
// numerics and quantization issues.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace kiln {

enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kF8E5M2, kI8, kI4, kI32, kCount };

struct DTypeTraits {
  DType dtype;
  std::string_view name;
  int bits;             // storage bits per element (int4: 4, two per byte)
  bool is_float;
  int exponent_bits;    // floats only
  int mantissa_bits;    // stored fraction bits (significant bits p = mantissa_bits + 1)
};

inline constexpr DTypeTraits kDTypeTraits[] = {
    {DType::kF32, "f32", 32, true, 8, 23},   {DType::kBF16, "bf16", 16, true, 8, 7},
    {DType::kF16, "f16", 16, true, 5, 10},   {DType::kF8E4M3, "f8e4m3", 8, true, 4, 3},
    {DType::kF8E5M2, "f8e5m2", 8, true, 5, 2}, {DType::kI8, "i8", 8, false, 0, 0},
    {DType::kI4, "i4", 4, false, 0, 0},      {DType::kI32, "i32", 32, false, 0, 0},
};
static_assert(std::size(kDTypeTraits) == static_cast<size_t>(DType::kCount),
              "every DType needs a row in kDTypeTraits");
consteval bool dtype_table_in_order() {
  for (size_t i = 0; i < std::size(kDTypeTraits); ++i)
    if (static_cast<size_t>(kDTypeTraits[i].dtype) != i) return false;
  return true;
}
static_assert(dtype_table_in_order(), "kDTypeTraits rows must follow the DType enum order");

constexpr const DTypeTraits& dtype_traits(DType t) { return kDTypeTraits[static_cast<size_t>(t)]; }
constexpr std::string_view dtype_name(DType t) { return dtype_traits(t).name; }
constexpr int dtype_bits(DType t) { return dtype_traits(t).bits; }
// Bytes for n elements (int4 packs two per byte, rounding up).
constexpr int64_t dtype_nbytes(DType t, int64_t n) { return (n * dtype_bits(t) + 7) / 8; }
std::optional<DType> parse_dtype(std::string_view name);

// The C++ type that stores one element, for typed access checks.
template <class T> struct DTypeOf;
struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };
template <> struct DTypeOf<float> { static constexpr DType value = DType::kF32; };
template <> struct DTypeOf<bf16_t> { static constexpr DType value = DType::kBF16; };
template <> struct DTypeOf<f16_t> { static constexpr DType value = DType::kF16; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::kI8; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kI32; };

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// ---- bf16: the top 16 bits of an f32 ------------------------------------------------------
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  // Round to nearest even: add 0x7fff plus the lowest kept bit; carries into the exponent
  // are correct (they round up to the next binade or to infinity).
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// ---- f16: IEEE binary16, 5 exponent bits, 10 fraction bits --------------------------------
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return f32_from_bits(sign);
    // Subnormal: value = mant * 2^-24; normalize into an f32.
    int e = -1;
    do { mant <<= 1; ++e; } while ((mant & 0x400u) == 0);
    return f32_from_bits(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13);
  }
  return f32_from_bits(sign | (exp + (127 - 15)) << 23 | mant << 13);
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((a >> 13) & 0x3ffu);  // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: infinity
  if (a < 0x38800000u) {
    // Result is subnormal (or zero) in f16: value / 2^-24, rounded to nearest even.
    if (a < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25): zero
    const uint32_t exp = a >> 23;
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // (113 - exp) + 13: align to the 2^-24 grid
    const uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    const uint32_t r = q + ((rem > half || (rem == half && (q & 1))) ? 1 : 0);
    return sign | static_cast<uint16_t>(r);
  }
  // Normal: rebias the exponent, round the 13 dropped bits to nearest even.
  uint32_t v = a - ((127u - 15u) << 23);
  v += 0xfffu + ((v >> 13) & 1u);
  return sign | static_cast<uint16_t>(v >> 13);
}

}  // namespace kiln

// fp8 (E4M3, E5M2) and TF32 conversions, in their own headers next to these.
#include "kiln/core/fp8.h"   // IWYU pragma: export
#include "kiln/core/tf32.h"  // IWYU pragma: export
