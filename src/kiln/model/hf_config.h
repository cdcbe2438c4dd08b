// Hugging Face config.json <-> ModelConfig (the keys of LlamaForCausalLM and GPT2LMHeadModel).
#pragma once

#include <string>

#include "kiln/core/status.h"
#include "kiln/model/config.h"

namespace kiln {

std::string config_to_hf_json(const ModelConfig& c);
Expected<ModelConfig> config_from_hf_json(const std::string& text);

}  // namespace kiln
