// Scratch memory of the attention kernels: one block per call from the caching allocator (so a
// training step allocates nothing from the OS after the first), sliced per worker thread; the
// allocator's stats show it as the kernels' extra memory. Baseline code only (not per-target).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kiln/core/allocator.h"

namespace kiln::cpu {

class ScratchBuffer {
 public:
  // num_slices × floats_per_slice floats; each slice starts on a 64-byte boundary.
  ScratchBuffer(int64_t num_slices, int64_t floats_per_slice)
      : stride_((floats_per_slice + 15) / 16 * 16) {
    const size_t bytes = static_cast<size_t>(num_slices * stride_) * sizeof(float);
    if (bytes > 0) data_ = static_cast<float*>(default_allocator().allocate(bytes));
  }
  ~ScratchBuffer() {
    if (data_) default_allocator().deallocate(data_);
  }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  float* slice(int64_t i) const { return data_ + i * stride_; }
  float* data() const { return data_; }

 private:
  int64_t stride_;
  float* data_ = nullptr;
};

}  // namespace kiln::cpu
