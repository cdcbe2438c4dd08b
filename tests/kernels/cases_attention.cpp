// Attention: both cpu implementations (naive GEMM path and FlashAttention) against the naive
// scalar reference (MHA, GQA, MQA, causal or not, sliding window, decode-style q_len < kv_len,
// fused-QKV row strides), forward and backward; the sweep of T × head_dim for flash;
// every flash tile candidate over those shapes;
// split-KV decode (any chunk count) and the exactness of its merge; packed variable-length
// batches; the paged KV cache; and the reference backward against finite differences.
// References are computed once per case and reused across SIMD targets and thread counts.
#include <map>
#include <memory>
#include <numeric>
#include <tuple>

#include "kiln/kernels/attention.h"
#include "kiln/kernels/cpu/attention_tiles.h"
#include "tests/kernels/harness.h"

namespace kiln::testing {
namespace {

struct AttnShape {
  int64_t b, t, s, h, hkv, d;
  bool causal;
  int64_t window;
  bool fused;  // q, k, v interleaved in one (B, T, (H + 2Hkv)·D) buffer

  std::string name() const {
    return fmt::format("b={} t={} s={} h={}/{} d={} causal={} window={} fused={}", b, t, s, h, hkv, d, causal, window,
                       fused);
  }
};

AttentionParams params_for(const AttnShape& a) {
  AttentionParams p;
  p.batch = a.b; p.q_len = a.t; p.kv_len = a.s; p.n_heads = a.h; p.n_kv_heads = a.hkv;
  p.head_dim = a.d; p.causal = a.causal; p.window = a.window;
  if (a.fused) {
    const int64_t row = (a.h + 2 * a.hkv) * a.d;
    p.q_row_stride = p.k_row_stride = p.v_row_stride = row;
  }
  return check_attention(p).value();
}

// Deterministic inputs of a shape. In fused mode q, k, v are views at column offsets of one
// buffer; gradients always go to separate buffers (same layout) so they do not overlap.
struct Inputs {
  AttentionParams p;
  std::vector<float> qb, kb, vb, dout;
  int64_t koff = 0, voff = 0;
  const float* q() const { return qb.data(); }
  const float* k() const { return kb.data() + koff; }
  const float* v() const { return vb.data() + voff; }
  size_t out_size() const { return static_cast<size_t>(p.batch * p.q_len * p.o_row_stride); }
  size_t lse_size() const { return static_cast<size_t>(p.batch * p.n_heads * p.q_len); }
};

Inputs make_inputs(const AttnShape& a) {
  Inputs in;
  in.p = params_for(a);
  Rng rng(static_cast<uint64_t>(a.t * 131 + a.s * 7 + a.h * 3 + a.d));
  const size_t qn = static_cast<size_t>(a.b * a.t * in.p.q_row_stride);
  const size_t kn = static_cast<size_t>(a.b * a.s * in.p.k_row_stride);
  in.qb = random_vector(rng, std::max(qn, kn) + 3 * 128 * 8);
  in.kb = a.fused ? in.qb : random_vector(rng, kn);
  in.vb = a.fused ? in.qb : random_vector(rng, kn);
  in.koff = a.fused ? a.h * a.d : 0;
  in.voff = a.fused ? (a.h + a.hkv) * a.d : 0;
  in.dout = random_vector(rng, in.out_size());
  return in;
}

struct RefResult {
  std::vector<float> o, lse, dq, dk, dv;
};

// The reference of a case, computed on first use (its cost grows as T²; the big cases would
// otherwise dominate the run across 3 targets × 3 thread counts).
const RefResult& reference(const AttnShape& a, const Inputs& in) {
  static std::map<std::string, std::unique_ptr<RefResult>> cache;
  std::unique_ptr<RefResult>& slot = cache[a.name()];
  if (!slot) {
    slot = std::make_unique<RefResult>();
    RefResult& r = *slot;
    r.o.resize(in.out_size());
    r.lse.resize(in.lse_size());
    ref::attention_forward(r.o.data(), r.lse.data(), in.q(), in.k(), in.v(), in.p);
    r.dq.resize(in.qb.size());
    r.dk.resize(in.kb.size());
    r.dv.resize(in.vb.size());
    ref::attention_backward(r.dq.data(), r.dk.data() + in.koff, r.dv.data() + in.voff, in.dout.data(), in.q(), in.k(),
                            in.v(), r.o.data(), r.lse.data(), in.p);
  }
  return *slot;
}

// fp32 sums of length D or S against double sums: nmse ~ len·u², bounds far above that.
std::vector<Compare> run_impl(const AttnShape& a, AttentionImpl impl, bool backward = true) {
  const Inputs in = make_inputs(a);
  const RefResult& r = reference(a, in);
  AttentionParams p = in.p;
  p.impl = impl;
  std::vector<float> o(in.out_size()), l(in.lse_size());
  cpu::attention_forward(o.data(), l.data(), in.q(), in.k(), in.v(), p);
  std::vector<Compare> cmp{{"out", r.o, o, 1e-10}, {"lse", r.lse, l, 1e-11}};
  if (!backward) return cmp;
  std::vector<float> dq(in.qb.size()), dk(in.kb.size()), dv(in.vb.size());
  cpu::attention_backward(dq.data(), dk.data() + in.koff, dv.data() + in.voff, in.dout.data(), in.q(), in.k(), in.v(),
                          r.o.data(), r.lse.data(), p);
  cmp.push_back({"dq", r.dq, dq, 1e-9});
  cmp.push_back({"dk", r.dk, dk, 1e-9});
  cmp.push_back({"dv", r.dv, dv, 1e-9});
  return cmp;
}

const AttnShape kBasicShapes[] = {
    {1, 1, 3, 1, 1, 8, true, 0, false},   {2, 17, 17, 4, 4, 16, true, 0, false},
    {1, 33, 33, 6, 2, 32, true, 0, false}, {1, 7, 40, 4, 1, 8, true, 0, false},
    {2, 9, 9, 2, 2, 8, false, 0, false},   {1, 64, 64, 4, 2, 16, true, 8, false},
    {2, 13, 13, 6, 2, 8, true, 0, true},   {1, 5, 21, 3, 3, 80, false, 4, false},
};

// The sweep, T in {1, 2, 17, 64, 255, 1024} × head_dim {32, 64, 80, 128} × MHA / GQA /
// MQA × causal or not × window or not, as a covering set (every value of every axis, the pairs
// that matter) rather than the full product; T = 1024 twice only. (T = 1 with a single key is
// left out: its dQ and dK are exactly zero, so any rounding is an infinite relative error.)
const AttnShape kFlashShapes[] = {
    {1, 1, 2, 4, 4, 32, true, 0, false},       {2, 1, 300, 4, 1, 64, true, 0, false},
    {1, 2, 2, 4, 2, 80, false, 0, false},      {1, 2, 129, 6, 6, 128, true, 16, false},
    {2, 17, 17, 2, 1, 128, true, 0, false},    {1, 17, 40, 4, 2, 32, false, 5, false},
    {1, 64, 64, 4, 4, 64, true, 0, false},     {1, 64, 64, 6, 3, 80, false, 0, true},
    {1, 64, 100, 2, 1, 32, true, 20, false},   {1, 255, 255, 2, 2, 64, true, 0, false},
    {1, 255, 255, 4, 1, 80, true, 33, false},  {1, 200, 255, 2, 1, 128, false, 0, false},
    {1, 1024, 1024, 2, 1, 64, true, 0, false}, {1, 1024, 1024, 1, 1, 32, true, 100, false},
};

}  // namespace

KILN_KERNEL_CASES(attention) {
  std::vector<KernelCase> cases;
  for (const AttnShape& a : kBasicShapes) {
    for (AttentionImpl impl : {AttentionImpl::kNaive, AttentionImpl::kFlash}) {
      cases.push_back({fmt::format("{} impl={}", a.name(), attention_impl_name(impl)), [a, impl] { return run_impl(a, impl); }});
    }
  }
  return cases;
}

KILN_KERNEL_CASES(flash_attention) {
  std::vector<KernelCase> cases;
  for (const AttnShape& a : kFlashShapes) {
    cases.push_back({a.name(), [a] { return run_impl(a, AttentionImpl::kFlash); }});
  }
  return cases;
}

// Every FlashAttention tile candidate (attention_tiles.h) on the basic and the sweep's shapes,
// the forward's and the backward's tiles different in each run so both passes meet all of them.
KILN_KERNEL_CASES(flash_attention_tiles) {
  std::vector<cpu::FlashTiles> cands;
  for (int64_t tq : cpu::kFlashTileQ)
    for (int64_t tk : cpu::kFlashTileK) cands.push_back({tq, tk});
  std::vector<KernelCase> cases;
  for (size_t i = 0; i < cands.size(); ++i) {
    cpu::FlashTileChoice tiles{cands[i], cands[cands.size() - 1 - i]};
    tiles.fwd.pack_v = i % 2 == 0;  // the forward with V in place and packed, each on half the tiles
    const auto run_with = [tiles](const AttnShape& a) {
      const cpu::FlashTileChoice saved = cpu::flash_tiles();
      cpu::set_flash_tiles(tiles);
      std::vector<Compare> cmp = run_impl(a, AttentionImpl::kFlash);
      cpu::set_flash_tiles(saved);
      return cmp;
    };
    const std::string name = fmt::format("fwd {} bwd {}", cpu::flash_tiles_name(tiles.fwd), cpu::flash_tiles_name(tiles.bwd));
    for (const AttnShape& a : kBasicShapes) cases.push_back({fmt::format("{} {}", a.name(), name), [=] { return run_with(a); }});
    for (const AttnShape& a : kFlashShapes) cases.push_back({fmt::format("{} {}", a.name(), name), [=] { return run_with(a); }});
  }
  return cases;
}

// Split-KV: 1 chunk (the sequential scan), several, and the automatic count, against the
// reference; any query count works (q_len 1..5 here).
KILN_KERNEL_CASES(split_kv) {
  const AttnShape shapes[] = {
      {1, 1, 1000, 4, 4, 64, true, 0, false},  {2, 1, 777, 8, 2, 32, true, 0, false},
      {1, 1, 513, 12, 1, 80, true, 0, false},  {1, 2, 300, 4, 2, 128, true, 64, false},
      {1, 5, 260, 2, 1, 64, false, 0, false},  {3, 3, 17, 2, 2, 32, true, 0, false},
      // The row kernel's key groups: head dims with a masked tail on every target (20, 100),
      // 80, GQA groups, contexts that are no multiple of the group, the block or the chunk.
      {1, 1, 1234, 12, 4, 80, true, 0, false}, {1, 4, 333, 6, 3, 20, true, 0, false},
      {2, 1, 70, 3, 1, 100, true, 0, false},   {1, 8, 201, 4, 2, 64, true, 37, false},
  };
  std::vector<KernelCase> cases;
  for (const AttnShape& a : shapes) {
    for (int64_t splits : {1, 3, 0}) {
      cases.push_back({fmt::format("{} splits={}", a.name(), splits), [a, splits] {
                         const Inputs in = make_inputs(a);
                         const RefResult& r = reference(a, in);
                         std::vector<float> o(in.out_size()), l(in.lse_size());
                         cpu::attention_forward_split_kv(o.data(), l.data(), in.q(), in.k(), in.v(), in.p, splits);
                         return std::vector<Compare>{{"out", r.o, o, 1e-10}, {"lse", r.lse, l, 1e-11}};
                       }});
    }
  }
  return cases;
}

// The merge is exact: attention over disjoint key sets (here: the reference, non-causal, on
// key ranges of one buffer) merged through the logsumexps equals attention over all keys to
// fp32 rounding of the parts (nmse ~ u² ≈ 4e-15).
KILN_KERNEL_CASES(split_kv_merge) {
  std::vector<KernelCase> cases;
  for (int64_t parts : {2, 5}) {
    cases.push_back({fmt::format("parts={}", parts), [parts] {
                       const int64_t T = 3, S = 301, H = 2, D = 48;
                       Rng rng(static_cast<uint64_t>(parts));
                       std::vector<float> q = random_vector(rng, T * H * D), k = random_vector(rng, S * H * D, -2, 2),
                                          v = random_vector(rng, S * H * D);
                       AttentionParams p;
                       p.q_len = T; p.kv_len = S; p.n_heads = H; p.n_kv_heads = H; p.head_dim = D; p.causal = false;
                       p = check_attention(p).value();
                       std::vector<float> o_full(T * H * D), l_full(H * T);
                       ref::attention_forward(o_full.data(), l_full.data(), q.data(), k.data(), v.data(), p);
                       // Parts laid out (P, rows = (T, H), D) and lse (P, rows) in (T, H) order.
                       const int64_t rows = T * H;
                       std::vector<float> po(parts * rows * D), pl(parts * rows);
                       for (int64_t c = 0; c < parts; ++c) {
                         const int64_t k0 = c * S / parts, k1 = (c + 1) * S / parts;
                         AttentionParams pc = p;
                         pc.kv_len = k1 - k0;
                         pc.q_len = T;
                         std::vector<float> lc(H * T);
                         ref::attention_forward(po.data() + c * rows * D, lc.data(), q.data(), k.data() + k0 * H * D,
                                                v.data() + k0 * H * D, pc);
                         for (int64_t t = 0; t < T; ++t)
                           for (int64_t h = 0; h < H; ++h) pl[c * rows + t * H + h] = lc[h * T + t];
                       }
                       std::vector<float> o(rows * D), l(rows), l_expect(rows);
                       cpu::attention_merge(o.data(), l.data(), po.data(), pl.data(), parts, rows, D);
                       for (int64_t t = 0; t < T; ++t)
                         for (int64_t h = 0; h < H; ++h) l_expect[t * H + h] = l_full[h * T + t];
                       return std::vector<Compare>{{"out", o_full, o, 1e-12}, {"lse", l_expect, l, 1e-13}};
                     }});
  }
  return cases;
}

// Packed variable-length batches: each sequence against the reference run on its own, forward
// and backward; a decode row (q_len 1), a chunked prefill (q_len < kv_len) and an empty one.
KILN_KERNEL_CASES(attention_varlen) {
  std::vector<KernelCase> cases;
  for (bool causal : {true, false}) {
    cases.push_back({fmt::format("causal={}", causal), [causal] {
                       const std::vector<int32_t> q_lens = {5, 1, 70, 0, 130}, k_lens = {5, 40, 70, 3, 200};
                       const int64_t H = 4, Hkv = 2, D = 32, n = static_cast<int64_t>(q_lens.size());
                       std::vector<int32_t> cu_q(n + 1, 0), cu_k(n + 1, 0);
                       for (int64_t i = 0; i < n; ++i) {
                         cu_q[i + 1] = cu_q[i] + q_lens[i];
                         cu_k[i + 1] = cu_k[i] + k_lens[i];
                       }
                       const int64_t tq = cu_q[n], tk = cu_k[n];
                       Rng rng(causal ? 7 : 8);
                       std::vector<float> q = random_vector(rng, tq * H * D), k = random_vector(rng, tk * Hkv * D),
                                          v = random_vector(rng, tk * Hkv * D), dout = random_vector(rng, tq * H * D);
                       AttentionParams p;
                       p.n_heads = H; p.n_kv_heads = Hkv; p.head_dim = D; p.causal = causal;
                       const AttentionVarlen vl{cu_q.data(), cu_k.data(), n};
                       p = check_attention_varlen(p, vl).value();
                       std::vector<float> o(tq * H * D), l(H * tq), dq(q.size()), dk(k.size()), dv(v.size());
                       cpu::attention_forward_varlen(o.data(), l.data(), q.data(), k.data(), v.data(), p, vl);
                       cpu::attention_backward_varlen(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                                                      v.data(), o.data(), l.data(), p, vl);
                       std::vector<float> ro(o.size()), rl(l.size()), rdq(dq.size()), rdk(dk.size()), rdv(dv.size());
                       for (int64_t i = 0; i < n; ++i) {
                         AttentionParams pi = p;
                         pi.batch = 1; pi.q_len = q_lens[i]; pi.kv_len = k_lens[i];
                         const int64_t q0 = cu_q[i], k0 = cu_k[i];
                         std::vector<float> li(H * q_lens[i]);
                         ref::attention_forward(ro.data() + q0 * H * D, li.data(), q.data() + q0 * H * D,
                                                k.data() + k0 * Hkv * D, v.data() + k0 * Hkv * D, pi);
                         for (int64_t h = 0; h < H; ++h)
                           for (int64_t t = 0; t < q_lens[i]; ++t) rl[h * tq + q0 + t] = li[h * q_lens[i] + t];
                         ref::attention_backward(rdq.data() + q0 * H * D, rdk.data() + k0 * Hkv * D,
                                                 rdv.data() + k0 * Hkv * D, dout.data() + q0 * H * D,
                                                 q.data() + q0 * H * D, k.data() + k0 * Hkv * D,
                                                 v.data() + k0 * Hkv * D, ro.data() + q0 * H * D, li.data(), pi);
                       }
                       // Keys no query sees (sequence 3) get zero gradients in both.
                       return std::vector<Compare>{{"out", ro, o, 1e-10}, {"lse", rl, l, 1e-11}, {"dq", rdq, dq, 1e-9},
                                                   {"dk", rdk, dk, 1e-9},  {"dv", rdv, dv, 1e-9}};
                     }});
  }
  return cases;
}

// Decode against the paged cache (blocks of 16 rows in shuffled order) equals attention over
// the same keys stored contiguously.
KILN_KERNEL_CASES(attention_paged) {
  std::vector<KernelCase> cases;
  // Block tables shuffled (no two blocks adjacent in the pool), or mostly in pool order with
  // a gap every few blocks (a prompt's blocks handed out together: the kernel scans adjacent
  // blocks as one run, across its 64-key runs and the gaps).
  for (const bool in_order : {false, true})
  for (int64_t splits : {1, 4, 0}) {
    cases.push_back({fmt::format("splits={} table={}", splits, in_order ? "in-order" : "shuffled"), [splits, in_order] {
                       const int64_t H = 6, Hkv = 2, D = 64, T = 2, bs = 16, max_blocks = 20;
                       const std::vector<int32_t> lens = {2, 300, 47};
                       const int64_t n = static_cast<int64_t>(lens.size()), num_blocks = n * max_blocks;
                       Rng rng(static_cast<uint64_t>(11 + splits));
                       std::vector<float> kpool = random_vector(rng, num_blocks * bs * Hkv * D),
                                          vpool = random_vector(rng, num_blocks * bs * Hkv * D),
                                          q = random_vector(rng, n * T * H * D);
                       std::vector<int32_t> table(num_blocks);
                       std::iota(table.begin(), table.end(), 0);
                       if (in_order) {
                         for (int64_t i = 5; i + 1 < num_blocks; i += 7) std::swap(table[i], table[i + 1]);
                       } else {
                         for (int64_t i = num_blocks - 1; i > 0; --i)
                           std::swap(table[i], table[rng.below(static_cast<uint64_t>(i + 1))]);
                       }
                       AttentionParams p;
                       p.q_len = T; p.kv_len = T; p.n_heads = H; p.n_kv_heads = Hkv; p.head_dim = D;
                       p.num_splits = splits;
                       p = check_attention(p).value();
                       const PagedKv kv{kpool.data(), vpool.data(), table.data(), lens.data(), bs, max_blocks, n};
                       std::vector<float> o(n * T * H * D), l(n * H * T), ro(o.size()), rl(l.size());
                       cpu::attention_decode_paged(o.data(), l.data(), q.data(), kv, p);
                       for (int64_t i = 0; i < n; ++i) {
                         std::vector<float> kc(lens[i] * Hkv * D), vc(kc.size());
                         for (int64_t j = 0; j < lens[i]; ++j) {
                           const int64_t row = table[i * max_blocks + j / bs] * bs + j % bs;
                           std::copy_n(kpool.data() + row * Hkv * D, Hkv * D, kc.data() + j * Hkv * D);
                           std::copy_n(vpool.data() + row * Hkv * D, Hkv * D, vc.data() + j * Hkv * D);
                         }
                         AttentionParams pi = p;
                         pi.kv_len = lens[i];
                         ref::attention_forward(ro.data() + i * T * H * D, rl.data() + i * H * T,
                                                q.data() + i * T * H * D, kc.data(), vc.data(), pi);
                       }
                       return std::vector<Compare>{{"out", ro, o, 1e-10}, {"lse", rl, l, 1e-11}};
                     }});
  }
  return cases;
}

KILN_GRAD_CASES(attention) {
  std::vector<GradCase> cases;
  for (const AttnShape& a : {AttnShape{1, 5, 5, 4, 2, 4, true, 0, false}, AttnShape{2, 3, 6, 2, 1, 3, true, 3, false},
                             AttnShape{1, 4, 4, 2, 2, 4, false, 0, false}}) {
    const AttentionParams p = params_for(a);
    Rng rng(99);
    const size_t qn = static_cast<size_t>(a.b * a.t * a.h * a.d), kn = static_cast<size_t>(a.b * a.s * a.hkv * a.d);
    const size_t on = qn;
    std::vector<float> x = random_vector(rng, qn + 2 * kn);
    std::vector<float> dy = random_vector(rng, on);
    auto split = [qn, kn](const std::vector<float>& xs) {
      return std::tuple(xs.data(), xs.data() + qn, xs.data() + qn + kn);
    };
    cases.push_back({fmt::format("attention b={} t={} s={} h={}/{} window={} causal={}", a.b, a.t, a.s, a.h, a.hkv,
                                 a.window, a.causal),
                     x,
                     [=](const std::vector<float>& xs) {
                       auto [q, k, v] = split(xs);
                       std::vector<float> o(on), l(static_cast<size_t>(a.b * a.h * a.t));
                       ref::attention_forward(o.data(), l.data(), q, k, v, p);
                       return dot(o, dy);
                     },
                     [=](const std::vector<float>& xs) {
                       auto [q, k, v] = split(xs);
                       std::vector<float> o(on), l(static_cast<size_t>(a.b * a.h * a.t));
                       ref::attention_forward(o.data(), l.data(), q, k, v, p);
                       std::vector<float> g(xs.size());
                       ref::attention_backward(g.data(), g.data() + qn, g.data() + qn + kn, dy.data(), q, k, v,
                                               o.data(), l.data(), p);
                       return g;
                     }});
  }
  return cases;
}

}  // namespace kiln::testing
