// Internals shared by the collective algorithms: the reduction spec, block partitions, the
// chunked ring engine, the double-binary-tree shape, and each algorithm's entry point
// (arguments already validated; counts in elements, pointers to bytes).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kiln/comm/communicator.h"
#include "kiln/comm/reduce.h"
#include "kiln/comm/types.h"
#include "kiln/comm/work.h"

namespace kiln::comm::detail {

// Message tags, one per family, so concurrent phases never match each other's messages.
enum Tag : int {
  kTagRing = 11,
  kTagRecursive = 12,
  kTagTree = 13,  // + 0..3: tree * 2 + (down ? 1 : 0)
  kTagAllToAll = 20,  // pairwise and scattered
  kTagBcast = 21,
  kTagFold = 22,
  kTagAllToAllV = 23,  // apart from kTagAllToAll: a message left by a count mismatch never
                       // meets a fixed-size all-to-all
};

// OpenMPI's shared-memory transport (vader) sends a message of up to 4 KiB with its header
// eagerly; a larger one pays a rendezvous (~5 us on this VM). Messages up to
// kEagerSplitMaxBytes are therefore cut into kEagerPieceBytes pieces (4 KiB less a 64 B
// header); past it one single-copy (CMA) message is faster.
inline constexpr size_t kEagerPieceBytes = 4032;
inline constexpr size_t kEagerSplitMaxBytes = size_t{32} << 10;
// The scattered all-to-all keeps the exchanges with up to this many peers in flight at once
// (MPICH's default block of its scattered algorithm); p <= 33 posts them all.
inline constexpr int kAllToAllWindow = 32;

// The piece size a message of `nbytes` is cut into: kEagerPieceBytes up to
// kEagerSplitMaxBytes, else the whole message.
inline size_t eager_piece_bytes(size_t nbytes) {
  return (nbytes > kEagerPieceBytes && nbytes <= kEagerSplitMaxBytes) ? kEagerPieceBytes : nbytes;
}

// Pipeline chunks (pipeline.cpp): a block is sent in chunks so that the next rank can reduce
// and forward chunk k while chunk k+1 is in flight. The chunk sizes depend on the call size
// only, so every rank picks the same. `set_pipeline_chunk_override` (collectives.h) replaces
// them all, for chunk sweeps.
// The ring's chunk for a call whose largest block is `max_block_bytes`.
size_t ring_chunk_bytes(size_t max_block_bytes);
// The double binary tree's chunk for an all-reduce of `nbytes` (each tree carries half).
size_t tree_chunk_bytes(size_t nbytes);
// The chain broadcast's chunk for a message of `nbytes` (eager pieces up to
// kEagerSplitMaxBytes, whatever the override).
size_t chain_chunk_bytes(size_t nbytes);

struct RedSpec {
  DType dtype;
  ReduceOp op;
  size_t esize;  // bytes per element
};

// Blocks of a vector: p blocks, either `count` elements each (equal) or the even partition
// of n elements (block_begin).
struct Partition {
  int64_t n = 0;      // total elements
  int p = 1;
  int64_t count = 0;  // elements per block when equal
  bool equal = false;
  static Partition even(int64_t n, int p) { return {n, p, 0, false}; }
  static Partition blocks_of(int64_t count, int p) { return {count * p, p, count, true}; }
  int64_t begin(int i) const { return equal ? i * count : block_begin(n, p, i); }
  int64_t size(int i) const { return begin(i + 1) - begin(i); }
  int64_t max_size() const { return equal ? count : (n + p - 1) / p; }
};

inline int mod(int a, int p) { return ((a % p) + p) % p; }
inline int floor_pow2(int p) {
  int q = 1;
  while (q * 2 <= p) q *= 2;
  return q;
}

// Non-power-of-two ranks for the recursive algorithms: the first 2*rem ranks pair up, the
// even one of each pair hands its data to the odd one and sits out ("extra"); the p2 others
// run the power-of-two algorithm under new ranks 0..p2-1, in the order of their ranks.
struct Fold {
  int p2 = 1, rem = 0;
  int newrank = -1;  // -1 for an extra rank
  static Fold of(int p, int r) {
    Fold f;
    f.p2 = floor_pow2(p);
    f.rem = p - f.p2;
    if (r < 2 * f.rem) f.newrank = (r % 2) ? r / 2 : -1;
    else f.newrank = r - f.rem;
    return f;
  }
  int real(int nr) const { return nr < rem ? nr * 2 + 1 : nr + rem; }
  // First of the original blocks that new rank nr stands for (nr = p2: p).
  int first_block(int nr) const { return nr < rem ? 2 * nr : nr + rem; }
};

// The chunked, pipelined ring. It runs `num_steps` steps; at step t every rank receives a
// block from its left neighbour and forwards what `on_chunk` returns to its right one.
//   plan(t) -> {landing buffer, bytes}: where the block of step t lands;
//   on_chunk(t, offset, nbytes) -> pointer to forward (step t+1's chunk at this offset);
// The first step's block is sent from `first` (first_nbytes). Blocks travel in `chunk`-byte
// messages (ring_chunk_bytes, the same on every rank). The right neighbour's step-t
// block has the same size as ours, so chunks match one to one.
struct RingLanding {
  std::byte* data;
  size_t nbytes;
};
template <class Plan, class OnChunk>
void ring_run(const Communicator& comm, int num_steps, size_t chunk, const std::byte* first,
              size_t first_nbytes, Plan plan, OnChunk on_chunk) {
  const int p = comm.size(), r = comm.rank();
  const int right = mod(r + 1, p), left = mod(r - 1, p);
  std::vector<MPI_Request> cur_sends, next_sends, recvs;
  for (int t = 0; t < num_steps; ++t) {
    const RingLanding land = plan(t);
    recvs.clear();
    for (size_t off = 0; off < land.nbytes; off += chunk)
      recvs.push_back(comm.irecv(land.data + off, std::min(chunk, land.nbytes - off),
                                 left, kTagRing));
    // The first block goes out once step 0's receives are posted (as in exchange()): a
    // large message that finds its receive posted is copied at once instead of queued.
    if (t == 0)
      for (size_t off = 0; off < first_nbytes; off += chunk)
        cur_sends.push_back(comm.isend(first + off, std::min(chunk, first_nbytes - off),
                                       right, kTagRing));
    size_t off = 0;
    for (MPI_Request& req : recvs) {
      const size_t len = std::min(chunk, land.nbytes - off);
      Communicator::wait(req);
      const std::byte* fwd = on_chunk(t, off, len);
      if (t + 1 < num_steps) next_sends.push_back(comm.isend(fwd, len, right, kTagRing));
      off += len;
    }
    Communicator::wait_all(cur_sends);
    std::swap(cur_sends, next_sends);
  }
  Communicator::wait_all(cur_sends);
}

// Sends `send_nbytes` to `to` and receives `recv_nbytes` from `from`, cutting messages of
// up to two eager pieces into them (the receiver cuts the same way; exchange.cpp says why not
// up to kEagerSplitMaxBytes).
void exchange(const Communicator& c, const std::byte* send, size_t send_nbytes, int to,
              std::byte* recv, size_t recv_nbytes, int from, int tag);

// Ring reduce-scatter over `part`: the reduced block `rank` is written to `out`; the
// intermediate partial sums live in scratch slots 1 and 2. in-place safe when out aliases
// send's own block. Applies avg's division.
void ring_reduce_scatter(Communicator& comm, const std::byte* send, std::byte* out,
                         const Partition& part, const RedSpec& spec, int avg_divisor);
// Ring all-gather over `part`: block `rank` is read from `own` (may already be in place in
// recv), the whole vector is written to recv.
void ring_all_gather(Communicator& comm, const std::byte* own, std::byte* recv,
                     const Partition& part, size_t esize);

// ---- the double binary tree -----------------------------------------------------------------
// Tree `which` (0 or 1) over p ranks: an in-order binary tree on positions 1..p (leaves are
// the odd positions); tree 1 is tree 0 mirrored (p even) or shifted by one (p odd), so no
// rank is an inner node in both.
struct TreeLinks {
  int parent = -1;
  int children[2] = {-1, -1};
  int num_children() const { return (children[0] >= 0) + (children[1] >= 0); }
};
TreeLinks tree_links(int p, int rank, int which);
int tree_height(int p);  // levels below the root

// ---- algorithm entry points ---------------------------------------------------------------------
// `avg_divisor` > 0: divide the reduced result by it (avg); the caller passes the op as sum.
void allreduce_ring(Communicator& c, const std::byte* send, std::byte* recv, int64_t n,
                    const RedSpec& s, int avg_divisor);
void allreduce_recursive_doubling(Communicator& c, const std::byte* send, std::byte* recv,
                                  int64_t n, const RedSpec& s, int avg_divisor);
void allreduce_rabenseifner(Communicator& c, const std::byte* send, std::byte* recv, int64_t n,
                            const RedSpec& s, int avg_divisor);
void allreduce_double_binary_tree(Communicator& c, const std::byte* send, std::byte* recv,
                                  int64_t n, const RedSpec& s, int avg_divisor);
void allreduce_hierarchical(Communicator& c, const std::byte* send, std::byte* recv, int64_t n,
                            const RedSpec& s, int avg_divisor);
void allreduce_mpi(Communicator& c, const std::byte* send, std::byte* recv, int64_t n,
                   const RedSpec& s, int avg_divisor);

void allgather_ring(Communicator& c, const std::byte* send, std::byte* recv, int64_t count,
                    size_t esize);
void allgather_recursive_doubling(Communicator& c, const std::byte* send, std::byte* recv,
                                  int64_t count, size_t esize);
void allgather_mpi(Communicator& c, const std::byte* send, std::byte* recv, int64_t count,
                   size_t esize);

void reducescatter_ring(Communicator& c, const std::byte* send, std::byte* recv, int64_t count,
                        const RedSpec& s, int avg_divisor);
void reducescatter_recursive_halving(Communicator& c, const std::byte* send, std::byte* recv,
                                     int64_t count, const RedSpec& s, int avg_divisor);
void reducescatter_mpi(Communicator& c, const std::byte* send, std::byte* recv, int64_t count,
                       const RedSpec& s, int avg_divisor);

void alltoall_pairwise(Communicator& c, const std::byte* send, std::byte* recv, int64_t count,
                       size_t esize);
void alltoall_scattered(Communicator& c, const std::byte* send, std::byte* recv, int64_t count,
                        size_t esize);
void alltoall_mpi(Communicator& c, const std::byte* send, std::byte* recv, int64_t count,
                  size_t esize);

void bcast_binomial(Communicator& c, std::byte* buf, size_t nbytes, int root);
void bcast_chain(Communicator& c, std::byte* buf, size_t nbytes, int root);
void bcast_mpi(Communicator& c, std::byte* buf, size_t nbytes, int root);

// ---- shared by the public entry points ----------------------------------------------------------
// While the communicator has a communication thread (work.h), a blocking call from another
// thread is queued on it behind the calls already in flight and waited for, so blocking and
// nonblocking calls may be mixed in any order. Returns false when the call should run here.
template <class F>
bool run_on_comm_thread(Communicator& comm, Status& out, F&& call) {
  CommThread* t = comm.started_comm_thread();
  if (t == nullptr || t->is_current()) return false;
  out = t->submit(std::forward<F>(call)).wait();
  return true;
}
// Unimplemented, naming the op `name`, unless the collectives move `dtype` (is_collective_dtype).
Status check_dtype(const char* name, DType dtype);

// MPI datatype and reduction op for the peer (16-bit floats get user-defined ops).
MPI_Datatype mpi_type(DType dtype);
MPI_Op mpi_op(DType dtype, ReduceOp op);

}  // namespace kiln::comm::detail
