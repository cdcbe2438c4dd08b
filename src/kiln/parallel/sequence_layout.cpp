// Sequence layouts of context parallelism: which token rows each rank of the group holds.
#include "kiln/parallel/sequence_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "kiln/comm/collectives.h"

namespace kiln::parallel {

std::string_view layout_kind_name(LayoutKind kind) {
  return kind == LayoutKind::kZigzag ? "zigzag" : "contiguous";
}

Expected<LayoutKind> parse_layout_kind(std::string_view name) {
  if (name == "contiguous") return LayoutKind::kContiguous;
  if (name == "zigzag") return LayoutKind::kZigzag;
  return invalid_argument("sequence layout '{}': expected contiguous or zigzag", name);
}

BlockKind block_kind(SequenceSegment q, SequenceSegment k, bool causal) {
  if (!causal) return BlockKind::kFull;
  if (k.start + k.len <= q.start) return BlockKind::kFull;
  if (k.start >= q.start + q.len) return BlockKind::kSkip;
  KILN_CHECK_MSG(k.start == q.start && k.len == q.len, "segments [{}, +{}) and [{}, +{}) partly overlap", q.start,
                 q.len, k.start, k.len);
  return BlockKind::kDiagonal;
}

Expected<SequenceLayout> SequenceLayout::create(LayoutKind kind, int64_t seq_len, int num_ranks) {
  if (num_ranks < 1) return invalid_argument("sequence layout: {} ranks (need >= 1)", num_ranks);
  if (seq_len < 1) return invalid_argument("sequence layout: T {} (need >= 1)", seq_len);
  SequenceLayout l;
  l.kind_ = kind;
  l.seq_len_ = seq_len;
  l.segments_.resize(num_ranks);
  if (kind == LayoutKind::kContiguous) {
    if (seq_len % num_ranks != 0)
      return invalid_argument("contiguous layout: T {} does not divide by the {} context-parallel ranks", seq_len,
                              num_ranks);
    const int64_t n = seq_len / num_ranks;
    for (int r = 0; r < num_ranks; ++r) l.segments_[r] = {{r * n, n}};
  } else {
    if (seq_len % (2 * num_ranks) != 0)
      return invalid_argument("zigzag layout: T {} does not divide by 2C = {} chunks (C = {} ranks); pad the "
                              "sequence or use the contiguous layout",
                              seq_len, 2 * num_ranks, num_ranks);
    const int64_t n = seq_len / (2 * num_ranks);
    for (int r = 0; r < num_ranks; ++r) l.segments_[r] = {{r * n, n}, {(2 * num_ranks - 1 - r) * n, n}};
  }
  return l;
}

Expected<SequenceLayout> SequenceLayout::hybrid(const SequenceLayout& ring, int ulysses_ranks) {
  if (ring.ulysses_ranks_ != 1) return invalid_argument("hybrid layout: {} is already a hybrid", ring.describe());
  const int64_t shard = ring.local_len();
  if (ulysses_ranks < 1 || shard % ulysses_ranks != 0)
    return invalid_argument("hybrid layout: a ring shard of {} rows does not split over {} Ulysses ranks", shard,
                            ulysses_ranks);
  const int64_t part = shard / ulysses_ranks;
  SequenceLayout l;
  l.kind_ = ring.kind_;
  l.seq_len_ = ring.seq_len_;
  l.ulysses_ranks_ = ulysses_ranks;
  for (int g = 0; g < ring.num_ranks(); ++g) {
    for (int m = 0; m < ulysses_ranks; ++m) {
      // Local rows [m·part, (m+1)·part) of ring shard g, walked through its segments.
      std::vector<SequenceSegment> mine;
      int64_t begin = m * part, end = begin + part, at = 0;
      for (const SequenceSegment& s : ring.segments(g)) {
        const int64_t lo = std::max(begin, at), hi = std::min(end, at + s.len);
        if (lo < hi) mine.push_back({s.start + (lo - at), hi - lo});
        at += s.len;
      }
      l.segments_.push_back(std::move(mine));
    }
  }
  return l;
}

std::string SequenceLayout::describe() const {
  if (ulysses_ranks_ > 1)
    return fmt::format("{} T {} over {} ranks (ring {} x Ulysses {})", layout_kind_name(kind_), seq_len_,
                       num_ranks(), num_ranks() / ulysses_ranks_, ulysses_ranks_);
  return fmt::format("{} T {} over {} ranks", layout_kind_name(kind_), seq_len_, num_ranks());
}

namespace {
// Copies between a rank's local rows and their places in the full buffer (to_local picks the
// direction).
void move_rows(const SequenceLayout& l, float* full, float* local, int64_t batch, int64_t row, int rank,
               bool to_local) {
  const int64_t t = l.seq_len(), tl = l.local_len();
  const size_t seg_bytes_per_row = static_cast<size_t>(row) * sizeof(float);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t at = 0;
    for (const SequenceSegment& s : l.segments(rank)) {
      float* f = full + (b * t + s.start) * row;
      float* lo = local + (b * tl + at) * row;
      if (to_local)
        std::memcpy(lo, f, s.len * seg_bytes_per_row);
      else
        std::memcpy(f, lo, s.len * seg_bytes_per_row);
      at += s.len;
    }
  }
}
}  // namespace

void SequenceLayout::shard(float* local, const float* full, int64_t batch, int64_t row, int rank) const {
  move_rows(*this, const_cast<float*>(full), local, batch, row, rank, true);
}

void SequenceLayout::unshard(float* full, const float* local, int64_t batch, int64_t row, int rank) const {
  move_rows(*this, full, const_cast<float*>(local), batch, row, rank, false);
}

Status SequenceLayout::gather(comm::Communicator& comm, float* full, const float* local, int64_t batch,
                              int64_t row) const {
  if (comm.size() != num_ranks())
    return invalid_argument("sequence layout gather: layout over {} ranks, communicator of {}", num_ranks(),
                            comm.size());
  const int64_t n = batch * local_len() * row;
  std::vector<float> all(static_cast<size_t>(n) * num_ranks());
  KILN_RETURN_IF_ERROR(comm::all_gather(comm, local, all.data(), n, DType::kF32));
  for (int r = 0; r < num_ranks(); ++r) unshard(full, all.data() + r * n, batch, row, r);
  return {};
}

}  // namespace kiln::parallel
