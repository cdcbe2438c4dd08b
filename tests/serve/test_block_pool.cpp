// Paged KV-cache bookkeeping without a model: the block pool against a simple model of it
// under random operations, copy-on-write of a shared partial block, prefix-cache hits through
// chained hashes, LRU eviction order, and sizing the pool from a memory budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <map>
#include <numeric>

#include "kiln/core/rng.h"
#include "kiln/serve/block_pool.h"
#include "kiln/serve/kv_cache_manager.h"

namespace kiln {
namespace {

std::vector<int32_t> iota_tokens(int64_t n, int32_t start = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

TEST(BlockPool, AllocateFreeShareRefCounts) {
  BlockPool pool(4, 16);
  auto a = pool.allocate().value(), b = pool.allocate().value();
  EXPECT_NE(a, b);
  EXPECT_EQ(pool.ref_count(a), 1);
  pool.share(a);
  EXPECT_EQ(pool.ref_count(a), 2);
  EXPECT_EQ(pool.stats().num_used, 2);
  EXPECT_EQ(pool.num_allocatable(), 2);
  pool.free(a);
  EXPECT_EQ(pool.ref_count(a), 1);
  pool.free(a);
  pool.free(b);
  EXPECT_EQ(pool.num_allocatable(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(pool.allocate().has_value());
  EXPECT_FALSE(pool.allocate().has_value());  // every block owned
  pool.check_invariants();
}

TEST(BlockPool, DoubleFreeAborts) {
  BlockPool pool(2, 4);
  auto a = pool.allocate().value();
  pool.free(a);
  EXPECT_DEATH(pool.free(a), "ref count 0");
}

// Random allocate / free / share / cache / lookup+touch against a reference model that keeps
// ref counts, the cache and the LRU order in plain containers.
TEST(BlockPool, RandomOperationsMatchModel) {
  constexpr int64_t kBlocks = 24, kBs = 4;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    BlockPool pool(kBlocks, kBs);
    Rng rng(seed);
    std::map<BlockId, int> ref;                      // model ref counts (owned blocks)
    std::map<BlockId, std::vector<int32_t>> tokens;  // model cache: block -> tokens
    std::map<BlockId, uint64_t> hash_of;
    std::list<BlockId> lru;  // model: cached blocks with ref 0
    auto owned = [&] {
      std::vector<BlockId> v;
      for (auto& [b, r] : ref)
        if (r > 0) v.push_back(b);
      return v;
    };
    for (int op = 0; op < 600; ++op) {
      const uint64_t kind = rng.below(6);
      std::vector<BlockId> own = owned();
      if (kind <= 1) {  // allocate
        const bool any_free =
            static_cast<int64_t>(own.size()) + static_cast<int64_t>(lru.size()) < kBlocks;
        auto b = pool.allocate();
        if (any_free) {
          ASSERT_TRUE(b.has_value());
          EXPECT_FALSE(tokens.count(*b)) << "a never-cached free block goes first";
        } else if (!lru.empty()) {
          ASSERT_TRUE(b.has_value());
          EXPECT_EQ(*b, lru.front()) << "eviction takes the least recently used block";
          lru.pop_front();
          tokens.erase(*b);
          hash_of.erase(*b);
        } else {
          EXPECT_FALSE(b.has_value());
          continue;
        }
        EXPECT_EQ(ref[*b], 0);
        ref[*b] = 1;
      } else if (kind == 2 && !own.empty()) {  // free
        BlockId b = own[rng.below(own.size())];
        pool.free(b);
        if (--ref[b] == 0 && tokens.count(b)) lru.push_back(b);
      } else if (kind == 3 && !own.empty()) {  // share (fork)
        BlockId b = own[rng.below(own.size())];
        pool.share(b);
        ++ref[b];
      } else if (kind == 4 && !own.empty()) {  // cache an owned block under a new hash
        BlockId b = own[rng.below(own.size())];
        if (tokens.count(b)) continue;
        std::vector<int32_t> t = iota_tokens(kBs, static_cast<int32_t>(rng.below(1000)));
        const uint64_t h = hash_block_tokens(kRootBlockHash, t);
        bool taken = false;
        for (auto& [ob, oh] : hash_of) taken |= oh == h;
        EXPECT_EQ(pool.cache(b, h, kRootBlockHash, t), !taken);
        if (!taken) {
          tokens[b] = t;
          hash_of[b] = h;
        }
      } else if (kind == 5 && !tokens.empty()) {  // prefix hit: lookup + touch
        auto it = tokens.begin();
        std::advance(it, static_cast<long>(rng.below(tokens.size())));
        auto b = pool.lookup(hash_of[it->first], kRootBlockHash, it->second);
        ASSERT_TRUE(b.has_value());
        EXPECT_EQ(*b, it->first);
        std::vector<int32_t> wrong = it->second;
        wrong[0] += 1;
        EXPECT_FALSE(pool.lookup(hash_of[it->first], kRootBlockHash, wrong).has_value());
        if (ref[*b] == 0) lru.remove(*b);
        pool.touch(*b);
        ++ref[*b];
      }
      pool.check_invariants();
      for (BlockId b = 0; b < kBlocks; ++b) {
        ASSERT_GE(pool.ref_count(b), 0);
        ASSERT_EQ(pool.ref_count(b), ref.count(b) ? ref[b] : 0) << "block " << b;
      }
      ASSERT_EQ(pool.lru_order(), std::vector<BlockId>(lru.begin(), lru.end()));
      ASSERT_EQ(pool.stats().num_cached, static_cast<int64_t>(tokens.size()));
    }
    // Everyone lets go: no leaks, every block free or evictable.
    for (auto& [b, r] : ref)
      while (r-- > 0) pool.free(b);
    const BlockPoolStats s = pool.stats();
    EXPECT_EQ(s.num_used, 0);
    EXPECT_EQ(s.num_free + s.num_evictable, kBlocks);
    pool.check_invariants();
  }
}

TEST(KvCacheManager, CopyOnWriteWhenAppendingIntoSharedPartialBlock) {
  KvCacheManager kv({.num_blocks = 8, .block_size = 16, .enable_prefix_caching = true});
  std::vector<BlockCopy> copies;
  BlockTable parent(16), child(16);
  ASSERT_TRUE(kv.allocate_slots(parent, {}, 20, copies));  // 1 full + 4 tokens
  EXPECT_EQ(parent.num_blocks(), 2);
  EXPECT_EQ(parent.num_slots(), 32);
  kv.fork(parent, child);
  EXPECT_EQ(kv.pool().ref_count(parent.block(0)), 2);
  EXPECT_EQ(kv.pool().ref_count(parent.block(1)), 2);
  EXPECT_TRUE(copies.empty());

  // The child writes token 20 into the shared partial block: it gets its own copy.
  const BlockId shared_tail = parent.block(1);
  ASSERT_TRUE(kv.allocate_slots(child, {}, 1, copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, shared_tail);
  EXPECT_EQ(copies[0].dst, child.block(1));
  EXPECT_EQ(copies[0].num_tokens, 4);
  EXPECT_NE(child.block(1), shared_tail);
  EXPECT_EQ(child.block(0), parent.block(0));  // the full block stays shared
  EXPECT_EQ(kv.pool().ref_count(shared_tail), 1);
  EXPECT_EQ(child.slot(20), int64_t{child.block(1)} * 16 + 4);

  // The parent is now the only owner of its tail: it appends in place, no copy.
  ASSERT_TRUE(kv.allocate_slots(parent, {}, 1, copies));
  EXPECT_EQ(copies.size(), 1u);
  EXPECT_EQ(parent.block(1), shared_tail);

  // Filling past the block boundary allocates a fresh block, never a copy.
  ASSERT_TRUE(kv.allocate_slots(child, {}, 12, copies));
  EXPECT_EQ(copies.size(), 1u);
  EXPECT_EQ(child.num_tokens(), 33);
  EXPECT_EQ(child.num_blocks(), 3);
  kv.free(child);
  kv.free(parent);
  EXPECT_EQ(kv.stats().pool.num_used, 0);
  kv.pool().check_invariants();
}

TEST(KvCacheManager, ForkAtBlockBoundaryNeedsNoCopy) {
  KvCacheManager kv({.num_blocks = 8, .block_size = 16, .enable_prefix_caching = false});
  std::vector<BlockCopy> copies;
  BlockTable parent(16), child(16);
  ASSERT_TRUE(kv.allocate_slots(parent, {}, 32, copies));
  kv.fork(parent, child);
  ASSERT_TRUE(kv.allocate_slots(child, {}, 1, copies));
  ASSERT_TRUE(kv.allocate_slots(parent, {}, 1, copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_NE(child.block(2), parent.block(2));
  kv.free(child);
  kv.free(parent);
  kv.pool().check_invariants();
}

TEST(KvCacheManager, AllocationFailsWithoutSideEffects) {
  KvCacheManager kv({.num_blocks = 3, .block_size = 4, .enable_prefix_caching = false});
  std::vector<BlockCopy> copies;
  BlockTable a(4);
  ASSERT_TRUE(kv.allocate_slots(a, {}, 9, copies));  // 3 blocks
  EXPECT_FALSE(kv.allocate_slots(a, {}, 4, copies));
  EXPECT_EQ(a.num_tokens(), 9);
  EXPECT_EQ(a.num_blocks(), 3);
  ASSERT_TRUE(kv.allocate_slots(a, {}, 3, copies));  // the last block still has room
  EXPECT_EQ(a.num_free_slots(), 0);
  kv.free(a);
  kv.pool().check_invariants();
}

// Speculative decoding reserves slots for draft tokens and gives back those of the rejected
// ones: truncate keeps the written prefix and frees only the blocks past it.
TEST(KvCacheManager, TruncateReturnsTheBlocksPastTheKeptTokens) {
  KvCacheManager kv({.num_blocks = 6, .block_size = 4, .enable_prefix_caching = false});
  std::vector<BlockCopy> copies;
  BlockTable a(4);
  ASSERT_TRUE(kv.allocate_slots(a, {}, 6, copies));  // 2 blocks
  ASSERT_TRUE(kv.allocate_slots(a, {}, 5, copies));  // + 1 pending + 4 draft slots: 3 blocks
  EXPECT_EQ(a.num_blocks(), 3);
  EXPECT_EQ(kv.pool().stats().num_used, 3);
  kv.truncate(a, 8);  // pending + 1 accepted: exactly 2 full blocks
  EXPECT_EQ(a.num_tokens(), 8);
  EXPECT_EQ(a.num_blocks(), 2);
  EXPECT_EQ(kv.pool().stats().num_used, 2);
  kv.truncate(a, 5);  // into the second block: it stays
  EXPECT_EQ(a.num_blocks(), 2);
  kv.truncate(a, 5);  // idempotent
  EXPECT_EQ(a.num_tokens(), 5);
  kv.free(a);
  kv.pool().check_invariants();
  EXPECT_EQ(kv.pool().stats().num_used, 0);
}

// Computes `tokens` into a fresh table, registers its full blocks, returns the table.
BlockTable compute(KvCacheManager& kv, const std::vector<int32_t>& tokens) {
  std::vector<BlockCopy> copies;
  std::vector<uint64_t> hashes;
  BlockTable t(kv.config().block_size);
  auto hit = kv.find_cached_prefix(tokens, hashes);
  const int64_t cached = static_cast<int64_t>(hit.size()) * kv.config().block_size;
  KILN_CHECK(kv.allocate_slots(t, hit, static_cast<int64_t>(tokens.size()) - cached, copies));
  kv.cache_full_blocks(t, tokens, hashes);
  return t;
}

TEST(PrefixCache, SharedPrefixHitsAcrossRequests) {
  KvCacheManager kv({.num_blocks = 16, .block_size = 16, .enable_prefix_caching = true});
  std::vector<int32_t> a = iota_tokens(40);  // 2 full blocks + 8
  BlockTable ta = compute(kv, a);
  EXPECT_EQ(kv.stats().pool.num_cached, 2);

  // B shares the first 36 tokens: the two full blocks are reused (shared, not copied).
  std::vector<int32_t> b = iota_tokens(36);
  b.push_back(999);
  b.push_back(998);
  std::vector<uint64_t> hb;
  auto hit = kv.find_cached_prefix(b, hb);
  ASSERT_EQ(hit.size(), 2u);
  EXPECT_EQ(hit[0], ta.block(0));
  EXPECT_EQ(hit[1], ta.block(1));
  BlockTable tb = compute(kv, b);
  EXPECT_EQ(tb.block(0), ta.block(0));
  EXPECT_EQ(kv.pool().ref_count(ta.block(0)), 2);
  EXPECT_NE(tb.block(2), ta.block(2));

  // A prompt that is exactly the cached blocks still computes its last token: one block hit.
  std::vector<uint64_t> hc;
  EXPECT_EQ(kv.find_cached_prefix(iota_tokens(32), hc).size(), 1u);
  EXPECT_EQ(kv.find_cached_prefix(iota_tokens(33), hc).size(), 2u);

  // Freed blocks stay cached (ref count 0) and still hit.
  kv.free(ta);
  kv.free(tb);
  EXPECT_EQ(kv.stats().pool.num_used, 0);
  EXPECT_EQ(kv.stats().pool.num_evictable, 2);
  std::vector<uint64_t> hd;
  EXPECT_EQ(kv.find_cached_prefix(a, hd).size(), 2u);
  kv.pool().check_invariants();
}

TEST(PrefixCache, HashIsChainedThroughTheParent) {
  // Same second-block tokens after a different first block: no hit for the second block.
  KvCacheManager kv({.num_blocks = 8, .block_size = 4, .enable_prefix_caching = true});
  BlockTable t = compute(kv, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  std::vector<uint64_t> h;
  EXPECT_EQ(kv.find_cached_prefix(std::vector<int32_t>{0, 2, 3, 4, 5, 6, 7, 8, 9}, h).size(), 0u);
  h.clear();
  EXPECT_EQ(kv.find_cached_prefix(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 0, 9}, h).size(), 1u);
  EXPECT_NE(hash_block_tokens(kRootBlockHash, std::vector<int32_t>{5, 6, 7, 8}),
            hash_block_tokens(hash_block_tokens(kRootBlockHash, std::vector<int32_t>{1, 2, 3, 4}),
                              std::vector<int32_t>{5, 6, 7, 8}));
  kv.free(t);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedTailFirst) {
  KvCacheManager kv({.num_blocks = 6, .block_size = 4, .enable_prefix_caching = true});
  BlockTable a = compute(kv, iota_tokens(12, 0));    // 3 full blocks a0 a1 a2
  BlockTable b = compute(kv, iota_tokens(12, 100));  // 3 full blocks b0 b1 b2
  const std::vector<BlockId> ab = {a.block(0), a.block(1), a.block(2)};
  const std::vector<BlockId> bb = {b.block(0), b.block(1), b.block(2)};
  kv.free(a);  // tail first: a2 a1 a0 become evictable in that order
  kv.free(b);
  EXPECT_EQ(kv.pool().lru_order(),
            (std::vector<BlockId>{ab[2], ab[1], ab[0], bb[2], bb[1], bb[0]}));

  // A prefix hit on a's head refreshes it (it leaves the LRU list while owned).
  BlockTable a2 = compute(kv, iota_tokens(5, 0));  // hits a0, computes 1 token in a new block
  EXPECT_EQ(a2.block(0), ab[0]);
  EXPECT_EQ(kv.stats().pool.num_evictions, 1);  // the new block evicted the LRU block a2
  kv.free(a2);                                  // a0 is now the most recently used
  EXPECT_EQ(kv.pool().lru_order(), (std::vector<BlockId>{ab[1], bb[2], bb[1], bb[0], ab[0]}));

  // Needing 3 blocks takes the one never-cached free block, then evicts a1 and b2; a's head
  // and b's head survive.
  std::vector<BlockCopy> copies;
  BlockTable c(4);
  ASSERT_TRUE(kv.allocate_slots(c, {}, 12, copies));
  EXPECT_EQ(kv.stats().pool.num_evictions, 3);
  std::vector<uint64_t> h;
  EXPECT_EQ(kv.find_cached_prefix(iota_tokens(13, 0), h).size(), 1u);  // a0 only
  h.clear();
  EXPECT_EQ(kv.find_cached_prefix(iota_tokens(13, 100), h).size(), 2u);  // b0 b1
  kv.free(c);
  kv.pool().check_invariants();
}

TEST(PrefixCache, RevivingCachedBlocksCountsAgainstFreeBlocks) {
  // Hitting 2 evictable cached blocks while needing 1 new block: 3 allocatable needed.
  KvCacheManager kv({.num_blocks = 3, .block_size = 4, .enable_prefix_caching = true});
  BlockTable a = compute(kv, iota_tokens(8));
  kv.free(a);
  std::vector<BlockCopy> copies;
  BlockTable other(4);
  ASSERT_TRUE(kv.allocate_slots(other, {}, 1, copies));  // takes the last never-cached block
  std::vector<uint64_t> h;
  auto hit = kv.find_cached_prefix(iota_tokens(9), h);
  ASSERT_EQ(hit.size(), 2u);
  BlockTable t(4);
  EXPECT_FALSE(kv.allocate_slots(t, hit, 1, copies));  // would have to evict its own prefix
  EXPECT_EQ(t.num_blocks(), 0);
  kv.free(other);
  ASSERT_TRUE(kv.allocate_slots(t, hit, 1, copies));
  EXPECT_EQ(t.num_tokens(), 9);
  kv.free(t);
  kv.pool().check_invariants();
}

TEST(KvMemory, BytesPerTokenAndBlocksFromBudget) {
  ModelConfig c = preset("llama-tiny").value();
  const int64_t per_token = kv_bytes_per_token(c, DType::kF32);
  EXPECT_EQ(per_token, 2 * c.n_layers * c.n_kv_heads * c.head_dim() * 4);
  EXPECT_EQ(kv_bytes_per_token(c, DType::kBF16), per_token / 2);
  const int64_t kv_heads = c.n_kv_heads;
  c.n_kv_heads = 1;  // MQA: 1/kv_heads of the memory
  EXPECT_EQ(kv_bytes_per_token(c, DType::kF32) * kv_heads, per_token);
  EXPECT_EQ(num_kv_blocks_for_memory(1 << 20, 1024, 16).value(), 64);
  EXPECT_EQ(num_kv_blocks_for_memory((1 << 20) + 1000, 1024, 16).value(), 64);
  auto none = num_kv_blocks_for_memory(1000, 1024, 16);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("--kv-cache-mem 1000"), std::string::npos);
}

}  // namespace
}  // namespace kiln
