// Ring attention (context_parallel.h): Q rows stay, K/V blocks travel the ring; partial outputs
// merge through their logsumexps; in backward each block's dK/dV follows it one step behind.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "kiln/parallel/context_parallel_detail.h"

namespace kiln::parallel {

void CpStats::add(const CpStats& o) {
  compute_seconds += o.compute_seconds;
  comm_seconds += o.comm_seconds;
  exposed_seconds += o.exposed_seconds;
  bytes_sent += o.bytes_sent;
  peak_extra_bytes = std::max(peak_extra_bytes, o.peak_extra_bytes);
  blocks_computed += o.blocks_computed;
}

namespace detail {

Expected<AttentionParams> check_cp_params(const char* op, const SequenceLayout& layout, int ranks,
                                          const AttentionParams& local) {
  if (layout.num_ranks() != ranks)
    return invalid_argument("[{}] layout {} is over {} ranks, the communicator has {}", op, layout.describe(),
                            layout.num_ranks(), ranks);
  if (local.q_len != layout.local_len() || local.kv_len != layout.local_len())
    return invalid_argument("[{}] local q_len {} and kv_len {} must both be the layout's {} rows per rank ({})", op,
                            local.q_len, local.kv_len, layout.local_len(), layout.describe());
  if (local.window != 0)
    return invalid_argument("[{}] sliding window {} is not implemented for context parallelism", op, local.window);
  auto p = check_attention(local);
  if (!p.ok()) return invalid_argument("[{}] {}", op, p.status().message());
  return p;
}

comm::Work ring_exchange(comm::Communicator& comm, std::vector<RingMessage> messages, int to, int from,
                         CpStats& stats) {
  for (const RingMessage& m : messages) stats.bytes_sent += m.count * static_cast<int64_t>(sizeof(float));
  comm::Communicator* c = &comm;
  return comm.comm_thread().submit([c, messages = std::move(messages), to, from]() -> Status {
    std::vector<MPI_Request> reqs;
    for (const RingMessage& m : messages) {
      const size_t nbytes = static_cast<size_t>(m.count) * sizeof(float);
      reqs.push_back(c->irecv(m.recv, nbytes, from, m.tag));
      reqs.push_back(c->isend(m.send, nbytes, to, m.tag));
    }
    comm::wait_all_requests(static_cast<int>(reqs.size()), reqs.data());
    return {};
  });
}

}  // namespace detail

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The shapes of one ring call, from the checked params.
struct RingShape {
  int64_t batch, rows, heads, kv_heads, dim;
  int64_t kv_elems() const { return batch * rows * kv_heads * dim; }  // one of K or V, packed
  int64_t kv_row() const { return kv_heads * dim; }
  int64_t q_row() const { return heads * dim; }
};

RingShape shape_of(const AttentionParams& p) {
  return {p.batch, p.q_len, p.n_heads, p.n_kv_heads, p.head_dim};
}

// Local row offsets of a rank's segments.
std::vector<int64_t> segment_offsets(std::span<const SequenceSegment> segs) {
  std::vector<int64_t> at;
  int64_t o = 0;
  for (const SequenceSegment& s : segs) at.push_back(o), o += s.len;
  return at;
}

// The attention of one query segment (n rows) against one key segment (m rows), batch 1.
AttentionParams block_params(const AttentionParams& p, int64_t n, int64_t m, bool causal, int64_t q_stride,
                             int64_t kv_stride, int64_t o_stride) {
  AttentionParams b = p;
  b.batch = 1;
  b.q_len = n;
  b.kv_len = m;
  b.causal = causal;
  b.num_splits = 0;
  b.q_row_stride = q_stride;
  b.k_row_stride = b.v_row_stride = kv_stride;
  b.o_row_stride = o_stride;
  return b;
}

// (K | V) packed (B, rows, Hkv, D) each from strided k and v.
void pack_kv(float* kv, const float* k, const float* v, const AttentionParams& p, const RingShape& s) {
  for (int64_t r = 0; r < s.batch * s.rows; ++r) {
    std::memcpy(kv + r * s.kv_row(), k + r * p.k_row_stride, s.kv_row() * sizeof(float));
    std::memcpy(kv + s.kv_elems() + r * s.kv_row(), v + r * p.v_row_stride, s.kv_row() * sizeof(float));
  }
}

// Folds one partial result into the running one: out rows (n, H, D) of `stride`, acc_lse (H, n)
// against part (n, H, D) packed and part_lse (H, n).
void merge_partial(float* out, int64_t stride, float* acc_lse, const float* part, const float* part_lse, int64_t n,
                   int64_t heads, int64_t dim) {
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < n; ++t) {
      const float a = acc_lse[h * n + t], b = part_lse[h * n + t];
      const float m = std::max(a, b);
      if (m == kNegInf) continue;  // no key seen yet by this row
      const float lse = m + std::log(std::exp(a - m) + std::exp(b - m));
      const float wa = std::exp(a - lse), wb = std::exp(b - lse);
      float* o = out + t * stride + h * dim;
      const float* pr = part + (t * heads + h) * dim;
      for (int64_t d = 0; d < dim; ++d) o[d] = wa * o[d] + wb * pr[d];
      acc_lse[h * n + t] = lse;
    }
  }
}

// lse (B, H, rows) ↔ per-segment slabs (B, segment, H, n): the kernels read and write a
// query block's logsumexps as one contiguous (H, n).
void lse_to_segments(float* slabs, const float* lse, const RingShape& s, std::span<const SequenceSegment> segs,
                     bool to_slabs) {
  const std::vector<int64_t> at = segment_offsets(segs);
  float* slab = slabs;
  for (int64_t b = 0; b < s.batch; ++b)
    for (size_t i = 0; i < segs.size(); ++i) {
      const int64_t n = segs[i].len;
      for (int64_t h = 0; h < s.heads; ++h) {
        float* full = const_cast<float*>(lse) + (b * s.heads + h) * s.rows + at[i];
        if (to_slabs)
          std::memcpy(slab + h * n, full, n * sizeof(float));
        else
          std::memcpy(full, slab + h * n, n * sizeof(float));
      }
      slab += s.heads * n;
    }
}

// The (query segment, key segment) kernel calls of one ring step: fn(b, i, j, kind) for every
// pair that is not skipped.
template <class F>
void for_each_block(std::span<const SequenceSegment> qsegs, std::span<const SequenceSegment> ksegs,
                    const RingShape& s, bool causal, F&& fn) {
  for (int64_t b = 0; b < s.batch; ++b)
    for (size_t i = 0; i < qsegs.size(); ++i)
      for (size_t j = 0; j < ksegs.size(); ++j) {
        const BlockKind kind = block_kind(qsegs[i], ksegs[j], causal);
        if (kind != BlockKind::kSkip) fn(b, i, j, kind);
      }
}

// What both passes know about a call: checked params, shapes, this rank's query segments (a ring
// layout's segments all have seg_rows rows) and its ring neighbours.
struct RingCall {
  AttentionParams p;
  RingShape s;
  int c, rank, to, from;
  std::span<const SequenceSegment> qsegs;
  std::vector<int64_t> qat;
  int64_t seg_rows;
};

Expected<RingCall> ring_call(const char* op, comm::Communicator& comm, const SequenceLayout& layout,
                             const AttentionParams& local) {
  if (layout.ulysses_ranks() != 1)
    return invalid_argument("[{}] layout {} is a hybrid layout: call hybrid_attention_*", op, layout.describe());
  KILN_ASSIGN_OR_RETURN(const AttentionParams p, detail::check_cp_params(op, layout, comm.size(), local));
  const int c = comm.size(), rank = comm.rank();
  const auto qsegs = layout.segments(rank);
  return RingCall{p, shape_of(p), c, rank, (rank + 1) % c, (rank + c - 1) % c, qsegs, segment_offsets(qsegs),
                  qsegs[0].len};
}

}  // namespace

Status ring_attention_forward(comm::Communicator& comm, const SequenceLayout& layout, float* out, float* lse,
                              const float* q, const float* k, const float* v, const AttentionParams& local,
                              CpStats* stats) {
  KILN_ASSIGN_OR_RETURN(const RingCall call, ring_call("ring_attention_forward", comm, layout, local));
  // Named references, not a structured binding: the lambdas below capture them (clang 14 cannot
  // capture structured bindings).
  [[maybe_unused]] const AttentionParams& p = call.p;
  [[maybe_unused]] const RingShape& s = call.s;
  [[maybe_unused]] const int c = call.c, rank = call.rank, to = call.to, from = call.from;
  [[maybe_unused]] const std::span<const SequenceSegment> qsegs = call.qsegs;
  [[maybe_unused]] const std::vector<int64_t>& qat = call.qat;
  [[maybe_unused]] const int64_t seg_rows = call.seg_rows;
  CpStats mine;
  detail::CpClock clock(mine);

  std::vector<float> kv[2] = {std::vector<float>(2 * s.kv_elems()), std::vector<float>(c > 1 ? 2 * s.kv_elems() : 0)};
  std::vector<float> acc_lse(s.batch * s.heads * s.rows, kNegInf);  // (B, segment, H, n)
  std::vector<float> part(seg_rows * s.q_row()), part_lse(s.heads * seg_rows);
  const AttentionParams diag = block_params(p, seg_rows, seg_rows, true, p.q_row_stride, s.kv_row(), s.q_row());
  const AttentionParams full = block_params(p, seg_rows, seg_rows, false, p.q_row_stride, s.kv_row(), s.q_row());
  mine.peak_extra_bytes =
      static_cast<int64_t>((kv[0].size() + kv[1].size() + acc_lse.size() + part.size() + part_lse.size()) *
                           sizeof(float)) +
      cpu::attention_forward_scratch_bytes(full, attention_impl());

  clock.compute([&] {
    pack_kv(kv[0].data(), k, v, p, s);
    for (int64_t r = 0; r < s.batch * s.rows; ++r) std::fill_n(out + r * p.o_row_stride, s.q_row(), 0.0f);
  });
  Status st;
  for (int step = 0; step < c; ++step) {
    const int cur = step % 2, src = (rank - step + c) % c;
    comm::Work w;
    if (step + 1 < c)
      w = detail::ring_exchange(comm, {{kv[cur].data(), kv[1 - cur].data(), 2 * s.kv_elems(), detail::kTagCpKv}},
                                to, from, mine);
    const auto ksegs = layout.segments(src);
    const std::vector<int64_t> kat = segment_offsets(ksegs);
    clock.compute([&] {
      for_each_block(qsegs, ksegs, s, p.causal, [&](int64_t b, size_t i, size_t j, BlockKind kind) {
        const float* kb = kv[cur].data() + (b * s.rows + kat[j]) * s.kv_row();
        cpu::attention_forward(part.data(), part_lse.data(), q + (b * s.rows + qat[i]) * p.q_row_stride, kb,
                               kb + s.kv_elems(), kind == BlockKind::kDiagonal ? diag : full);
        merge_partial(out + (b * s.rows + qat[i]) * p.o_row_stride, p.o_row_stride,
                      acc_lse.data() + (b * qsegs.size() + i) * s.heads * seg_rows, part.data(), part_lse.data(),
                      seg_rows, s.heads, s.dim);
        ++mine.blocks_computed;
      });
    });
    if (step + 1 < c) {
      Status ws = clock.wait(w);
      if (st.ok()) st = ws;
    }
  }
  clock.compute([&] { lse_to_segments(acc_lse.data(), lse, s, qsegs, false); });
  if (stats) stats->add(mine);
  return st;
}

Status ring_attention_backward(comm::Communicator& comm, const SequenceLayout& layout, float* dq, float* dk,
                               float* dv, const float* dout, const float* q, const float* k, const float* v,
                               const float* out, const float* lse, const AttentionParams& local, CpStats* stats) {
  KILN_ASSIGN_OR_RETURN(const RingCall call, ring_call("ring_attention_backward", comm, layout, local));
  // Named references, not a structured binding: the lambdas below capture them (clang 14 cannot
  // capture structured bindings).
  [[maybe_unused]] const AttentionParams& p = call.p;
  [[maybe_unused]] const RingShape& s = call.s;
  [[maybe_unused]] const int c = call.c, rank = call.rank, to = call.to, from = call.from;
  [[maybe_unused]] const std::span<const SequenceSegment> qsegs = call.qsegs;
  [[maybe_unused]] const std::vector<int64_t>& qat = call.qat;
  [[maybe_unused]] const int64_t seg_rows = call.seg_rows;
  CpStats mine;
  detail::CpClock clock(mine);
  const int64_t kv2 = 2 * s.kv_elems();  // (K | V) or (dK | dV)

  // kv: the block computed on and the next one arriving. Gradients of the current block:
  // acc (this rank's contribution, then the total), sent (the previous block's total, on its
  // way to the next rank), in (the current block's partial from the previous rank).
  const size_t ring_n = c > 1 ? kv2 : 0;
  std::vector<float> kv[2] = {std::vector<float>(kv2), std::vector<float>(ring_n)};
  std::vector<float> acc(kv2), sent(kv2), in(ring_n);
  std::vector<float> lse_slabs(s.batch * s.heads * s.rows);
  std::vector<float> dq_part(seg_rows * p.q_row_stride), dk_part(seg_rows * s.kv_row()), dv_part(seg_rows * s.kv_row());
  const AttentionParams diag = block_params(p, seg_rows, seg_rows, true, p.q_row_stride, s.kv_row(), p.o_row_stride);
  const AttentionParams full = block_params(p, seg_rows, seg_rows, false, p.q_row_stride, s.kv_row(), p.o_row_stride);
  mine.peak_extra_bytes = static_cast<int64_t>((kv[0].size() + kv[1].size() + acc.size() + sent.size() + in.size() +
                                                lse_slabs.size() + dq_part.size() + dk_part.size() + dv_part.size()) *
                                               sizeof(float)) +
                          cpu::attention_backward_scratch_bytes(full, attention_impl());

  clock.compute([&] {
    pack_kv(kv[0].data(), k, v, p, s);
    lse_to_segments(lse_slabs.data(), lse, s, qsegs, true);
    for (int64_t r = 0; r < s.batch * s.rows; ++r) std::fill_n(dq + r * p.q_row_stride, s.q_row(), 0.0f);
  });
  Status st;
  auto wait = [&](const comm::Work& w) {
    Status ws = clock.wait(w);
    if (st.ok()) st = ws;
  };
  for (int step = 0; step < c; ++step) {
    const int cur = step % 2, src = (rank - step + c) % c;
    std::vector<detail::RingMessage> msgs;
    if (step + 1 < c) msgs.push_back({kv[cur].data(), kv[1 - cur].data(), kv2, detail::kTagCpKv});
    if (step > 0) msgs.push_back({sent.data(), in.data(), kv2, detail::kTagCpGrad});
    comm::Work w;
    if (!msgs.empty()) w = detail::ring_exchange(comm, std::move(msgs), to, from, mine);
    const auto ksegs = layout.segments(src);
    const std::vector<int64_t> kat = segment_offsets(ksegs);
    clock.compute([&] {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for_each_block(qsegs, ksegs, s, p.causal, [&](int64_t b, size_t i, size_t j, BlockKind kind) {
        const int64_t qrow = b * s.rows + qat[i], krow = b * s.rows + kat[j];
        const float* kb = kv[cur].data() + krow * s.kv_row();
        cpu::attention_backward(dq_part.data(), dk_part.data(), dv_part.data(), dout + qrow * p.o_row_stride,
                                q + qrow * p.q_row_stride, kb, kb + s.kv_elems(), out + qrow * p.o_row_stride,
                                lse_slabs.data() + (b * qsegs.size() + i) * s.heads * seg_rows,
                                kind == BlockKind::kDiagonal ? diag : full);
        for (int64_t t = 0; t < seg_rows; ++t) {
          float* d = dq + (qrow + t) * p.q_row_stride;
          const float* g = dq_part.data() + t * p.q_row_stride;
          for (int64_t e = 0; e < s.q_row(); ++e) d[e] += g[e];
        }
        float* ak = acc.data() + krow * s.kv_row();
        float* av = ak + s.kv_elems();
        for (int64_t e = 0; e < seg_rows * s.kv_row(); ++e) ak[e] += dk_part[e], av[e] += dv_part[e];
        ++mine.blocks_computed;
      });
    });
    if (step > 0 || step + 1 < c) wait(w);
    clock.compute([&] {
      if (step > 0)
        for (int64_t e = 0; e < kv2; ++e) acc[e] += in[e];
    });
    std::swap(acc, sent);  // sent: the total of block src, for the next rank
  }
  const float* home = sent.data();  // c = 1: this rank's block, complete
  if (c > 1) {
    wait(detail::ring_exchange(comm, {{sent.data(), in.data(), kv2, detail::kTagCpGrad}}, to, from, mine));
    home = in.data();
  }
  clock.compute([&] {
    for (int64_t r = 0; r < s.batch * s.rows; ++r) {
      std::memcpy(dk + r * p.k_row_stride, home + r * s.kv_row(), s.kv_row() * sizeof(float));
      std::memcpy(dv + r * p.v_row_stride, home + s.kv_elems() + r * s.kv_row(), s.kv_row() * sizeof(float));
    }
  });
  if (stats) stats->add(mine);
  return st;
}

}  // namespace kiln::parallel
