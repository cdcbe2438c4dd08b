// Tensor parallelism on paper. (1) The collectives one training step of kiln's model code
// runs (Transformer::Tp in transformer.cpp), as a formula that `kiln bench tp` and
// tests/parallel hold against take_tp_traffic(). (2) A per-layer prediction of Megatron-style
// tensor parallelism on the modelled topologies of comm_model.h for `kiln plan tp`: GEMM time
// at the device's peak beside the blocking TP collectives, with the same collective counts.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/core/status.h"
#include "kiln/model/checkpoint_mode.h"
#include "kiln/model/config.h"
#include "kiln/model/transformer.h"
#include "kiln/perf/comm_model.h"

namespace kiln::perf {

// How many collectives of one pass each move a whole (N, d_model) buffer of the N token rows.
struct TpCollectives {
  int64_t all_reduce = 0, all_gather = 0, reduce_scatter = 0;
};

// One transformer block. Without sequence parallelism (Megatron's g and f): forward all-reduces
// the two row-parallel outputs (attention's o / c_proj, the MLP's down / c_proj), backward the
// two column-parallel input gradients (before each norm's backward). With it, forward gathers
// the two norm outputs entering the column-parallel Linears and reduce-scatters the two
// row-parallel outputs; backward gathers dy for the two row-parallel backwards, gathers the two
// norm outputs again for the column-parallel weight gradients (they are kept as N / tp rows,
// not whole), and reduce-scatters the two column-parallel input gradients.
TpCollectives tp_block_collectives(Pass pass, bool sp);

// Outside the blocks. Forward: the vocab-parallel embedding's partial lookups summed
// (all-reduce; SP: reduce-scatter), and with SP the final norm's rows gathered for the LM head.
// Backward: the head's input gradient, a partial sum over vocabulary shards (all-reduce; SP:
// reduce-scatter), and with SP dy gathered for the embedding's gradient.
TpCollectives tp_edge_collectives(Pass pass, bool sp);

// What take_tp_traffic() reports after one training forward + backward of `rows` token rows
// (this rank's batch × seq_len) at `tp` ranks: the counts above over the n_layers blocks, each
// buffer rows × d_model fp32 floats; the vocab-parallel cross-entropy's row max and (sum of
// exp, target logit), 3 × rows floats; kFull checkpointing re-runs the forward of blocks
// 0 .. L-2 inside backward (the last block's buffers still hold its forward), kSelective only
// the attention core (no collectives). Zeros at tp = 1; seconds is not predicted (0).
TensorParallelTraffic tp_traffic_formula(const ModelConfig& c, int tp, bool sp, int64_t rows,
                                         CheckpointMode ckpt = CheckpointMode::kNone);

// ---- kiln plan tp ----------------------------------------------------------------------------
// One GPT-2 / Megatron block over batch × seq tokens.
struct TpLayerShape {
  int64_t d_model = 3072, n_heads = 32, ffn = 4 * 3072, seq = 1024, batch = 8;
};

// Matmul FLOPs of one block's forward (2 per multiply-add): QKV 6·B·T·h², attention output
// 2·B·T·h², MLP 4·B·T·h·ffn (24·B·T·h² in all at ffn = 4h), and attention's QKᵀ and AV,
// 4·B·T²·h (all heads, the causal half not skipped, as Megatron's count).
double block_forward_flops(const TpLayerShape& s);

struct TpPlanOptions {
  bool sp = false;
  bool recompute = false;          // full activation recomputation: the forward runs twice
  double bytes_per_element = 2;    // the activations' dtype on the wire (bf16 / fp16)
  double flops_per_s = 0;          // one device's dense matmul peak
  double gemm_efficiency = 1;      // the fraction of that peak the GEMMs reach
};

struct TpLayerPrediction {
  int tp = 1;
  double gemm_s = 0;      // one rank's matmuls of the block, forward + backward (1 / tp of them)
  double comm_s = 0;      // its TP collectives, on the critical path (not overlapped)
  double efficiency = 1;  // gemm_s / (gemm_s + comm_s): per-rank FLOP rate over the peak's
  std::string algos;      // the fastest modelled algorithm of each collective used
};

// Errors name the flag-level cause: tp not dividing heads or ffn, tp past the topology, no peak.
Expected<TpLayerPrediction> predict_tp_layer(const Topology& t, const TpLayerShape& s, int tp,
                                             const TpPlanOptions& o);

}  // namespace kiln::perf
