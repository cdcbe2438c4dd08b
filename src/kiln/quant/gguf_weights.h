// A llama.cpp GGUF's Q8_0 and Q4_0 matrices kept quantized: each becomes a kiln QTensor with
// the very same values (int8 / int4 symmetric, group 32 along the input, Δ the block's f16
// scale d): Q8_0's x = d·q (q int8) is code q + 128 with z = 128; Q4_0's x = d·(q − 8) is code
// q with z = 8. No value is rounded again. The quantized Linear backends (qlinear.h) then run
// those weights as they are stored, as kiln-quantized models run.
#pragma once

#include "kiln/model/gguf.h"
#include "kiln/model/transformer.h"
#include "kiln/quant/qmodel.h"

namespace kiln::quant {

// The quantized state of `model` (built from f by gguf::llama_from_gguf) for every Linear whose
// GGUF tensor is Q8_0 or Q4_0, q_proj / k_proj rows un-permuted as the loader does. MoE experts'
// stacked tensors, F32/F16 tensors and a tied head stay fp32 (not in the state).
QuantizedState gguf_quantized_state(const gguf::File& f, Transformer& model);

// A llama.cpp GGUF file as a kiln model: gguf::llama_from_gguf's, with the Q8_0 / Q4_0 matrices
// on the quantized backends (install_backends) and the F16 ones packed as halves (PackedLinear
// with f16 weights: kept, not widened); `state`, when given, receives the Q8_0 / Q4_0 weights.
// `act`: how those matrices take their activations — int8 per block of 32 by default, as
// llama.cpp runs Q8_0 / Q4_0 (the block kernels, W8A8 / W4A8), or kNone for f32 activations
// (the weight-only kernels, W8A16 / W4A16: the accuracy path). Errors name the file.
Expected<gguf::LoadedModel> load_gguf_model(const std::string& path, QuantizedState* state = nullptr,
                                            ActQuant act = ActQuant::kInt8Block);

}  // namespace kiln::quant
