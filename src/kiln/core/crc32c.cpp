// CRC-32C, reflected, polynomial 0x1EDC6F41 (0x82F63B78 bit-reversed), initial value and final
// xor 0xFFFFFFFF. Tables built once at compile time.
#include "kiln/core/crc32c.h"

#include <array>
#include <cstring>

namespace kiln {
namespace {

constexpr uint32_t kPolyReflected = 0x82F63B78u;

// kTables[0][b]: the CRC of byte b; kTables[k][b]: of byte b followed by k zero bytes.
constexpr std::array<std::array<uint32_t, 256>, 8> make_tables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c & 1) ? (c >> 1) ^ kPolyReflected : c >> 1;
    t[0][b] = c;
  }
  for (size_t k = 1; k < 8; ++k)
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  return t;
}
constexpr auto kTables = make_tables();

}  // namespace

uint32_t crc32c_ref(std::string_view bytes, uint32_t crc) {
  crc = ~crc;
  for (const char ch : bytes) crc = (crc >> 8) ^ kTables[0][(crc ^ static_cast<uint8_t>(ch)) & 0xff];
  return ~crc;
}

uint32_t crc32c(std::string_view bytes, uint32_t crc) {
  crc = ~crc;
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t n = bytes.size();
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian: byte 0 in the low bits
    w ^= crc;
    crc = kTables[7][w & 0xff] ^ kTables[6][(w >> 8) & 0xff] ^ kTables[5][(w >> 16) & 0xff] ^
          kTables[4][(w >> 24) & 0xff] ^ kTables[3][(w >> 32) & 0xff] ^ kTables[2][(w >> 40) & 0xff] ^
          kTables[1][(w >> 48) & 0xff] ^ kTables[0][w >> 56];
  }
  for (; n > 0; --n, ++p) crc = (crc >> 8) ^ kTables[0][(crc ^ *p) & 0xff];
  return ~crc;
}

}  // namespace kiln
