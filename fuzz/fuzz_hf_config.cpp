// libFuzzer target: Hugging Face config.json text (config_from_hf_json); every field's type and
// range is checked there, so no input may throw, crash or overflow.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kiln/model/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto cfg = kiln::config_from_hf_json(text);
  if (cfg.ok()) (void)cfg->describe();
  return 0;
}
