// Broadcast algorithms: binomial tree (lg p rounds, the whole message each) and a pipelined
// chain (the message flows rank to rank in chunks); MPI's own as the peer.
#include "kiln/dist/detail.h"

namespace kiln::dist::detail {

void bcast_binomial(Communicator& c, std::byte* buf, size_t nbytes, int root) {
  const int p = c.size(), r = c.rank();
  if (p == 1) return;
  const int vr = mod(r - root, p);  // rank relative to the root
  int mask = 1;
  while (mask < p) {
    if (vr & mask) {  // our parent is vr without its lowest set bit
      c.recv(buf, nbytes, mod(vr - mask + root, p), kTagBcast);
      break;
    }
    mask <<= 1;
  }
  std::vector<MPI_Request> sends;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < p) sends.push_back(c.isend(buf, nbytes, mod(vr + mask + root, p), kTagBcast));
  Communicator::wait_all(sends);
}

void bcast_chain(Communicator& c, std::byte* buf, size_t nbytes, int root) {
  const int p = c.size(), r = c.rank();
  if (p == 1 || nbytes == 0) return;
  const int vr = mod(r - root, p);
  const int prev = mod(r - 1, p), next = mod(r + 1, p);
  std::vector<MPI_Request> sends;
  const size_t chunk = chain_chunk_bytes(nbytes);
  for (size_t off = 0; off < nbytes; off += chunk) {
    const size_t len = std::min(chunk, nbytes - off);
    if (vr > 0) c.recv(buf + off, len, prev, kTagBcast);
    if (vr < p - 1) sends.push_back(c.isend(buf + off, len, next, kTagBcast));
  }
  Communicator::wait_all(sends);
}

void bcast_mpi(Communicator& c, std::byte* buf, size_t nbytes, int root) {
  MPI_Bcast(buf, static_cast<int>(nbytes), MPI_BYTE, root, c.handle());
}

}  // namespace kiln::dist::detail
