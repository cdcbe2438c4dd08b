// Quantized Linear backends over the kernels of kernels/quant_gemm.h.
#include "kiln/quant/qlinear.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "kiln/core/dtype.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/gemm.h"

namespace kiln::quant {

namespace {
// The kernel entry points (one place, so a backend swap is one edit).
void run_weight_only(const QuantGemmParams& p) { cpu::quant_gemm(p); }
void run_w8a8(const W8A8Params& p) { cpu::w8a8_gemm(p); }
void run_block(const BlockQuantGemmParams& p) { cpu::block_quant_gemm(p); }
void run_quantize_rows(const float* x, int64_t n, int64_t in, int8_t* q, float* scales) {
  cpu::quantize_rows_int8(x, n, in, in, q, in, scales);
}
}  // namespace

std::string_view act_quant_name(ActQuant a) {
  switch (a) {
    case ActQuant::kNone: return "none";
    case ActQuant::kInt8: return "int8-per-token";
    case ActQuant::kFp8: return "fp8e4m3-per-token";
    case ActQuant::kInt8Block: return "int8-per-block32";
  }
  return "?";
}

std::unique_ptr<KernelWeight> to_kernel_weight(const QTensor& t) {
  auto kw = std::make_unique<KernelWeight>();
  QuantWeight& w = kw->w;
  w.out = t.rows;
  w.in = t.cols;
  const bool per_tensor = t.scheme.group == QuantScheme::kPerTensor;
  if (t.scheme.format == QFormat::kFp8E4M3) {
    w.format = QuantFormat::kFp8E4M3;
    w.group = t.group_size();
    w.per_tensor_scale = per_tensor;
    kw->data = t.codes;
    kw->scales = t.scales;
  } else {
    const int shift = 1 << (t.scheme.bits - 1);
    const int64_t gpr = t.groups_per_row();
    w.group = t.group_size();
    // Scales (and zeros) per (row, group); a per-tensor scale is expanded to every row.
    kw->scales.resize(static_cast<size_t>(t.rows * gpr));
    kw->zeros.resize(kw->scales.size());
    bool any_zero = false;
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t g = 0; g < gpr; ++g) {
        const int64_t pi = t.param_index(r, g * t.group_size());
        kw->scales[r * gpr + g] = t.scales[pi];
        kw->zeros[r * gpr + g] = t.zeros[pi] - static_cast<float>(shift);
        any_zero = any_zero || kw->zeros[r * gpr + g] != 0.0f;
      }
    if (!any_zero) kw->zeros.clear();
    if (t.scheme.bits == 8) {
      w.format = QuantFormat::kInt8;
      kw->data.resize(t.codes.size());
      for (size_t i = 0; i < t.codes.size(); ++i)
        kw->data[i] = static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(t.codes[i]) - shift));
    } else {
      KILN_CHECK_MSG(t.cols % 2 == 0, "int4 kernels need an even input dimension, got {}", t.cols);
      w.format = QuantFormat::kInt4;
      kw->data.assign(static_cast<size_t>(t.rows * t.cols / 2), 0);
      for (int64_t i = 0; i < t.rows * t.cols; ++i) {
        const uint8_t nib = static_cast<uint8_t>((static_cast<int>(t.codes[i]) - shift) & 0xF);
        kw->data[i / 2] |= static_cast<uint8_t>((i % 2) ? nib << 4 : nib);
      }
    }
  }
  w.data = kw->data.data();
  w.scales = kw->scales.data();
  w.zeros = kw->zeros.empty() ? nullptr : kw->zeros.data();
  KILN_CHECK_MSG(check_quant_weight(w, "QuantizedLinear").ok(), "{}",
                 check_quant_weight(w, "QuantizedLinear").message());
  if (w.format == QuantFormat::kInt8 && w.zeros == nullptr && w.group == w.in) {
    kw->row_sums.resize(static_cast<size_t>(w.out));
    w8a8_row_sums(w, kw->row_sums.data());
  }
  return kw;
}

QuantizedLinear::QuantizedLinear(QTensor t, ActQuant act) : q_(std::move(t)), act_(act) {
  kw_ = to_kernel_weight(q_);
  if (act_ == ActQuant::kInt8Block) {
    bw_ = std::make_unique<PackedBlockWeight>();
    const Status s = pack_block_quant(kw_->w, bw_.get());
    KILN_CHECK_MSG(s.ok(), "int8-per-block32 activations need a symmetric int8 / int4 weight with groups of 32, got {}: {}",
                   q_.scheme.describe(), s.message());
    kw_.reset();  // the packed copy is the one the forward streams
    return;
  }
  if (act_ == ActQuant::kInt8)
    KILN_CHECK_MSG(!kw_->row_sums.empty(), "W8A8 needs a symmetric per-channel int8 weight, got {}", q_.scheme.describe());
}

int64_t QuantizedLinear::weight_bytes() const {
  if (bw_) return bw_->w.bytes();
  return quant_weight_bytes(kw_->w) + static_cast<int64_t>(kw_->row_sums.size() * sizeof(int32_t));
}

std::string QuantizedLinear::kernel_name() const {
  if (bw_) return fmt::format("block {} x int8/32: {}", block_quant_format_name(bw_->w.format), cpu::block_quant_path_name());
  if (act_ == ActQuant::kInt8) return "w8a8: " + cpu::w8a8_path_name();
  return "weight-only: " + cpu::quant_gemm_path_name();
}

void QuantizedLinear::forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const {
  const int64_t in = q_.cols, out = q_.rows;
  if (bw_) {
    BlockQuantGemmParams p;
    p.w = &bw_->w;
    p.n = n;
    p.x = x; p.ldx = in;
    p.y = y; p.ldy = out;
    p.bias = l.b;
    p.residual = residual; p.ldr = out;
    run_block(p);
    return;
  }
  if (act_ == ActQuant::kInt8) {
    qa_.resize(static_cast<size_t>(n * in));
    a_scale_.resize(static_cast<size_t>(n));
    run_quantize_rows(x, n, in, qa_.data(), a_scale_.data());
    W8A8Params p;
    p.w = &kw_->w;
    p.w_row_sums = kw_->row_sums.data();
    p.n = n;
    p.a = qa_.data(); p.lda = in;
    p.a_scales = a_scale_.data();
    p.y = y; p.ldy = out;
    p.bias = l.b;
    p.residual = residual; p.ldr = out;
    run_w8a8(p);
    return;
  }
  const float* xin = x;
  if (act_ == ActQuant::kFp8) {
    xa_.assign(x, x + n * in);
    fake_quantize_rows(xa_.data(), n, in, QFormat::kFp8E4M3, 8);
    xin = xa_.data();
  }
  QuantGemmParams p;
  p.w = &kw_->w;
  p.n = n;
  p.x = xin; p.ldx = in;
  p.y = y; p.ldy = out;
  p.bias = l.b;
  p.residual = residual; p.ldr = out;
  run_weight_only(p);
}

Bf16Linear::Bf16Linear(const Linear& l) { sync(l); }

void Bf16Linear::sync(const Linear& l) {
  w_.resize(static_cast<size_t>(l.out * l.in));
  for (size_t i = 0; i < w_.size(); ++i) w_[i] = f32_to_bf16(l.w[i]);
}

void Bf16Linear::forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const {
  GemmParams p;
  p.m = n; p.n = l.out; p.k = l.in;
  p.a = x; p.lda = l.in;
  p.b = w_.data(); p.ldb = l.in; p.b_dtype = DType::kBF16; p.trans_b = true;
  p.c = y; p.ldc = l.out;
  p.bias = l.b;
  p.residual = residual; p.ldr = l.out;
  cpu::gemm(p);
}

}  // namespace kiln::quant
