// Quantization schemes x̂ = Δ(q − z): symmetric or with a zero point, per tensor, per output
// channel or group-wise along the input dimension, 2/3/4/8-bit integers or fp8 E4M3; range
// choice (min-max, percentile, MSE-optimal), bit packing, and per-token activation quantization.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/status.h"

namespace kiln::quant {

enum class QFormat { kInt, kFp8E4M3 };
// How a range [lo, hi] is chosen from the values: the extremes, a percentile of |x| (clips the
// tail), or the clip ratio of the extremes that minimizes the quantization MSE.
enum class RangeMethod { kMinMax, kPercentile, kMse };

struct QuantScheme {
  QFormat format = QFormat::kInt;
  int bits = 4;            // 2, 3, 4 or 8 (fp8: 8)
  bool symmetric = false;  // symmetric: z = 2^(bits-1), Δ = max|x| / (2^(bits-1) − 1)
  // Group size along the input dimension; kPerChannel: one group per row (output channel);
  // kPerTensor: one scale for the whole tensor.
  int64_t group = 128;
  RangeMethod range = RangeMethod::kMinMax;
  double percentile = 99.9;  // kPercentile: the percentile of |x| (or of each tail) kept

  static constexpr int64_t kPerChannel = 0;
  static constexpr int64_t kPerTensor = -1;
  int qmax() const { return (1 << bits) - 1; }
  std::string describe() const;  // e.g. "int4 g128 asym", "int8 per-channel sym", "fp8e4m3 per-tensor"
};

// "w4g128" / "w8" / "w3g64" / "w8a8" / "fp8" style names -> a weight scheme (InvalidArgument otherwise).
Expected<QuantScheme> parse_weight_scheme(const std::string& name);
Status check_scheme(const QuantScheme& s, int64_t cols);

// A quantized (rows, cols) matrix: one unsigned code per element (unpacked; pack_codes packs
// them), and Δ, z per (row, group). Int: x̂ = Δ(q − z), q ∈ [0, 2^bits − 1]; fp8: q holds E4M3
// bits, x̂ = Δ · e4m3(q), z unused (0).
struct QTensor {
  QuantScheme scheme;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;  // (rows, cols)
  std::vector<float> scales;   // (rows, groups_per_row()) or (1,) per tensor
  std::vector<float> zeros;    // same shape as scales, integer-valued

  int64_t group_size() const;      // columns per group
  int64_t groups_per_row() const;  // 1 for per channel and per tensor
  int64_t param_index(int64_t r, int64_t c) const {
    return scheme.group == QuantScheme::kPerTensor ? 0 : r * groups_per_row() + c / group_size();
  }
  float value(int64_t r, int64_t c) const;
  void dequantize(float* out) const;  // (rows, cols)
  std::vector<float> dequantize() const;
  // Bytes of packed codes + f32 scales/zeros (what a kernel streams per use).
  int64_t storage_bytes() const;
};

// Δ and z for values in [lo, hi] (int formats; fp8 uses Δ = max(|lo|, |hi|) / 448).
struct QParams {
  float scale = 1.0f, zero = 0.0f;
};
QParams params_for_range(const QuantScheme& s, float lo, float hi);
// Quantize one value with given parameters (returns the code), and its reconstruction.
uint8_t quantize_value(const QuantScheme& s, const QParams& p, float x);
float dequantize_value(const QuantScheme& s, const QParams& p, uint8_t q);
// The range [lo, hi] chosen for a set of values by s.range (weights: the group's values).
void choose_range(const QuantScheme& s, std::span<const float> values, float& lo, float& hi);

// Round to nearest with the scheme's ranges; w (rows, cols) row-major.
QTensor quantize_rtn(const float* w, int64_t rows, int64_t cols, const QuantScheme& s);
// Quantizes with given per-(row, group) parameters (GPTQ sets them as it goes).
void quantize_group_with(QTensor& t, const float* w, int64_t r, int64_t group_index);

// Packing: each row as a little-endian bit stream of `bits`-bit codes (4-bit: low nibble is the
// even column), rows padded to whole bytes. 8-bit is a copy.
int64_t packed_row_bytes(int64_t cols, int bits);
std::vector<uint8_t> pack_codes(const uint8_t* codes, int64_t rows, int64_t cols, int bits);
std::vector<uint8_t> unpack_codes(const uint8_t* packed, int64_t rows, int64_t cols, int bits);

// Split of the quantization error of values under a range: squared error from values clipped
// outside [lo, hi] and from rounding inside it (sums, and their means over all values).
struct ErrorSplit {
  double clip_mse = 0, round_mse = 0;
  int64_t clipped = 0;
};
ErrorSplit split_error(const QuantScheme& s, std::span<const float> values, float lo, float hi);

// Activations at run time, per token (row): symmetric int8, scale = max|x_row| / 127.
// q (n, k) int8, scale (n,).
void quantize_rows_int8(const float* x, int64_t n, int64_t k, int8_t* q, float* scale);
// Fake quantization of rows in place (quantize then dequantize, values stay f32): symmetric
// per-token int of `bits` (int8 for W8A8) or fp8 E4M3 per token.
void fake_quantize_rows(float* x, int64_t n, int64_t k, QFormat format, int bits);

}  // namespace kiln::quant
