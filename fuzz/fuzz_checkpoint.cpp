// libFuzzer target: a training checkpoint's header (checkpoint_prefix_bytes, then
// parse_checkpoint_header over the whole input as the file): magic, length, CRC-32C, JSON fields
// and the sections that must tile the file. Each input is parsed as it is and again with its
// header CRC recomputed, so mutations of the JSON reach the field checks behind the checksum.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "kiln/core/crc32c.h"
#include "kiln/train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto need = kiln::checkpoint_prefix_bytes(bytes, size);
  if (!need.ok() || *need > size) return 0;
  (void)kiln::parse_checkpoint_header(bytes, size).ok();
  std::string fixed(bytes);
  const uint32_t crc = kiln::crc32c(std::string_view(fixed).substr(0, *need - 4));
  std::memcpy(fixed.data() + *need - 4, &crc, 4);
  (void)kiln::parse_checkpoint_header(fixed, size).ok();
  return 0;
}
