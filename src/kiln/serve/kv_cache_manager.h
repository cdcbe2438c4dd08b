// Paged KV-cache bookkeeping per sequence on top of the BlockPool: sizing the pool from a
// memory budget, prefix-cache lookup of a new sequence's longest cached prefix, slot
// allocation with copy-on-write of a shared partial block, fork (parallel sampling) and free.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/status.h"
#include "kiln/model/config.h"
#include "kiln/serve/block_pool.h"
#include "kiln/serve/block_table.h"

namespace kiln {

inline constexpr int64_t kDefaultKvBlockSize = 16;  // tokens per block, as in vLLM

// K and V of one token over all layers: 2 · layers · kv_heads · head_dim · dtype bytes;
// latent attention: layers · (kv_lora_rank + qk_rope_head_dim) · dtype bytes.
int64_t kv_bytes_per_token(const ModelConfig& config, DType dtype);

// What a model's KV bytes per token are compared with (/metrics, `kiln info --memory`, `kiln
// bench mla-decode`): multi-head attention of its width (n_heads KV heads of d_model / n_heads,
// no latent) and grouped-query attention with n_heads / gqa_group of those heads (at least one).
inline constexpr int64_t kDefaultGqaGroup = 4;
ModelConfig mha_of_same_width(const ModelConfig& config);
ModelConfig gqa_of_same_width(const ModelConfig& config, int64_t gqa_group = kDefaultGqaGroup);
// Blocks of block_size tokens that fit in mem_bytes; InvalidArgument when not even one does.
Expected<int64_t> num_kv_blocks_for_memory(int64_t mem_bytes, int64_t bytes_per_token,
                                           int64_t block_size);

struct KvCacheConfig {
  int64_t num_blocks = 1024;
  int64_t block_size = kDefaultKvBlockSize;
  bool enable_prefix_caching = true;
};

// The executor copies the K/V of the first num_tokens slots of block src into block dst
// before running the step (copy-on-write of a shared, partially filled block).
struct BlockCopy {
  BlockId src = -1;
  BlockId dst = -1;
  int64_t num_tokens = 0;
};

struct KvCacheStats {
  BlockPoolStats pool;
  int64_t prefix_query_tokens = 0;  // prompt tokens looked up in the prefix cache
  int64_t prefix_hit_tokens = 0;    // of those, found cached (prefill skipped)
  double hit_rate() const {
    return prefix_query_tokens ? double(prefix_hit_tokens) / double(prefix_query_tokens) : 0.0;
  }
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }
  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }
  // Blocks needed to hold num_tokens tokens.
  int64_t blocks_for(int64_t num_tokens) const {
    return (num_tokens + config_.block_size - 1) / config_.block_size;
  }

  // The cached blocks of the longest cached prefix of `tokens`, in full blocks and leaving at
  // least the last token to compute (its logits are needed). Extends `block_hashes` (the
  // sequence's chained hashes, one per full block) as far as it looks. Changes nothing.
  std::vector<BlockId> find_cached_prefix(std::span<const int32_t> tokens,
                                          std::vector<uint64_t>& block_hashes) const;
  void record_prefix_query(int64_t num_query_tokens, int64_t num_hit_tokens);

  // Reserves slots for num_new_tokens more tokens of `table` (first taking the cached_prefix
  // blocks, for a table that is still empty). When the next token lands in a partially filled
  // block shared with another sequence, that block is copied to a fresh one first (appended
  // to `copies`). Returns false and changes nothing when the pool has too few blocks.
  bool allocate_slots(BlockTable& table, std::span<const BlockId> cached_prefix,
                      int64_t num_new_tokens, std::vector<BlockCopy>& copies);
  // child := parent's blocks, shared (ref counts + 1); child must be empty.
  void fork(const BlockTable& parent, BlockTable& child);
  // Returns every block of the table, last block first, so that a sequence's tail is evicted
  // before its head (heads are the prefixes other requests share).
  void free(BlockTable& table);
  // Keeps the first num_tokens tokens of the table and returns the blocks past them to the
  // pool (speculative decoding: the slots of rejected draft tokens).
  void truncate(BlockTable& table, int64_t num_tokens);
  // Registers the table's full, written blocks in the prefix cache (tokens: the sequence's
  // tokens, at least table.num_tokens() of them).
  void cache_full_blocks(const BlockTable& table, std::span<const int32_t> tokens,
                         std::vector<uint64_t>& block_hashes);

  KvCacheStats stats() const;

 private:
  // Extends hashes to cover the first num_blocks full blocks of tokens.
  void extend_hashes(std::span<const int32_t> tokens, int64_t num_blocks,
                     std::vector<uint64_t>& hashes) const;

  KvCacheConfig config_;
  BlockPool pool_;
  int64_t prefix_query_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
};

}  // namespace kiln
