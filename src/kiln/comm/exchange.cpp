// One pairwise exchange for the recursive and pairwise algorithms: receive posted first,
// messages of up to two eager pieces (kExchangeSplitMaxBytes) cut into them (see detail.h).
#include <array>

#include "kiln/comm/detail.h"

namespace kiln::comm::detail {
namespace {

// A pairwise exchange cuts only messages of up to two eager pieces. Measured at p = 2 on the
// EPYC VM (kiln bench comm, session 4), one message against eager pieces: 4 KiB messages
// (rabenseifner 8 KiB all-reduce, 8 KiB all-gather) 11.3 / 4.4 us against 6.0 / 3.0 us with
// pieces; 8 KiB messages (recursive doubling 8 KiB all-reduce) 4.8 us against 5.9; 16 KiB
// (32 KiB all-gather, recursive halving reduce-scatter, recursive doubling all-reduce) 5.5, 5.8,
// 7.2 us against 11.3, 11.7, 24.0 — five pieces each way cost more than one rendezvous here.
constexpr size_t kExchangeSplitMaxBytes = 2 * kEagerPieceBytes;
constexpr size_t kMaxPieces = (kExchangeSplitMaxBytes + kEagerPieceBytes - 1) / kEagerPieceBytes;

size_t piece_bytes(size_t nbytes) {
  return nbytes <= kExchangeSplitMaxBytes ? eager_piece_bytes(nbytes) : nbytes;
}

}  // namespace

void exchange(const Communicator& c, const std::byte* send, size_t send_nbytes, int to,
              std::byte* recv, size_t recv_nbytes, int from, int tag) {
  const size_t rp = piece_bytes(recv_nbytes), sp = piece_bytes(send_nbytes);
  if (rp == recv_nbytes && sp == send_nbytes) {
    // One message each way: one MPI_Sendrecv costs a third of the API calls of irecv + send +
    // wait (about 0.1 us of a 0.7 us small all-reduce at p = 2 here).
    c.sendrecv(send, send_nbytes, to, recv, recv_nbytes, from, tag);
    return;
  }
  std::array<MPI_Request, 2 * kMaxPieces> reqs;
  int num = 0;
  size_t off = 0;
  do {  // a zero-byte message is still one message, matching the sender's
    const size_t len = std::min(rp, recv_nbytes - off);
    reqs[num++] = c.irecv(recv + off, len, from, tag);
    off += len;
  } while (off < recv_nbytes);
  if (sp == send_nbytes) {
    // One message: a blocking send is safe, the partner's receive is already posted or will
    // be before it sends.
    c.send(send, send_nbytes, to, tag);
  } else {
    for (off = 0; off < send_nbytes; off += sp)
      reqs[num++] = c.isend(send + off, std::min(sp, send_nbytes - off), to, tag);
  }
  wait_all_requests(num, reqs.data());
}

}  // namespace kiln::comm::detail
