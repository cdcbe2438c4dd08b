// Broadcast algorithms: binomial tree (lg p rounds, the whole message each, or pipelined in
// eager pieces up to 32 KiB) and a pipelined chain (the message flows rank to rank in
// chunks); MPI's own as the peer.
#include <array>

#include "kiln/comm/detail.h"

namespace kiln::comm::detail {

void bcast_binomial(Communicator& c, std::byte* buf, size_t nbytes, int root) {
  const int p = c.size(), r = c.rank();
  if (p == 1 || nbytes == 0) return;
  const int vr = mod(r - root, p);  // rank relative to the root
  int mask = 1, parent = -1;
  while (mask < p) {
    if (vr & mask) {  // our parent is vr without its lowest set bit
      parent = mod(vr - mask + root, p);
      break;
    }
    mask <<= 1;
  }
  std::array<int, 32> children;  // the largest subtree first (at most lg p of them)
  int num_children = 0;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < p) children[num_children++] = mod(vr + mask + root, p);
  // Messages up to kEagerSplitMaxBytes travel as eager pieces (no rendezvous), each forwarded
  // to the children as soon as it has arrived; a larger one is one message per link.
  // (Eager pieces at 128 KiB, p = 4: 0.50-0.87x MPI_Bcast in three processes, against
  // 0.39-1.45x with one message; the spread is the VM's process-long modes, not the piece size.)
  const size_t piece = eager_piece_bytes(nbytes);
  const size_t npieces = (nbytes + piece - 1) / piece;
  if (npieces == 1 && num_children <= 1) {
    // One message in, at most one out: blocking calls, no request vectors. At 8-32 B the
    // best kiln broadcast took a median 1.19-1.25x MPI_Bcast's time at p = 2 and 4 through
    // isend/irecv and the vectors (up to 1.67x), 0.86-0.94x this way (2-core Xeon VM,
    // docs/results/collectives-2026-12-01-b.txt).
    if (parent >= 0) c.recv(buf, nbytes, parent, kTagBcast);
    if (num_children == 1) c.send(buf, nbytes, children[0], kTagBcast);
    return;
  }
  std::vector<MPI_Request> recvs, sends;
  if (parent >= 0)
    for (size_t k = 0; k < npieces; ++k)
      recvs.push_back(c.irecv(buf + k * piece, std::min(piece, nbytes - k * piece), parent, kTagBcast));
  for (size_t k = 0; k < npieces; ++k) {
    const size_t off = k * piece, len = std::min(piece, nbytes - off);
    if (parent >= 0) Communicator::wait(recvs[k]);
    for (int i = 0; i < num_children; ++i) sends.push_back(c.isend(buf + off, len, children[i], kTagBcast));
  }
  Communicator::wait_all(sends);
}

void bcast_chain(Communicator& c, std::byte* buf, size_t nbytes, int root) {
  const int p = c.size(), r = c.rank();
  if (p == 1 || nbytes == 0) return;
  const int vr = mod(r - root, p);
  const int prev = mod(r - 1, p), next = mod(r + 1, p);
  const size_t chunk = chain_chunk_bytes(nbytes);
  const size_t nchunks = (nbytes + chunk - 1) / chunk;
  if (nchunks == 1) {  // one message per link: blocking calls, as in bcast_binomial
    if (vr > 0) c.recv(buf, nbytes, prev, kTagBcast);
    if (vr < p - 1) c.send(buf, nbytes, next, kTagBcast);
    return;
  }
  // Every receive is posted first, so a small (eager) chunk lands in place instead of being
  // buffered as unexpected; chunk k is forwarded as soon as it has arrived.
  std::vector<MPI_Request> recvs, sends;
  if (vr > 0)
    for (size_t k = 0; k < nchunks; ++k)
      recvs.push_back(c.irecv(buf + k * chunk, std::min(chunk, nbytes - k * chunk), prev, kTagBcast));
  for (size_t k = 0; k < nchunks; ++k) {
    const size_t off = k * chunk, len = std::min(chunk, nbytes - off);
    if (vr > 0) Communicator::wait(recvs[k]);
    if (vr < p - 1) sends.push_back(c.isend(buf + off, len, next, kTagBcast));
  }
  Communicator::wait_all(sends);
}

void bcast_mpi(Communicator& c, std::byte* buf, size_t nbytes, int root) {
  MPI_Bcast(buf, static_cast<int>(nbytes), MPI_BYTE, root, c.handle());
}

}  // namespace kiln::comm::detail
