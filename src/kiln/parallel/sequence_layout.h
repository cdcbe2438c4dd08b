// How a sequence of T tokens is cut over the C ranks of a context-parallel group: which global
// token rows each rank holds (in the order it stores them), the moves between a full (B, T, ...)
// row buffer and a rank's (B, T/C, ...) local rows, and which (query block, key block) pairs of
// causal attention are full, diagonal (causal within) or skipped.
//   contiguous: rank r holds [r·T/C, (r+1)·T/C) — causal work grows with r.
//   zig-zag:    T cut in 2C chunks; rank r holds chunks r and 2C−1−r — every rank the same work.
//   hybrid:     a contiguous or zig-zag layout over R ring ranks, each ring shard's local rows
//               split in U consecutive parts (rank g·U + m holds part m of ring shard g).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/comm/communicator.h"
#include "kiln/core/status.h"

namespace kiln::parallel {

enum class LayoutKind { kContiguous, kZigzag };
std::string_view layout_kind_name(LayoutKind kind);  // "contiguous" | "zigzag"
Expected<LayoutKind> parse_layout_kind(std::string_view name);

// Global token rows [start, start + len).
struct SequenceSegment {
  int64_t start = 0, len = 0;
};

// What causal attention of one query segment against one key segment needs.
enum class BlockKind { kFull, kDiagonal, kSkip };
// Non-causal: always kFull. Causal: keys all before the queries: kFull; the same rows: kDiagonal;
// keys all after: kSkip. Segments of a ring layout never partly overlap (asserted).
BlockKind block_kind(SequenceSegment q, SequenceSegment k, bool causal);

class SequenceLayout {
 public:
  // InvalidArgument (the same on every rank: no communication) unless T > 0, ranks >= 1 and
  // T divides by ranks (contiguous) or 2·ranks (zig-zag).
  static Expected<SequenceLayout> create(LayoutKind kind, int64_t seq_len, int num_ranks);
  // The hybrid layout: `ring` over its ranks, each shard split over `ulysses_ranks`.
  static Expected<SequenceLayout> hybrid(const SequenceLayout& ring, int ulysses_ranks);

  LayoutKind kind() const { return kind_; }
  int64_t seq_len() const { return seq_len_; }
  int num_ranks() const { return static_cast<int>(segments_.size()); }
  // 1 for a ring layout (contiguous or zig-zag); U for SequenceLayout::hybrid(ring, U).
  int ulysses_ranks() const { return ulysses_ranks_; }
  int64_t local_len() const { return seq_len_ / num_ranks(); }  // T / C rows per rank
  // The rank's segments in its storage order (local row 0 is the first segment's start).
  std::span<const SequenceSegment> segments(int rank) const { return segments_[rank]; }
  std::string describe() const;  // "zigzag T 8192 over 4 ranks"

  // full (B, T, row) → local (B, T/C, row): the rank's rows. `row` elements per token (H·D for
  // q; for a (B, H, T) logsumexp pass batch = B·H and row = 1).
  void shard(float* local, const float* full, int64_t batch, int64_t row, int rank) const;
  // local (B, T/C, row) → its rows of full (B, T, row); the rest of full untouched.
  void unshard(float* full, const float* local, int64_t batch, int64_t row, int rank) const;
  // Collective over `comm` (size num_ranks()): full (B, T, row) on every rank from each rank's
  // local rows.
  Status gather(comm::Communicator& comm, float* full, const float* local, int64_t batch, int64_t row) const;

 private:
  LayoutKind kind_ = LayoutKind::kContiguous;
  int64_t seq_len_ = 0;
  int ulysses_ranks_ = 1;
  std::vector<std::vector<SequenceSegment>> segments_;  // [rank][segment]
};

}  // namespace kiln::parallel
