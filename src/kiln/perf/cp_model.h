// Context parallelism on paper (`kiln plan cp`): ring attention (contiguous or zig-zag layout),
// DeepSpeed-Ulysses and the Ulysses × ring hybrid of parallel/context_parallel.h, per layer and
// per step, on the modelled topologies of comm_model.h. The block counts come from the runtime's
// own SequenceLayout and block_kind, the FLOPs from attention_forward_cost / _backward_cost, the
// bytes from the buffers the runtime sends; the ring's overlap is an event simulation of its
// double-buffered exchanges. No MPI: arithmetic only.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/core/status.h"
#include "kiln/kernels/attention.h"
#include "kiln/parallel/sequence_layout.h"
#include "kiln/perf/comm_model.h"

namespace kiln::perf {

// One attention layer's shape (a model config's heads, KV heads, head dim; layers for the step).
// The defaults: Llama-2-7B's attention (32 heads of 128, MHA, 32 layers).
struct CpAttentionShape {
  int64_t heads = 32, kv_heads = 32, head_dim = 128, layers = 32, batch = 1;
  bool causal = true;
};

enum class CpMethod { kRing, kUlysses, kHybrid };
std::string_view cp_method_name(CpMethod m);  // "ring" | "ulysses" | "hybrid"
Expected<CpMethod> parse_cp_method(std::string_view name);

struct CpPlanOptions {
  CpMethod method = CpMethod::kRing;
  parallel::LayoutKind layout = parallel::LayoutKind::kZigzag;  // the ring's (ignored by Ulysses)
  int cp = 2;           // C ranks in all
  int ulysses = 2;      // hybrid: U, the Ulysses group (ring over C / U); ring: 1; Ulysses: C
  double bytes_per_element = 2;     // q, k, v, out and gradients in memory and on the wire
  double forward_flops_per_s = 0;   // the attention forward kernel's rate (peak × efficiency)
  double backward_flops_per_s = 0;  // backward's; 0: the forward's
};

// One layer, one rank (the busiest where ranks differ). Seconds and bytes.
struct CpPrediction {
  int ulysses = 1, ring = 1;          // U × R = C
  double fwd_compute_s = 0, bwd_compute_s = 0;  // the busiest rank's attention kernels
  double mean_compute_s = 0, min_compute_s = 0;  // forward + backward, over ranks
  double imbalance = 1;               // busiest / mean of forward + backward work
  double ring_hop_bytes_fwd = 0;      // one hop: 2·(T/R)·(KV heads / U)·D·bytes (K and V)
  double ring_hop_bytes_bwd = 0;      // a middle hop of backward: K/V and dK/dV
  double a2a_bytes_fwd = 0, a2a_bytes_bwd = 0;  // Ulysses: send buffers per rank, in + out
  double bytes_sent = 0;              // payload a rank sends (as CpStats counts it)
  double comm_s = 0;                  // every transfer's modelled time, forward + backward
  double exposed_s = 0;               // communication no compute hides (see predict_cp_layer)
  double wait_s = 0;                  // the worst rank's waits, imbalance included (simulated)
  double layer_s = 0;                 // forward + backward as the slowest rank sees it
  double memory_bytes = 0;            // inputs, outputs, gradients and scratch (kernels' excluded)
  std::string comm_note;              // the link or all-to-all algorithm used
};

// Heads and KV heads must divide by the Ulysses group (U = C for Ulysses, U for the hybrid) —
// the runtime's rule. InvalidArgument naming the counts and pointing to ring / hybrid otherwise.
Status check_cp_heads(const CpAttentionShape& s, const CpPlanOptions& o);

// Per layer at global sequence T (batch rows each of T tokens):
//  * compute: each (query segment, key segment) pair of the runtime's layout, per ring step, at
//    attention_forward_cost / attention_backward_cost of that block (a diagonal block is causal:
//    n(n+1)/2 of its n² pairs) over the rate; Ulysses' heads / U on every rank.
//  * ring: an exchange posted at each step's start completes `alpha + bytes / bw` after both
//    neighbours posted theirs (rendezvous); a step ends when its compute and its exchange have.
//    exposed = Σ over hops max(0, hop − the busiest rank's compute of that step) + backward's
//    last dK/dV hop home; wait = the worst rank's simulated waits (imbalance waits included,
//    what `kiln bench cp` calls exposed).
//  * Ulysses: the all-to-alls kiln runs (forward q, k, v in; out, lse back; backward dout, q, k,
//    v, out, lse in; dq, dk, dv back) at the fastest all-to-all of comm_model, all exposed.
//  * memory: q, k, v, out, dout, dq, dk, dv and lse local, plus the larger pass's buffers: ring
//    K/V blocks in flight (2 forward; 5 backward: two K/V, this block's dK/dV, the one sent, the
//    one received) and partials; Ulysses' head-sharded copies and all-to-all buffers.
// Errors: C not dividing T (by 2C for zig-zag), heads not dividing by U, C past the topology,
// no rate.
Expected<CpPrediction> predict_cp_layer(const Topology& t, const CpAttentionShape& s, int64_t seq,
                                        const CpPlanOptions& o);

// This CPU's attention kernels (cpu::attention_forward / _backward, the process's threads) on one
// block of `block`'s shape, in FLOPs per second of attention_*_cost: the best of `reps` timed
// calls after one untimed. For `kiln plan cp --check` (the rates kiln's ring blocks run at).
struct AttentionRate {
  double forward_flops_per_s = 0, backward_flops_per_s = 0;
};
AttentionRate measure_attention_rate(const AttentionParams& block, int reps = 2);

}  // namespace kiln::perf
