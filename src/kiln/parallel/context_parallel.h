// Context-parallel attention: the sequence is split over the C ranks of a group (a
// SequenceLayout); everything but attention is local to a rank's rows, and these calls compute
// the attention of the rank's query rows against the whole sequence — the same output,
// logsumexp and gradients as cpu::attention_forward / attention_backward on the full sequence.
//
//   * Ring: each rank keeps its Q rows and passes its K/V rows around the ring (double-buffered
//     send/recv on the communicator's communication thread, the next block in flight while the
//     current one is computed); partial outputs merge exactly through their logsumexps.
//     Backward recomputes against each block with the final out and lse, accumulating dQ here
//     while each block's dK/dV follows it around the ring and arrives home at the end.
//   * Ulysses: an all-to-all turns the sequence-sharded (T/C rows, all heads) q/k/v into
//     head-sharded (all T rows, H/C heads), attention runs locally, and an all-to-all turns the
//     output back. Heads and KV heads must divide by C.
//   * Hybrid: Ulysses inside groups of U consecutive ranks, ring across the R = C/U groups
//     (the layout from SequenceLayout::hybrid).
//
// Buffers are the local rows in the layout's order; `local` describes them as an attention
// call would: batch B, q_len = kv_len = T/C, heads, KV heads, head_dim, causal, scale and row
// strides (q, k, v may be slices of a fused QKV row). out (B, T/C, H, D) of o_row_stride, lse
// (B, H, T/C); gradients packed with the strides of q, k, v. Every rank of the group calls with
// the same arguments (its own buffers); argument errors are InvalidArgument, the same on every
// rank, before any message. A peer that never answers ends the job after KILN_COMM_TIMEOUT.
#pragma once

#include <cstdint>

#include "kiln/comm/communicator.h"
#include "kiln/kernels/attention.h"
#include "kiln/parallel/sequence_layout.h"

namespace kiln::parallel {

// What one call did on this rank (add() sums calls).
struct CpStats {
  double compute_seconds = 0;  // attention kernels and merges on the calling thread
  double comm_seconds = 0;     // the communication thread's transfers (Work timestamps)
  double exposed_seconds = 0;  // the calling thread waiting for transfers (not hidden)
  int64_t bytes_sent = 0;      // payload this rank sent
  int64_t peak_extra_bytes = 0;  // scratch beyond the inputs and outputs, kernels' included
  int64_t blocks_computed = 0;   // (query segment, key segment) kernel calls
  void add(const CpStats& o);
};

// ---- Ring ------------------------------------------------------------------------------------
// comm.size() == layout.num_ranks(); the layout is contiguous or zig-zag (a ring layout).
Status ring_attention_forward(comm::Communicator& comm, const SequenceLayout& layout, float* out, float* lse,
                              const float* q, const float* k, const float* v, const AttentionParams& local,
                              CpStats* stats = nullptr);
// dout like out; out and lse from ring_attention_forward.
Status ring_attention_backward(comm::Communicator& comm, const SequenceLayout& layout, float* dq, float* dk,
                               float* dv, const float* dout, const float* q, const float* k, const float* v,
                               const float* out, const float* lse, const AttentionParams& local,
                               CpStats* stats = nullptr);

// ---- Ulysses ---------------------------------------------------------------------------------
// Any layout over comm.size() ranks; n_heads and n_kv_heads divisible by comm.size().
Status ulysses_attention_forward(comm::Communicator& comm, const SequenceLayout& layout, float* out, float* lse,
                                 const float* q, const float* k, const float* v, const AttentionParams& local,
                                 CpStats* stats = nullptr);
Status ulysses_attention_backward(comm::Communicator& comm, const SequenceLayout& layout, float* dq, float* dk,
                                  float* dv, const float* dout, const float* q, const float* k, const float* v,
                                  const float* out, const float* lse, const AttentionParams& local,
                                  CpStats* stats = nullptr);

// ---- Hybrid ----------------------------------------------------------------------------------
// `ulysses`: this rank's group of U consecutive ranks (its rank m = member); `ring`: the R
// ranks with the same member index (its rank g = group). layout = SequenceLayout::hybrid of a
// ring layout over R ranks with U; heads and KV heads divisible by U. A DeviceMesh with axes
// (cp_ring R, cp_ulysses U) gives both communicators.
struct HybridGroups {
  comm::Communicator& ring;
  comm::Communicator& ulysses;
};
Status hybrid_attention_forward(HybridGroups groups, const SequenceLayout& layout, float* out, float* lse,
                                const float* q, const float* k, const float* v, const AttentionParams& local,
                                CpStats* stats = nullptr);
Status hybrid_attention_backward(HybridGroups groups, const SequenceLayout& layout, float* dq, float* dk,
                                 float* dv, const float* dout, const float* q, const float* k, const float* v,
                                 const float* out, const float* lse, const AttentionParams& local,
                                 CpStats* stats = nullptr);

}  // namespace kiln::parallel
