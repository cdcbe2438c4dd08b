// All-to-all by pairwise exchange: in step s every rank sends its block for rank r+s and
// receives rank r-s's block for it; p-1 steps, each link used once per step.
#include <cstring>

#include "kiln/dist/detail.h"

namespace kiln::dist::detail {

void alltoall_pairwise(Communicator& c, const std::byte* send, std::byte* recv, int64_t count,
                       size_t es) {
  const int p = c.size(), r = c.rank();
  const size_t block = count * es;
  if (send == recv && p > 1) {
    // In place: a block may be overwritten before it is sent, so send from a copy.
    std::byte* copy = c.scratch(0, p * block);
    if (block > 0) std::memcpy(copy, send, p * block);
    send = copy;
  }
  if (send != recv && block > 0) std::memcpy(recv + r * block, send + r * block, block);
  for (int step = 1; step < p; ++step) {
    const int to = mod(r + step, p), from = mod(r - step, p);
    exchange(c, send + to * block, block, to, recv + from * block, block, from, kTagAllToAll);
  }
}

void alltoall_mpi(Communicator& c, const std::byte* send, std::byte* recv, int64_t count,
                  size_t es) {
  const int block = static_cast<int>(count * es);
  MPI_Alltoall(send == recv ? MPI_IN_PLACE : send, block, MPI_BYTE, recv, block, MPI_BYTE,
               c.handle());
}

}  // namespace kiln::dist::detail
