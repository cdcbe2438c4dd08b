// The collectives, implemented on MPI point-to-point: all-reduce, all-gather, reduce-scatter,
// all-to-all and broadcast, each with several algorithms (types.h) and `auto` selection by
// the alpha-beta model (cost_model.h), probing close calls in-process (auto_probe.h); and the
// variable-size all-to-all of expert parallelism. Every rank of `comm` calls with the same
// arguments (all_to_all_v: with counts that agree between peers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kiln/core/dtype.h"
#include "kiln/core/status.h"
#include "kiln/comm/auto_probe.h"
#include "kiln/comm/communicator.h"
#include "kiln/comm/types.h"

namespace kiln::comm {

// Buffers hold `count` elements of `dtype` (f32, bf16, f16). In-place follows NCCL:
//  * all_reduce: send == recv;
//  * all_gather: send == recv + rank * count_per_rank elements;
//  * reduce_scatter: recv == send + rank * count_per_rank elements;
//  * all_to_all: send == recv.
// avg is the sum divided by the number of ranks; bf16/f16 are reduced in f32 and rounded
// once per reduction step. Every rank ends with bitwise the same all-reduce result.
// Errors (a bad dtype, an algorithm that does not implement the op, a bad root) are
// returned the same on every rank, before any communication.

// recv (count) = op over ranks of send (count).
Status all_reduce(Communicator& comm, const void* send, void* recv, int64_t count, DType dtype,
                  ReduceOp op, Algo algo = Algo::kAuto);
// recv (p * count_per_rank) = concatenation over ranks of send (count_per_rank).
Status all_gather(Communicator& comm, const void* send, void* recv, int64_t count_per_rank,
                  DType dtype, Algo algo = Algo::kAuto);
// recv (count_per_rank) = op over ranks of block `rank` of send (p * count_per_rank).
Status reduce_scatter(Communicator& comm, const void* send, void* recv, int64_t count_per_rank,
                      DType dtype, ReduceOp op, Algo algo = Algo::kAuto);
// Block j of recv (p blocks of count_per_rank) = block `rank` of rank j's send.
Status all_to_all(Communicator& comm, const void* send, void* recv, int64_t count_per_rank,
                  DType dtype, Algo algo = Algo::kAuto);
// Variable-size all-to-all (MPI_Alltoallv's job: expert-parallel MoE dispatch and combine).
// Counts and displacements are in elements of `dtype`, one entry per rank of `comm` (p):
// block j of send, send_counts[j] elements at send + send_displs[j], goes to rank j; rank j's
// block for this rank lands at recv + recv_displs[j], recv_counts[j] elements. Blocks may sit
// in any order with gaps between them; recv outside the blocks is never written. Zero-count
// peers exchange no message. Not in place: send == recv is an error.
//  * Argument errors come back before any message (InvalidArgument; Unimplemented for a
//    dtype; OutOfRange for a block past 2 GiB or a displacement past int64 bytes): spans not
//    of p entries, negative counts or displacements, recv blocks that overlap each other or a
//    send block, a null buffer with nonzero counts, send_counts[rank] != recv_counts[rank].
//    They are the same on every rank where the arguments are; a rank that fails alone sends
//    nothing, and its peers end the job at KILN_COMM_TIMEOUT naming it.
//  * recv_counts[j] must equal rank j's send_counts[rank] (all_to_all_counts gives it); no rank
//    can check that alone. A receive that gets another size returns InvalidArgument naming
//    the peer once every exchange is done (that block's contents are then unspecified,
//    nothing outside it is written; the sender returns ok). A mismatch with a count of 0 on one
//    side goes unseen there: a receiver expecting data that never comes ends the job at
//    KILN_COMM_TIMEOUT naming the peer; data sent to a rank expecting none stays queued and
//    would be taken by the next all_to_all_v from that peer (flagged there only if its size
//    differs).
Status all_to_all_v(Communicator& comm, const void* send, std::span<const int64_t> send_counts,
                    std::span<const int64_t> send_displs, void* recv,
                    std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                    DType dtype);
// The counts exchange before an all_to_all_v: recv_counts[j] = rank j's send_counts[rank]
// (p entries each; send_counts >= 0; the two spans may be the same memory).
Status all_to_all_counts(Communicator& comm, std::span<const int64_t> send_counts,
                         std::span<int64_t> recv_counts);
// buf (count) on every rank = buf of `root`.
Status broadcast(Communicator& comm, void* buf, int64_t count, DType dtype, int root,
                 Algo algo = Algo::kAuto);

// The algorithm `auto` resolves to for this call (same on every rank): the pinned choice, or
// while the probe runs at this size (auto_probe.h), the candidate the next call runs. Does not
// advance the probe. `nbytes_total` is the nccl-tests size (cost_model.h, AlgoCost).
Algo resolve_algo(Communicator& comm, CollOp op, int64_t nbytes_total);
// What `auto` does at this size: the algorithm, whether the probe runs or pinned it, the
// model's pick, the candidates and their agreed times (same on every rank).
AutoChoice auto_choice(Communicator& comm, CollOp op, int64_t nbytes_total);

// Tuning hook for chunk sweeps (`kiln bench comm --chunk-bytes`): the pipelined algorithms
// (ring, double binary tree, chain) send `bytes` per chunk (rounded down to a multiple of 64,
// at least 1 KiB) instead of their per-size defaults; 0 restores the defaults. Must be the
// same on every rank.
void set_pipeline_chunk_override(size_t bytes);
size_t pipeline_chunk_override();

}  // namespace kiln::comm
