// core/huge_pages.h: sizes rounded and aligned as documented (whether the kernel grants huge
// pages is up to its THP setting and is not checked).
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <gtest/gtest.h>

#include "kiln/core/huge_pages.h"

namespace kiln {
namespace {

TEST(HugePages, SmallBuffersRoundToPagesLargeToHugePages) {
  const LargeBuffer small = allocate_large(100);
  ASSERT_NE(small.ptr, nullptr);
  EXPECT_EQ(small.bytes, 4096u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.ptr) % 64, 0u);
  std::memset(small.ptr, 1, small.bytes);  // all of it is usable
  std::free(small.ptr);

  constexpr size_t kHuge = size_t{2} << 20;
  const LargeBuffer large = allocate_large(kHuge + 1);
  ASSERT_NE(large.ptr, nullptr);
  EXPECT_EQ(large.bytes, 2 * kHuge);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large.ptr) % kHuge, 0u);
  std::memset(large.ptr, 1, large.bytes);
  std::free(large.ptr);

  const LargeBuffer empty = allocate_large(0);
  ASSERT_NE(empty.ptr, nullptr);
  EXPECT_EQ(empty.bytes, 4096u);
  std::free(empty.ptr);
}

}  // namespace
}  // namespace kiln
