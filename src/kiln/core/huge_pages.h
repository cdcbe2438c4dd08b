// Buffers that big streaming kernels read in order (packed GEMM panels, pre-packed weights, the
// DRAM read probe) on transparent huge pages: with 4 KiB pages, a stream crosses a page every
// 4 KiB and prefetches far ahead land on pages not yet in the TLB. The dev VMs set THP to
// "madvise", so a buffer gets huge pages only when asked (measured gains: gemm.cpp ScratchBuffer,
// gemm_prepacked.cpp pack_weight_as).
#pragma once

#include <cstddef>

namespace kiln {

struct LargeBuffer {
  void* ptr = nullptr;  // null when the allocation failed; free with std::free
  size_t bytes = 0;     // the rounded size
};

// bytes >= 2 MiB: 2 MiB-aligned, rounded up to 2 MiB and advised MADV_HUGEPAGE (advisory:
// errors ignored); smaller: 64-byte aligned, rounded up to 4 KiB.
LargeBuffer allocate_large(size_t bytes);

}  // namespace kiln
