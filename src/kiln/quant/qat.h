// Quantization-aware training: a fake-quantization LinearBackend. The forward uses the weight
// quantized then dequantized (values stay f32 on the grid; w8a8 also fake-quantizes each input
// row to int8 per token); the backward is the straight-through estimator: gradients pass as if
// rounding were the identity, 1 inside the clipping range and 0 outside. The grid follows the
// fp32 master weight through sync(), which the Trainer calls after every optimizer step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/model/transformer.h"
#include "kiln/quant/qmodel.h"
#include "kiln/quant/scheme.h"

namespace kiln::quant {

struct QatConfig {
  QuantScheme weight;        // e.g. int4 g128 asym
  bool act_int8 = false;     // w8a8: per-token int8 activations
  std::string name;          // "w4g128" / "w8a8"
};
// "w4g128", "w8a8" (or any weight scheme name parse_weight_scheme accepts, "aN" suffix for
// per-token int8 activations).
Expected<QatConfig> parse_qat(const std::string& name);

class FakeQuantLinear : public LinearBackend {
 public:
  FakeQuantLinear(const Linear& l, const QatConfig& c);
  void forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const override;
  void backward(const Linear& l, float* dx, const float* dy, const float* x, int64_t n,
                bool accumulate_dx) const override;
  void sync(const Linear& l) override;

  const std::vector<float>& fake_weight() const { return wq_; }
  const std::vector<uint8_t>& weight_mask() const { return mask_; }

 private:
  // x (n, in) -> xa_ fake-quantized (w8a8) and the STE mask of x.
  const float* act_input(const float* x, int64_t n, int64_t in) const;
  QatConfig c_;
  std::vector<float> wq_;      // (out, in) fake-quantized weight
  std::vector<uint8_t> mask_;  // (out, in) 1 where w lies inside its group's clipping range
  mutable std::vector<float> xa_, tmp_;
};

// Installs FakeQuantLinear on every block Linear (not the head/embedding). Fails when a
// Linear already has a backend.
Status install_qat(Transformer& model, const QatConfig& c);
// QAT over tensor-parallel shards of `m` at tp ranks (every rank, so all give the same verdict):
// each shard's fake quantization must be the single process's, so a row-parallel weight's
// input columns per rank hold whole groups; per-channel and per-tensor scales and int8
// activations span the whole input row, which the split cuts (InvalidArgument naming them).
Status check_qat_tensor_split(const QatConfig& c, const ModelConfig& m, int tp);
// After QAT: the real quantized model (the same grid the fake quantization used), backends
// replaced by QuantizedLinear.
QuantizedState export_qat(Transformer& model, const QatConfig& c);

}  // namespace kiln::quant
