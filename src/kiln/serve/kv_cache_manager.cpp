// KvCacheManager: the per-sequence side of the paged KV cache (see kv_cache_manager.h).
#include "kiln/serve/kv_cache_manager.h"

#include <algorithm>

namespace kiln {

int64_t kv_bytes_per_token(const ModelConfig& config, DType dtype) {
  // Latent attention caches [c, k_pe] once for all heads (the values are the same rows).
  if (config.is_mla()) return config.n_layers * dtype_nbytes(dtype, config.kv_lora_rank + config.qk_rope_head_dim);
  return 2 * config.n_layers * config.n_kv_heads * dtype_nbytes(dtype, config.head_dim());
}

ModelConfig mha_of_same_width(const ModelConfig& config) {
  ModelConfig mha = config;
  mha.kv_lora_rank = mha.q_lora_rank = mha.qk_nope_head_dim = mha.qk_rope_head_dim = mha.v_head_dim = 0;
  mha.rope_interleave = false;
  mha.n_kv_heads = config.n_heads;
  return mha;
}

ModelConfig gqa_of_same_width(const ModelConfig& config, int64_t gqa_group) {
  KILN_CHECK_MSG(gqa_group >= 1, "gqa_of_same_width: a group of {} query heads", gqa_group);
  ModelConfig gqa = mha_of_same_width(config);
  gqa.n_kv_heads = std::max<int64_t>(1, config.n_heads / gqa_group);
  return gqa;
}

Expected<int64_t> num_kv_blocks_for_memory(int64_t mem_bytes, int64_t bytes_per_token,
                                           int64_t block_size) {
  if (bytes_per_token <= 0 || block_size <= 0) {
    return invalid_argument("[kv_cache] bytes per token {} and block size {} must be positive",
                            bytes_per_token, block_size);
  }
  const int64_t bytes_per_block = bytes_per_token * block_size;
  const int64_t n = mem_bytes > 0 ? mem_bytes / bytes_per_block : 0;
  if (n < 1) {
    return invalid_argument(
        "[kv_cache] --kv-cache-mem {} bytes holds no block of {} tokens ({} bytes per token, {} "
        "bytes per block)",
        mem_bytes, block_size, bytes_per_token, bytes_per_block);
  }
  return n;
}

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : config_(config), pool_(config.num_blocks, config.block_size) {}

void KvCacheManager::extend_hashes(std::span<const int32_t> tokens, int64_t num_blocks,
                                   std::vector<uint64_t>& hashes) const {
  const int64_t bs = config_.block_size;
  KILN_CHECK(num_blocks * bs <= static_cast<int64_t>(tokens.size()));
  for (auto i = static_cast<int64_t>(hashes.size()); i < num_blocks; ++i) {
    const uint64_t parent = i == 0 ? kRootBlockHash : hashes[static_cast<size_t>(i - 1)];
    hashes.push_back(hash_block_tokens(
        parent, tokens.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs))));
  }
}

std::vector<BlockId> KvCacheManager::find_cached_prefix(std::span<const int32_t> tokens,
                                                        std::vector<uint64_t>& block_hashes) const {
  std::vector<BlockId> hit;
  if (!config_.enable_prefix_caching || tokens.empty()) return hit;
  const int64_t bs = config_.block_size;
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / bs;
  extend_hashes(tokens, max_blocks, block_hashes);
  for (int64_t i = 0; i < max_blocks; ++i) {
    const uint64_t parent = i == 0 ? kRootBlockHash : block_hashes[static_cast<size_t>(i - 1)];
    auto b = pool_.lookup(block_hashes[static_cast<size_t>(i)], parent,
                          tokens.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs)));
    if (!b) break;
    hit.push_back(*b);
  }
  return hit;
}

void KvCacheManager::record_prefix_query(int64_t num_query_tokens, int64_t num_hit_tokens) {
  prefix_query_tokens_ += num_query_tokens;
  prefix_hit_tokens_ += num_hit_tokens;
}

bool KvCacheManager::allocate_slots(BlockTable& table, std::span<const BlockId> cached_prefix,
                                    int64_t num_new_tokens, std::vector<BlockCopy>& copies) {
  const int64_t bs = config_.block_size;
  KILN_CHECK(num_new_tokens >= 0);
  KILN_CHECK_MSG(cached_prefix.empty() || table.num_blocks() == 0,
                 "a cached prefix can only start an empty block table");
  KILN_CHECK(table.num_blocks() == blocks_for(table.num_tokens()));
  const auto num_cached = static_cast<int64_t>(cached_prefix.size());
  const int64_t tokens_before = table.num_tokens() + num_cached * bs;
  const int64_t num_new_blocks = std::max<int64_t>(
      0, blocks_for(tokens_before + num_new_tokens) - table.num_blocks() - num_cached);
  // Writing into a partially filled block that another sequence also owns: copy it first.
  const bool cow = num_new_tokens > 0 && table.num_tokens() % bs != 0 &&
                   pool_.ref_count(table.block(table.num_blocks() - 1)) > 1;
  int64_t num_revived = 0;  // cached blocks nobody owns: taking them uses allocatable blocks
  for (BlockId b : cached_prefix) num_revived += pool_.ref_count(b) == 0;
  if (num_new_blocks + int64_t{cow} + num_revived > pool_.num_allocatable()) return false;

  for (BlockId b : cached_prefix) {  // before allocating, so none of them gets evicted
    pool_.touch(b);
    table.append_block(b);
  }
  table.append_tokens(num_cached * bs);
  if (cow) {
    const int64_t last = table.num_blocks() - 1;
    const BlockId src = table.block(last);
    const BlockId dst = pool_.allocate().value();
    copies.push_back({src, dst, table.num_tokens() % bs});
    pool_.free(src);
    table.replace_block(last, dst);
  }
  for (int64_t i = 0; i < num_new_blocks; ++i) table.append_block(pool_.allocate().value());
  table.append_tokens(num_new_tokens);
  return true;
}

void KvCacheManager::fork(const BlockTable& parent, BlockTable& child) {
  KILN_CHECK(child.num_blocks() == 0 && child.block_size() == parent.block_size());
  for (BlockId b : parent.block_ids()) {
    pool_.share(b);
    child.append_block(b);
  }
  child.append_tokens(parent.num_tokens());
}

void KvCacheManager::free(BlockTable& table) {
  const auto ids = table.block_ids();
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) pool_.free(*it);
  table.clear();
}

void KvCacheManager::truncate(BlockTable& table, int64_t num_tokens) {
  table.truncate_tokens(num_tokens);
  while (table.num_blocks() > blocks_for(num_tokens)) pool_.free(table.pop_block());
}

void KvCacheManager::cache_full_blocks(const BlockTable& table, std::span<const int32_t> tokens,
                                       std::vector<uint64_t>& block_hashes) {
  if (!config_.enable_prefix_caching) return;
  const int64_t bs = config_.block_size;
  const int64_t full = table.num_full_blocks();
  extend_hashes(tokens, full, block_hashes);
  for (int64_t i = 0; i < full; ++i) {
    const BlockId b = table.block(i);
    if (pool_.is_cached(b)) continue;
    const uint64_t parent = i == 0 ? kRootBlockHash : block_hashes[static_cast<size_t>(i - 1)];
    (void)pool_.cache(b, block_hashes[static_cast<size_t>(i)], parent,
                      tokens.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs)));
  }
}

KvCacheStats KvCacheManager::stats() const {
  KvCacheStats s;
  s.pool = pool_.stats();
  s.prefix_query_tokens = prefix_query_tokens_;
  s.prefix_hit_tokens = prefix_hit_tokens_;
  return s;
}

}  // namespace kiln
