// libFuzzer target: a training checkpoint's header (checkpoint_prefix_bytes, then
// parse_checkpoint_header over the whole input as the file): magic, length, CRC-32C, JSON fields
// and the sections that must tile the file.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto need = kiln::checkpoint_prefix_bytes(bytes, size);
  if (!need.ok() || *need > size) return 0;
  (void)kiln::parse_checkpoint_header(bytes, size).ok();
  return 0;
}
