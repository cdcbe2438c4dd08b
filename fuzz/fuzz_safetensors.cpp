// libFuzzer target: a safetensors file image (parse_safetensors_header over the whole input as
// the file): header length, JSON, dtypes, shapes and offsets that must tile the data exactly.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  (void)kiln::safetensors_header_length(bytes, size).ok();
  auto h = kiln::parse_safetensors_header(bytes, size);
  if (!h.ok()) return 0;
  (void)h->metadata_value("format");
  return 0;
}
