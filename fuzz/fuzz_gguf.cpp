// libFuzzer target: a GGUF image (gguf::parse), then, when it parses, the Llama loader
// (gguf::llama_from_gguf): neither may crash, read out of bounds or allocate without bound.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/model/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto file = kiln::gguf::parse(bytes, "fuzz.gguf");
  if (!file.ok()) return 0;
  auto model = kiln::gguf::llama_from_gguf(*file);
  (void)model.ok();
  return 0;
}
