// Context-parallel attention (parallel/context_parallel.h) against the single-process oracle:
// cpu::attention_forward / attention_backward on the whole sequence. At C = P ranks (P = 1..4,
// skipping what does not divide), ring (contiguous and zig-zag), Ulysses and the 2 × 2 hybrid
// give the oracle's outputs, logsumexps and gradients within kTol, causal and not, GQA, up to
// T = 8192. Argument errors come back the same on every rank.
//
// Tolerance: the oracle's flash kernel sums each row's softmax over key tiles in one order; a
// layout regroups the same terms (per key block, then the logsumexp merge out = Σ e^(lse_i −
// lse) out_i, lse = log Σ e^lse_i, then — for dK/dV — a sum over the ring's ranks). Each regrouping
// adds a few fp32 roundings (ε = 2^-24 ≈ 6e-8) per merge: at most 2C = 8 blocks per row here,
// ~4 roundings each (exp, log, two multiply-adds) gives ≈ 2C · 4 · ε ≈ 2e-6 relative, and the
// ‖·‖-relative error of a sum of S terms grows like √S · ε ≈ 5e-6 at S = 8192. kTol = 2e-5
// (max error relative to the largest |value|) keeps 4× head-room over that; measured errors are
// ~1e-7..1e-6 (docs/results/context-parallel-2026-12-02.md). A skipped ring step or swapped
// zig-zag chunk gives errors of order 1.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kiln/comm/communicator.h"
#include "kiln/comm/mesh.h"
#include "kiln/core/rng.h"
#include "kiln/kernels/attention.h"
#include "kiln/parallel/context_parallel.h"
#include "tests/parallel/fixtures.h"

namespace kiln::parallel {
namespace {

using comm::Communicator;
using testing::diff;

constexpr double kTol = 2e-5;

Communicator& world() { return Communicator::world(); }

enum class Method { kRing, kUlysses, kHybrid };
const char* method_name(Method m) { return m == Method::kRing ? "ring" : m == Method::kUlysses ? "ulysses" : "hybrid"; }

struct Case {
  Method method = Method::kRing;
  LayoutKind kind = LayoutKind::kZigzag;
  int64_t batch = 1, seq = 1536, heads = 4, kv_heads = 2, dim = 16;
  bool causal = true;
  std::string name() const {
    return fmt::format("{} {} B {} T {} H {}/{} D {} {}", method_name(method), layout_kind_name(kind), batch, seq,
                       heads, kv_heads, dim, causal ? "causal" : "full");
  }
};

// The whole problem, the same on every rank.
struct Problem {
  AttentionParams full;
  std::vector<float> q, k, v, dout;                 // (B, T, H or Hkv, D)
  std::vector<float> out, lse, dq, dk, dv;          // the oracle
};

Problem make_problem(const Case& c, bool with_oracle) {
  Problem pr;
  AttentionParams& p = pr.full;
  p.batch = c.batch, p.q_len = p.kv_len = c.seq, p.n_heads = c.heads, p.n_kv_heads = c.kv_heads;
  p.head_dim = c.dim, p.causal = c.causal;
  p = *check_attention(p);  // the kernels take packed strides filled in
  const int64_t qn = c.batch * c.seq * c.heads * c.dim, kvn = c.batch * c.seq * c.kv_heads * c.dim;
  Rng rng(1234 + c.seq);
  pr.q.resize(qn), pr.k.resize(kvn), pr.v.resize(kvn), pr.dout.resize(qn);
  rng.fill_normal(pr.q), rng.fill_normal(pr.k), rng.fill_normal(pr.v), rng.fill_normal(pr.dout);
  if (with_oracle) {
    pr.out.resize(qn), pr.lse.resize(c.batch * c.heads * c.seq), pr.dq.resize(qn), pr.dk.resize(kvn),
        pr.dv.resize(kvn);
    cpu::attention_forward(pr.out.data(), pr.lse.data(), pr.q.data(), pr.k.data(), pr.v.data(), p);
    cpu::attention_backward(pr.dq.data(), pr.dk.data(), pr.dv.data(), pr.dout.data(), pr.q.data(), pr.k.data(),
                            pr.v.data(), pr.out.data(), pr.lse.data(), p);
  }
  return pr;
}

// The hybrid's two communicators: (cp_ring R, cp_ulysses U) over the world.
struct Groups {
  std::unique_ptr<comm::DeviceMesh> mesh;
  HybridGroups groups() { return {mesh->comm("cp_ring"), mesh->comm("cp_ulysses")}; }
};
Groups hybrid_groups(int ulysses) {
  auto m = comm::DeviceMesh::create(world(), {{"cp_ring", world().size() / ulysses}, {"cp_ulysses", ulysses}});
  EXPECT_TRUE(m.ok()) << m.status().message();
  return {std::move(*m)};
}

Expected<SequenceLayout> layout_for(const Case& c, int ranks) {
  if (c.method != Method::kHybrid) return SequenceLayout::create(c.kind, c.seq, ranks);
  KILN_ASSIGN_OR_RETURN(SequenceLayout ring, SequenceLayout::create(c.kind, c.seq, ranks / 2));
  return SequenceLayout::hybrid(ring, 2);
}

struct Local {
  std::vector<float> out, lse, dq, dk, dv;
  CpStats fwd, bwd;
};

// This rank's forward and backward through the case's method.
Expected<Local> run_local(const Case& c, const SequenceLayout& layout, const Problem& pr, Groups* g) {
  const int rank = world().rank();
  const int64_t tl = layout.local_len();
  AttentionParams p = pr.full;
  p.q_len = p.kv_len = tl;
  std::vector<float> q(c.batch * tl * c.heads * c.dim), k(c.batch * tl * c.kv_heads * c.dim), v(k.size()),
      dout(q.size());
  layout.shard(q.data(), pr.q.data(), c.batch, c.heads * c.dim, rank);
  layout.shard(k.data(), pr.k.data(), c.batch, c.kv_heads * c.dim, rank);
  layout.shard(v.data(), pr.v.data(), c.batch, c.kv_heads * c.dim, rank);
  layout.shard(dout.data(), pr.dout.data(), c.batch, c.heads * c.dim, rank);
  Local l;
  l.out.resize(q.size()), l.lse.resize(c.batch * c.heads * tl), l.dq.resize(q.size()), l.dk.resize(k.size()),
      l.dv.resize(k.size());
  Status st;
  switch (c.method) {
    case Method::kRing:
      st = ring_attention_forward(world(), layout, l.out.data(), l.lse.data(), q.data(), k.data(), v.data(), p, &l.fwd);
      if (st.ok())
        st = ring_attention_backward(world(), layout, l.dq.data(), l.dk.data(), l.dv.data(), dout.data(), q.data(),
                                     k.data(), v.data(), l.out.data(), l.lse.data(), p, &l.bwd);
      break;
    case Method::kUlysses:
      st = ulysses_attention_forward(world(), layout, l.out.data(), l.lse.data(), q.data(), k.data(), v.data(), p,
                                     &l.fwd);
      if (st.ok())
        st = ulysses_attention_backward(world(), layout, l.dq.data(), l.dk.data(), l.dv.data(), dout.data(), q.data(),
                                        k.data(), v.data(), l.out.data(), l.lse.data(), p, &l.bwd);
      break;
    case Method::kHybrid:
      st = hybrid_attention_forward(g->groups(), layout, l.out.data(), l.lse.data(), q.data(), k.data(), v.data(), p,
                                    &l.fwd);
      if (st.ok())
        st = hybrid_attention_backward(g->groups(), layout, l.dq.data(), l.dk.data(), l.dv.data(), dout.data(),
                                       q.data(), k.data(), v.data(), l.out.data(), l.lse.data(), p, &l.bwd);
      break;
  }
  if (!st.ok()) return st;
  return l;
}

// Runs the case at C = P and compares, on rank 0, the gathered results with the oracle.
void check_case(const Case& c) {
  SCOPED_TRACE(c.name());
  const int ranks = world().size();
  auto layout = layout_for(c, ranks);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  Groups g;
  if (c.method == Method::kHybrid) g = hybrid_groups(2);
  const bool root = world().rank() == 0;
  const Problem pr = make_problem(c, root);
  auto l = run_local(c, *layout, pr, &g);
  ASSERT_TRUE(l.ok()) << l.status().message();
  struct Named {
    const char* name;
    std::vector<float>* local;
    const std::vector<float>* ref;
    int64_t batch, row;
  };
  const Named all[] = {{"out", &l->out, &pr.out, c.batch, c.heads * c.dim},
                       {"lse", &l->lse, &pr.lse, c.batch * c.heads, 1},
                       {"dq", &l->dq, &pr.dq, c.batch, c.heads * c.dim},
                       {"dk", &l->dk, &pr.dk, c.batch, c.kv_heads * c.dim},
                       {"dv", &l->dv, &pr.dv, c.batch, c.kv_heads * c.dim}};
  for (const Named& n : all) {
    std::vector<float> full(n.batch * c.seq * n.row);
    ASSERT_TRUE(layout->gather(world(), full.data(), n.local->data(), n.batch, n.row).ok());
    // Rank 0 holds the oracle; every rank checks its errors, so all agree on the verdict.
    testing::Diff d;
    if (root) d = diff(full, *n.ref);
    double e[2] = {d.rel_rms, d.max_rel};
    MPI_Bcast(e, 2, MPI_DOUBLE, 0, world().handle());
    d = {e[0], e[1]};
    EXPECT_LE(d.max_rel, kTol) << n.name << " rel_rms " << d.rel_rms;
    if (root && std::getenv("KILN_CP_TEST_VERBOSE"))
      std::printf("%s %s: rel_rms %.2e max_rel %.2e\n", c.name().c_str(), n.name, d.rel_rms, d.max_rel);
  }
}

// ---- layouts (no communication) ---------------------------------------------------------------

TEST(SequenceLayout, ZigzagHoldsChunksRAnd2CMinus1MinusR) {
  auto l = SequenceLayout::create(LayoutKind::kZigzag, 16, 4);
  ASSERT_TRUE(l.ok());
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(l->segments(r).size(), 2u);
    EXPECT_EQ(l->segments(r)[0].start, 2 * r);
    EXPECT_EQ(l->segments(r)[1].start, 2 * (7 - r));
    EXPECT_EQ(l->segments(r)[1].len, 2);
  }
  auto c = SequenceLayout::create(LayoutKind::kContiguous, 16, 4);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->segments(3)[0].start, 12);
  EXPECT_EQ(c->segments(3)[0].len, 4);
}

TEST(SequenceLayout, ShardThenUnshardIsTheIdentity) {
  for (LayoutKind kind : {LayoutKind::kContiguous, LayoutKind::kZigzag}) {
    auto l = SequenceLayout::create(kind, 24, 3);
    ASSERT_TRUE(l.ok());
    std::vector<float> full(2 * 24 * 5), back(full.size(), -1), local(2 * 8 * 5);
    for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);
    for (int r = 0; r < 3; ++r) {
      l->shard(local.data(), full.data(), 2, 5, r);
      l->unshard(back.data(), local.data(), 2, 5, r);
    }
    EXPECT_EQ(back, full) << layout_kind_name(kind);
  }
}

TEST(SequenceLayout, HybridSplitsEachRingShard) {
  auto ring = SequenceLayout::create(LayoutKind::kZigzag, 16, 2);  // chunks of 4: {0, 3}, {1, 2}
  ASSERT_TRUE(ring.ok());
  auto h = SequenceLayout::hybrid(*ring, 2);
  ASSERT_TRUE(h.ok());
  const int64_t want[4] = {0, 12, 4, 8};  // rank g·2 + m: part m of ring shard g
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(h->segments(r).size(), 1u);
    EXPECT_EQ(h->segments(r)[0].start, want[r]);
    EXPECT_EQ(h->segments(r)[0].len, 4);
  }
}

// Causal work per rank: (query chunk, key chunk) pairs computed, diagonals counted half.
TEST(SequenceLayout, ZigzagBalancesCausalWork) {
  for (LayoutKind kind : {LayoutKind::kContiguous, LayoutKind::kZigzag}) {
    auto l = SequenceLayout::create(kind, 64, 4);
    ASSERT_TRUE(l.ok());
    std::vector<double> work(4, 0);
    for (int r = 0; r < 4; ++r)
      for (int s = 0; s < 4; ++s)
        for (const SequenceSegment& q : l->segments(r))
          for (const SequenceSegment& k : l->segments(s)) {
            const BlockKind b = block_kind(q, k, true);
            work[r] += b == BlockKind::kFull ? q.len * k.len : b == BlockKind::kDiagonal ? q.len * k.len / 2.0 : 0;
          }
    if (kind == LayoutKind::kZigzag)
      for (int r = 1; r < 4; ++r) EXPECT_EQ(work[r], work[0]);
    else
      EXPECT_EQ(work[3], 7 * work[0]);  // rank r: r full blocks + a diagonal
  }
}

TEST(SequenceLayout, ZigzagNeedsTDivisibleBy2C) {
  auto l = SequenceLayout::create(LayoutKind::kZigzag, 12, 4);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().message().find("2C = 8"), std::string::npos) << l.status().message();
  EXPECT_TRUE(SequenceLayout::create(LayoutKind::kContiguous, 12, 4).ok());
}

// ---- against the oracle --------------------------------------------------------------------

TEST(RingAttention, MatchesOneProcessBothLayoutsCausalAndNot) {
  for (LayoutKind kind : {LayoutKind::kContiguous, LayoutKind::kZigzag})
    for (bool causal : {true, false}) {
      Case c;
      c.kind = kind, c.causal = causal;
      check_case(c);
    }
}

TEST(RingAttention, MatchesOneProcessWithBatchAndMha) {
  Case c;
  c.batch = 2, c.seq = 768, c.heads = c.kv_heads = 2;
  check_case(c);
}

TEST(RingAttention, MatchesOneProcessAtT8192) {
  if (8192 % (2 * world().size()) != 0) GTEST_SKIP() << "T 8192 does not split in 2P chunks";
  Case c;
  c.seq = 8192, c.heads = 2, c.kv_heads = 1;
  check_case(c);
}

TEST(RingAttention, StatsCountTheRingsBytes) {
  Case c;
  auto layout = layout_for(c, world().size());
  ASSERT_TRUE(layout.ok());
  const Problem pr = make_problem(c, false);
  auto l = run_local(c, *layout, pr, nullptr);
  ASSERT_TRUE(l.ok());
  const int64_t kv_bytes = 2 * c.batch * layout->local_len() * c.kv_heads * c.dim * 4;
  EXPECT_EQ(l->fwd.bytes_sent, (world().size() - 1) * kv_bytes);
  EXPECT_EQ(l->bwd.bytes_sent, 2 * (world().size() - 1) * kv_bytes + (world().size() > 1 ? kv_bytes : 0));
  EXPECT_GT(l->fwd.peak_extra_bytes, kv_bytes);
  EXPECT_GE(l->fwd.comm_seconds, 0.0);
}

TEST(UlyssesAttention, MatchesOneProcess) {
  const int p = world().size();
  for (int64_t kv_heads : {4, 2}) {
    if (4 % p != 0 || kv_heads % p != 0) continue;
    for (LayoutKind kind : {LayoutKind::kContiguous, LayoutKind::kZigzag})
      for (bool causal : {true, false}) {
        Case c;
        c.method = Method::kUlysses, c.kind = kind, c.causal = causal, c.kv_heads = kv_heads;
        check_case(c);
      }
  }
}

TEST(HybridAttention, MatchesOneProcessAt2x2) {
  if (world().size() != 4) GTEST_SKIP() << "the hybrid runs as 2 x 2 at P = 4";
  for (LayoutKind kind : {LayoutKind::kContiguous, LayoutKind::kZigzag})
    for (bool causal : {true, false}) {
      Case c;
      c.method = Method::kHybrid, c.kind = kind, c.causal = causal;
      check_case(c);
    }
  Case big;
  big.method = Method::kHybrid, big.seq = 8192, big.heads = 2, big.kv_heads = 2;
  check_case(big);
}

// ---- errors, the same verdict on every rank -------------------------------------------------

TEST(ContextParallelErrors, UlyssesHeadsNotDivisiblePointToRing) {
  const int p = world().size();
  if (p == 1) GTEST_SKIP() << "every head count divides by 1";
  Case c;
  c.method = Method::kUlysses, c.kind = LayoutKind::kContiguous, c.heads = 2 * p + 2, c.kv_heads = p + 1;
  auto layout = layout_for(c, p);
  ASSERT_TRUE(layout.ok());
  const Problem pr = make_problem(c, false);
  auto l = run_local(c, *layout, pr, nullptr);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().message().find("ring"), std::string::npos) << l.status().message();
  EXPECT_NE(l.status().message().find("ulysses_attention_forward"), std::string::npos) << l.status().message();
}

TEST(ContextParallelErrors, ZigzagTNotDivisibleBy2CIsRefused) {
  const int p = world().size();
  if (p == 1) GTEST_SKIP() << "C = 1: T = 3 splits in 2 chunks? no: tested in SequenceLayout";
  auto l = SequenceLayout::create(LayoutKind::kZigzag, 2 * p * 64 + p, p);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
}

TEST(ContextParallelErrors, WrongLocalRowsOrHybridLayoutForRing) {
  Case c;
  auto layout = layout_for(c, world().size());
  ASSERT_TRUE(layout.ok());
  AttentionParams p;
  p.q_len = p.kv_len = layout->local_len() + 1, p.n_heads = 4, p.n_kv_heads = 2, p.head_dim = 16;
  std::vector<float> buf((layout->local_len() + 1) * 4 * 16);
  Status st = ring_attention_forward(world(), *layout, buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), p);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("rows per rank"), std::string::npos) << st.message();
  if (world().size() % 2 == 0) {
    auto ring = SequenceLayout::create(LayoutKind::kZigzag, c.seq, world().size() / 2);
    auto h = SequenceLayout::hybrid(*ring, 2);
    ASSERT_TRUE(h.ok());
    p.q_len = p.kv_len = h->local_len();
    Status hs = ring_attention_forward(world(), *h, buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), p);
    ASSERT_FALSE(hs.ok());
    EXPECT_NE(hs.message().find("hybrid"), std::string::npos) << hs.message();
  }
}

}  // namespace
}  // namespace kiln::parallel
