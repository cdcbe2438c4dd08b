// The pool of fixed-size KV-cache blocks behind PagedAttention: a free list, reference counts,
// and the prefix cache (full blocks keyed by a chained hash, kept after their last owner frees
// them and evicted least-recently-used only when a free block is needed). Pure bookkeeping:
// block ids only, no tensors.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace kiln {

using BlockId = int32_t;

// Hash of the empty prefix: the parent of a sequence's first block.
inline constexpr uint64_t kRootBlockHash = 0x6b696c6e2d6b7621ull;  // "kiln-kv!"

// Chained block hash: hash(parent block's hash, this block's tokens). Two blocks get the same
// hash only when their whole prefixes match (up to 64-bit collisions, which the pool also
// guards against by comparing the block's own tokens and parent hash on lookup).
uint64_t hash_block_tokens(uint64_t parent_hash, std::span<const int32_t> tokens);

struct BlockPoolStats {
  int64_t num_blocks = 0;
  int64_t num_used = 0;       // ref count > 0 (owned by at least one sequence)
  int64_t num_free = 0;       // ref count 0, not cached: allocatable at no cost
  int64_t num_cached = 0;     // carry a prefix hash (owned or not)
  int64_t num_evictable = 0;  // cached with ref count 0: allocatable by evicting them (LRU)
  int64_t num_evictions = 0;  // cached blocks evicted so far
};

class BlockPool {
 public:
  BlockPool(int64_t num_blocks, int64_t block_size);

  int64_t num_blocks() const { return static_cast<int64_t>(ref_.size()); }
  int64_t block_size() const { return block_size_; }
  // Blocks an allocation can get: never-cached free blocks plus evictable cached ones.
  int64_t num_allocatable() const { return static_cast<int64_t>(free_.size()) + num_evictable_; }

  // A block with ref count 1; prefers never-cached blocks, else evicts the least recently
  // freed cached block (dropping its hash). nullopt when every block is in use.
  std::optional<BlockId> allocate();
  // Drops one reference; at zero a cached block becomes evictable (most recently used end),
  // an uncached one returns to the free list.
  void free(BlockId id);
  // One more owner of a block that is already owned (fork for parallel sampling).
  void share(BlockId id);
  // One more owner of a cached block found by lookup(); a ref-0 block leaves the LRU list.
  void touch(BlockId id);
  int32_t ref_count(BlockId id) const { return ref_[static_cast<size_t>(id)]; }

  // Prefix cache. lookup: the block cached under `hash` whose parent hash and tokens match.
  std::optional<BlockId> lookup(uint64_t hash, uint64_t parent_hash,
                                std::span<const int32_t> tokens) const;
  // Registers an owned, full block under `hash`. Returns false (block stays uncached) when
  // the hash already names another block, e.g. two sequences computed the same prefix.
  bool cache(BlockId id, uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens);
  bool is_cached(BlockId id) const { return cached_[static_cast<size_t>(id)] != 0; }

  BlockPoolStats stats() const;
  // Evictable blocks from least to most recently used (tests check the eviction order).
  std::vector<BlockId> lru_order() const;
  // Aborts (KILN_CHECK) unless every block is exactly one of used / free / evictable and the
  // hash map, LRU list and counters agree.
  void check_invariants() const;

 private:
  void lru_push_back(BlockId id);
  void lru_remove(BlockId id);

  int64_t block_size_;
  std::vector<int32_t> ref_;           // (num_blocks,)
  std::vector<uint8_t> cached_;        // (num_blocks,) 1: hash_[id] is registered
  std::vector<uint64_t> hash_;         // (num_blocks,)
  std::vector<uint64_t> parent_hash_;  // (num_blocks,)
  std::vector<int32_t> tokens_;        // (num_blocks, block_size) tokens of cached blocks
  std::vector<BlockId> free_;          // stack of ref-0 uncached blocks
  std::unordered_map<uint64_t, BlockId> by_hash_;
  // Intrusive doubly linked LRU list over ref-0 cached blocks: head = least recently used.
  std::vector<BlockId> prev_, next_;  // (num_blocks,) -1: none
  std::vector<uint8_t> in_lru_;       // (num_blocks,)
  BlockId lru_head_ = -1, lru_tail_ = -1;
  int64_t num_evictable_ = 0;
  int64_t num_evictions_ = 0;
};

}  // namespace kiln
