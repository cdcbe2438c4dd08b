// Chunk sizes of the pipelined algorithms (ring, double binary tree, chain): per-size defaults
// and the override that `kiln bench comm --chunk-bytes` uses to sweep them.
#include <atomic>

#include "kiln/comm/collectives.h"
#include "kiln/comm/detail.h"

namespace kiln::comm {
namespace {

// 0: the per-size defaults below. Set only by the bench, identically on every rank.
std::atomic<size_t> g_chunk_override{0};

}  // namespace

void set_pipeline_chunk_override(size_t bytes) {
  // A multiple of 64 B (whole elements of every dtype, cache-line aligned offsets), >= 1 KiB
  // (4032 B: one eager message of OpenMPI's vader, see detail.h).
  g_chunk_override.store(bytes == 0 ? 0 : std::max<size_t>(1024, bytes / 64 * 64),
                         std::memory_order_relaxed);
}

size_t pipeline_chunk_override() { return g_chunk_override.load(std::memory_order_relaxed); }

namespace detail {

// Defaults, from a sweep of 64 KiB, 256 KiB, 1 MiB and 4 MiB chunks at 8-256 MiB calls, p = 2
// and 4, on the 2-core Zen 5 VM with OpenMPI 4.1 over vader (`kiln bench comm --chunk-bytes`,
// /work/notes/comm_final.txt). Above 32 KiB vader moves a message with one single-copy (CMA)
// transfer, so each message costs a system call and a rendezvous: fewer, larger chunks win,
// and with 2 cores for 2-4 ranks there is little to overlap anyway. Below 8 MiB calls the
// 256 KiB chunk (a quarter of the 1 MiB L2 per core) is kept; it was not swept there.
constexpr size_t kSmallChunk = size_t{256} << 10;

// Ring: 4 MiB chunks once a block reaches 1 MiB (at 32-256 MiB, p = 2: 1.3-1.6x MPI's
// busbw against 1.1-1.3x with 256 KiB; p = 4: 4 MiB best or within noise of the best).
size_t ring_chunk_bytes(size_t max_block_bytes) {
  if (max_block_bytes <= kEagerSplitMaxBytes) return kEagerPieceBytes;
  if (const size_t o = pipeline_chunk_override()) return o;
  return max_block_bytes >= (size_t{1} << 20) ? size_t{4} << 20 : kSmallChunk;
}

// Double binary tree: 1 MiB from 8 MiB calls (p = 2: best at 8-128 MiB; p = 4: best or
// within 10% of 256 KiB, which won at 128-256 MiB by less than the run-to-run noise). Its
// pipeline needs several chunks per tree to fill, so not 4 MiB.
size_t tree_chunk_bytes(size_t nbytes) {
  if (const size_t o = pipeline_chunk_override()) return o;
  return nbytes >= (size_t{8} << 20) ? size_t{1} << 20 : kSmallChunk;
}

// Chain broadcast. Up to 32 KiB: eager pieces, as the ring's blocks (p = 4, 8 KiB: 6.1 us
// against 10-11 us with one 8 KiB message and 10.5 us for MPI_Bcast; 32 KiB: 12.9 us against
// 24-35 us and 14.9 us; p = 2, 8 KiB: 1.05 us against 2.9 us). From 32 KiB to 8 MiB one
// 256 KiB chunk: a sweep of 4-64 KiB chunks at 128 KiB-2 MiB (p = 2 and 4, 2-core Zen 4 VM;
// notes of docs/results/collectives-2026-11-30-b.txt) found every smaller chunk slower (p = 4,
// 128 KiB: 41-107 us against 45 us; 512 KiB: 140-388 us against 148 us): each rendezvous
// message costs a system call and a handshake, and 4 ranks on 2 cores leave little to
// overlap. From 8 MiB: 1 MiB (p = 2: 0.96-0.99x MPI at 1 MiB and 4 MiB, 0.74-0.94x at
// 64-256 KiB; p = 4: 1.3-1.4x MPI at 1 MiB).
size_t chain_chunk_bytes(size_t nbytes) {
  if (nbytes <= kEagerSplitMaxBytes) return eager_piece_bytes(nbytes);
  if (const size_t o = pipeline_chunk_override()) return o;
  return nbytes >= (size_t{8} << 20) ? size_t{1} << 20 : kSmallChunk;
}

}  // namespace detail
}  // namespace kiln::comm
