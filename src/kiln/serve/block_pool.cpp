// BlockPool: free list + reference counts + prefix-cache hash map + intrusive LRU list of
// evictable (cached, unowned) blocks. All operations are O(1) except lookup's token compare
// (O(block_size)); nothing allocates after construction except the hash map's nodes.
#include "kiln/serve/block_pool.h"

#include <algorithm>

#include "kiln/core/status.h"

namespace kiln {
namespace {

// splitmix64's finalizer: a bijective 64-bit mix with full avalanche.
uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

}  // namespace

uint64_t hash_block_tokens(uint64_t parent_hash, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent_hash ^ 0x9e3779b97f4a7c15ull);
  for (int32_t t : tokens) h = mix64(h + 0x9e3779b97f4a7c15ull + static_cast<uint32_t>(t));
  return mix64(h ^ static_cast<uint64_t>(tokens.size()));
}

BlockPool::BlockPool(int64_t num_blocks, int64_t block_size) : block_size_(block_size) {
  KILN_CHECK_MSG(num_blocks >= 1 && block_size >= 1, "BlockPool({}, {})", num_blocks, block_size);
  const auto n = static_cast<size_t>(num_blocks);
  ref_.assign(n, 0);
  cached_.assign(n, 0);
  hash_.assign(n, 0);
  parent_hash_.assign(n, 0);
  tokens_.assign(n * static_cast<size_t>(block_size), 0);
  prev_.assign(n, -1);
  next_.assign(n, -1);
  in_lru_.assign(n, 0);
  free_.reserve(n);
  // Stack: block 0 is handed out first.
  for (int64_t i = num_blocks - 1; i >= 0; --i) free_.push_back(static_cast<BlockId>(i));
  by_hash_.reserve(n);
}

void BlockPool::lru_push_back(BlockId id) {
  const auto i = static_cast<size_t>(id);
  KILN_CHECK(!in_lru_[i]);
  prev_[i] = lru_tail_;
  next_[i] = -1;
  if (lru_tail_ >= 0)
    next_[static_cast<size_t>(lru_tail_)] = id;
  else
    lru_head_ = id;
  lru_tail_ = id;
  in_lru_[i] = 1;
  ++num_evictable_;
}

void BlockPool::lru_remove(BlockId id) {
  const auto i = static_cast<size_t>(id);
  KILN_CHECK(in_lru_[i]);
  if (prev_[i] >= 0)
    next_[static_cast<size_t>(prev_[i])] = next_[i];
  else
    lru_head_ = next_[i];
  if (next_[i] >= 0)
    prev_[static_cast<size_t>(next_[i])] = prev_[i];
  else
    lru_tail_ = prev_[i];
  prev_[i] = next_[i] = -1;
  in_lru_[i] = 0;
  --num_evictable_;
}

std::optional<BlockId> BlockPool::allocate() {
  BlockId id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else if (lru_head_ >= 0) {
    id = lru_head_;
    lru_remove(id);
    const auto i = static_cast<size_t>(id);
    by_hash_.erase(hash_[i]);
    cached_[i] = 0;
    ++num_evictions_;
  } else {
    return std::nullopt;
  }
  KILN_CHECK(ref_[static_cast<size_t>(id)] == 0);
  ref_[static_cast<size_t>(id)] = 1;
  return id;
}

void BlockPool::free(BlockId id) {
  KILN_CHECK_MSG(id >= 0 && id < num_blocks(), "block {} of {}", id, num_blocks());
  int32_t& r = ref_[static_cast<size_t>(id)];
  KILN_CHECK_MSG(r > 0, "free of block {} with ref count {}", id, r);
  if (--r > 0) return;
  if (cached_[static_cast<size_t>(id)])
    lru_push_back(id);
  else
    free_.push_back(id);
}

void BlockPool::share(BlockId id) {
  KILN_CHECK_MSG(id >= 0 && id < num_blocks(), "block {} of {}", id, num_blocks());
  KILN_CHECK_MSG(ref_[static_cast<size_t>(id)] > 0, "share of unowned block {}", id);
  ++ref_[static_cast<size_t>(id)];
}

void BlockPool::touch(BlockId id) {
  const auto i = static_cast<size_t>(id);
  KILN_CHECK_MSG(cached_[i], "touch of uncached block {}", id);
  if (ref_[i] == 0) lru_remove(id);
  ++ref_[i];
}

std::optional<BlockId> BlockPool::lookup(uint64_t hash, uint64_t parent_hash,
                                         std::span<const int32_t> tokens) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const auto i = static_cast<size_t>(it->second);
  if (parent_hash_[i] != parent_hash || static_cast<int64_t>(tokens.size()) != block_size_) {
    return std::nullopt;
  }
  const int32_t* stored = tokens_.data() + i * static_cast<size_t>(block_size_);
  if (!std::equal(tokens.begin(), tokens.end(), stored)) return std::nullopt;  // collision
  return it->second;
}

bool BlockPool::cache(BlockId id, uint64_t hash, uint64_t parent_hash,
                      std::span<const int32_t> tokens) {
  const auto i = static_cast<size_t>(id);
  KILN_CHECK_MSG(ref_[i] > 0, "cache of unowned block {}", id);
  KILN_CHECK_MSG(static_cast<int64_t>(tokens.size()) == block_size_, "cache of a partial block");
  if (cached_[i]) return hash_[i] == hash;
  if (by_hash_.count(hash)) return false;
  by_hash_.emplace(hash, id);
  cached_[i] = 1;
  hash_[i] = hash;
  parent_hash_[i] = parent_hash;
  std::copy(tokens.begin(), tokens.end(),
            tokens_.begin() + static_cast<ptrdiff_t>(i) * block_size_);
  return true;
}

BlockPoolStats BlockPool::stats() const {
  BlockPoolStats s;
  s.num_blocks = num_blocks();
  for (size_t i = 0; i < ref_.size(); ++i) {
    if (ref_[i] > 0) ++s.num_used;
    if (cached_[i]) ++s.num_cached;
  }
  s.num_free = static_cast<int64_t>(free_.size());
  s.num_evictable = num_evictable_;
  s.num_evictions = num_evictions_;
  return s;
}

std::vector<BlockId> BlockPool::lru_order() const {
  std::vector<BlockId> out;
  for (BlockId b = lru_head_; b >= 0; b = next_[static_cast<size_t>(b)]) out.push_back(b);
  return out;
}

void BlockPool::check_invariants() const {
  const auto n = static_cast<size_t>(num_blocks());
  std::vector<uint8_t> in_free(n, 0);
  for (BlockId b : free_) {
    KILN_CHECK_MSG(!in_free[static_cast<size_t>(b)], "block {} twice in the free list", b);
    in_free[static_cast<size_t>(b)] = 1;
  }
  int64_t lru_len = 0;
  BlockId prev = -1;
  for (BlockId b = lru_head_; b >= 0; b = next_[static_cast<size_t>(b)]) {
    KILN_CHECK(prev_[static_cast<size_t>(b)] == prev);
    KILN_CHECK_MSG(++lru_len <= num_blocks(), "LRU list has a cycle");
    prev = b;
  }
  KILN_CHECK(prev == lru_tail_ && lru_len == num_evictable_);
  int64_t num_cached = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool used = ref_[i] > 0, freed = in_free[i] != 0, evictable = in_lru_[i] != 0;
    KILN_CHECK_MSG(ref_[i] >= 0, "block {} has ref count {}", i, ref_[i]);
    KILN_CHECK_MSG(int(used) + int(freed) + int(evictable) == 1,
                   "block {}: used {} free {} evictable {}", i, used, freed, evictable);
    KILN_CHECK_MSG(!freed || !cached_[i], "free-list block {} is cached", i);
    KILN_CHECK_MSG(!evictable || cached_[i], "evictable block {} is not cached", i);
    if (cached_[i]) {
      ++num_cached;
      auto it = by_hash_.find(hash_[i]);
      KILN_CHECK_MSG(it != by_hash_.end() && it->second == static_cast<BlockId>(i),
                     "cached block {} not in the hash map", i);
    }
  }
  KILN_CHECK(num_cached == static_cast<int64_t>(by_hash_.size()));
}

}  // namespace kiln
