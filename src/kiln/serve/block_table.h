// A sequence's block table: logical block i of the sequence lives in physical block
// block_ids()[i] of the pool, so token position p has K/V slot
// block_ids()[p / block_size] * block_size + p % block_size (what a paged attention kernel reads).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/serve/block_pool.h"

namespace kiln {

class BlockTable {
 public:
  explicit BlockTable(int64_t block_size) : block_size_(block_size) { KILN_CHECK(block_size >= 1); }

  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  // Slots reserved (num_blocks · block_size) and slots holding a token's K/V.
  int64_t num_slots() const { return num_blocks() * block_size_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_free_slots() const { return num_slots() - num_tokens_; }
  // Full blocks (every slot written).
  int64_t num_full_blocks() const { return num_tokens_ / block_size_; }
  std::span<const BlockId> block_ids() const { return blocks_; }
  BlockId block(int64_t i) const { return blocks_[static_cast<size_t>(i)]; }

  // Physical K/V slot of token position p (p < num_slots()).
  int64_t slot(int64_t p) const {
    KILN_CHECK_MSG(p >= 0 && p < num_slots(), "slot({}) of {} slots", p, num_slots());
    return int64_t{blocks_[static_cast<size_t>(p / block_size_)]} * block_size_ + p % block_size_;
  }

  void append_block(BlockId id) { blocks_.push_back(id); }
  void replace_block(int64_t i, BlockId id) { blocks_[static_cast<size_t>(i)] = id; }
  // Marks n more slots as written; they must already be reserved.
  void append_tokens(int64_t n) {
    KILN_CHECK_MSG(n >= 0 && num_tokens_ + n <= num_slots(), "append {} tokens to {} of {} slots",
                   n, num_tokens_, num_slots());
    num_tokens_ += n;
  }
  // Keeps only the first n written slots (n <= num_tokens()); blocks stay reserved.
  void truncate_tokens(int64_t n) {
    KILN_CHECK_MSG(n >= 0 && n <= num_tokens_, "truncate to {} of {} tokens", n, num_tokens_);
    num_tokens_ = n;
  }
  // Removes the last block (the caller returns it to the pool); it must hold no written slot.
  BlockId pop_block() {
    KILN_CHECK_MSG(!blocks_.empty() && num_tokens_ <= (num_blocks() - 1) * block_size_,
                   "pop_block with {} tokens in {} blocks", num_tokens_, num_blocks());
    const BlockId id = blocks_.back();
    blocks_.pop_back();
    return id;
  }
  // Forgets every block (the caller has returned them to the pool).
  void clear() {
    blocks_.clear();
    num_tokens_ = 0;
  }

 private:
  int64_t block_size_;
  int64_t num_tokens_ = 0;
  std::vector<BlockId> blocks_;
};

}  // namespace kiln
