// The quantized-GEMM op boundary (quant_gemm.h): format table, byte counts, exact element
// decode, argument validation naming the op and the shapes, and W8A8 weight row sums.
#include "kiln/kernels/quant_gemm.h"

#include <iterator>

#include <cstring>

#include "kiln/core/dtype.h"
#include "kiln/core/fp8.h"

namespace kiln {

namespace {
struct QuantFormatInfo {
  QuantFormat format;
  std::string_view name;
  int bits;
};
constexpr QuantFormatInfo kQuantFormats[] = {
    {QuantFormat::kInt8, "int8", 8},
    {QuantFormat::kInt4, "int4", 4},
    {QuantFormat::kFp8E4M3, "fp8_e4m3", 8},
    {QuantFormat::kFp8E5M2, "fp8_e5m2", 8},
    {QuantFormat::kF16, "f16", 16},
};
static_assert(std::size(kQuantFormats) == static_cast<size_t>(QuantFormat::kCount));
consteval bool quant_formats_in_order() {
  for (size_t i = 0; i < std::size(kQuantFormats); ++i)
    if (static_cast<size_t>(kQuantFormats[i].format) != i) return false;
  return true;
}
static_assert(quant_formats_in_order(), "kQuantFormats rows must follow the enum order");

bool valid_format(QuantFormat f) { return static_cast<int>(f) >= 0 && f < QuantFormat::kCount; }
}  // namespace

std::string_view quant_format_name(QuantFormat f) {
  return valid_format(f) ? kQuantFormats[static_cast<size_t>(f)].name : "?";
}

int64_t quant_row_bytes(QuantFormat f, int64_t in) {
  return f == QuantFormat::kInt4 ? (in + 1) / 2 : f == QuantFormat::kF16 ? 2 * in : in;
}

int64_t quant_weight_bytes(const QuantWeight& w) {
  const int64_t scales = w.per_tensor_scale ? 1 : w.out * w.num_groups();
  const int64_t zeros = w.zeros ? w.out * w.num_groups() : 0;
  return w.out * quant_row_bytes(w.format, w.in) + 4 * (scales + zeros);
}

float quant_weight_element(const QuantWeight& w, int64_t j, int64_t k) {
  const int64_t g = w.per_tensor_scale ? 0 : j * w.num_groups() + k / w.group;
  const float scale = w.scales[g];
  switch (w.format) {
    case QuantFormat::kInt8:
    case QuantFormat::kInt4: {
      int q;
      if (w.format == QuantFormat::kInt8) {
        q = static_cast<int8_t>(w.data[j * w.in + k]);
      } else {
        const uint8_t byte = w.data[j * (w.in / 2) + k / 2];
        const int nib = (k % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
        q = nib >= 8 ? nib - 16 : nib;
      }
      const float z = w.zeros ? w.zeros[j * w.num_groups() + k / w.group] : 0.0f;
      return scale * (static_cast<float>(q) - z);
    }
    case QuantFormat::kFp8E4M3: return scale * Fp8E4M3::decode(w.data[j * w.in + k]);
    case QuantFormat::kFp8E5M2: return scale * Fp8E5M2::decode(w.data[j * w.in + k]);
    case QuantFormat::kF16: {
      uint16_t h;
      std::memcpy(&h, w.data + 2 * (j * w.in + k), sizeof(h));
      return scale * f16_to_f32(h);
    }
    case QuantFormat::kCount: break;
  }
  KILN_CHECK_MSG(false, "bad QuantFormat {}", static_cast<int>(w.format));
  return 0.0f;
}

Status check_quant_weight(const QuantWeight& w, std::string_view op) {
  if (!valid_format(w.format)) return invalid_argument("[{}] unknown weight format {}", op, static_cast<int>(w.format));
  const std::string_view fmt_name = quant_format_name(w.format);
  if (w.out < 1 || w.in < 1)
    return invalid_argument("[{}] weight ({}, {}) {} must have at least one row and column", op, w.out, w.in, fmt_name);
  if (!w.data || !w.scales) return invalid_argument("[{}] weight ({}, {}) {} lacks data or scales", op, w.out, w.in, fmt_name);
  if (!w.per_tensor_scale) {
    if (w.group < 1 || w.in % w.group != 0)
      return invalid_argument("[{}] weight ({}, {}) {}: group size {} does not divide in = {}", op, w.out, w.in,
                              fmt_name, w.group, w.in);
  } else if (w.zeros) {
    return invalid_argument("[{}] weight ({}, {}) {}: zero-points need group-wise scales, not a per-tensor scale",
                            op, w.out, w.in, fmt_name);
  }
  if (w.format == QuantFormat::kInt4 && (w.in % 2 != 0 || (!w.per_tensor_scale && w.group % 2 != 0)))
    return invalid_argument("[{}] weight ({}, {}) int4: in and the group size ({}) must be even (two codes per byte)",
                            op, w.out, w.in, w.group);
  if ((w.format == QuantFormat::kFp8E4M3 || w.format == QuantFormat::kFp8E5M2 || w.format == QuantFormat::kF16) &&
      w.zeros)
    return invalid_argument("[{}] weight ({}, {}) {}: fp8 and f16 weights are symmetric (zeros must be null)", op, w.out,
                            w.in, fmt_name);
  return {};
}

Status check_quant_gemm(const QuantGemmParams& p) {
  if (!p.w) return invalid_argument("[quant_gemm] no weight");
  KILN_RETURN_IF_ERROR(check_quant_weight(*p.w, "quant_gemm"));
  const QuantWeight& w = *p.w;
  if (p.n < 0) return invalid_argument("[quant_gemm] negative row count n={}", p.n);
  if (p.n == 0) return {};
  if (!p.x || !p.y) return invalid_argument("[quant_gemm] x ({}, {}) or y ({}, {}) is null", p.n, w.in, p.n, w.out);
  if (p.ldx < w.in || p.ldy < w.out || (p.residual && p.ldr < w.out))
    return invalid_argument("[quant_gemm] x ({}, {}) ldx={}, y ({}, {}) ldy={}, residual ldr={}: a leading "
                            "dimension is shorter than its row",
                            p.n, w.in, p.ldx, p.n, w.out, p.ldy, p.ldr);
  return {};
}

Status check_w8a8(const W8A8Params& p) {
  if (!p.w) return invalid_argument("[w8a8_gemm] no weight");
  KILN_RETURN_IF_ERROR(check_quant_weight(*p.w, "w8a8_gemm"));
  const QuantWeight& w = *p.w;
  if (w.format != QuantFormat::kInt8 || w.zeros || (!w.per_tensor_scale && w.group != w.in))
    return invalid_argument("[w8a8_gemm] weight ({}, {}) {} group={} zeros={}: W8A8 needs symmetric int8 with "
                            "per-channel (group = in) or per-tensor scales",
                            w.out, w.in, quant_format_name(w.format), w.group, w.zeros != nullptr);
  if (!p.w_row_sums) return invalid_argument("[w8a8_gemm] weight ({}, {}) lacks w_row_sums (see w8a8_row_sums)", w.out, w.in);
  if (p.n < 0) return invalid_argument("[w8a8_gemm] negative row count n={}", p.n);
  if (p.n == 0) return {};
  if (!p.a || !p.a_scales || !p.y)
    return invalid_argument("[w8a8_gemm] a ({}, {}), its scales or y ({}, {}) is null", p.n, w.in, p.n, w.out);
  if (p.lda < w.in || p.ldy < w.out || (p.residual && p.ldr < w.out))
    return invalid_argument("[w8a8_gemm] a ({}, {}) lda={}, y ({}, {}) ldy={}, residual ldr={}: a leading "
                            "dimension is shorter than its row",
                            p.n, w.in, p.lda, p.n, w.out, p.ldy, p.ldr);
  return {};
}

void w8a8_row_sums(const QuantWeight& w, int32_t* sums) {
  KILN_CHECK(w.format == QuantFormat::kInt8);
  for (int64_t j = 0; j < w.out; ++j) {
    const int8_t* row = reinterpret_cast<const int8_t*>(w.data) + j * w.in;
    int32_t s = 0;
    for (int64_t k = 0; k < w.in; ++k) s += row[k];
    sums[j] = s;
  }
}

}  // namespace kiln
