// Quantized Linear backends: the packed weight in the layout of kernels/quant_gemm.h (built
// from a QTensor), run by the quantized kernels — weight-only int8/int4 (2/3-bit grids widened
// to int4 codes) and fp8, W8A8 int8 with per-token activation scales, fp8 W8A8 (activations
// rounded to E4M3 per token, then the fp8-weight kernel), and llama.cpp's Q8_0 / Q4_0 recipe
// (int8 / int4 weights in blocks of 32, activations int8 per block of 32: kernels/block_quant_gemm.h).
#pragma once

#include <memory>
#include <vector>

#include "kiln/kernels/block_quant_gemm.h"
#include "kiln/kernels/quant_gemm.h"
#include "kiln/model/transformer.h"
#include "kiln/quant/scheme.h"

namespace kiln::quant {

// Activation quantization at run time: none (W·A16, the accuracy path), int8 per token (W8A8),
// fp8 per token, int8 per block of 32 (W8A8 / W4A8 on symmetric group-32 int8 / int4 weights,
// as llama.cpp runs Q8_0 / Q4_0; the weights repacked for the block kernels).
enum class ActQuant { kNone, kInt8, kFp8, kInt8Block };
std::string_view act_quant_name(ActQuant a);

// A QTensor in the kernels' layout (owning the buffers QuantWeight points into).
struct KernelWeight {
  QuantWeight w;
  std::vector<uint8_t> data;
  std::vector<float> scales, zeros;
  std::vector<int32_t> row_sums;  // W8A8 only
};
// Int: signed codes q_u − 2^(bits−1) (2/3/4-bit as kInt4 nibbles, 8-bit as kInt8), zero points
// shifted the same way (null when all are 0); per-tensor int scales are expanded per channel.
std::unique_ptr<KernelWeight> to_kernel_weight(const QTensor& t);

class QuantizedLinear : public LinearBackend {
 public:
  QuantizedLinear(QTensor t, ActQuant act);
  void forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const override;
  // Backward uses the fp32 master weight (which loading sets to the dequantized values).

  const QTensor& qtensor() const { return q_; }
  ActQuant act() const { return act_; }
  // Bytes the forward streams per call: packed codes + scales (+ zeros, + W8A8 row sums).
  int64_t weight_bytes() const;
  // The kernel the forward runs, for `kiln info` and benchmarks.
  std::string kernel_name() const;

 private:
  QTensor q_;
  ActQuant act_;
  std::unique_ptr<KernelWeight> kw_;     // every mode but kInt8Block
  std::unique_ptr<PackedBlockWeight> bw_;  // kInt8Block
  mutable std::vector<int8_t> qa_;     // (n, in) W8A8 activations
  mutable std::vector<float> a_scale_;  // (n,)
  mutable std::vector<float> xa_;       // (n, in) fp8-rounded activations
};

// A bf16 copy of the weight through the bf16 GEMM (the decode-speed baseline beside fp32).
class Bf16Linear : public LinearBackend {
 public:
  explicit Bf16Linear(const Linear& l);
  void forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const override;
  void sync(const Linear& l) override;

 private:
  std::vector<uint16_t> w_;  // (out, in) bf16 bits
};

}  // namespace kiln::quant
