// CRC-32C (Castagnoli; the checksum of iSCSI, ext4 and SSE4.2's crc32 instruction): checkpoint
// sections carry one, so a flipped byte anywhere is refused on load instead of resuming with
// garbage. Detects every error burst up to 32 bits, so every single flipped byte.
#pragma once

#include <cstdint>
#include <string_view>

namespace kiln {

// CRC-32C of `bytes` continuing from `crc` (0 to start): crc32c(ab) == crc32c(b, crc32c(a)).
// Slicing-by-8 tables: 8 bytes per step.
uint32_t crc32c(std::string_view bytes, uint32_t crc = 0);
// The same, one byte per step: the reference the fast one is tested against.
uint32_t crc32c_ref(std::string_view bytes, uint32_t crc = 0);

}  // namespace kiln
