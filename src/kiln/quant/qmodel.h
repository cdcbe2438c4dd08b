// Quantizing a whole model (RTN, GPTQ, AWQ, SmoothQuant, fp8) and the quantized model format:
// config.json + model.safetensors where each quantized Linear `X.weight` is stored as
// `X.qweight` (U8, packed codes: (out, ⌈in·bits/8⌉), or (out, in) E4M3 bytes), `X.scales`
// (F32, (out, groups) or (1,)) and `X.zeros` (F32, same shape; absent when symmetric), every
// other tensor F32 as in an fp32 model; __metadata__ holds kiln.quant.{method, bits, group,
// symmetric, format, act}. Loading installs QuantizedLinear backends on those Linears.
#pragma once

#include <map>
#include <span>
#include <memory>
#include <string>

#include "kiln/model/transformer.h"
#include "kiln/quant/calibrate.h"
#include "kiln/quant/gptq.h"
#include "kiln/quant/qlinear.h"
#include "kiln/quant/scheme.h"

namespace kiln::quant {

enum class Method { kRtn, kGptq, kAwq, kSmoothQuant, kFp8, kQat };  // kQat: exported after QAT (RTN grid)
Expected<Method> parse_method(const std::string& name);
std::string_view method_name(Method m);

struct QuantizeOptions {
  Method method = Method::kRtn;
  QuantScheme scheme;        // the weights' scheme (SmoothQuant: int8 per-channel sym; fp8: E4M3)
  GptqOptions gptq;
  double alpha = -1;         // AWQ: fixed α (< 0: grid search); SmoothQuant: migration strength
  bool quantize_head = false;  // also the LM head (never when tied to the embedding)
  CalibOptions calib;
  bool report = false;       // the clipping vs rounding table
};

// The quantized weights of a model and how its activations are quantized at run time.
struct QuantizedState {
  Method method = Method::kRtn;
  QuantScheme scheme;
  ActQuant act = ActQuant::kNone;
  std::map<std::string, QTensor> weights;  // by HF weight name
};

// Quantizes `model` in place (AWQ/SmoothQuant fold scales into its fp32 weights), installs the
// QuantizedLinear backends and sets each quantized master weight to its dequantized values.
// `calib` is the corpus shard for calibration (unused by RTN and fp8). Appends a log.
Expected<QuantizedState> quantize_model(Transformer& model, const TokenShard* calib, const QuantizeOptions& o,
                                        std::string* log);

// Installs backends for `state` on model (and writes the dequantized masters).
void install_backends(Transformer& model, const QuantizedState& state);

Status save_quantized_model(const std::string& dir, Transformer& model, const QuantizedState& state);
// Loads an fp32/f16/bf16 model directory (load_model), a quantized one (backends installed) or a
// llama.cpp `.gguf` file (gguf_weights.h: Q8_0 / Q4_0 on the quantized backends); `state`, when
// given, receives the quantized weights (empty for a plain model). The loader of every command.
Expected<std::unique_ptr<Transformer>> load_any_model(const std::string& dir, QuantizedState* state = nullptr);

// Tensor parallelism (model/transformer.h TensorShard): the quantized weights of the slices a
// shard's parameter entries (Transformer::param_entries, or param_entries_for a tp rank) name
// in the single-process model's `full` state: the same codes and scales (a column-parallel
// weight keeps its rows; a row-parallel one its columns, whole groups). InvalidArgument when a
// slice would not be the same computation: int8 activations (their per-token scale spans the
// whole input row, which a row-parallel split cuts) or a group that straddles two shards'
// columns (per-channel and per-tensor scales slice exactly: each column keeps its row's scale).
Expected<QuantizedState> shard_quantized_state(const QuantizedState& full, std::span<const ParamEntry> shard);

// Bytes of weights one decode token streams: quantized Linears at their stored size, other
// matrices (fp32 Linears, and the embedding row) at 4 bytes per element.
int64_t weight_bytes_per_token(Transformer& model);

}  // namespace kiln::quant
