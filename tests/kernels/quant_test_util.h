// Random quantized weights for the quantized-GEMM tests (cases_quant_gemm.cpp,
// test_quant_gemm.cpp): a QuantWeight plus the vectors that own its codes, scales and zeros.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/core/rng.h"
#include "kiln/kernels/quant_gemm.h"

namespace kiln::testing {

struct OwnedQuantWeight {
  std::vector<uint8_t> data;
  std::vector<float> scales, zeros;
  QuantWeight w;
};

// Random codes over the whole grid (fp8: every finite pattern except NaN/inf), scales in
// [0.01, 0.1), zero-points (when asymmetric) in [-4, 4) with fractional parts.
inline OwnedQuantWeight random_quant_weight(Rng& rng, QuantFormat f, int64_t out, int64_t in, int64_t group,
                                            bool zeros, bool per_tensor = false) {
  OwnedQuantWeight o;
  o.w.format = f;
  o.w.out = out;
  o.w.in = in;
  o.w.group = group;
  o.w.per_tensor_scale = per_tensor;
  o.data.resize(static_cast<size_t>(out * quant_row_bytes(f, in)));
  for (uint8_t& b : o.data) {
    b = static_cast<uint8_t>(rng.below(256));
    if (f == QuantFormat::kFp8E4M3 && (b & 0x7f) == 0x7f) b ^= 0x01;  // not NaN
    if (f == QuantFormat::kFp8E5M2 && (b & 0x7c) == 0x7c) b ^= 0x04;  // not inf/NaN
  }
  if (f == QuantFormat::kF16)  // halves of magnitude < 2 (exponent ≤ 15): no inf/NaN, no huge sums
    for (size_t i = 1; i < o.data.size(); i += 2) o.data[i] &= 0xbf;
  const int64_t ng = per_tensor ? 1 : in / group;
  o.scales.resize(static_cast<size_t>(per_tensor ? 1 : out * ng));
  for (float& s : o.scales) s = rng.uniform(0.01f, 0.1f);
  if (zeros) {
    o.zeros.resize(static_cast<size_t>(out * ng));
    for (float& z : o.zeros) z = rng.uniform(-4.0f, 4.0f);
  }
  o.w.data = o.data.data();
  o.w.scales = o.scales.data();
  o.w.zeros = zeros ? o.zeros.data() : nullptr;
  return o;
}

}  // namespace kiln::testing
