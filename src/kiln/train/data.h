// Token shards and the batch loader.
// Shard file format (little-endian): a 64-byte header
//   bytes 0-7   magic "KILNTOK1"
//   bytes 8-11  u32 version (1)
//   bytes 12-15 u32 bytes per token (2 for vocab <= 65536, else 4)
//   bytes 16-23 u64 number of tokens
//   bytes 24-27 u32 vocabulary size
//   bytes 28-63 zero
// followed by the tokens (uint16 or uint32). Readers check every field and the file size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/rng.h"
#include "kiln/core/status.h"

namespace kiln {

struct TokenShard {
  std::vector<int32_t> tokens;
  int64_t vocab_size = 0;
};

Status write_shard(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size);
Expected<TokenShard> read_shard(const std::string& path);

// Batches of `batch` windows of seq_len + 1 tokens (inputs and next-token targets), drawn at
// positions from a seeded RNG, so a run is reproducible and resumable from (seed, step).
class BatchLoader {
 public:
  BatchLoader(const TokenShard* shard, int64_t batch, int64_t seq_len, uint64_t seed);
  // Fills inputs and targets (batch, seq_len) for batch number `index` (any order).
  void batch_at(int64_t index, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) const;
  // The same into batch · seq_len values at each pointer.
  void batch_at(int64_t index, int32_t* inputs, int32_t* targets) const;
  // Sequential, non-overlapping windows for evaluation; returns false past the end.
  bool eval_batch(int64_t index, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) const;

 private:
  const TokenShard* shard_;
  int64_t batch_, seq_len_;
  uint64_t seed_;
};

}  // namespace kiln
