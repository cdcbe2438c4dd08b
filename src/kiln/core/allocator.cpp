// Caching allocator implementation: a best-fit lookup over free blocks of equal rounded size.
#include "kiln/core/allocator.h"

#include <cstdlib>

#include "kiln/core/status.h"

namespace kiln {

size_t CachingAllocator::round_size(size_t nbytes) {
  constexpr size_t kMiB = size_t{1} << 20;
  if (nbytes <= kAlignment) return kAlignment;
  if (nbytes <= kMiB) {
    size_t s = kAlignment;
    while (s < nbytes) s <<= 1;
    return s;
  }
  return (nbytes + kMiB - 1) / kMiB * kMiB;
}

void* CachingAllocator::allocate(size_t nbytes) {
  const size_t block = round_size(nbytes);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.num_allocs;
  void* ptr = nullptr;
  auto it = free_.find(block);
  if (it != free_.end()) {
    ptr = it->second;
    free_.erase(it);
    stats_.bytes_cached -= static_cast<int64_t>(block);
  } else {
    ptr = std::aligned_alloc(kAlignment, block);
    if (ptr == nullptr) {
      // Out of memory: give the cache back and try once more before failing loudly.
      for (auto& [size, p] : free_) std::free(p);
      stats_.bytes_reserved -= stats_.bytes_cached;
      stats_.bytes_cached = 0;
      free_.clear();
      ptr = std::aligned_alloc(kAlignment, block);
      KILN_CHECK_MSG(ptr != nullptr, "out of memory allocating {} bytes", block);
    }
    ++stats_.num_os_allocs;
    stats_.bytes_reserved += static_cast<int64_t>(block);
  }
  live_[ptr] = {block, nbytes};
  ++stats_.num_live;
  stats_.bytes_in_use += static_cast<int64_t>(block);
  stats_.bytes_requested += static_cast<int64_t>(nbytes);
  if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
  if (stats_.bytes_requested > stats_.peak_bytes_requested)
    stats_.peak_bytes_requested = stats_.bytes_requested;
  return ptr;
}

void CachingAllocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  KILN_CHECK_MSG(it != live_.end(), "deallocate of a pointer this allocator did not hand out");
  const auto [block, requested] = it->second;
  live_.erase(it);
  --stats_.num_live;
  stats_.bytes_in_use -= static_cast<int64_t>(block);
  stats_.bytes_requested -= static_cast<int64_t>(requested);
  stats_.bytes_cached += static_cast<int64_t>(block);
  free_.emplace(block, ptr);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, p] : free_) std::free(p);
  free_.clear();
  stats_.bytes_reserved -= stats_.bytes_cached;
  stats_.bytes_cached = 0;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  AllocatorStats s = stats_;
  s.largest_free_block = free_.empty() ? 0 : static_cast<int64_t>(free_.rbegin()->first);
  return s;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
  stats_.peak_bytes_requested = stats_.bytes_requested;
}

CachingAllocator::~CachingAllocator() {
  // Live blocks are left alone: a tensor in static storage may still free one later.
  for (auto& [size, p] : free_) std::free(p);
}

CachingAllocator& default_allocator() {
  static CachingAllocator a;
  return a;
}

}  // namespace kiln
