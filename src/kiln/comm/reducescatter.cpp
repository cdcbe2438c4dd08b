// Reduce-scatter algorithms: ring (p-1 steps; partial sums travel around the ring and end at
// their owner) and recursive halving (lg p exchanges of halving ranges); MPI's own as peer.
#include <cstring>

#include "kiln/comm/detail.h"

namespace kiln::comm::detail {

void ring_reduce_scatter(Communicator& c, const std::byte* send, std::byte* out,
                         const Partition& part, const RedSpec& s, int avg_divisor) {
  const int p = c.size(), r = c.rank();
  const size_t es = s.esize;
  if (p == 1) {
    if (out != send && part.size(0) > 0) std::memcpy(out, send, part.size(0) * es);
    if (avg_divisor > 0) divide(s.dtype, out, part.size(0), avg_divisor);
    return;
  }
  const size_t max_bytes = part.max_size() * es;
  std::byte* tmp = c.scratch(0, max_bytes);                              // (max block)
  std::byte* work[2] = {c.scratch(1, max_bytes), c.scratch(2, max_bytes)};  // partial sums
  // Step t: block r-t-2 arrives (partial over ranks r-t-1..r-1), we add ours and forward
  // it; at the last step (t = p-2) the block is r itself and complete.
  const int first = mod(r - 1, p);
  ring_run(
      c, p - 1, ring_chunk_bytes(max_bytes), send + part.begin(first) * es, part.size(first) * es,
      [&](int t) {
        return RingLanding{tmp, static_cast<size_t>(part.size(mod(r - t - 2, p))) * es};
      },
      [&](int t, size_t off, size_t len) -> const std::byte* {
        const int b = mod(r - t - 2, p);
        std::byte* dst = (t == p - 2 ? out : work[t % 2]) + off;
        combine(s.dtype, s.op, dst, send + part.begin(b) * es + off, tmp + off, len / es);
        if (t == p - 2 && avg_divisor > 0) divide(s.dtype, dst, len / es, avg_divisor);
        return dst;
      });
}

void reducescatter_ring(Communicator& c, const std::byte* send, std::byte* recv, int64_t count,
                        const RedSpec& s, int avg_divisor) {
  ring_reduce_scatter(c, send, recv, Partition::blocks_of(count, c.size()), s, avg_divisor);
}

void reducescatter_recursive_halving(Communicator& c, const std::byte* send, std::byte* recv,
                                     int64_t count, const RedSpec& s, int avg_divisor) {
  const int p = c.size(), r = c.rank();
  const size_t es = s.esize, block = count * es, total = p * block;
  if (p == 1) {
    if (recv != send && block > 0) std::memcpy(recv, send, block);
    if (avg_divisor > 0) divide(s.dtype, recv, count, avg_divisor);
    return;
  }
  const Fold f = Fold::of(p, r);
  std::byte* tmp = c.scratch(0, total);
  std::byte* work = c.scratch(1, total);  // (p * count) partial sums
  const std::byte* src = send;
  if (r < 2 * f.rem) {
    if (f.newrank < 0) {  // the extra rank hands its whole vector over, gets its block back
      c.send(send, total, r + 1, kTagFold);
      c.recv(recv, block, r + 1, kTagFold);
      return;
    }
    c.recv(tmp, total, r - 1, kTagFold);
    combine(s.dtype, s.op, work, send, tmp, p * count);
    src = work;
  }
  const int me = f.newrank;
  for (int mask = f.p2 / 2; mask >= 1; mask >>= 1) {
    const int lo = me & ~(2 * mask - 1);
    const bool upper = me & mask;
    const int keep = upper ? lo + mask : lo, give = upper ? lo : lo + mask;
    const size_t k0 = f.first_block(keep) * block, k1 = f.first_block(keep + mask) * block;
    const size_t g0 = f.first_block(give) * block, g1 = f.first_block(give + mask) * block;
    const int partner = f.real(me ^ mask);
    exchange(c, src + g0, g1 - g0, partner, tmp, k1 - k0, partner, kTagRecursive);
    combine(s.dtype, s.op, work + k0, src + k0, tmp, (k1 - k0) / es);
    src = work;
  }
  // `work` now holds our new rank's blocks reduced: block r, and block r-1 for the extra.
  if (avg_divisor > 0)
    divide(s.dtype, work + f.first_block(me) * block,
           (f.first_block(me + 1) - f.first_block(me)) * count, avg_divisor);
  if (r < 2 * f.rem) c.send(work + (r - 1) * block, block, r - 1, kTagFold);
  if (block > 0) std::memcpy(recv, src + r * block, block);
}

void reducescatter_mpi(Communicator& c, const std::byte* send, std::byte* recv, int64_t count,
                       const RedSpec& s, int avg_divisor) {
  const size_t block = count * s.esize;
  const std::byte* in = send;
  if (recv == send + c.rank() * block) {
    // NCCL's in-place layout is not MPI's: reduce from a copy of the input.
    std::byte* copy = c.scratch(0, block * c.size());
    std::memcpy(copy, send, block * c.size());
    in = copy;
  }
  MPI_Reduce_scatter_block(in, recv, static_cast<int>(count), mpi_type(s.dtype),
                           mpi_op(s.dtype, s.op), c.handle());
  if (avg_divisor > 0) divide(s.dtype, recv, count, avg_divisor);
}

}  // namespace kiln::comm::detail
