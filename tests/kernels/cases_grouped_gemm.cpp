// Grouped GEMM cases for the kernel harness: cpu::grouped_gemm against ref::grouped_gemm over the
// three MoE patterns (forward x·Wᵀ, input gradient dy·W, weight gradient dW += dyᵀ·x with the
// ragged k) with ragged groups (m_e = 0, 1, 7, 33, ...; G = 1, 3, 8, 64), groups whose m, n and k
// all differ under every transpose pair, padded leading dims, alpha/beta, groups large enough to
// be cut into many items, small cache blockings (several MC and K blocks per item) and a B panel
// too large for one item. Operands of consecutive groups are adjacent in one buffer (with pad 0,
// the MoE layout: x and y sorted by expert, W stacked (E, F, C)), so a write past a group's C
// lands in the next group's.
//
// Tolerance as in cases_gemm.cpp: an fp32 length-k dot product has nmse ~ k u² (u = 2^-24;
// ~1e-11 at k = 2048), so 1e-10 per group; k = 0 groups are exact (C zeroed or kept).
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/grouped_gemm.h"
#include "tests/kernels/harness.h"

namespace kiln::testing {
namespace {

struct Shape3 {
  int64_t m, n, k;
};

struct GroupedCase {
  std::string label;
  std::vector<Shape3> shapes;  // (m, n, k) of each group
  bool ta = false, tb = false;
  int64_t pad = 0;  // extra elements per stored row of every A, B and C
  float alpha = 1.0f, beta = 0.0f;
  cpu::GemmBlocking blocking{};  // {0,0,0}: the current blocking

  std::string name() const {
    std::string s =
        fmt::format("{} G={} ta={} tb={} pad={} alpha={} beta={} blk={}/{}/{} (m,n,k):", label,
                    shapes.size(), ta, tb, pad, alpha, beta, blocking.mc, blocking.kc, blocking.nc);
    for (size_t g = 0; g < shapes.size() && g < 12; ++g)
      s += fmt::format(" ({},{},{})", shapes[g].m, shapes[g].n, shapes[g].k);
    if (shapes.size() > 12) s += " ...";
    return s;
  }
};

// The MoE patterns for experts with rows[e] tokens each, d_model c, expert FFN width f.
enum class Pattern { kForward, kInputGrad, kWeightGrad };
GroupedCase moe_case(Pattern pat, const std::vector<int64_t>& rows, int64_t c, int64_t f) {
  GroupedCase g;
  for (int64_t r : rows) {
    switch (pat) {
      case Pattern::kForward:
        g.shapes.push_back({r, f, c});
        break;  // y_e = x_e · W_eᵀ
      case Pattern::kInputGrad:
        g.shapes.push_back({r, c, f});
        break;  // dx_e = dy_e · W_e
      case Pattern::kWeightGrad:
        g.shapes.push_back({f, c, r});
        break;  // dW_e += dy_eᵀ · x_e
    }
  }
  g.label = pat == Pattern::kForward     ? "forward"
            : pat == Pattern::kInputGrad ? "input-grad"
                                         : "weight-grad";
  g.tb = pat == Pattern::kForward;
  g.ta = pat == Pattern::kWeightGrad;
  g.beta = pat == Pattern::kWeightGrad ? 1.0f : 0.0f;
  return g;
}

KernelCase make_case(const GroupedCase& gc, uint64_t seed) {
  return {
      gc.name(), [gc, seed]() {
        Rng rng(seed);
        const size_t num_groups = gc.shapes.size();
        // Offsets of each group's A, B and C in the shared buffers, and their leading dims.
        std::vector<GemmGroup> groups(num_groups);
        std::vector<int64_t> a_off(num_groups), b_off(num_groups), c_off(num_groups);
        int64_t a_size = 1, b_size = 1, c_size = 1;
        for (size_t g = 0; g < num_groups; ++g) {
          const auto [m, n, k] = gc.shapes[g];
          GemmGroup& e = groups[g];
          e.m = m;
          e.n = n;
          e.k = k;
          e.lda = std::max<int64_t>(1, (gc.ta ? m : k) + gc.pad);
          e.ldb = std::max<int64_t>(1, (gc.tb ? k : n) + gc.pad);
          e.ldc = std::max<int64_t>(1, n + gc.pad);
          a_off[g] = a_size;  // element 0 is never a group's: offsets > 0 catch underruns too
          b_off[g] = b_size;
          c_off[g] = c_size;
          a_size += (gc.ta ? k : m) * e.lda;
          b_size += (gc.tb ? n : k) * e.ldb;
          c_size += m * e.ldc;
        }
        const std::vector<float> a = random_vector(rng, static_cast<size_t>(a_size));
        const std::vector<float> b = random_vector(rng, static_cast<size_t>(b_size));
        // C: valid region random when beta reads it, NaN when beta = 0 (must not be read).
        std::vector<float> c0(static_cast<size_t>(c_size), kPaddingSentinel);
        for (size_t g = 0; g < num_groups; ++g)
          for (int64_t i = 0; i < groups[g].m; ++i)
            for (int64_t j = 0; j < groups[g].n; ++j)
              c0[c_off[g] + i * groups[g].ldc + j] =
                  gc.beta != 0.0f ? rng.uniform(-1.0f, 1.0f) : NAN;

        std::vector<float> c_ref = c0, c_fast = c0;
        const auto params = [&](std::vector<float>& c) {
          for (size_t g = 0; g < num_groups; ++g) {
            groups[g].a = a.data() + a_off[g];
            groups[g].b = b.data() + b_off[g];
            groups[g].c = c.data() + c_off[g];
          }
          GroupedGemmParams p;
          p.groups = groups;
          p.trans_a = gc.ta;
          p.trans_b = gc.tb;
          p.alpha = gc.alpha;
          p.beta = gc.beta;
          return p;
        };
        const GroupedGemmParams p_ref = params(c_ref);
        EXPECT_TRUE(check_grouped_gemm(p_ref).ok()) << check_grouped_gemm(p_ref).to_string();
        ref::grouped_gemm(p_ref);

        const cpu::GemmBlocking saved = cpu::gemm_blocking(cpu::GemmPath::kF32);
        if (gc.blocking.mc > 0) cpu::set_gemm_blocking(cpu::GemmPath::kF32, gc.blocking);
        cpu::grouped_gemm(params(c_fast));
        cpu::set_gemm_blocking(cpu::GemmPath::kF32, saved);

        std::vector<Compare> out;
        for (size_t g = 0; g < num_groups; ++g) {
          const auto slice = [&](const std::vector<float>& c) {
            return std::vector<float>(c.begin() + c_off[g],
                                      c.begin() + c_off[g] + groups[g].m * groups[g].ldc);
          };
          for (Compare& cmp : compare_strided(fmt::format("C[{}]", g), slice(c_ref), slice(c_fast),
                                              groups[g].m, groups[g].n, groups[g].ldc, 1e-10))
            out.push_back(std::move(cmp));
        }
        // Element 0 of C belongs to no group.
        out.push_back({"C outside the groups untouched", {kPaddingSentinel}, {c_fast[0]}, 0.0});
        return out;
      }};
}

// m_e of E experts under Zipf-like routing of `rows` token rows (expert e gets ~ 1 / (e + 1)^s),
// the tail rounded down to 0, 1, 2, ... rows.
std::vector<int64_t> zipf_rows(int64_t experts, int64_t rows, double s) {
  double h = 0;
  for (int64_t e = 0; e < experts; ++e) h += std::pow(static_cast<double>(e + 1), -s);
  std::vector<int64_t> out;
  for (int64_t e = 0; e < experts; ++e)
    out.push_back(static_cast<int64_t>(static_cast<double>(rows) *
                                       std::pow(static_cast<double>(e + 1), -s) / h));
  return out;
}

}  // namespace

KILN_KERNEL_CASES(grouped_gemm) {
  std::vector<KernelCase> cases;
  uint64_t seed = 1;
  // Ragged expert rows: empty experts, single rows, the small-M boundary (8, 9), partial MR strips.
  const std::vector<std::vector<int64_t>> routings = {{33},
                                                      {0},
                                                      {1},
                                                      {7},
                                                      {1, 0, 130},
                                                      {0, 1, 7, 33, 64, 100, 9, 0},
                                                      {8, 9, 15, 16, 29, 0, 2, 45},
                                                      zipf_rows(64, 700, 1.1)};
  for (Pattern pat : {Pattern::kForward, Pattern::kInputGrad, Pattern::kWeightGrad}) {
    for (size_t r = 0; r < routings.size(); ++r) {
      // d_model and FFN width: not multiples of any SIMD width, and one aligned pair.
      const bool aligned = r % 3 == 2;
      GroupedCase g = moe_case(pat, routings[r], aligned ? 64 : 37, aligned ? 96 : 70);
      g.pad = r % 4 == 3 ? 3 : 0;
      cases.push_back(make_case(g, seed++));
    }
    // The other beta (forward and input grad accumulating, weight grad overwriting) and alpha.
    GroupedCase g = moe_case(pat, {5, 0, 40, 17}, 33, 50);
    g.beta = pat == Pattern::kWeightGrad ? 0.0f : 1.0f;
    g.alpha = -0.5f;
    cases.push_back(make_case(g, seed++));
  }
  // Groups whose m, n and k all differ (and are 0 in turn), every transpose pair, padded, beta.
  const int64_t sizes[] = {0, 1, 2, 7, 16, 33, 64, 100, 257};
  for (int t = 0; t < 4; ++t) {
    GroupedCase g{"mixed", {}, t % 2 == 1, t / 2 == 1};
    for (int i = 0; i < 8; ++i)
      g.shapes.push_back({sizes[(i + t) % 9], sizes[(3 * i + 1) % 9], sizes[(5 * i + 2 * t) % 9]});
    g.pad = t == 2 ? 3 : 0;
    g.alpha = t == 3 ? 1.5f : 1.0f;
    g.beta = t % 2 == 1 ? 0.75f : 0.0f;
    cases.push_back(make_case(g, seed++));
  }
  // Large groups beside small ones: on 2 and 3 threads the large ones are cut into several row
  // blocks and column chunks (row cuts when A is packed: transposed A).
  for (bool ta : {false, true}) {
    GroupedCase g{"cut", {{300, 520, 129}, {3, 520, 129}, {150, 260, 64}, {40, 33, 700}}, ta, !ta};
    g.beta = ta ? 1.0f : 0.0f;
    cases.push_back(make_case(g, seed++));
  }
  // Small cache blockings: items spanning several MC blocks and K blocks, forward and weight grad.
  for (Pattern pat : {Pattern::kForward, Pattern::kWeightGrad}) {
    GroupedCase g = moe_case(pat, {100, 3, 0, 151}, 151, 200);
    g.blocking = {28, 32, 64};
    cases.push_back(make_case(g, seed++));
  }
  // A B panel over kThreadPanelBytes (k 2100 x 520 f32 = 4.2 MiB): cut into column chunks.
  cases.push_back(make_case({"wide-panel", {{9, 520, 2100}, {20, 64, 5}}}, seed++));
  // No groups, and groups that are all empty.
  cases.push_back(make_case({"empty", {}}, seed++));
  cases.push_back(
      make_case({"empty", {{0, 5, 3}, {4, 0, 2}, {0, 0, 0}}, false, false, 0, 1.0f, 0.0f}, seed++));
  return cases;
}

}  // namespace kiln::testing
