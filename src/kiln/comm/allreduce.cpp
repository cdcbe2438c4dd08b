// All-reduce algorithms: ring (reduce-scatter then all-gather, chunked and pipelined),
// recursive doubling (small messages), Rabenseifner (recursive halving + recursive
// doubling), hierarchical (in node, across nodes, in node) and MPI's own as the peer.
#include <cstring>

#include "kiln/comm/detail.h"

namespace kiln::comm::detail {
namespace {

void copy_if_needed(std::byte* dst, const std::byte* src, size_t nbytes) {
  if (dst != src && nbytes > 0) std::memcpy(dst, src, nbytes);
}

}  // namespace

void allreduce_ring(Communicator& c, const std::byte* send, std::byte* recv, int64_t n,
                    const RedSpec& s, int avg_divisor) {
  const int p = c.size(), r = c.rank();
  const size_t es = s.esize;
  if (p == 1) {
    copy_if_needed(recv, send, n * es);
    if (avg_divisor > 0) divide(s.dtype, recv, n, avg_divisor);
    return;
  }
  const Partition part = Partition::even(n, p);
  std::byte* tmp = c.scratch(0, part.max_size() * es);  // (max block)
  // Steps 0..p-2 reduce-scatter (block r-t-1 arrives, is reduced, forwarded); steps
  // p-1..2p-3 all-gather (block lands in recv and is forwarded). Rank r ends the first
  // phase owning block r+1, which it divides for avg before the all-gather.
  ring_run(
      c, 2 * (p - 1), ring_chunk_bytes(part.max_size() * es), send + part.begin(r) * es,
      part.size(r) * es,
      [&](int t) {
        const int b = mod(r - t - 1, p);
        return RingLanding{t < p - 1 ? tmp : recv + part.begin(b) * es,
                           static_cast<size_t>(part.size(b)) * es};
      },
      [&](int t, size_t off, size_t len) -> const std::byte* {
        const int b = mod(r - t - 1, p);
        std::byte* dst = recv + part.begin(b) * es + off;
        if (t < p - 1) {
          combine(s.dtype, s.op, dst, send + part.begin(b) * es + off, tmp + off, len / es);
          if (t == p - 2 && avg_divisor > 0) divide(s.dtype, dst, len / es, avg_divisor);
        }
        return dst;
      });
}

void allreduce_recursive_doubling(Communicator& c, const std::byte* send, std::byte* recv,
                                  int64_t n, const RedSpec& s, int avg_divisor) {
  const int p = c.size(), r = c.rank();
  const size_t nbytes = n * s.esize;
  const Fold f = Fold::of(p, r);
  std::byte* tmp = c.scratch(0, nbytes);
  const std::byte* src = send;  // our partial result: send until the first reduction
  if (r < 2 * f.rem) {  // fold: the extra rank hands its vector to its odd neighbour
    if (f.newrank < 0) {
      c.send(send, nbytes, r + 1, kTagFold);
      c.recv(recv, nbytes, r + 1, kTagFold);  // the final result (already divided)
      return;
    }
    c.recv(tmp, nbytes, r - 1, kTagFold);
    combine(s.dtype, s.op, recv, send, tmp, n);
    src = recv;
  }
  for (int mask = 1; mask < f.p2; mask <<= 1) {
    const int partner = f.real(f.newrank ^ mask);
    exchange(c, src, nbytes, partner, tmp, nbytes, partner, kTagRecursive);
    // a (op) b == b (op) a exactly, so both partners hold bitwise the same values.
    combine(s.dtype, s.op, recv, src, tmp, n);
    src = recv;
  }
  copy_if_needed(recv, src, nbytes);  // p = 1
  if (avg_divisor > 0) divide(s.dtype, recv, n, avg_divisor);
  if (r < 2 * f.rem) c.send(recv, nbytes, r - 1, kTagFold);  // unfold
}

void allreduce_rabenseifner(Communicator& c, const std::byte* send, std::byte* recv, int64_t n,
                            const RedSpec& s, int avg_divisor) {
  const int p = c.size(), r = c.rank();
  const size_t es = s.esize, nbytes = n * es;
  if (p == 1) {
    copy_if_needed(recv, send, nbytes);
    if (avg_divisor > 0) divide(s.dtype, recv, n, avg_divisor);
    return;
  }
  const Fold f = Fold::of(p, r);
  const Partition part = Partition::even(n, f.p2);  // one block per new rank
  std::byte* tmp = c.scratch(0, nbytes);
  const std::byte* src = send;  // our contribution: send until the first reduction
  if (r < 2 * f.rem) {
    if (f.newrank < 0) {
      c.send(send, nbytes, r + 1, kTagFold);
      c.recv(recv, nbytes, r + 1, kTagFold);
      return;
    }
    c.recv(tmp, nbytes, r - 1, kTagFold);
    combine(s.dtype, s.op, recv, send, tmp, n);
    src = recv;
  }
  const int me = f.newrank;
  // Recursive halving: the group [lo, lo + 2*mask) of new ranks splits in two; we keep the
  // half holding `me`, send the other half and reduce the partner's copy of ours.
  for (int mask = f.p2 / 2; mask >= 1; mask >>= 1) {
    const int lo = me & ~(2 * mask - 1);
    const bool upper = me & mask;
    const int keep_lo = upper ? lo + mask : lo, give_lo = upper ? lo : lo + mask;
    const int64_t k0 = part.begin(keep_lo), k1 = part.begin(keep_lo + mask);
    const int64_t g0 = part.begin(give_lo), g1 = part.begin(give_lo + mask);
    const int partner = f.real(me ^ mask);
    exchange(c, src + g0 * es, (g1 - g0) * es, partner, tmp, (k1 - k0) * es, partner,
             kTagRecursive);
    combine(s.dtype, s.op, recv + k0 * es, src + k0 * es, tmp, k1 - k0);
    src = recv;
  }
  if (avg_divisor > 0) divide(s.dtype, recv + part.begin(me) * es, part.size(me), avg_divisor);
  // Recursive doubling all-gather: the group of `mask` new ranks holding `me` swaps its
  // range with the partner group.
  for (int mask = 1; mask < f.p2; mask <<= 1) {
    const int lo = me & ~(mask - 1), plo = lo ^ mask;
    const int64_t m0 = part.begin(lo), m1 = part.begin(lo + mask);
    const int64_t q0 = part.begin(plo), q1 = part.begin(plo + mask);
    const int partner = f.real(me ^ mask);
    exchange(c, recv + m0 * es, (m1 - m0) * es, partner, recv + q0 * es, (q1 - q0) * es, partner,
             kTagRecursive);
  }
  if (r < 2 * f.rem) c.send(recv, nbytes, r - 1, kTagFold);
}

void allreduce_hierarchical(Communicator& c, const std::byte* send, std::byte* recv, int64_t n,
                            const RedSpec& s, int avg_divisor) {
  const size_t es = s.esize;
  if (c.size() == 1) {
    copy_if_needed(recv, send, n * es);
    if (avg_divisor > 0) divide(s.dtype, recv, n, avg_divisor);
    return;
  }
  Communicator::NodeGroups& g = c.node_groups();
  Communicator& node = *g.node;
  const int L = node.size(), l = node.rank();
  // Across nodes: ring for large blocks, recursive doubling for small ones (the alpha-beta
  // crossover on this machine is a few KiB; 16 KiB is safe either way).
  auto cross_allreduce = [&](Communicator& cc, std::byte* buf, int64_t count) {
    if (cc.size() == 1) return;
    if (static_cast<size_t>(count) * es < (size_t{16} << 10))
      allreduce_recursive_doubling(cc, buf, buf, count, s, 0);
    else
      allreduce_ring(cc, buf, buf, count, s, 0);
  };
  if (g.uniform) {
    // Reduce-scatter inside the node: local rank l owns block l of the vector.
    const Partition part = Partition::even(n, L);
    std::byte* own = recv + part.begin(l) * es;
    ring_reduce_scatter(node, send, own, part, s, 0);
    cross_allreduce(*g.cross, own, part.size(l));
    if (avg_divisor > 0) divide(s.dtype, own, part.size(l), avg_divisor);
    ring_all_gather(node, own, recv, part, es);
    return;
  }
  // Nodes of different sizes: block l has no partner on a smaller node, so fall back to
  // all-reduce in the node, all-reduce among node leaders, broadcast in the node.
  allreduce_ring(node, send, recv, n, s, 0);
  if (g.leaders) cross_allreduce(*g.leaders, recv, n);
  bcast_binomial(node, recv, n * es, 0);
  if (avg_divisor > 0) divide(s.dtype, recv, n, avg_divisor);
}

void allreduce_mpi(Communicator& c, const std::byte* send, std::byte* recv, int64_t n,
                   const RedSpec& s, int avg_divisor) {
  const void* sb = send == recv ? MPI_IN_PLACE : send;
  MPI_Allreduce(sb, recv, static_cast<int>(n), mpi_type(s.dtype), mpi_op(s.dtype, s.op),
                c.handle());
  if (avg_divisor > 0) divide(s.dtype, recv, n, avg_divisor);
}

}  // namespace kiln::comm::detail
