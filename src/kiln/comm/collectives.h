// The collectives, implemented on MPI point-to-point: all-reduce, all-gather, reduce-scatter,
// all-to-all and broadcast, each with several algorithms (types.h) and `auto` selection by
// the alpha-beta model (cost_model.h), probing close calls in-process (auto_probe.h). Every
// rank of `comm` calls with the same arguments.
#pragma once

#include <cstddef>
#include <cstdint>

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
