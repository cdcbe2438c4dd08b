// The MoE MLP (moe.h): routing, capacity, dispatch and combine, the experts' grouped GEMMs and
// the router losses, forward and backward.
#include "kiln/model/moe.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kiln/comm/collectives.h"
#include "kiln/comm/communicator.h"
#include "kiln/comm/work.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/activation.h"
#include "kiln/kernels/gemm.h"
#include "kiln/kernels/grouped_gemm.h"

namespace kiln {

namespace {
template <class T>
int64_t vec_bytes(const std::vector<T>& v) {
  return static_cast<int64_t>(v.capacity() * sizeof(T));
}

template <class T>
void grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

// One grouped GEMM over the local experts, expert e on its rows [off[e], off[e + 1]) of the
// expert-row buffers (kernels/grouped_gemm.h: the ragged groups' tiles in one parallel region):
//   kForward: out = Y_e (m_e, out) = X_e (m_e, in) · W_eᵀ, in = X
//   kInput:   out = dX_e (m_e, in) (+)= dY_e (m_e, out) · W_e, in = dY
//   kWeight:  dW_e (out, in) += dY_eᵀ · X_e, in = dY, in2 = X (out unused)
enum class ExpertGemm { kForward, kInput, kWeight };
void expert_gemm(ExpertGemm kind, const std::vector<Linear>& experts, const int64_t* off, float* out, const float* in,
                 const float* in2 = nullptr, bool accumulate = false) {
  std::vector<GemmGroup> groups(experts.size());
  for (size_t e = 0; e < experts.size(); ++e) {
    const Linear& l = experts[e];
    const int64_t r0 = off[e], m = off[e + 1] - off[e];
    GemmGroup& g = groups[e];
    switch (kind) {
      case ExpertGemm::kForward:
        g = {m, l.out, l.in, in + r0 * l.in, l.in, l.w, l.in, out + r0 * l.out, l.out};
        break;
      case ExpertGemm::kInput:
        g = {m, l.in, l.out, in + r0 * l.out, l.out, l.w, l.in, out + r0 * l.in, l.in};
        break;
      case ExpertGemm::kWeight:
        g = {l.out, l.in, m, in + r0 * l.out, l.out, in2 + r0 * l.in, l.in, l.dw, l.in};
        break;
    }
  }
  GroupedGemmParams p;
  p.groups = groups;
  p.trans_a = kind == ExpertGemm::kWeight;
  p.trans_b = kind == ExpertGemm::kForward;
  p.beta = kind == ExpertGemm::kWeight || accumulate ? 1.0f : 0.0f;
  cpu::grouped_gemm(p);
}

// Sums over the batch group (MPI's own all-reduce: a few doubles per block).
void sum_over_batch(comm::Communicator* batch, std::vector<double>& v) {
  if (batch == nullptr || batch->size() == 1) return;
  const int rc = MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_SUM, batch->handle());
  if (rc != MPI_SUCCESS) fatal(__FILE__, __LINE__, "MoE routing statistics: MPI_Allreduce failed");
}

// Per expert, the assignments of the batch group's earlier data ranks (the capacity's token order).
std::vector<int64_t> earlier_ranks_counts(comm::Communicator* batch, const std::vector<int64_t>& counts) {
  std::vector<int64_t> before(counts.size(), 0);
  if (batch == nullptr || batch->size() == 1) return before;
  const int rc = MPI_Exscan(counts.data(), before.data(), static_cast<int>(counts.size()), MPI_INT64_T, MPI_SUM,
                            batch->handle());
  if (rc != MPI_SUCCESS) fatal(__FILE__, __LINE__, "MoE capacity: MPI_Exscan failed");
  if (batch->rank() == 0) std::fill(before.begin(), before.end(), 0);  // MPI leaves rank 0's undefined
  return before;
}
}  // namespace

int64_t MoeActivations::bytes() const {
  return vec_bytes(probs) + vec_bytes(lse) + vec_bytes(choice) + vec_bytes(gates) + vec_bytes(row) +
         vec_bytes(sent_token) + vec_bytes(returned) + vec_bytes(xin) + vec_bytes(h1) + vec_bytes(h3) +
         vec_bytes(act) + vec_bytes(chunk_sent) + vec_bytes(expert_rows) + vec_bytes(recv_from) + vec_bytes(a2a) +
         vec_bytes(shared_h1) + vec_bytes(shared_h3) + vec_bytes(shared_act) + vec_bytes(aux_dp);
}

double MoeStats::max_over_mean() const {
  if (tokens_per_expert.empty() || blocks == 0) return 0.0;
  const int64_t E = static_cast<int64_t>(tokens_per_expert.size()) / blocks;
  double worst = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const auto first = tokens_per_expert.begin() + b * E;
    const double mean = static_cast<double>(std::accumulate(first, first + E, int64_t{0})) / static_cast<double>(E);
    if (mean > 0) worst = std::max(worst, static_cast<double>(*std::max_element(first, first + E)) / mean);
  }
  return worst;
}

void MoeStats::add(const MoeStats& o) {
  blocks += o.blocks;
  aux += o.aux;
  z += o.z;
  assignments += o.assignments;
  dropped += o.dropped;
  tokens_per_expert.insert(tokens_per_expert.end(), o.tokens_per_expert.begin(), o.tokens_per_expert.end());
  all_to_all_bytes += o.all_to_all_bytes;
  all_to_all_seconds += o.all_to_all_seconds;
  exposed_seconds += o.exposed_seconds;
}

void MoeBlock::forward(float* y, const float* x, int64_t N, const float* residual, MoeActivations& a,
                       MoeStats* stats) const {
  const int64_t C = d_model, E = num_experts, K = top_k;
  a.tokens = N;
  grow(a.probs, N * E); grow(a.lse, N); grow(a.choice, N * K); grow(a.gates, N * K); grow(a.row, N * K);
  // Router: logits (fp32 GEMM), softmax and top-k per token, in place.
  router.forward_f32(a.probs.data(), x, N, nullptr);
  parallel_for(N, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* p = a.probs.data() + t * E;
      const float m = *std::max_element(p, p + E);
      double sum = 0;
      for (int64_t i = 0; i < E; ++i) sum += std::exp(static_cast<double>(p[i]) - m);
      const double lse = m + std::log(sum);
      a.lse[t] = static_cast<float>(lse);
      for (int64_t i = 0; i < E; ++i) p[i] = static_cast<float>(std::exp(static_cast<double>(p[i]) - lse));
      int32_t* ch = a.choice.data() + t * K;
      double kept = 0;
      for (int64_t j = 0; j < K; ++j) {  // the j-th largest probability (lowest index on ties)
        int32_t best = -1;
        for (int64_t i = 0; i < E; ++i) {
          if (std::find(ch, ch + j, static_cast<int32_t>(i)) != ch + j) continue;
          if (best < 0 || p[i] > p[best]) best = static_cast<int32_t>(i);
        }
        ch[j] = best;
        kept += p[best];
      }
      for (int64_t j = 0; j < K; ++j) a.gates[t * K + j] = static_cast<float>(p[ch[j]] / kept);
    }
  });
  // The batch group's statistics: assignments and probability sums per expert, Σ lse², tokens.
  std::vector<int64_t> counts(static_cast<size_t>(E), 0);
  std::vector<double> st(static_cast<size_t>(2 * E + 2), 0.0);
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t j = 0; j < K; ++j) ++counts[static_cast<size_t>(a.choice[t * K + j])];
    for (int64_t i = 0; i < E; ++i) st[static_cast<size_t>(E + i)] += a.probs[t * E + i];
    st[static_cast<size_t>(2 * E)] += static_cast<double>(a.lse[t]) * a.lse[t];
  }
  for (int64_t i = 0; i < E; ++i) st[static_cast<size_t>(i)] = static_cast<double>(counts[static_cast<size_t>(i)]);
  st[static_cast<size_t>(2 * E + 1)] = static_cast<double>(N);
  comm::Communicator* batch = stats ? ep.batch : nullptr;
  sum_over_batch(batch, st);
  const double Ng = st[static_cast<size_t>(2 * E + 1)];
  const double ranks = batch ? batch->size() : 1;  // each rank's gradient is its rows' share × ranks
  double aux = 0;
  grow(a.aux_dp, E);
  for (int64_t i = 0; i < E; ++i) {
    const double f = st[static_cast<size_t>(i)] / (Ng * K), P = st[static_cast<size_t>(E + i)] / Ng;
    aux += f * P;
    a.aux_dp[static_cast<size_t>(i)] = static_cast<float>(aux_coef * E * f * ranks / Ng);
  }
  aux *= static_cast<double>(E);
  a.z_dp = static_cast<float>(z_coef * 2.0 * ranks / Ng);
  // Capacity: each expert keeps its first C assignments in the batch group's token order (data
  // rank, token, then the token's choices in order).
  const int64_t capacity = capacity_factor > 0 && stats
                               ? static_cast<int64_t>(std::ceil(capacity_factor * static_cast<double>(K) * Ng / E))
                               : -1;
  std::vector<int64_t> seen = capacity >= 0 ? earlier_ranks_counts(batch, counts) : std::vector<int64_t>(E, 0);
  if (stats) {
    for (int64_t i = 0; i < E; ++i) {
      const auto g = static_cast<int64_t>(st[static_cast<size_t>(i)]);
      if (capacity >= 0) stats->dropped += std::max<int64_t>(0, g - capacity);
      stats->tokens_per_expert.push_back(g);
    }
    ++stats->blocks;
    stats->aux += aux;
    stats->z += st[static_cast<size_t>(2 * E)] / Ng;
    stats->assignments += static_cast<int64_t>(Ng) * K;
  }
  // Sent rows: per chunk of tokens, the kept assignments sorted by expert, then token.
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(ep.chunks, N));
  a.chunk_sent.assign(static_cast<size_t>(chunks + 1), 0);
  a.sent_token.clear();
  std::vector<int64_t> chunk_counts(static_cast<size_t>(chunks * E), 0);  // kept per (chunk, expert)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t t0 = c * N / chunks, t1 = (c + 1) * N / chunks;
    int64_t* cc = chunk_counts.data() + c * E;
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t j = 0; j < K; ++j) {
        const auto e = static_cast<size_t>(a.choice[t * K + j]);
        const bool keep = capacity < 0 || seen[e] < capacity;
        ++seen[e];
        a.row[t * K + j] = keep ? 0 : -1;
        if (keep) ++cc[e];
      }
    }
    std::vector<int64_t> next(static_cast<size_t>(E));  // the next sent row of each expert
    int64_t r = a.chunk_sent[static_cast<size_t>(c)];
    for (int64_t e = 0; e < E; ++e) {
      next[static_cast<size_t>(e)] = r;
      r += cc[e];
    }
    a.chunk_sent[static_cast<size_t>(c + 1)] = r;
    a.sent_token.resize(static_cast<size_t>(r));
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t j = 0; j < K; ++j) {
        if (a.row[t * K + j] < 0) continue;
        const int64_t at = next[static_cast<size_t>(a.choice[t * K + j])]++;
        a.row[t * K + j] = static_cast<int32_t>(at);
        a.sent_token[static_cast<size_t>(at)] = static_cast<int32_t>(t);
      }
    }
  }
  grow(a.returned, a.chunk_sent.back() * C);
  dispatch_forward(x, chunk_counts, a, stats);
  // Shared experts, then the gated sum of the routed ones.
  const float* base = residual;
  if (shared_gate.w != nullptr) {
    grow(a.shared_h1, N * shared_ff); grow(a.shared_h3, N * shared_ff); grow(a.shared_act, N * shared_ff);
    shared_gate.forward(a.shared_h1.data(), x, N);
    shared_up.forward(a.shared_h3.data(), x, N);
    cpu::swiglu_forward(a.shared_act.data(), a.shared_h1.data(), a.shared_h3.data(), N * shared_ff);
    shared_down.forward(y, a.shared_act.data(), N, residual);
    base = y;
  }
  parallel_for(N, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* out = y + t * C;
      if (base != y) std::memcpy(out, base + t * C, static_cast<size_t>(C) * sizeof(float));
      for (int64_t j = 0; j < K; ++j) {
        const int32_t r = a.row[t * K + j];
        if (r < 0) continue;
        const float g = a.gates[t * K + j];
        const float* e = a.returned.data() + int64_t{r} * C;
        for (int64_t i = 0; i < C; ++i) out[i] += g * e[i];
      }
    }
  });
}

namespace {
// A collective of the MoE exchange: its arguments are the layer's own, so a failure is a broken
// invariant (a dead peer ends the job in the communicator's wait).
void a2a_ok(const Status& s) {
  if (!s.ok()) fatal(__FILE__, __LINE__, "MoE all-to-all: " + s.to_string());
}

// Chunk c's rows as exchanged (source-major: each source's rows, by local expert) to or from the
// expert rows (expert-major: each local expert's rows, by source), `width` floats a row.
void permute_rows(const MoeActivations& a, int64_t c, int ep, int64_t El, const float* from, float* to, int64_t width,
                  bool to_expert_major) {
  const int64_t* rf = a.recv_from.data() + c * ep * El;       // (ep, El)
  const int64_t* off = a.expert_rows.data() + c * (El + 1);   // expert rows of chunk c
  int64_t src = off[0];
  std::vector<int64_t> at(off, off + El);  // the next expert row of each local expert
  for (int s = 0; s < ep; ++s) {
    for (int64_t e = 0; e < El; ++e) {
      const int64_t n = rf[s * El + e];
      if (n == 0) continue;  // an empty block (its buffers may be empty vectors: no pointer to pass)
      const float* f = to_expert_major ? from + src * width : from + at[static_cast<size_t>(e)] * width;
      float* t = to_expert_major ? to + at[static_cast<size_t>(e)] * width : to + src * width;
      std::memcpy(t, f, static_cast<size_t>(n * width) * sizeof(float));
      src += n;
      at[static_cast<size_t>(e)] += n;
    }
  }
}
}  // namespace

void MoeBlock::experts_forward(const int64_t* off, MoeActivations& a, float* out) const {
  const int64_t F = d_ff, El = local_experts(), r0 = off[0], rows = off[El] - off[0];
  expert_gemm(ExpertGemm::kForward, w1, off, a.h1.data(), a.xin.data());
  expert_gemm(ExpertGemm::kForward, w3, off, a.h3.data(), a.xin.data());
  cpu::swiglu_forward(a.act.data() + r0 * F, a.h1.data() + r0 * F, a.h3.data() + r0 * F, rows * F);
  expert_gemm(ExpertGemm::kForward, w2, off, out, a.act.data());
}

void MoeBlock::experts_backward(const int64_t* off, const float* dout, float* dxin, MoeActivations& a) const {
  const int64_t F = d_ff, El = local_experts(), r0 = off[0], rows = off[El] - off[0];
  expert_gemm(ExpertGemm::kInput, w2, off, dact_.data(), dout);
  expert_gemm(ExpertGemm::kWeight, w2, off, nullptr, dout, a.act.data());
  cpu::swiglu_backward(dh1_.data() + r0 * F, dh3_.data() + r0 * F, dact_.data() + r0 * F, a.h1.data() + r0 * F,
                       a.h3.data() + r0 * F, rows * F);
  expert_gemm(ExpertGemm::kInput, w1, off, dxin, dh1_.data());
  expert_gemm(ExpertGemm::kInput, w3, off, dxin, dh3_.data(), nullptr, true);
  expert_gemm(ExpertGemm::kWeight, w1, off, nullptr, dh1_.data(), a.xin.data());
  expert_gemm(ExpertGemm::kWeight, w3, off, nullptr, dh3_.data(), a.xin.data());
}

void MoeBlock::dispatch_forward(const float* x, const std::vector<int64_t>& chunk_counts, MoeActivations& a,
                                MoeStats* stats) const {
  const int64_t C = d_model, E = num_experts, F = d_ff, El = local_experts();
  const int64_t chunks = static_cast<int64_t>(a.chunk_sent.size()) - 1, S = a.chunk_sent.back();
  const int P = ep.size;
  // The sent rows of x (one process: they are the expert rows themselves).
  float* sent = P == 1 ? (grow(a.xin, S * C), a.xin.data()) : (grow(send_, S * C), send_.data());
  parallel_for(S, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      std::memcpy(sent + r * C, x + int64_t{a.sent_token[static_cast<size_t>(r)]} * C, static_cast<size_t>(C) * sizeof(float));
  });
  a.expert_rows.assign(static_cast<size_t>(chunks * (El + 1)), 0);
  if (P == 1) {
    for (int64_t c = 0; c < chunks; ++c) {
      int64_t* off = a.expert_rows.data() + c * (El + 1);
      off[0] = a.chunk_sent[static_cast<size_t>(c)];
      for (int64_t e = 0; e < El; ++e) off[e + 1] = off[e] + chunk_counts[static_cast<size_t>(c * E + e)];
    }
    grow(a.h1, S * F); grow(a.h3, S * F); grow(a.act, S * F);
    for (int64_t c = 0; c < chunks; ++c) experts_forward(a.expert_rows.data() + c * (El + 1), a, a.returned.data());
    return;
  }
  // Expert parallelism. The counts first: rank d gets, per chunk, how many rows of each of its
  // experts this rank sends (one all-to-all of chunks · E_local floats per peer: exact counts).
  comm::Communicator& comm = *ep.comm;
  const double t_counts = comm::now_seconds();
  std::vector<float> send_counts(static_cast<size_t>(P * chunks * El)), recv_counts(send_counts.size());
  for (int d = 0; d < P; ++d)
    for (int64_t c = 0; c < chunks; ++c)
      for (int64_t e = 0; e < El; ++e)
        send_counts[static_cast<size_t>((d * chunks + c) * El + e)] =
            static_cast<float>(chunk_counts[static_cast<size_t>(c * E + d * El + e)]);
  a2a_ok(comm::all_to_all(comm, send_counts.data(), recv_counts.data(), chunks * El, DType::kF32));
  const double counts_seconds = comm::now_seconds() - t_counts;
  a.recv_from.assign(static_cast<size_t>(chunks * P * El), 0);
  for (int s = 0; s < P; ++s)
    for (int64_t c = 0; c < chunks; ++c)
      for (int64_t e = 0; e < El; ++e)
        a.recv_from[static_cast<size_t>((c * P + s) * El + e)] =
            static_cast<int64_t>(recv_counts[static_cast<size_t>((s * chunks + c) * El + e)]);
  // Per chunk: the exchange's arguments (in floats) and the expert rows' layout.
  a.a2a.assign(static_cast<size_t>(chunks * 4 * P), 0);
  int64_t R = 0;  // expert rows so far
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t* sc = a.a2a.data() + c * 4 * P;
    int64_t *sd = sc + P, *rc = sc + 2 * P, *rd = sc + 3 * P;
    int64_t sent_row = a.chunk_sent[static_cast<size_t>(c)], recv_row = R;
    for (int d = 0; d < P; ++d) {
      int64_t n = 0, m = 0;
      for (int64_t e = 0; e < El; ++e) {
        n += chunk_counts[static_cast<size_t>(c * E + d * El + e)];
        m += a.recv_from[static_cast<size_t>((c * P + d) * El + e)];
      }
      sc[d] = n * C; sd[d] = sent_row * C; sent_row += n;
      rc[d] = m * C; rd[d] = recv_row * C; recv_row += m;
    }
    int64_t* off = a.expert_rows.data() + c * (El + 1);
    off[0] = R;
    for (int64_t e = 0; e < El; ++e) {
      int64_t n = 0;
      for (int s = 0; s < P; ++s) n += a.recv_from[static_cast<size_t>((c * P + s) * El + e)];
      off[e + 1] = off[e] + n;
    }
    R = recv_row;
  }
  grow(recv_, R * C); grow(a.xin, R * C); grow(a.h1, R * F); grow(a.h3, R * F); grow(a.act, R * F);
  grow(out_, R * C); grow(back_, R * C);
  // All chunks' dispatches are queued at once (they run in order on the communication thread);
  // chunk c's experts run as soon as its rows are in, while later chunks are still moving, and
  // each chunk's combine is queued as soon as its outputs are.
  auto args = [&](int64_t c) { return std::span<const int64_t>(a.a2a.data() + c * 4 * P, static_cast<size_t>(4 * P)); };
  std::vector<comm::Work> dispatch, combine;
  for (int64_t c = 0; c < chunks; ++c) {
    const auto g = args(c);
    dispatch.push_back(comm::all_to_all_v_async(comm, send_.data(), g.subspan(0, P), g.subspan(P, P), recv_.data(),
                                                g.subspan(2 * P, P), g.subspan(3 * P, P), DType::kF32));
  }
  double exposed = counts_seconds;
  for (int64_t c = 0; c < chunks; ++c) {
    const double t0 = comm::now_seconds();
    a2a_ok(dispatch[static_cast<size_t>(c)].wait());
    exposed += comm::now_seconds() - t0;
    permute_rows(a, c, P, El, recv_.data(), a.xin.data(), C, true);
    experts_forward(a.expert_rows.data() + c * (El + 1), a, out_.data());
    permute_rows(a, c, P, El, out_.data(), back_.data(), C, false);
    const auto g = args(c);
    combine.push_back(comm::all_to_all_v_async(comm, back_.data(), g.subspan(2 * P, P), g.subspan(3 * P, P),
                                               a.returned.data(), g.subspan(0, P), g.subspan(P, P), DType::kF32));
  }
  const double t0 = comm::now_seconds();
  for (const comm::Work& w : combine) a2a_ok(w.wait());
  exposed += comm::now_seconds() - t0;
  if (stats) {
    double busy = counts_seconds;
    for (const auto* works : {&dispatch, &combine})
      for (const comm::Work& w : *works) busy += w.end_seconds() - w.start_seconds();
    stats->all_to_all_seconds += busy;
    stats->exposed_seconds += exposed;
    stats->all_to_all_bytes += static_cast<int64_t>((send_counts.size() + 2 * S * C) * sizeof(float));
  }
}

void MoeBlock::dispatch_backward(const float* dsent, float* dsent_in, MoeActivations& a, MoeStats& stats) const {
  const int64_t C = d_model, F = d_ff, El = local_experts();
  const int64_t chunks = static_cast<int64_t>(a.chunk_sent.size()) - 1, S = a.chunk_sent.back();
  const int P = ep.size;
  const int64_t R = a.expert_rows[static_cast<size_t>(chunks * (El + 1) - 1)];
  grow(dact_, R * F); grow(dh1_, R * F); grow(dh3_, R * F);
  if (P == 1) {  // the sent rows are the expert rows
    for (int64_t c = 0; c < chunks; ++c)
      experts_backward(a.expert_rows.data() + c * (El + 1), dsent, dsent_in, a);
    return;
  }
  comm::Communicator& comm = *ep.comm;
  grow(recv_, R * C); grow(out_, R * C); grow(back_, R * C);
  float* dout = out_.data();   // expert-major output gradients
  float* dxin = recv_.data();  // expert-major input gradients (recv_ is free once permuted)
  std::vector<float> drecv(static_cast<size_t>(R * C));
  auto args = [&](int64_t c) { return std::span<const int64_t>(a.a2a.data() + c * 4 * P, static_cast<size_t>(4 * P)); };
  std::vector<comm::Work> dispatch, combine;
  for (int64_t c = 0; c < chunks; ++c) {
    const auto g = args(c);
    dispatch.push_back(comm::all_to_all_v_async(comm, dsent, g.subspan(0, P), g.subspan(P, P), drecv.data(),
                                                g.subspan(2 * P, P), g.subspan(3 * P, P), DType::kF32));
  }
  double exposed = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const double t0 = comm::now_seconds();
    a2a_ok(dispatch[static_cast<size_t>(c)].wait());
    exposed += comm::now_seconds() - t0;
    permute_rows(a, c, P, El, drecv.data(), dout, C, true);
    experts_backward(a.expert_rows.data() + c * (El + 1), dout, dxin, a);
    permute_rows(a, c, P, El, dxin, back_.data(), C, false);
    const auto g = args(c);
    combine.push_back(comm::all_to_all_v_async(comm, back_.data(), g.subspan(2 * P, P), g.subspan(3 * P, P), dsent_in,
                                               g.subspan(0, P), g.subspan(P, P), DType::kF32));
  }
  const double t0 = comm::now_seconds();
  for (const comm::Work& w : combine) a2a_ok(w.wait());
  exposed += comm::now_seconds() - t0;
  double busy = 0;
  for (const auto* works : {&dispatch, &combine})
    for (const comm::Work& w : *works) busy += w.end_seconds() - w.start_seconds();
  stats.all_to_all_seconds += busy;
  stats.exposed_seconds += exposed;
  stats.all_to_all_bytes += static_cast<int64_t>(2 * S * C * sizeof(float));
}

void MoeBlock::backward(float* dx, const float* dy, const float* x, int64_t N, MoeActivations& a, bool accumulate,
                        MoeStats& stats) const {
  KILN_CHECK_MSG(a.tokens == N, "MoE backward of {} tokens after a forward of {}", N, a.tokens);
  const int64_t C = d_model, E = num_experts, K = top_k, S = a.chunk_sent.back();
  // The gates' gradients and the sent rows' output gradients (gate · dy).
  std::vector<float> dgate(static_cast<size_t>(N * K), 0.0f), dsent(static_cast<size_t>(S * C));
  parallel_for(N, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* g = dy + t * C;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t r = a.row[t * K + j];
        if (r < 0) continue;
        const float* e = a.returned.data() + int64_t{r} * C;
        float* d = dsent.data() + int64_t{r} * C;
        double dot = 0;
        const float gate = a.gates[t * K + j];
        for (int64_t i = 0; i < C; ++i) {
          dot += static_cast<double>(g[i]) * e[i];
          d[i] = gate * g[i];
        }
        dgate[static_cast<size_t>(t * K + j)] = static_cast<float>(dot);
      }
    }
  });
  std::vector<float> dsent_in(static_cast<size_t>(S * C));  // the sent rows' input gradients
  dispatch_backward(dsent.data(), dsent_in.data(), a, stats);
  // Router: gates -> probabilities (+ the load-balancing loss) -> logits (+ the z-loss).
  std::vector<float> dlogits(static_cast<size_t>(N * E));
  parallel_for(N, 16, [&](int64_t t0, int64_t t1) {
    std::vector<double> dp(static_cast<size_t>(E));
    for (int64_t t = t0; t < t1; ++t) {
      const float* p = a.probs.data() + t * E;
      for (int64_t i = 0; i < E; ++i) dp[static_cast<size_t>(i)] = a.aux_dp[static_cast<size_t>(i)];
      // gate_j = p_j / s over the chosen: dp_m += (dgate_m − Σ_j dgate_j gate_j) / s.
      double s = 0, dot = 0;
      for (int64_t j = 0; j < K; ++j) {
        s += p[a.choice[t * K + j]];
        dot += static_cast<double>(dgate[static_cast<size_t>(t * K + j)]) * a.gates[t * K + j];
      }
      for (int64_t j = 0; j < K; ++j)
        dp[static_cast<size_t>(a.choice[t * K + j])] += (dgate[static_cast<size_t>(t * K + j)] - dot) / s;
      double pdp = 0;
      for (int64_t i = 0; i < E; ++i) pdp += p[i] * dp[static_cast<size_t>(i)];
      const double zg = static_cast<double>(a.z_dp) * a.lse[t];
      for (int64_t i = 0; i < E; ++i)
        dlogits[static_cast<size_t>(t * E + i)] = static_cast<float>(p[i] * (dp[static_cast<size_t>(i)] - pdp + zg));
    }
  });
  router.backward_f32(dx, dlogits.data(), x, N, accumulate);
  if (shared_gate.w != nullptr) {
    std::vector<float> dsa(static_cast<size_t>(N * shared_ff)), ds1(dsa.size()), ds3(dsa.size());
    shared_down.backward(dsa.data(), dy, a.shared_act.data(), N, false);
    cpu::swiglu_backward(ds1.data(), ds3.data(), dsa.data(), a.shared_h1.data(), a.shared_h3.data(), N * shared_ff);
    shared_gate.backward(dx, ds1.data(), x, N, true);
    shared_up.backward(dx, ds3.data(), x, N, true);
  }
  // The routed experts' input gradients back to their tokens, in slot order (deterministic).
  parallel_for(N, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* d = dx + t * C;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t r = a.row[t * K + j];
        if (r < 0) continue;
        const float* g = dsent_in.data() + int64_t{r} * C;
        for (int64_t i = 0; i < C; ++i) d[i] += g[i];
      }
    }
  });
}

}  // namespace kiln
