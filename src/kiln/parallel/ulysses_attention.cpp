// DeepSpeed-Ulysses attention and the Ulysses × ring hybrid (context_parallel.h): an all-to-all
// from sequence-sharded to head-sharded rows, attention on the whole (group) sequence for this
// rank's heads, and the all-to-all back.
#include <cstring>
#include <functional>
#include <vector>

#include "kiln/comm/collectives.h"
#include "kiln/parallel/context_parallel_detail.h"

namespace kiln::parallel {
namespace {

// One tensor moved by the all-to-all: rows (B, T, heads, D) of row_stride floats, or a
// logsumexp (B, heads, T) when lse.
struct Field {
  float* data;
  int64_t row_stride;
  int64_t heads;
  bool lse = false;
};

struct Shape {
  int64_t batch, local_rows, group_rows, dim;
  int ranks;  // U
};

// Floats of one field's block for one peer: its heads / U, for local_rows rows.
int64_t block_elems(const Field& f, const Shape& s) {
  return s.batch * s.local_rows * (f.heads / s.ranks) * (f.lse ? 1 : s.dim);
}

// local (B, Tl, heads of row_stride) heads [h0, h0+nh) ↔ packed (B, Tl, nh, D); for an lse field
// (B, heads, Tl) ↔ (B, nh, Tl).
void move_heads(float* packed, const Field& f, const Shape& s, int64_t h0, int64_t nh, bool to_packed) {
  if (f.lse) {
    for (int64_t b = 0; b < s.batch; ++b) {
      float* local = f.data + (b * f.heads + h0) * s.local_rows;
      float* pk = packed + b * nh * s.local_rows;
      const size_t bytes = static_cast<size_t>(nh * s.local_rows) * sizeof(float);
      to_packed ? std::memcpy(pk, local, bytes) : std::memcpy(local, pk, bytes);
    }
    return;
  }
  const size_t bytes = static_cast<size_t>(nh * s.dim) * sizeof(float);
  for (int64_t r = 0; r < s.batch * s.local_rows; ++r) {
    float* local = f.data + r * f.row_stride + h0 * s.dim;
    float* pk = packed + r * nh * s.dim;
    to_packed ? std::memcpy(pk, local, bytes) : std::memcpy(local, pk, bytes);
  }
}

// The all-to-all on comm's communication thread, timed.
Status all_to_all_timed(comm::Communicator& comm, const float* send, float* recv, int64_t per_rank,
                        detail::CpClock& clock, CpStats& stats) {
  stats.bytes_sent += per_rank * (comm.size() - 1) * static_cast<int64_t>(sizeof(float));
  if (comm.size() == 1) {
    clock.compute([&] { std::memcpy(recv, send, per_rank * sizeof(float)); });
    return {};
  }
  comm::Communicator* c = &comm;
  return clock.wait(comm.comm_thread().submit(
      [c, send, recv, per_rank] { return comm::all_to_all(*c, send, recv, per_rank, DType::kF32); }));
}

// fn(block, field index, peer) for every field's block of every peer in a send or receive
// buffer of per_rank floats per peer.
template <class F>
void walk_blocks(float* buf, int64_t per_rank, std::span<const Field> fields, const Shape& s, F&& fn) {
  for (int peer = 0; peer < s.ranks; ++peer) {
    float* at = buf + peer * per_rank;
    for (size_t fi = 0; fi < fields.size(); ++fi) {
      fn(at, fi, peer);
      at += block_elems(fields[fi], s);
    }
  }
}

// A group buffer (B, Tg, heads / U, D) packed, or an lse (B, heads / U, Tg) ↔ member i's block
// of it (its rows at group_layout.segments(i)).
void move_group(const SequenceLayout& group_layout, float* group, float* block, const Field& f, const Shape& s,
                int member, bool to_group) {
  const int64_t nh = f.heads / s.ranks;
  const int64_t batch = f.lse ? s.batch * nh : s.batch, row = f.lse ? 1 : nh * s.dim;
  if (to_group)
    group_layout.unshard(group, block, batch, row, member);
  else
    group_layout.shard(block, group, batch, row, member);
}

// Sequence-sharded fields → head-sharded group buffers (to_group), or the mirror: group buffers
// → this rank's rows of every head, in fields. One all-to-all either way.
Status exchange(comm::Communicator& comm, const SequenceLayout& group_layout, std::span<const Field> fields,
                std::span<float* const> group, bool to_group, const Shape& s, detail::CpClock& clock, CpStats& stats,
                std::vector<float>& send, std::vector<float>& recv) {
  int64_t per_rank = 0;
  for (const Field& f : fields) per_rank += block_elems(f, s);
  send.resize(per_rank * s.ranks);
  recv.resize(per_rank * s.ranks);
  // Seq → head: block for peer j holds heads [j·nh, (j+1)·nh) of this rank's rows; head → seq:
  // block for member i holds its rows of this rank's heads.
  clock.compute([&] {
    walk_blocks(send.data(), per_rank, fields, s, [&](float* at, size_t fi, int peer) {
      const int64_t nh = fields[fi].heads / s.ranks;
      if (to_group)
        move_heads(at, fields[fi], s, peer * nh, nh, true);
      else
        move_group(group_layout, group[fi], at, fields[fi], s, peer, false);
    });
  });
  KILN_RETURN_IF_ERROR(all_to_all_timed(comm, send.data(), recv.data(), per_rank, clock, stats));
  clock.compute([&] {
    walk_blocks(recv.data(), per_rank, fields, s, [&](float* at, size_t fi, int peer) {
      const int64_t nh = fields[fi].heads / s.ranks;
      if (to_group)
        move_group(group_layout, group[fi], at, fields[fi], s, peer, true);
      else
        move_heads(at, fields[fi], s, peer * nh, nh, false);
    });
  });
  return {};
}

Status check_heads(const char* op, const AttentionParams& p, int u, bool hybrid) {
  if (p.n_heads % u != 0 || p.n_kv_heads % u != 0)
    return invalid_argument(
        "[{}] n_heads {} and n_kv_heads {} must both divide by the {} Ulysses ranks; use ring attention (any head "
        "count){}",
        op, p.n_heads, p.n_kv_heads, u, hybrid ? " or a smaller Ulysses group" : " or the hybrid with a Ulysses group that divides them");
  return {};
}

// Attention on the group's sequence for this rank's heads (packed buffers, params `g`).
using InnerForward = std::function<Status(float* out, float* lse, const float* q, const float* k, const float* v,
                                          const AttentionParams& g, CpStats& stats)>;
using InnerBackward = std::function<Status(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                           const float* k, const float* v, const float* out, const float* lse,
                                           const AttentionParams& g, CpStats& stats)>;

// The group's params: all Tg rows, heads / U, packed rows.
AttentionParams group_params(const AttentionParams& p, const Shape& s) {
  AttentionParams g = p;
  g.q_len = g.kv_len = s.group_rows;
  g.n_heads = p.n_heads / s.ranks;
  g.n_kv_heads = p.n_kv_heads / s.ranks;
  g.q_row_stride = g.o_row_stride = g.n_heads * s.dim;
  g.k_row_stride = g.v_row_stride = g.n_kv_heads * s.dim;
  return g;
}

int64_t bytes_of(std::initializer_list<const std::vector<float>*> bufs) {
  int64_t n = 0;
  for (const auto* b : bufs) n += static_cast<int64_t>(b->size() * sizeof(float));
  return n;
}

// Adds a call's stats: its buffers and the inner call's peak are alive together.
void report(CpStats& mine, CpStats inner, int64_t buffer_bytes, CpStats* stats) {
  mine.peak_extra_bytes = buffer_bytes + inner.peak_extra_bytes;
  inner.peak_extra_bytes = 0;
  mine.add(inner);
  if (stats) stats->add(mine);
}

Status ulysses_forward(comm::Communicator& comm, const SequenceLayout& group_layout, const AttentionParams& p,
                       float* out, float* lse, const float* q, const float* k, const float* v, const InnerForward& inner,
                       CpStats* stats) {
  CpStats mine, inner_stats;
  detail::CpClock clock(mine);
  const Shape s{p.batch, p.q_len, group_layout.seq_len(), p.head_dim, comm.size()};
  const AttentionParams g = group_params(p, s);
  std::vector<float> gq(s.batch * s.group_rows * g.n_heads * s.dim), gk(s.batch * s.group_rows * g.n_kv_heads * s.dim),
      gv(gk.size()), gout(gq.size()), glse(s.batch * g.n_heads * s.group_rows), send, recv;
  const Field in[] = {{const_cast<float*>(q), p.q_row_stride, p.n_heads},
                      {const_cast<float*>(k), p.k_row_stride, p.n_kv_heads},
                      {const_cast<float*>(v), p.v_row_stride, p.n_kv_heads}};
  float* const gin[] = {gq.data(), gk.data(), gv.data()};
  KILN_RETURN_IF_ERROR(exchange(comm, group_layout, in, gin, true, s, clock, mine, send, recv));
  const int64_t a2a_bytes = bytes_of({&send, &recv});
  KILN_RETURN_IF_ERROR(inner(gout.data(), glse.data(), gq.data(), gk.data(), gv.data(), g, inner_stats));
  const Field res[] = {{out, p.o_row_stride, p.n_heads}, {lse, 0, p.n_heads, true}};
  float* const gres[] = {gout.data(), glse.data()};
  KILN_RETURN_IF_ERROR(exchange(comm, group_layout, res, gres, false, s, clock, mine, send, recv));
  report(mine, inner_stats, bytes_of({&gq, &gk, &gv, &gout, &glse}) + std::max(a2a_bytes, bytes_of({&send, &recv})), stats);
  return {};
}

Status ulysses_backward(comm::Communicator& comm, const SequenceLayout& group_layout, const AttentionParams& p,
                        float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const InnerBackward& inner,
                        CpStats* stats) {
  CpStats mine, inner_stats;
  detail::CpClock clock(mine);
  const Shape s{p.batch, p.q_len, group_layout.seq_len(), p.head_dim, comm.size()};
  const AttentionParams g = group_params(p, s);
  const size_t qn = s.batch * s.group_rows * g.n_heads * s.dim, kvn = s.batch * s.group_rows * g.n_kv_heads * s.dim;
  std::vector<float> gdout(qn), gq(qn), gk(kvn), gv(kvn), gout(qn), glse(s.batch * g.n_heads * s.group_rows), gdq(qn),
      gdk(kvn), gdv(kvn), send, recv;
  auto mut = [](const float* x) { return const_cast<float*>(x); };
  const Field in[] = {{mut(dout), p.o_row_stride, p.n_heads}, {mut(q), p.q_row_stride, p.n_heads},
                      {mut(k), p.k_row_stride, p.n_kv_heads}, {mut(v), p.v_row_stride, p.n_kv_heads},
                      {mut(out), p.o_row_stride, p.n_heads},  {mut(lse), 0, p.n_heads, true}};
  float* const gin[] = {gdout.data(), gq.data(), gk.data(), gv.data(), gout.data(), glse.data()};
  KILN_RETURN_IF_ERROR(exchange(comm, group_layout, in, gin, true, s, clock, mine, send, recv));
  const int64_t a2a_bytes = bytes_of({&send, &recv});
  KILN_RETURN_IF_ERROR(inner(gdq.data(), gdk.data(), gdv.data(), gdout.data(), gq.data(), gk.data(), gv.data(),
                             gout.data(), glse.data(), g, inner_stats));
  const Field res[] = {{dq, p.q_row_stride, p.n_heads}, {dk, p.k_row_stride, p.n_kv_heads},
                       {dv, p.v_row_stride, p.n_kv_heads}};
  float* const gres[] = {gdq.data(), gdk.data(), gdv.data()};
  KILN_RETURN_IF_ERROR(exchange(comm, group_layout, res, gres, false, s, clock, mine, send, recv));
  report(mine, inner_stats, bytes_of({&gdout, &gq, &gk, &gv, &gout, &glse, &gdq, &gdk, &gdv}) + std::max(a2a_bytes, bytes_of({&send, &recv})), stats);
  return {};
}

// The local kernels as inner attention of pure Ulysses (timed as compute).
Status local_forward(float* out, float* lse, const float* q, const float* k, const float* v, const AttentionParams& g,
                     CpStats& st) {
  detail::CpClock(st).compute([&] { cpu::attention_forward(out, lse, q, k, v, g); });
  st.peak_extra_bytes = cpu::attention_forward_scratch_bytes(g, attention_impl());
  st.blocks_computed += g.batch;
  return {};
}
Status local_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                      const float* v, const float* out, const float* lse, const AttentionParams& g, CpStats& st) {
  detail::CpClock(st).compute([&] { cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, g); });
  st.peak_extra_bytes = cpu::attention_backward_scratch_bytes(g, attention_impl());
  st.blocks_computed += g.batch;
  return {};
}

// The hybrid's checks, its ring layout and the Ulysses group's layout (contiguous parts of the
// ring shard).
struct HybridLayouts {
  SequenceLayout ring, group;
};
Expected<HybridLayouts> hybrid_layouts(const char* op, HybridGroups g, const SequenceLayout& layout,
                                       const AttentionParams& local) {
  const int u = g.ulysses.size(), r = g.ring.size();
  if (layout.ulysses_ranks() != u || layout.num_ranks() != u * r)
    return invalid_argument("[{}] layout {} does not match ring {} x Ulysses {} groups", op, layout.describe(), r, u);
  KILN_ASSIGN_OR_RETURN(const AttentionParams p, detail::check_cp_params(op, layout, u * r, local));
  KILN_RETURN_IF_ERROR(check_heads(op, p, u, true));
  KILN_ASSIGN_OR_RETURN(SequenceLayout ring, SequenceLayout::create(layout.kind(), layout.seq_len(), r));
  KILN_ASSIGN_OR_RETURN(SequenceLayout group,
                        SequenceLayout::create(LayoutKind::kContiguous, ring.local_len(), u));
  return HybridLayouts{std::move(ring), std::move(group)};
}

}  // namespace

Status ulysses_attention_forward(comm::Communicator& comm, const SequenceLayout& layout, float* out, float* lse,
                                 const float* q, const float* k, const float* v, const AttentionParams& local,
                                 CpStats* stats) {
  const char* op = "ulysses_attention_forward";
  KILN_ASSIGN_OR_RETURN(const AttentionParams p, detail::check_cp_params(op, layout, comm.size(), local));
  KILN_RETURN_IF_ERROR(check_heads(op, p, comm.size(), false));
  return ulysses_forward(comm, layout, p, out, lse, q, k, v, local_forward, stats);
}

Status ulysses_attention_backward(comm::Communicator& comm, const SequenceLayout& layout, float* dq, float* dk,
                                  float* dv, const float* dout, const float* q, const float* k, const float* v,
                                  const float* out, const float* lse, const AttentionParams& local,
                                  CpStats* stats) {
  const char* op = "ulysses_attention_backward";
  KILN_ASSIGN_OR_RETURN(const AttentionParams p, detail::check_cp_params(op, layout, comm.size(), local));
  KILN_RETURN_IF_ERROR(check_heads(op, p, comm.size(), false));
  return ulysses_backward(comm, layout, p, dq, dk, dv, dout, q, k, v, out, lse, local_backward, stats);
}

Status hybrid_attention_forward(HybridGroups groups, const SequenceLayout& layout, float* out, float* lse,
                                const float* q, const float* k, const float* v, const AttentionParams& local,
                                CpStats* stats) {
  const char* op = "hybrid_attention_forward";
  KILN_ASSIGN_OR_RETURN(const HybridLayouts l, hybrid_layouts(op, groups, layout, local));
  KILN_ASSIGN_OR_RETURN(const AttentionParams p, check_attention(local));
  InnerForward ring = [&](float* o, float* ls, const float* gq, const float* gk, const float* gv,
                          const AttentionParams& g, CpStats& st) {
    return ring_attention_forward(groups.ring, l.ring, o, ls, gq, gk, gv, g, &st);
  };
  return ulysses_forward(groups.ulysses, l.group, p, out, lse, q, k, v, ring, stats);
}

Status hybrid_attention_backward(HybridGroups groups, const SequenceLayout& layout, float* dq, float* dk,
                                 float* dv, const float* dout, const float* q, const float* k, const float* v,
                                 const float* out, const float* lse, const AttentionParams& local,
                                 CpStats* stats) {
  const char* op = "hybrid_attention_backward";
  KILN_ASSIGN_OR_RETURN(const HybridLayouts l, hybrid_layouts(op, groups, layout, local));
  KILN_ASSIGN_OR_RETURN(const AttentionParams p, check_attention(local));
  InnerBackward ring = [&](float* gdq, float* gdk, float* gdv, const float* gdout, const float* gq, const float* gk,
                           const float* gv, const float* go, const float* gl, const AttentionParams& g, CpStats& st) {
    return ring_attention_backward(groups.ring, l.ring, gdq, gdk, gdv, gdout, gq, gk, gv, go, gl, g, &st);
  };
  return ulysses_backward(groups.ulysses, l.group, p, dq, dk, dv, dout, q, k, v, out, lse, ring, stats);
}

}  // namespace kiln::parallel
