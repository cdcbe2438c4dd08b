// Model directories the way Hugging Face lays them out: config.json + model.safetensors with
// HF tensor names (GPT-2's Conv1D weights stored transposed, as HF does), plus the
// tokenizer.json when there is one. Loading checks every size it reads: a truncated or
// corrupted file is an error naming the file and the tensor, never a crash.
#pragma once

#include <memory>
#include <string>

#include "kiln/core/status.h"
#include "kiln/model/hf_config.h"
#include "kiln/model/transformer.h"

namespace kiln {

// Writes dir/config.json and dir/model.safetensors (f32), each via a temporary file + rename.
Status save_model(const std::string& dir, Transformer& model);
// Reads dir/config.json and dir/model.safetensors (F32, F16 or BF16 tensors).
// A path ending in ".gguf" is read as a llama.cpp Llama GGUF instead (gguf.h; dequantized to fp32).
Expected<std::unique_ptr<Transformer>> load_model(const std::string& dir);

}  // namespace kiln
