// CRC-32C against published check values (RFC 3720 B.4, the "123456789" check) and the
// slicing-by-8 version against the byte-at-a-time reference on many lengths and offsets.
#include <gtest/gtest.h>

#include <string>

#include "kiln/core/crc32c.h"
#include "kiln/core/rng.h"

namespace kiln {
namespace {

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string up, down;
  for (int i = 0; i < 32; ++i) {
    up.push_back(static_cast<char>(i));
    down.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crc32c(up), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down), 0x113FDB5Cu);
  EXPECT_EQ(crc32c_ref("123456789"), 0xE3069283u);
}

TEST(Crc32c, FastMatchesReferenceAndChains) {
  Rng rng(7);
  std::string buf(300, '\0');
  for (char& c : buf) c = static_cast<char>(rng.below(256));
  for (size_t off = 0; off < 9; ++off)
    for (size_t len = 0; off + len <= buf.size(); len += 7) {
      const std::string_view s = std::string_view(buf).substr(off, len);
      ASSERT_EQ(crc32c(s), crc32c_ref(s)) << off << " " << len;
      const size_t cut = len / 3;
      ASSERT_EQ(crc32c(s.substr(cut), crc32c(s.substr(0, cut))), crc32c(s)) << off << " " << len;
    }
}

}  // namespace
}  // namespace kiln
