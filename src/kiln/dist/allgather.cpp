// All-gather algorithms: ring (p-1 steps, each forwarding the block that just arrived) and
// recursive doubling (lg p exchanges of doubling ranges); MPI's own as the peer.
#include <cstring>

#include "kiln/dist/detail.h"

namespace kiln::dist::detail {

void ring_all_gather(Communicator& c, const std::byte* own, std::byte* recv,
                     const Partition& part, size_t es) {
  const int p = c.size(), r = c.rank();
  std::byte* mine = recv + part.begin(r) * es;
  if (own != mine && part.size(r) > 0) std::memcpy(mine, own, part.size(r) * es);
  if (p == 1) return;
  // Step t: block r-t-1 arrives from the left straight into recv and is forwarded.
  ring_run(
      c, p - 1, ring_chunk_bytes(part.max_size() * es), mine, part.size(r) * es,
      [&](int t) {
        const int b = mod(r - t - 1, p);
        return RingLanding{recv + part.begin(b) * es, static_cast<size_t>(part.size(b)) * es};
      },
      [&](int t, size_t off, size_t) -> const std::byte* {
        return recv + part.begin(mod(r - t - 1, p)) * es + off;
      });
}

void allgather_ring(Communicator& c, const std::byte* send, std::byte* recv, int64_t count,
                    size_t esize) {
  ring_all_gather(c, send, recv, Partition::blocks_of(count, c.size()), esize);
}

void allgather_recursive_doubling(Communicator& c, const std::byte* send, std::byte* recv,
                                  int64_t count, size_t es) {
  const int p = c.size(), r = c.rank();
  const size_t block = count * es;
  if (send != recv + r * block && block > 0) std::memcpy(recv + r * block, send, block);
  if (p == 1) return;
  const Fold f = Fold::of(p, r);
  if (r < 2 * f.rem) {  // fold: the extra rank's block joins its odd neighbour's
    if (f.newrank < 0) {
      c.send(recv + r * block, block, r + 1, kTagFold);
      c.recv(recv, p * block, r + 1, kTagFold);
      return;
    }
    c.recv(recv + (r - 1) * block, block, r - 1, kTagFold);
  }
  // New rank i holds the blocks [first_block(i), first_block(i+1)); groups of `mask` new
  // ranks hold contiguous ranges, which partners swap.
  const int me = f.newrank;
  for (int mask = 1; mask < f.p2; mask <<= 1) {
    const int g = me & ~(mask - 1), pg = g ^ mask;
    const size_t m0 = f.first_block(g) * block, m1 = f.first_block(g + mask) * block;
    const size_t q0 = f.first_block(pg) * block, q1 = f.first_block(pg + mask) * block;
    const int partner = f.real(me ^ mask);
    exchange(c, recv + m0, m1 - m0, partner, recv + q0, q1 - q0, partner, kTagRecursive);
  }
  if (r < 2 * f.rem) c.send(recv, p * block, r - 1, kTagFold);
}

void allgather_mpi(Communicator& c, const std::byte* send, std::byte* recv, int64_t count,
                   size_t es) {
  const size_t block = count * es;
  const bool in_place = send == recv + c.rank() * block;
  MPI_Allgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(block), MPI_BYTE, recv,
                static_cast<int>(block), MPI_BYTE, c.handle());
}

}  // namespace kiln::dist::detail
