// Context parallelism's per-layer prediction (cp_model.h): block counts from the runtime's
// layouts, an event simulation of the ring's double-buffered exchanges, Ulysses' all-to-alls
// priced by comm_model.
#include "kiln/perf/cp_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <vector>

#include "kiln/core/rng.h"

namespace kiln::perf {
namespace {

using parallel::BlockKind;
using parallel::LayoutKind;
using parallel::SequenceLayout;
using parallel::SequenceSegment;

constexpr double kLseBytes = 4;  // logsumexps stay fp32 (one per query row and head)

// Seconds of each ring rank's attention kernels at each ring step: [rank][step].
using StepTimes = std::vector<std::vector<double>>;

// Ring rank `rank` at step s computes its query segments against the key segments of rank
// (rank − s) mod R: the same pairs for_each_block visits in ring_attention.cpp.
void ring_compute(const SequenceLayout& layout, const CpAttentionShape& s, int64_t heads, int64_t kv_heads,
                  double fwd_rate, double bwd_rate, StepTimes& fwd, StepTimes& bwd) {
  const int r = layout.num_ranks();
  fwd.assign(r, std::vector<double>(r, 0.0));
  bwd = fwd;
  for (int rank = 0; rank < r; ++rank)
    for (int step = 0; step < r; ++step) {
      const int src = (rank - step + r) % r;
      for (const SequenceSegment& q : layout.segments(rank))
        for (const SequenceSegment& k : layout.segments(src)) {
          const BlockKind kind = parallel::block_kind(q, k, s.causal);
          if (kind == BlockKind::kSkip) continue;
          AttentionParams p;
          p.batch = s.batch, p.q_len = q.len, p.kv_len = k.len, p.n_heads = heads, p.n_kv_heads = kv_heads;
          p.head_dim = s.head_dim, p.causal = kind == BlockKind::kDiagonal;
          fwd[rank][step] += attention_forward_cost(p).flops / fwd_rate;
          bwd[rank][step] += attention_backward_cost(p).flops / bwd_rate;
        }
    }
}

struct RingRun {
  double makespan = 0;  // the last rank's end
  double max_wait = 0;  // the worst rank's time blocked on exchanges
};

// Each rank posts an exchange with both neighbours at a step's start (hops[step] seconds once
// both sides have posted; < 0: none), computes, then waits for it; `final_hop` (< 0: none) is
// one more exchange after the last step (backward's dK/dV going home).
RingRun simulate_ring(const StepTimes& comp, const std::vector<double>& hops, double final_hop) {
  const int r = static_cast<int>(comp.size());
  std::vector<double> start(r, 0.0), wait(r, 0.0), next(r);
  auto advance = [&](double hop, auto&& compute_of) {
    for (int i = 0; i < r; ++i) {
      const double end = start[i] + compute_of(i);
      double done = end;
      if (hop >= 0 && r > 1)
        done = std::max({start[i], start[(i + r - 1) % r], start[(i + 1) % r]}) + hop;
      next[i] = std::max(end, done);
      wait[i] += next[i] - end;
    }
    start = next;
  };
  for (size_t step = 0; step < hops.size(); ++step) advance(hops[step], [&](int i) { return comp[i][step]; });
  if (final_hop >= 0) advance(final_hop, [](int) { return 0.0; });
  return {*std::max_element(start.begin(), start.end()), *std::max_element(wait.begin(), wait.end())};
}

// The busiest rank's compute at each step.
double busiest_at(const StepTimes& comp, size_t step) {
  double m = 0;
  for (const auto& rank : comp) m = std::max(m, rank[step]);
  return m;
}

// The link one ring hop crosses: NVLink while the whole group fits in a node, else the slowest
// hop (the GPU's NIC); on a torus one link between neighbours.
LinkSpec ring_link(const Topology& t, int c) {
  if (t.kind == TopologyKind::kTorus) return t.torus_link;
  return c <= t.ranks_per_node ? t.intra : t.inter;
}

double hop_seconds(const LinkSpec& l, double bytes) { return l.latency_s + bytes / l.bw_bytes_per_s; }

Expected<CommPrediction> fastest_all_to_all(const Topology& t, int u, double send_bytes) {
  KILN_ASSIGN_OR_RETURN(const std::vector<CommPrediction> v, predict_comm(t, ModelOp::kAllToAll, u, send_bytes));
  return *std::min_element(v.begin(), v.end(),
                           [](const CommPrediction& a, const CommPrediction& b) { return a.seconds < b.seconds; });
}

}  // namespace

std::string_view cp_method_name(CpMethod m) {
  switch (m) {
    case CpMethod::kRing: return "ring";
    case CpMethod::kUlysses: return "ulysses";
    case CpMethod::kHybrid: return "hybrid";
  }
  return "?";
}

Expected<CpMethod> parse_cp_method(std::string_view name) {
  if (name == "ring") return CpMethod::kRing;
  if (name == "ulysses") return CpMethod::kUlysses;
  if (name == "hybrid") return CpMethod::kHybrid;
  return invalid_argument("[plan cp] unknown method '{}' (ring, ulysses, hybrid)", name);
}

Status check_cp_heads(const CpAttentionShape& s, const CpPlanOptions& o) {
  if (o.method == CpMethod::kRing) return {};
  const int u = o.method == CpMethod::kUlysses ? o.cp : o.ulysses;
  if (s.heads % u != 0 || s.kv_heads % u != 0)
    return invalid_argument("[plan cp] {}: {} heads and {} KV heads must both divide by the {} Ulysses ranks; use "
                            "ring attention (any head count){}",
                            cp_method_name(o.method), s.heads, s.kv_heads, u,
                            o.method == CpMethod::kUlysses ? " or the hybrid with a Ulysses group that divides them"
                                                           : " or a smaller Ulysses group");
  return {};
}

Expected<CpPrediction> predict_cp_layer(const Topology& t, const CpAttentionShape& s, int64_t seq,
                                        const CpPlanOptions& o) {
  const int c = o.cp;
  if (c < 1 || c > t.max_ranks)
    return invalid_argument("[plan cp] topology {} takes 1..{} ranks, C is {}", t.name, t.max_ranks, c);
  if (s.heads < 1 || s.kv_heads < 1 || s.heads % s.kv_heads != 0 || s.head_dim < 1 || s.batch < 1)
    return invalid_argument("[plan cp] {} heads, {} KV heads (dividing the heads), head dim {}, batch {}: all >= 1",
                            s.heads, s.kv_heads, s.head_dim, s.batch);
  if (!(o.forward_flops_per_s > 0) || o.backward_flops_per_s < 0)
    return invalid_argument("[plan cp] topology {} names no device peak: give --tflops", t.name);
  const int u = o.method == CpMethod::kRing ? 1 : o.method == CpMethod::kUlysses ? c : o.ulysses;
  if (u < 1 || c % u != 0 || (o.method == CpMethod::kHybrid && (u < 2 || u == c)))
    return invalid_argument("[plan cp] hybrid: the Ulysses group {} must divide C = {} and lie in 2..C/2", u, c);
  KILN_RETURN_IF_ERROR(check_cp_heads(s, o));
  const int r = c / u;
  // Ulysses alone runs the local kernel on the whole sequence (one contiguous "ring" of one).
  const LayoutKind kind = r == 1 ? LayoutKind::kContiguous : o.layout;
  auto ring_layout = SequenceLayout::create(kind, seq, r);
  if (!ring_layout.ok() || seq % c != 0)
    return invalid_argument("[plan cp] T = {} must divide by C = {}{}", seq, c,
                            kind == LayoutKind::kZigzag ? fmt::format(" and by 2 x {} ring ranks (zig-zag)", r) : "");
  // Hybrid groups are consecutive ranks: each ring shard splits in U parts, so T/R divides by U.
  if (ring_layout->local_len() % u != 0)
    return invalid_argument("[plan cp] T/R = {} must divide by the {} Ulysses ranks", ring_layout->local_len(), u);

  CpPrediction p;
  p.ulysses = u, p.ring = r;
  const double b = o.bytes_per_element, B = static_cast<double>(s.batch), D = static_cast<double>(s.head_dim);
  const double H = static_cast<double>(s.heads), Hkv = static_cast<double>(s.kv_heads);
  const double Hu = H / u, Hkvu = Hkv / u;
  const double tl = static_cast<double>(seq / c);           // local rows
  const double n = static_cast<double>(ring_layout->local_len());  // the ring's rows (T / R)
  const double seg = static_cast<double>(ring_layout->segments(0)[0].len);

  // ---- compute -------------------------------------------------------------------------------
  const double bwd_rate = o.backward_flops_per_s > 0 ? o.backward_flops_per_s : o.forward_flops_per_s;
  StepTimes fwd, bwd;
  ring_compute(*ring_layout, s, s.heads / u, s.kv_heads / u, o.forward_flops_per_s, bwd_rate, fwd, bwd);
  double sum = 0, min_total = std::numeric_limits<double>::infinity(), max_total = 0;
  for (int i = 0; i < r; ++i) {
    double f = 0, g = 0;
    for (int step = 0; step < r; ++step) f += fwd[i][step], g += bwd[i][step];
    p.fwd_compute_s = std::max(p.fwd_compute_s, f);
    p.bwd_compute_s = std::max(p.bwd_compute_s, g);
    sum += f + g, min_total = std::min(min_total, f + g), max_total = std::max(max_total, f + g);
  }
  p.mean_compute_s = sum / r;
  p.min_compute_s = min_total;
  p.imbalance = max_total / p.mean_compute_s;

  // ---- ring ----------------------------------------------------------------------------------
  const double kv2 = 2 * B * n * Hkvu * D * b;  // (K | V) or (dK | dV) of one block
  std::vector<double> hops_f(r, -1.0), hops_b(r, -1.0);
  double final_hop = -1;
  if (r > 1) {
    const LinkSpec link = ring_link(t, c);
    p.ring_hop_bytes_fwd = kv2;
    p.ring_hop_bytes_bwd = 2 * kv2;
    for (int step = 0; step < r; ++step) {
      if (step + 1 < r) hops_f[step] = hop_seconds(link, kv2);
      const double bytes = (step + 1 < r ? kv2 : 0) + (step > 0 ? kv2 : 0);
      hops_b[step] = hop_seconds(link, bytes);
    }
    final_hop = hop_seconds(link, kv2);
    p.bytes_sent += kv2 * (r - 1) + kv2 * (2 * r - 1);  // K/V: R−1 hops each pass; dK/dV: R
    for (int step = 0; step < r; ++step) {
      if (hops_f[step] >= 0) p.comm_s += hops_f[step], p.exposed_s += std::max(0.0, hops_f[step] - busiest_at(fwd, step));
      p.comm_s += hops_b[step];
      p.exposed_s += std::max(0.0, hops_b[step] - busiest_at(bwd, step));
    }
    p.comm_s += final_hop;
    p.exposed_s += final_hop;
    p.comm_note = fmt::format("ring hop {:.0f} GB/s", link.bw_bytes_per_s / 1e9);
  }
  const RingRun run_f = simulate_ring(fwd, hops_f, -1), run_b = simulate_ring(bwd, hops_b, final_hop);
  p.wait_s = run_f.max_wait + run_b.max_wait;
  p.layer_s = run_f.makespan + run_b.makespan;

  // ---- Ulysses' all-to-alls: send buffers per rank (the receive buffers are the same size) ----
  double uly_fwd_bytes = 0, uly_bwd_bytes = 0;
  if (o.method != CpMethod::kRing) {
    const double rows = B * tl;
    const double fwd_in = rows * (H + 2 * Hkv) * D * b, fwd_out = rows * (H * D * b + H * kLseBytes);
    const double bwd_in = rows * ((3 * H + 2 * Hkv) * D * b + H * kLseBytes), bwd_out = rows * (H + 2 * Hkv) * D * b;
    p.a2a_bytes_fwd = fwd_in + fwd_out;
    p.a2a_bytes_bwd = bwd_in + bwd_out;
    p.bytes_sent += (p.a2a_bytes_fwd + p.a2a_bytes_bwd) * (u - 1) / u;
    if (u > 1) {
      std::string algos;
      for (const double bytes : {fwd_in, fwd_out, bwd_in, bwd_out}) {
        KILN_ASSIGN_OR_RETURN(const CommPrediction a, fastest_all_to_all(t, u, bytes));
        p.comm_s += a.seconds, p.exposed_s += a.seconds, p.wait_s += a.seconds, p.layer_s += a.seconds;
        if (algos.find(a.algo) == std::string::npos) algos += (algos.empty() ? "" : ",") + a.algo;
      }
      p.comm_note = (p.comm_note.empty() ? "" : p.comm_note + "; ") + "alltoall:" + algos;
    }
    // Head-sharded copies of every tensor a pass touches, and the all-to-all buffers (send + recv).
    uly_fwd_bytes = B * n * (2 * Hu * D * b + 2 * Hkvu * D * b + Hu * kLseBytes) + 2 * std::max(fwd_in, fwd_out);
    uly_bwd_bytes = B * n * (4 * Hu * D * b + 4 * Hkvu * D * b + Hu * kLseBytes) + 2 * std::max(bwd_in, bwd_out);
  }

  // ---- memory --------------------------------------------------------------------------------
  const double io = B * tl * (4 * H * D * b + 4 * Hkv * D * b + H * kLseBytes);
  double ring_fwd = 0, ring_bwd = 0;
  if (o.method != CpMethod::kUlysses) {  // Ulysses alone runs the local kernel: no ring buffers
    ring_fwd = kv2 * (r > 1 ? 2 : 1) + B * n * Hu * kLseBytes + seg * Hu * (D * b + kLseBytes);
    ring_bwd = kv2 * (r > 1 ? 5 : 2) + B * n * Hu * kLseBytes + seg * (Hu + 2 * Hkvu) * D * b;
  }
  p.memory_bytes = io + std::max(uly_fwd_bytes + ring_fwd, uly_bwd_bytes + ring_bwd);
  return p;
}

AttentionRate measure_attention_rate(const AttentionParams& block, int reps) {
  const AttentionParams p = check_attention(block).value();
  const size_t qn = p.batch * p.q_len * p.n_heads * p.head_dim, kvn = p.batch * p.kv_len * p.n_kv_heads * p.head_dim;
  std::vector<float> q(qn), k(kvn), v(kvn), out(qn), dout(qn), lse(p.batch * p.n_heads * p.q_len), dq(qn), dk(kvn),
      dv(kvn);
  Rng rng(11);
  rng.fill_normal(q), rng.fill_normal(k), rng.fill_normal(v), rng.fill_normal(dout);
  auto best_of = [&](auto&& fn) {
    fn();  // first touch
    double best = std::numeric_limits<double>::infinity();
    for (int i = 0; i < std::max(reps, 1); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  const double f = best_of([&] { cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p); });
  const double g = best_of([&] {
    cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                            lse.data(), p);
  });
  return {attention_forward_cost(p).flops / f, attention_backward_cost(p).flops / g};
}

}  // namespace kiln::perf
