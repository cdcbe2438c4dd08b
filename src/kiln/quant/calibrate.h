// Calibration: unlabeled windows of the corpus run through the model's own forward with a
// capturing LinearBackend that accumulates, per Linear, what the methods need — GPTQ's
// H = 2/n·XᵀX, AWQ's mean |X_j|, SmoothQuant's max |X_j| and a strided sample of input rows —
// and the per-layer report of clipping vs rounding error for each range method.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/model/transformer.h"
#include "kiln/quant/scheme.h"
#include "kiln/train/data.h"

namespace kiln::quant {

// Statistics of one Linear's inputs x (n, in) over the calibration forwards.
struct LinearStats {
  int64_t in = 0;
  int64_t rows = 0;                 // rows seen
  std::vector<float> xtx;           // (in, in) Σ xᵀx, when collected
  std::vector<float> abs_mean;      // (in,) mean |x_j| (finalized by finish())
  std::vector<float> abs_max;       // (in,) max |x_j|
  std::vector<float> sample;        // (sample_rows, in) every sample_every-th row
  int64_t sample_rows = 0;
  // H = 2/n · XᵀX, the GPTQ Hessian of the layer-wise squared error.
  std::vector<float> hessian() const;
};

// The capturing backend: records stats, then computes through the previous backend (or fp32).
class CaptureLinear : public LinearBackend {
 public:
  CaptureLinear(LinearStats* stats, std::shared_ptr<LinearBackend> inner, bool want_xtx, int64_t sample_every,
                int64_t max_sample_rows);
  void forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const override;

 private:
  LinearStats* stats_;
  std::shared_ptr<LinearBackend> inner_;
  bool want_xtx_;
  int64_t sample_every_, max_sample_rows_;
};

struct CalibOptions {
  int64_t samples = 256;  // sequences
  int64_t seq_len = 128;
  int64_t batch = 16;     // sequences per forward
  uint64_t seed = 1234;
  int64_t max_sample_rows = 1024;  // rows of X kept per Linear (AWQ search, reports)
};

// `samples` windows of seq_len tokens drawn from the shard (seeded), (samples, seq_len).
std::vector<int32_t> calibration_tokens(const TokenShard& shard, const CalibOptions& o);

// Runs the calibration tokens through the model with capturing backends on the Linears whose
// names are in `names` (all when empty); restores the previous backends afterwards.
// Returns name -> stats.
Expected<std::map<std::string, LinearStats>> capture_stats(Transformer& model, const std::vector<int32_t>& tokens,
                                                           const CalibOptions& o, bool want_xtx,
                                                           const std::vector<std::string>& names = {});

// Clipping vs rounding error of per-tensor static 8-bit activation quantization of each
// Linear's captured input sample, and of the weight under `weight_scheme`, for the three range
// methods; a printable table.
std::string range_report(Transformer& model, const std::map<std::string, LinearStats>& stats,
                         const QuantScheme& weight_scheme);

}  // namespace kiln::quant
