// Hugging Face config.json <-> ModelConfig (the keys of LlamaForCausalLM and GPT2LMHeadModel, as
// transformers 4.x and 5.x write them, RoPE scalings under rope_parameters or rope_scaling).
#pragma once

#include <string>

#include "kiln/core/status.h"
#include "kiln/model/config.h"

namespace kiln {

// Writes both spellings of the RoPE settings (rope_parameters for transformers 5, rope_theta and
// rope_scaling for 4.x) and bos/eos_token_id (null when unknown).
std::string config_to_hf_json(const ModelConfig& c);
// Every key is read (type and range checked: InvalidArgument naming the key; a value kiln does
// not implement: Unimplemented naming it), known harmless (metadata, dropout, generation
// defaults, ...: the table in hf_config.cpp; keys starting with "_") or refused: an unknown key
// is Unimplemented naming it, since it may change the model. Then check_config (config.h),
// which also bounds the memory the sizes imply.
Expected<ModelConfig> config_from_hf_json(const std::string& text);

}  // namespace kiln
