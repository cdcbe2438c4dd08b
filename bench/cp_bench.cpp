// `kiln bench cp`: context-parallel attention timed per rank (cp_bench.h).
#include "bench/cp_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/parallel_bench_util.h"
#include "kiln/comm/mesh.h"
#include "kiln/comm/work.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/parallel/context_parallel.h"

namespace kiln::bench {
namespace {

using parallel::CpStats;
using parallel::LayoutKind;
using parallel::SequenceLayout;

enum class Method { kRing, kUlysses, kHybrid };

struct Variant {
  Method method;
  LayoutKind kind;
  std::string name() const {
    const char* m = method == Method::kRing ? "ring" : method == Method::kUlysses ? "ulysses" : "hybrid 2x2";
    return fmt::format("{} {}", m, parallel::layout_kind_name(kind));
  }
};

// One rank's measurements of a variant (means over the reps).
struct RankResult {
  double fwd_compute_s = 0, bwd_compute_s = 0, exposed_s = 0, comm_s = 0, wall_s = 0;
  double bytes_sent = 0, mem_bytes = 0;
};
constexpr int kFields = 7;

// The hybrid's communicators, or none.
struct Comms {
  comm::Communicator* cp = nullptr;
  std::unique_ptr<comm::DeviceMesh> mesh;
};

Expected<SequenceLayout> layout_of(const Variant& v, int64_t seq, int c) {
  if (v.method != Method::kHybrid) return SequenceLayout::create(v.kind, seq, c);
  KILN_ASSIGN_OR_RETURN(SequenceLayout ring, SequenceLayout::create(v.kind, seq, c / 2));
  return SequenceLayout::hybrid(ring, 2);
}

// Forward and backward of one variant on this rank's rows; stats summed over reps.
Expected<RankResult> measure(const Variant& v, const SequenceLayout& layout, Comms& comms, const CpBenchOptions& o) {
  comm::Communicator& world = comm::Communicator::world();
  const int64_t tl = layout.local_len();
  AttentionParams p;
  p.q_len = p.kv_len = tl, p.n_heads = o.heads, p.n_kv_heads = o.kv_heads, p.head_dim = o.head_dim;
  p.causal = o.causal;
  const int64_t qn = tl * o.heads * o.head_dim, kvn = tl * o.kv_heads * o.head_dim;
  std::vector<float> q(qn), k(kvn), val(kvn), dout(qn), out(qn), lse(o.heads * tl), dq(qn), dk(kvn), dv(kvn);
  Rng rng(7 + world.rank());
  rng.fill_normal(q), rng.fill_normal(k), rng.fill_normal(val), rng.fill_normal(dout);
  auto run = [&](CpStats* f, CpStats* b) -> Status {
    switch (v.method) {
      case Method::kRing:
        KILN_RETURN_IF_ERROR(parallel::ring_attention_forward(*comms.cp, layout, out.data(), lse.data(), q.data(),
                                                              k.data(), val.data(), p, f));
        return parallel::ring_attention_backward(*comms.cp, layout, dq.data(), dk.data(), dv.data(), dout.data(),
                                                 q.data(), k.data(), val.data(), out.data(), lse.data(), p, b);
      case Method::kUlysses:
        KILN_RETURN_IF_ERROR(parallel::ulysses_attention_forward(*comms.cp, layout, out.data(), lse.data(), q.data(),
                                                                 k.data(), val.data(), p, f));
        return parallel::ulysses_attention_backward(*comms.cp, layout, dq.data(), dk.data(), dv.data(), dout.data(),
                                                    q.data(), k.data(), val.data(), out.data(), lse.data(), p, b);
      case Method::kHybrid: {
        parallel::HybridGroups g{comms.mesh->comm("cp_ring"), comms.mesh->comm("cp_ulysses")};
        KILN_RETURN_IF_ERROR(parallel::hybrid_attention_forward(g, layout, out.data(), lse.data(), q.data(), k.data(),
                                                                val.data(), p, f));
        return parallel::hybrid_attention_backward(g, layout, dq.data(), dk.data(), dv.data(), dout.data(), q.data(),
                                                   k.data(), val.data(), out.data(), lse.data(), p, b);
      }
    }
    return {};
  };
  KILN_RETURN_IF_ERROR(run(nullptr, nullptr));  // warm-up: first touch of every buffer
  CpStats f, b;
  double wall = 0;
  for (int r = 0; r < o.reps; ++r) {
    sleeping_barrier(world);
    const double t0 = comm::now_seconds();
    KILN_RETURN_IF_ERROR(run(&f, &b));
    wall += comm::now_seconds() - t0;
  }
  RankResult res;
  res.fwd_compute_s = f.compute_seconds / o.reps;
  res.bwd_compute_s = b.compute_seconds / o.reps;
  res.exposed_s = (f.exposed_seconds + b.exposed_seconds) / o.reps;
  res.comm_s = (f.comm_seconds + b.comm_seconds) / o.reps;
  res.wall_s = wall / o.reps;
  res.bytes_sent = static_cast<double>(f.bytes_sent + b.bytes_sent) / o.reps;
  // The buffers above (inputs, outputs, gradients) + the larger scratch of the two passes.
  const double io = static_cast<double>((q.size() * 4 + k.size() * 5 + lse.size()) * sizeof(float));
  res.mem_bytes = io + static_cast<double>(std::max(f.peak_extra_bytes, b.peak_extra_bytes));
  return res;
}

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

}  // namespace

int run_cp_bench(const CpBenchOptions& o) {
  comm::init();
  int rc = 0;
  {
    comm::Communicator& world = comm::Communicator::world();
    const int c = world.size(), rank = world.rank();
    set_num_threads(o.threads);
    Comms comms;
    auto cp = world.split(0, rank);  // the ring's messages apart from the bench's barriers
    if (!cp.ok()) {
      if (rank == 0) fmt::print(stderr, "kiln bench cp: {}\n", cp.status().message());
      comm::finalize();
      return 1;
    }
    comms.cp = cp->get();
    std::vector<Variant> variants = {{Method::kRing, LayoutKind::kContiguous}, {Method::kRing, LayoutKind::kZigzag}};
    std::string notes;
    if (o.heads % c == 0 && o.kv_heads % c == 0)
      variants.push_back({Method::kUlysses, LayoutKind::kContiguous});
    else
      notes += fmt::format("# ulysses: skipped, {} heads / {} KV heads do not divide by C = {}\n", o.heads,
                           o.kv_heads, c);
    if (c == 4) {
      auto mesh = comm::DeviceMesh::create(world, {{"cp_ring", 2}, {"cp_ulysses", 2}});
      if (mesh.ok() && o.heads % 2 == 0 && o.kv_heads % 2 == 0) {
        comms.mesh = std::move(*mesh);
        variants.push_back({Method::kHybrid, LayoutKind::kZigzag});
      }
    }
    if (rank == 0) {
      fmt::print("# bench cp C {} heads {} kv_heads {} head_dim {} {} reps {} threads/rank {} cpu {}\n", c, o.heads,
                 o.kv_heads, o.head_dim, o.causal ? "causal" : "non-causal", o.reps, o.threads, cpu_features().brand);
      fmt::print("{}", notes);
      fmt::print("# per call = one forward + one backward; compute = kernels and merges on the compute thread; "
                 "exposed = its waits for transfers; comm = the communication thread's transfer time; mem = "
                 "inputs, outputs, gradients and peak scratch per rank\n");
      fmt::print("| method | T | T/C | fwd compute ms (min..max rank) | bwd compute ms (min..max) | imbalance "
                 "max/min | exposed ms (max) | comm ms (max) | sent MiB/rank | mem MiB/rank | mem B per local "
                 "token | wall ms | wall / ring zigzag |\n");
      fmt::print("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    }
    for (int64_t seq : o.seqs) {
      double ring_zigzag_wall = 0;
      for (const Variant& v : variants) {
        auto layout = layout_of(v, seq, c);
        Expected<RankResult> r = layout.ok() ? measure(v, *layout, comms, o) : Expected<RankResult>(layout.status());
        if (!r.ok()) {  // the same verdict on every rank: arguments only
          if (rank == 0) fmt::print(stderr, "kiln bench cp: {}: {}\n", v.name(), r.status().message());
          rc = 1;
          continue;
        }
        double mine[kFields] = {r->fwd_compute_s, r->bwd_compute_s, r->exposed_s, r->comm_s,
                                r->wall_s,        r->bytes_sent,    r->mem_bytes};
        std::vector<double> all(static_cast<size_t>(kFields) * c);
        MPI_Gather(mine, kFields, MPI_DOUBLE, all.data(), kFields, MPI_DOUBLE, 0, world.handle());
        if (rank != 0) continue;
        auto field = [&](int f) {
          std::vector<double> x;
          for (int i = 0; i < c; ++i) x.push_back(all[i * kFields + f]);
          return summarize(x);
        };
        const Summary fwd = field(0), bwd = field(1), exposed = field(2), cm = field(3), wall = field(4),
                      sent = field(5), mem = field(6);
        std::vector<double> total;
        for (int i = 0; i < c; ++i) total.push_back(all[i * kFields] + all[i * kFields + 1]);
        const Summary work = summarize(total);
        if (v.method == Method::kRing && v.kind == LayoutKind::kZigzag) ring_zigzag_wall = wall.max;
        const std::string vs = ring_zigzag_wall > 0 ? fmt::format("{:.2f}", wall.max / ring_zigzag_wall) : "-";
        fmt::print("| {} | {} | {} | {:.1f}..{:.1f} | {:.1f}..{:.1f} | {:.2f} | {:.1f} | {:.1f} | {:.2f} | {:.2f} | "
                   "{:.0f} | {:.1f} | {} |\n",
                   v.name(), seq, seq / c, 1e3 * fwd.min, 1e3 * fwd.max, 1e3 * bwd.min, 1e3 * bwd.max,
                   work.max / std::max(work.min, 1e-12), 1e3 * exposed.max, 1e3 * cm.max, mib(sent.max),
                   mib(mem.max), mem.max / static_cast<double>(seq / c), 1e3 * wall.max, vs);
        std::fflush(stdout);
      }
    }
  }
  comm::finalize();
  return rc;
}

}  // namespace kiln::bench
