// A caching allocator: freed blocks go to per-size free lists and are reused, so steady-state
// training steps allocate nothing from the OS. Reports bytes in use, peak, cached and the
// fragmentation (bytes reserved for live blocks that the caller did not ask for).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace kiln {

struct AllocatorStats {
  int64_t bytes_requested = 0;       // sum of sizes asked for by live allocations
  int64_t bytes_in_use = 0;          // sum of block sizes handed out (>= requested)
  int64_t peak_bytes_in_use = 0;
  int64_t peak_bytes_requested = 0;
  int64_t bytes_cached = 0;          // free blocks kept for reuse
  int64_t bytes_reserved = 0;        // in_use + cached: what the process holds
  int64_t num_allocs = 0;            // calls to allocate
  int64_t num_os_allocs = 0;         // of which went to the OS
  int64_t num_live = 0;
  int64_t largest_free_block = 0;    // biggest cached block (filled in by stats())
  // Internal fragmentation: 1 - requested / in_use (0 when nothing is live).
  double fragmentation() const {
    return bytes_in_use == 0 ? 0.0 : 1.0 - static_cast<double>(bytes_requested) / bytes_in_use;
  }
  // External fragmentation of the cache: 1 - largest free block / cached bytes (0: the cached
  // memory is one block, or none; near 1: it is split into many small blocks).
  double external_fragmentation() const {
    return bytes_cached == 0 ? 0.0 : 1.0 - static_cast<double>(largest_free_block) / bytes_cached;
  }
  // Share of the reserved bytes that no live block uses: 1 - in_use / reserved.
  double reserved_unused() const {
    return bytes_reserved == 0 ? 0.0 : 1.0 - static_cast<double>(bytes_in_use) / bytes_reserved;
  }
};

class CachingAllocator {
 public:
  static constexpr size_t kAlignment = 64;  // a cache line; also what AVX-512 loads like

  // Block sizes: powers of two up to 1 MiB, then multiples of 1 MiB, so a block is at most
  // 2x (small) or 1 MiB (large) bigger than asked.
  static size_t round_size(size_t nbytes);

  void* allocate(size_t nbytes);
  void deallocate(void* ptr);
  void empty_cache();  // return every cached block to the OS
  AllocatorStats stats() const;
  void reset_peak();

  ~CachingAllocator();

 private:
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;                       // block size -> free block
  std::unordered_map<void*, std::pair<size_t, size_t>> live_;  // ptr -> (block, requested)
  AllocatorStats stats_;
};

// The process-wide allocator used by Tensor storage.
CachingAllocator& default_allocator();

}  // namespace kiln
