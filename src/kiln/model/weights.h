// Model directories the way Hugging Face lays them out: config.json + model.safetensors with
// HF tensor names (GPT-2's Conv1D weights stored transposed, as HF does), plus the
// tokenizer.json when there is one. Loading checks every size it reads: a truncated or
// corrupted file is an error naming the file and the tensor, never a crash.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/model/hf_config.h"
#include "kiln/model/safetensors.h"
#include "kiln/model/transformer.h"

namespace kiln {

// Writes dir/config.json and dir/model.safetensors (f32), each via a temporary file + rename.
Status save_model(const std::string& dir, Transformer& model);
// Reads dir/config.json and dir/model.safetensors (F32, F16 or BF16 tensors). Every tensor the
// config needs is checked (name, dtype, shape) against the file's header before the model is
// allocated, and a tensor the config does not use is an error naming it (match_params).
// A path ending in ".gguf" is read as a llama.cpp Llama GGUF instead (gguf.h; dequantized to fp32).
Expected<std::unique_ptr<Transformer>> load_model(const std::string& dir);

// The file's tensor for each entry (entries = Transformer::param_entries_for(c)), in order:
// present, F32/F16/BF16, with the shape c needs in HF layout. Every other tensor of the file is an
// error naming it (config.json misdescribes the file), except buffers transformers derives from
// the config (rotary_emb.inv_freq, GPT-2's attn.bias / attn.masked_bias) and, when c ties the
// head, an lm_head.weight equal to the embedding.
Expected<std::vector<const SafetensorsTensor*>> match_params(SafetensorsFile& st, const ModelConfig& c,
                                                              const std::vector<ParamEntry>& entries);

}  // namespace kiln
