// Fast CPU grouped GEMM: every group's C is cut into work items (a block of rows x a chunk of
// columns, sized by FLOPs), and all items of all groups run in one parallel region, largest
// first, claimed dynamically. An item runs cpu::gemm's single-thread pieces (gemm_driver.h): pack
// its columns of B, run its rows against them with the same micro-kernels; m <= kGemmSmallM
// groups take the streaming small-M kernels.
#include "kiln/kernels/grouped_gemm.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "kiln/core/trace.h"
#include "kiln/kernels/cpu/gemm_driver.h"
#include "kiln/kernels/cpu/parallel.h"

namespace kiln::cpu {
namespace {

enum class ItemKind : uint8_t {
  kPacked,  // rows [r0, r1) x columns [c0, c1) in MR / NR strips, the packed path
  kSmallM,  // all rows (m <= kGemmSmallM) x columns [c0, c1), the small-M path
  kScale,   // k = 0: C = beta·C (beta = 0 zeroes without reading)
};

// A block of one group's C, computed whole by one thread.
struct WorkItem {
  double cost = 0;  // FLOPs (kScale: the elements it writes)
  int64_t group = 0;
  ItemKind kind = ItemKind::kPacked;
  int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
};

// The cut aims at about this many items per thread: with items claimed largest first, the last
// ones are small and the threads finish within about one small item of each other, while each
// extra cut packs some A or B again. On the 2-core EPYC VM (kiln bench grouped-gemm, e8-zipf and
// e64-zipf, 2 threads, 3 alternating runs) 4 was best or even in every pattern: 8 was 1-8% slower
// on e8-zipf, 16 5-15% slower. The machine was shared with other builds: a few % is noise.
constexpr int64_t kItemsPerThread = 4;
// No item is cut below this (~20 µs at 100 GFLOP/s, several pool wake-ups): smaller ones would
// repack more than they gain in balance. An estimate, not tuned.
constexpr double kMinItemFlops = 2e6;
// A column chunk of at least this many NR strips: an A strip is then reused from L1 across a few
// B micro-panels (run_block groups 8). In the runs above, minimums of 1 and 8 strips were even
// with 4 within the noise.
constexpr int64_t kMinChunkStrips = 4;

// One packed group cut into num_m row blocks x num_n column chunks, at least `pieces` of them if
// the strips allow, with the least data handled twice: a row cut makes each item pack its
// columns of B again (n per extra row block, times k), a column cut makes each item read its rows
// of A again, packing them (m) or in place (counted as half: a read without the write). Every
// item's packed B panel (k x its columns) stays within kThreadPanelBytes.
struct Cut {
  int64_t num_m = 1, num_n = 1;
};
Cut cut_group(const GemmGroup& e, int64_t mstrips, int64_t nstrips, int64_t nr, int64_t pieces,
              bool a_in_place) {
  const int64_t max_n = std::max<int64_t>(1, nstrips / kMinChunkStrips);
  const int64_t min_n = std::min(nstrips, ceil_div(4 * e.k * nstrips * nr, kThreadPanelBytes));
  pieces = std::min(pieces, mstrips * std::max(max_n, min_n));
  const double a_weight = a_in_place ? 0.5 : 1.0;
  Cut best;
  double best_cost = INFINITY;
  for (int64_t num_m = 1; num_m <= std::min(mstrips, pieces); ++num_m) {
    const int64_t num_n = std::max(min_n, std::min(max_n, ceil_div(pieces, num_m)));
    if (num_m * num_n < pieces) continue;
    const double cost =
        static_cast<double>(num_m - 1) * e.n + a_weight * static_cast<double>(num_n - 1) * e.m;
    if (cost < best_cost) {
      best_cost = cost;
      best = {num_m, num_n};
    }
  }
  if (best_cost == INFINITY) best = {std::min(mstrips, pieces), min_n};
  return best;
}

// The work items of all groups into `items`, largest first (ties in group and position order:
// the same plan every call).
void plan_items(const GroupedGemmParams& p, const PackedPath& path, int threads,
                std::vector<WorkItem>& items) {
  double total = 0;
  for (const GemmGroup& e : p.groups) total += gemm_flops(e.m, e.n, e.k);
  // One thread: no cut for balance (only to keep B panels in cache).
  const double target =
      threads == 1 ? INFINITY : std::max(kMinItemFlops, total / (kItemsPerThread * threads));
  const auto pieces_for = [&](double cost) {
    return std::isinf(target) ? int64_t{1} : std::max<int64_t>(1, std::llround(cost / target));
  };
  items.clear();
  for (size_t g = 0; g < p.groups.size(); ++g) {
    const GemmGroup& e = p.groups[g];
    if (e.m == 0 || e.n == 0) continue;
    const auto group = static_cast<int64_t>(g);
    if (e.k == 0) {
      if (p.beta != 1.0f)
        items.push_back({static_cast<double>(e.m * e.n), group, ItemKind::kScale, 0, e.m, 0, e.n});
      continue;
    }
    const double cost = gemm_flops(e.m, e.n, e.k);
    if (e.m <= kGemmSmallM) {
      // Column chunks of >= 64, multiples of 16 (where the small-M kernels start a column group).
      const int64_t num = std::min(pieces_for(cost), std::max<int64_t>(1, e.n / 64));
      for (int64_t t = 0; t < num; ++t) {
        const int64_t j0 = t == 0 ? 0 : (e.n * t / num) & ~int64_t{15};
        const int64_t j1 = t + 1 == num ? e.n : (e.n * (t + 1) / num) & ~int64_t{15};
        if (j1 > j0)
          items.push_back({cost * (j1 - j0) / e.n, group, ItemKind::kSmallM, 0, e.m, j0, j1});
      }
      continue;
    }
    const int64_t mstrips = ceil_div(e.m, path.mr), nstrips = ceil_div(e.n, path.nr);
    const Cut cut = cut_group(e, mstrips, nstrips, path.nr, pieces_for(cost),
                              path.kernel_direct_a != nullptr && !p.trans_a);
    for (int64_t i = 0; i < cut.num_m; ++i) {
      const int64_t r0 = mstrips * i / cut.num_m, r1 = mstrips * (i + 1) / cut.num_m;
      for (int64_t j = 0; j < cut.num_n; ++j) {
        const int64_t c0 = nstrips * j / cut.num_n, c1 = nstrips * (j + 1) / cut.num_n;
        if (r1 > r0 && c1 > c0)
          items.push_back({cost * static_cast<double>((r1 - r0) * (c1 - c0)) /
                               static_cast<double>(mstrips * nstrips),
                           group, ItemKind::kPacked, r0, r1, c0, c1});
      }
    }
  }
  std::sort(items.begin(), items.end(), [](const WorkItem& a, const WorkItem& b) {
    if (a.cost != b.cost) return a.cost > b.cost;
    return std::tie(a.group, a.r0, a.c0) < std::tie(b.group, b.r0, b.c0);
  });
}

// C (m, n) = beta·C for a group with k = 0 (no product to add).
void scale_c(const GemmParams& q) {
  for (int64_t i = 0; i < q.m; ++i) {
    float* row = q.c + i * q.ldc;  // (n,)
    if (q.beta == 0.0f) {
      std::fill(row, row + q.n, 0.0f);
    } else {
      for (int64_t j = 0; j < q.n; ++j) row[j] *= q.beta;
    }
  }
}

}  // namespace

void grouped_gemm(const GroupedGemmParams& p) {
  trace::Scope kiln_trace_(trace::Category::kKernel, "grouped_gemm", [&](trace::Event& e) { e.flops = grouped_gemm_flops(p); e.bytes = grouped_gemm_bytes(p); e.set_dims({static_cast<int64_t>(p.groups.size())}); e.dtype = "f32"; });
  KILN_CHECK_MSG(check_grouped_gemm(p).ok(), "{}", check_grouped_gemm(p).message());
  const GemmTargetKernels& kernels = gemm_target_kernels();
  const PackedPath& path = kernels.f32;
  const GemmBlocking blk = gemm_blocking(GemmPath::kF32);
  const int64_t mc_strips = std::max<int64_t>(1, blk.mc / path.mr);
  // This thread's item list, reused (no allocation per call once grown); named through a
  // reference so that the pool's threads read this one, not their own thread_local copy.
  thread_local std::vector<WorkItem> reused;
  std::vector<WorkItem>& items = reused;
  plan_items(p, path, num_threads(), items);
  run_tasks(static_cast<int64_t>(items.size()), [&](int64_t t) {
    const WorkItem& it = items[static_cast<size_t>(t)];
    const GemmParams q = group_gemm_params(p, static_cast<size_t>(it.group));
    switch (it.kind) {
      case ItemKind::kPacked:
        run_column_chunk(q, path, panel_layout(q, path, blk), it.c0, it.c1, it.r0, it.r1,
                         mc_strips);
        break;
      case ItemKind::kSmallM:
        small_m_columns(q, kernels, small_m_args(q), it.c0, it.c1);
        break;
      case ItemKind::kScale:
        scale_c(q);
        break;
    }
  });
}

}  // namespace kiln::cpu
