#include "kiln/core/huge_pages.h"

#include <sys/mman.h>

#include <cstdlib>

namespace kiln {

LargeBuffer allocate_large(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20, kPage = 4096;
  const bool huge = bytes >= kHuge;
  const size_t unit = huge ? kHuge : kPage;
  LargeBuffer b;
  b.bytes = (bytes + unit - 1) & ~(unit - 1);
  if (b.bytes == 0) b.bytes = kPage;
  b.ptr = std::aligned_alloc(huge ? kHuge : 64, b.bytes);
  if (huge && b.ptr) madvise(b.ptr, b.bytes, MADV_HUGEPAGE);
  return b;
}

}  // namespace kiln
