// The block-quantized GEMM's op boundary (block_quant_gemm.h): the packed layout's exact
// accessors, packing from a kiln QuantWeight, and argument validation naming the op and shapes.
#include "kiln/kernels/block_quant_gemm.h"

#include <cstring>

#include "kiln/core/dtype.h"

namespace kiln {

namespace {
// Where channel j's block b lives: the tile's block record and the channel within the tile.
const uint8_t* block_record(const BlockQuantWeight& w, int64_t j, int64_t b) {
  return w.data + (j / kQuantTile) * w.tile_bytes() + b * w.block_bytes();
}
}  // namespace

std::string_view block_quant_format_name(BlockQuantFormat f) { return f == BlockQuantFormat::kQ8 ? "q8" : "q4"; }

int block_quant_code(const BlockQuantWeight& w, int64_t j, int64_t k) {
  const int64_t b = k / kQuantBlock, kk = k % kQuantBlock, c = j % kQuantTile;
  const int64_t quad = kk / 4, r = kk % 4;
  const uint8_t* rec = block_record(w, j, b);
  if (w.format == BlockQuantFormat::kQ8) return static_cast<int>(rec[quad * 64 + 4 * c + r]) - 128;
  const uint8_t byte = rec[(quad / 2) * 64 + 4 * c + r];
  return static_cast<int>(quad % 2 == 0 ? (byte & 0x0f) : (byte >> 4)) - 8;
}

float block_quant_scale(const BlockQuantWeight& w, int64_t j, int64_t b) {
  const uint8_t* rec = block_record(w, j, b) + w.code_bytes() + 2 * (j % kQuantTile);
  uint16_t h = 0;
  std::memcpy(&h, rec, sizeof(h));
  return f16_to_f32(h);
}

bool block_quant_packable(const QuantWeight& src) {
  return check_quant_weight(src, "pack_block_quant").ok() &&
         (src.format == QuantFormat::kInt8 || src.format == QuantFormat::kInt4) && !src.zeros &&
         !src.per_tensor_scale && src.group == kQuantBlock;
}

Status pack_block_quant(const QuantWeight& src, PackedBlockWeight* dst) {
  KILN_RETURN_IF_ERROR(check_quant_weight(src, "pack_block_quant"));
  if (!block_quant_packable(src))
    return invalid_argument(
        "[pack_block_quant] weight ({}, {}) {} group={} zeros={} per_tensor={}: the block kernels take symmetric "
        "int8 or int4 with one scale per 32 inputs (Q8_0 / Q4_0's shape)",
        src.out, src.in, quant_format_name(src.format), src.group, src.zeros != nullptr, src.per_tensor_scale);
  BlockQuantWeight& w = dst->w;
  w.format = src.format == QuantFormat::kInt8 ? BlockQuantFormat::kQ8 : BlockQuantFormat::kQ4;
  w.out = src.out;
  w.in = src.in;
  dst->bytes.assign(static_cast<size_t>(w.bytes()), 0);  // padding channels: code 0, scale 0
  const int offset = w.offset();
  for (int64_t t = 0; t < w.tiles(); ++t) {
    for (int64_t b = 0; b < w.blocks(); ++b) {
      uint8_t* rec = dst->bytes.data() + t * w.tile_bytes() + b * w.block_bytes();
      for (int64_t c = 0; c < kQuantTile; ++c) {
        const int64_t j = t * kQuantTile + c;
        if (j >= w.out) break;  // padding: the zero bytes above (q + offset is not stored there: scale 0)
        for (int64_t kk = 0; kk < kQuantBlock; ++kk) {
          const int64_t k = b * kQuantBlock + kk, quad = kk / 4, r = kk % 4;
          // quant_weight_element(…) / scale without the float round trip: the code itself.
          int q;
          if (src.format == QuantFormat::kInt8) {
            q = static_cast<int8_t>(src.data[j * src.in + k]);
          } else {
            const uint8_t byte = src.data[j * (src.in / 2) + k / 2];
            const int nib = (k % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
            q = nib >= 8 ? nib - 16 : nib;
          }
          const auto u = static_cast<uint8_t>(q + offset);
          if (w.format == BlockQuantFormat::kQ8) rec[quad * 64 + 4 * c + r] = u;
          else rec[(quad / 2) * 64 + 4 * c + r] |= static_cast<uint8_t>(quad % 2 == 0 ? u : u << 4);
        }
        const uint16_t h = f32_to_f16(src.scales[j * src.num_groups() + b]);
        std::memcpy(rec + w.code_bytes() + 2 * c, &h, sizeof(h));
      }
    }
  }
  w.data = dst->bytes.data();
  return {};
}

Status check_block_quant_gemm(const BlockQuantGemmParams& p) {
  if (!p.w || !p.w->data) return invalid_argument("[block_quant_gemm] no packed weight");
  const BlockQuantWeight& w = *p.w;
  if (w.out < 1 || w.in < 1 || w.in % kQuantBlock != 0)
    return invalid_argument("[block_quant_gemm] weight ({}, {}): in must be a positive multiple of {}", w.out, w.in,
                            kQuantBlock);
  if (p.n < 0) return invalid_argument("[block_quant_gemm] negative row count n={}", p.n);
  if (p.n == 0) return {};
  if (!p.x || !p.y) return invalid_argument("[block_quant_gemm] x ({}, {}) or y ({}, {}) is null", p.n, w.in, p.n, w.out);
  if (p.ldx < w.in || p.ldy < w.out || (p.residual && p.ldr < w.out))
    return invalid_argument("[block_quant_gemm] x ({}, {}) ldx={}, y ({}, {}) ldy={}, residual ldr={}: a leading "
                            "dimension is shorter than its row",
                            p.n, w.in, p.ldx, p.n, w.out, p.ldy, p.ldr);
  return {};
}

}  // namespace kiln
