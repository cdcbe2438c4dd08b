// Mixed-precision training: the precisions of `kiln train --precision`, their LinearBackends
// (installed on every Linear of a model; the fp32 weights stay the master copy AdamW updates),
// loss scaling (static and dynamic) and fp8 delayed scaling from an amax history.
//   bf16: matmul inputs (activations, weights, output gradients) rounded to bf16 and fed to the
//         bf16 GEMM (AVX512_BF16 vdpbf16ps where present), f32 accumulation and outputs.
//   fp16: EMULATED — inputs rounded to IEEE f16 (RNE, subnormals kept) and stored as f32, then
//         the f32 GEMM; the rounding shows f16's range (overflow to inf, underflow to zero) that
//         loss scaling exists for. Gradient values flushed to zero are counted.
//   fp8:  EMULATED — quantize-dequantize around the f32 GEMM: weights and activations E4M3,
//         output gradients E5M2, each with a per-tensor scale σ = fmax / amax where amax is the
//         largest of the last H recorded amaxes (delayed scaling); saturating casts.
#pragma once

#include <deque>
#include <memory>
#include <string_view>

#include "kiln/core/status.h"
#include "kiln/core/tensor.h"
#include "kiln/comm/communicator.h"
#include "kiln/model/transformer.h"
#include "kiln/train/precision_kernels.h"

namespace kiln {

enum class Precision { kF32, kBF16, kF16, kFP8 };
std::string_view precision_name(Precision p);
Expected<Precision> parse_precision(std::string_view s);

// Per-tensor fp8 scale from a history of amaxes (delayed scaling, as in NVIDIA Transformer
// Engine): the scale used for a tensor comes from the amaxes of its previous H uses, so no
// extra pass over the tensor is needed before casting it; the current amax is recorded after.
class DelayedScaler {
 public:
  DelayedScaler(Fp8Kind kind, int history) : kind_(kind), history_len_(history < 1 ? 1 : history) {}
  // σ = fmax / max(history); 1 when the history is empty or all zero.
  float scale() const;
  void record(float amax);  // NaN/inf amaxes are not recorded
  bool empty() const { return history_.empty(); }
  Fp8Kind kind() const { return kind_; }
  const std::deque<float>& history() const { return history_; }

 private:
  Fp8Kind kind_;
  int history_len_;
  std::deque<float> history_;
};

// Loss scaling: the loss gradient is multiplied by S before backward, the gradients divided by
// S after. Static: S fixed. Dynamic: when a gradient is inf/NaN the step is skipped and S
// halved; after `window` good steps in a row S is doubled.
class LossScaler {
 public:
  LossScaler(double scale, bool dynamic, int64_t window) : scale_(scale), dynamic_(dynamic), window_(window) {}
  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  int64_t good_steps() const { return good_steps_; }
  // After backward: returns whether the optimizer step should run (false: skip it).
  bool update(bool found_nonfinite);
  void restore(double scale, int64_t good_steps) { scale_ = scale; good_steps_ = good_steps; }

 private:
  double scale_;
  bool dynamic_;
  int64_t window_;
  int64_t good_steps_ = 0;
};

// State shared by the backends of one model: conversion scratch (grown to the largest Linear,
// then reused; from the caching allocator) and counters.
struct PrecisionContext {
  Precision precision = Precision::kF32;
  int amax_history = 16;
  Tensor x_scratch, dy_scratch;  // converted matmul inputs: activations, output gradients
  int64_t grads_flushed = 0;     // fp16: non-zero output-gradient values rounded to zero
  int64_t values_rounded = 0;    // elements converted (for the flushed fraction)
  // fp8 over several ranks: the ranks over which each tensor's amax is reduced (max) before its
  // scale is taken, so every shard and every data-parallel rank's rows scale as the whole
  // tensor of the whole batch would in one process (Transformer Engine's amax reduction
  // group). The Trainer passes ParallelPlan::amax_group(); null: this rank's own amax.
  comm::Communicator* amax_group = nullptr;
  // A buffer of at least `bytes` in slot t (grown, never shrunk).
  void* scratch(Tensor& t, int64_t bytes);
  // Bytes of scratch a (B·T)-row step needs and of the low-precision weight copies (memory model).
  static int64_t scratch_bytes(Precision p, const ModelConfig& c, int64_t rows);
  static int64_t weight_copy_bytes(Precision p, const ModelConfig& c);
};

// Installs the precision's backend on every Linear (fp32: removes them). Fails when a Linear
// already has another backend (e.g. QAT fake quantization). The backends' sync() must run after
// every change of the master weights (the Trainer does it after each optimizer step).
// amax_group: fp8's (PrecisionContext::amax_group); collective over it then (the weights' casts).
Expected<std::shared_ptr<PrecisionContext>> install_precision(Transformer& model, Precision p, int amax_history = 16,
                                                              comm::Communicator* amax_group = nullptr);

// Calls sync() on the backend of every Linear that has one.
void sync_backends(Transformer& model);

}  // namespace kiln
