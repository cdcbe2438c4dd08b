// The mixture-of-experts MLP of a Llama-family block (HF Mixtral's math and names), forward and
// backward, one code path from one process to expert parallelism:
//
//   router   logits z = x Wgᵀ (N, E) in fp32, p = softmax(z), each token's top-k experts by p,
//            gates = those k probabilities renormalized to sum 1 (Mixtral);
//   dispatch the kept (token, expert) assignments sorted by expert (then token): capacity mode
//            keeps at most C = ceil(CF · k · N / E) per expert in token order (the rest add
//            nothing: the token passes through the residual), dropless keeps them all; under
//            expert parallelism the rows go to the ranks holding their experts by a variable
//            all-to-all, in chunks whose transfers overlap the previous chunk's experts;
//   experts  SwiGLU MLPs w2(silu(w1 x) ⊙ w3 x) over ragged groups of rows, one grouped GEMM per
//            projection for all experts (kernels/grouped_gemm.h);
//   combine  y = residual + Σ_j gate_j · expert_j(x) + shared(x) (DeepSeek's shared experts,
//            always on, one fused MLP).
//
// The objective adds, per block, α · aux + β · z where aux = E · Σ_i f_i · P_i (Switch's
// load-balancing loss: f_i the fraction of the N · k assignments routed to expert i before any
// drop, P_i the mean router probability of expert i; 1 at perfect balance) and z = mean over
// tokens of logsumexp(z_t)² (ST-MoE's router z-loss); α and β are the config's coefficients
// over the number of MoE blocks (each term averaged over the blocks). HF's
// load_balancing_loss_func differs: it pools every layer's tokens before the product and its f
// sums to k (k times ours for one layer). The statistics (f, P, the token count) and the
// capacity's token order span the ExpertShard's batch group, so data-parallel ranks compute the
// single-process objective and drops; each rank's gradient is that of its rows' share.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kiln/model/transformer.h"

namespace kiln {

// What a MoE block's backward reads (saved by its forward), sized by the routing and grown as
// needed. "Sent" rows are this rank's kept assignments sorted by expert, then token; "expert"
// rows are the rows this rank's experts ran, grouped by local expert (the same rows in one
// process).
struct MoeActivations {
  int64_t tokens = 0;             // N of the forward
  std::vector<float> probs;       // (N, E) router softmax
  std::vector<float> lse;         // (N,) router logsumexp
  std::vector<int32_t> choice;    // (N, k) experts by descending probability
  std::vector<float> gates;       // (N, k) renormalized probabilities
  std::vector<int32_t> row;       // (N, k) the assignment's sent row; -1: dropped
  std::vector<int32_t> sent_token;  // (S,) token of each sent row
  std::vector<float> returned;    // (S, C) expert outputs of the sent rows (for the gates' gradient)
  std::vector<float> xin, h1, h3, act;  // expert rows: (R, C), (R, F) × 3
  // Per chunk: the chunk's first sent row, and per expert-row group the counts the experts ran.
  std::vector<int64_t> chunk_sent;      // (chunks + 1,)
  std::vector<int64_t> expert_rows;     // (chunks, E_local + 1) offsets of each local expert's rows
  // Expert parallelism: per chunk, the rows exchanged with each peer (recv_from (chunks, ep,
  // E_local): rows rank s sent for local expert e).
  std::vector<int64_t> recv_from;
  // Per chunk the all-to-all arguments in elements, [chunk][send counts, send displacements,
  // receive counts, receive displacements][ep]; the backward reuses them.
  std::vector<int64_t> a2a;
  std::vector<float> shared_h1, shared_h3, shared_act;  // (N, S·F)
  // The router losses' gradient: d(α · aux)/dp_ti = aux_dp[i] for every token, and
  // d(β · z)/dz_ti = z_dp · lse_t · p_ti (from the batch group's statistics).
  std::vector<float> aux_dp;  // (E,)
  float z_dp = 0;
  int64_t bytes() const;
};

// The MoE MLP of one block. The weights are the model's (flat buffer slices, set by the
// Transformer); w1/w2/w3 hold this rank's experts only.
struct MoeBlock {
  int64_t d_model = 0, d_ff = 0, num_experts = 0, top_k = 0, shared_ff = 0;
  double capacity_factor = 0;
  float aux_coef = 0, z_coef = 0;  // the config's coefficients over the number of MoE blocks
  ExpertShard ep;
  Linear router;                   // (E, C)
  std::vector<Linear> w1, w2, w3;  // local experts: gate (F, C), down (C, F), up (F, C)
  Linear shared_gate, shared_up, shared_down;  // w null: no shared experts

  int64_t local_experts() const { return num_experts / ep.size; }
  int64_t first_expert() const { return ep.rank * local_experts(); }
  // y (N, C) = residual + the MoE MLP of x (N, C); saves into `a`, adds the routing to `stats`.
  // Without stats (decoding through a KV cache, serving) the block is dropless and local: no
  // capacity, no batch-group statistics.
  void forward(float* y, const float* x, int64_t N, const float* residual, MoeActivations& a, MoeStats* stats) const;
  // dx (N, C) = (or += when accumulate) the gradient of x from dy (N, C) and the router losses;
  // the weight gradients accumulate. x is the forward's input.
  void backward(float* dx, const float* dy, const float* x, int64_t N, MoeActivations& a, bool accumulate,
                MoeStats& stats) const;

 private:
  // The sent rows of x to the expert rows (one process: the same rows; expert parallelism: the
  // all-to-alls, chunk by chunk), the experts, and their outputs back into a.returned.
  void dispatch_forward(const float* x, const std::vector<int64_t>& chunk_counts, MoeActivations& a,
                        MoeStats* stats) const;
  // The sent rows' output gradients dsent (S, C) through the same exchange and the experts'
  // backward, to the sent rows' input gradients dsent_in (S, C); the weight gradients accumulate.
  void dispatch_backward(const float* dsent, float* dsent_in, MoeActivations& a, MoeStats& stats) const;
  // The experts over expert rows [off[0], off[E_local]) (off: each local expert's first row).
  void experts_forward(const int64_t* off, MoeActivations& a, float* out) const;
  void experts_backward(const int64_t* off, const float* dout, float* dxin, MoeActivations& a) const;
  // Reused buffers of the exchange and the backward (not saved between forward and backward).
  mutable std::vector<float> send_, recv_, out_, back_, dact_, dh1_, dh3_;
};

}  // namespace kiln
