// fp8 (OCP 8-bit floating point): E4M3 (bias 7, largest 448, no infinity, NaN = S.1111.111)
// and E5M2 (bias 15, largest 57344, IEEE-style infinity and NaNs). f32 -> fp8 rounds to nearest,
// ties to even, keeps subnormals; the saturating option clamps overflow (and ±inf) to ±max.
// Included from dtype.h; the exhaustive tests are in tests/core/test_fp8.cpp.
#pragma once

#include <cstdint>

#include "kiln/core/dtype.h"

namespace kiln {

struct f8e4m3_t { uint8_t bits; };
struct f8e5m2_t { uint8_t bits; };
template <> struct DTypeOf<f8e4m3_t> { static constexpr DType value = DType::kF8E4M3; };
template <> struct DTypeOf<f8e5m2_t> { static constexpr DType value = DType::kF8E5M2; };

// One fp8 layout: 1 sign bit, kExpBits exponent bits, kManBits fraction bits.
template <int kExpBits, int kManBits, bool kHasInf>
struct Fp8Layout {
  static constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  static constexpr int kMinNormalExp = 1 - kBias;  // exponent of the smallest normal
  // Magnitude patterns (sign bit clear). E4M3 spends only S.1111.111 on NaN, so its top
  // binade holds finite values; E5M2 reserves the whole top binade like IEEE.
  static constexpr uint32_t kMaxFinite = kHasInf ? ((((1u << kExpBits) - 2) << kManBits) | ((1u << kManBits) - 1))
                                                 : 0x7eu;
  static constexpr uint32_t kInf = kHasInf ? ((1u << kExpBits) - 1) << kManBits : 0x7fu;  // E4M3: NaN
  static constexpr uint32_t kNaN = kHasInf ? (kInf | (1u << (kManBits - 1))) : 0x7fu;     // quiet NaN

  static float decode(uint8_t v) {
    const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
    const uint32_t mag = v & 0x7fu;
    const uint32_t exp = mag >> kManBits;
    const uint32_t mant = mag & ((1u << kManBits) - 1);
    if (kHasInf ? exp == (1u << kExpBits) - 1 : mag == 0x7fu) {
      return f32_from_bits(sign | 0x7f800000u | (kHasInf && mant == 0 ? 0u : 0x400000u));
    }
    if (exp == 0) {
      // Subnormal: mant · 2^(kMinNormalExp - kManBits), exact in f32 (a small integer times a
      // power of two).
      const float scale = f32_from_bits(static_cast<uint32_t>(127 + kMinNormalExp - kManBits) << 23);
      const float m = static_cast<float>(mant) * scale;
      return sign ? -m : m;
    }
    return f32_from_bits(sign | (exp - kBias + 127) << 23 | mant << (23 - kManBits));
  }

  static uint8_t encode(float f, bool saturate) {
    const uint32_t u = f32_bits(f);
    const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | static_cast<uint8_t>(kNaN);
    if (a == 0x7f800000u) return sign | static_cast<uint8_t>(saturate ? kMaxFinite : kInf);
    constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(127 + kMinNormalExp) << 23;
    uint32_t r;  // the rounded magnitude pattern, possibly past kMaxFinite
    if (a < kMinNormalBits) {
      // Subnormal (or zero) result: |f| / 2^(kMinNormalExp - kManBits) rounded to an integer,
      // ties to even. r == 1 << kManBits is the smallest normal, which is the right pattern.
      if (a < 0x00800000u) return sign;  // f32 subnormals are far below half the fp8 minimum
      const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
      const int shift = 23 + kMinNormalExp - kManBits - (static_cast<int>(a >> 23) - 127);
      if (shift > 24) return sign;  // below half the smallest subnormal
      const uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
      r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    } else {
      // Normal: rebias, then round the 23 - kManBits dropped bits to nearest even; a carry
      // into the exponent is the correct next binade.
      constexpr int kDrop = 23 - kManBits;
      uint32_t v = a - (static_cast<uint32_t>(127 - kBias) << 23);
      v += (1u << (kDrop - 1)) - 1u + ((v >> kDrop) & 1u);
      r = v >> kDrop;
    }
    if (r > kMaxFinite) return sign | static_cast<uint8_t>(saturate ? kMaxFinite : kInf);
    return sign | static_cast<uint8_t>(r);
  }
};

using Fp8E4M3 = Fp8Layout<4, 3, false>;
using Fp8E5M2 = Fp8Layout<5, 2, true>;
static_assert(Fp8E4M3::kMaxFinite == 0x7e && Fp8E5M2::kMaxFinite == 0x7b && Fp8E5M2::kInf == 0x7c);

inline float f8e4m3_to_f32(uint8_t v) { return Fp8E4M3::decode(v); }
inline float f8e5m2_to_f32(uint8_t v) { return Fp8E5M2::decode(v); }
// Non-saturating (default): E4M3 overflow and ±inf give NaN, E5M2 overflow gives ±inf.
// Saturating: both clamp to ±max (448, 57344); NaN stays NaN.
inline uint8_t f32_to_f8e4m3(float f, bool saturate = false) { return Fp8E4M3::encode(f, saturate); }
inline uint8_t f32_to_f8e5m2(float f, bool saturate = false) { return Fp8E5M2::encode(f, saturate); }

}  // namespace kiln
