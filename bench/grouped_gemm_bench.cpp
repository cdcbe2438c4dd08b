// The grouped-GEMM benchmark's body (grouped_gemm_bench.h): routings to rows per expert, the
// MoE GEMM patterns over one layer's buffers, and the interleaved timing of one grouped call
// against a loop of cpu::gemm.
#include "bench/grouped_gemm_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/grouped_gemm.h"

namespace kiln::bench {
namespace {

constexpr int kUserError = 2;  // kiln::app::kUserError (bench/ does not include apps/)

// Skew of "zipf" routing: expert e (from 0) gets rows in proportion to 1 / (e + 1)^s. At s = 1.2
// over 4096 rows the busiest of 8 experts gets 12x the rows of the idlest (1756 vs 144), and 43
// of 64 experts get fewer than 32 rows (6 get 8, the small-M path) while the busiest gets 1199.
constexpr double kZipfExponent = 1.2;

// Rows per expert for "e<E>-balanced" or "e<E>-zipf", `rows` = tokens x top_k in all; an expert
// gets each token at most once (at most `tokens` rows).
Expected<std::vector<int64_t>> expert_rows(const std::string& routing, int64_t tokens,
                                           int64_t top_k) {
  const size_t dash = routing.find('-');
  const std::string kind = dash == std::string::npos ? "" : routing.substr(dash + 1);
  int64_t experts = 0;
  if (routing.size() > 1 && routing[0] == 'e' && dash != std::string::npos) {
    const std::string digits = routing.substr(1, dash - 1);
    if (!digits.empty() && digits.size() <= 5 &&
        std::all_of(digits.begin(), digits.end(), ::isdigit))
      experts = std::stoll(digits);
  }
  if (experts < 1 || (kind != "balanced" && kind != "zipf"))
    return invalid_argument(
        "--routing {}: e<experts>-balanced or e<experts>-zipf expected, e.g. e8-zipf", routing);
  if (experts < top_k)
    return invalid_argument("--routing {}: {} experts cannot take top-{} routing", routing, experts,
                            top_k);
  const int64_t rows = tokens * top_k;
  std::vector<double> weight(static_cast<size_t>(experts), 1.0);
  if (kind == "zipf")
    for (int64_t e = 0; e < experts; ++e)
      weight[e] = std::pow(static_cast<double>(e + 1), -kZipfExponent);
  double total = 0;
  for (double w : weight) total += w;
  std::vector<int64_t> out(static_cast<size_t>(experts));
  int64_t given = 0;
  for (int64_t e = 0; e < experts; ++e)
    given += out[e] = static_cast<int64_t>(rows * weight[e] / total);
  for (int64_t e = 0; given < rows; e = (e + 1) % experts)
    ++out[e], ++given;  // the rounding remainder
  for (int64_t e = 0; e + 1 < experts;
       ++e) {  // more rows than tokens: the excess to the next expert
    out[e + 1] += std::max<int64_t>(0, out[e] - tokens);
    out[e] = std::min(out[e], tokens);
  }
  return out;
}

// The MoE tensors of one layer, experts' rows consecutive (sorted by expert).
struct MoeBuffers {
  std::vector<float> x, dy, w, y, dx,
      dw;  // x (R, C), dy (R, F), W (E, F, C), y (R, F), dx (R, C), dW (E, F, C)
};

// The groups of one pattern: forward y_e = x_e·W_eᵀ, input-grad dx_e = dy_e·W_e, weight-grad
// dW_e += dy_eᵀ·x_e.
std::vector<GemmGroup> moe_groups(const std::string& pattern, const std::vector<int64_t>& rows,
                                  int64_t c, int64_t f, MoeBuffers& t) {
  std::vector<GemmGroup> groups;
  int64_t row = 0;
  for (size_t e = 0; e < rows.size(); ++e) {
    const int64_t m = rows[e];
    const float* w = t.w.data() + static_cast<int64_t>(e) * f * c;  // (F, C)
    if (pattern == "forward") {
      groups.push_back({m, f, c, t.x.data() + row * c, c, w, c, t.y.data() + row * f, f});
    } else if (pattern == "input-grad") {
      groups.push_back({m, c, f, t.dy.data() + row * f, f, w, c, t.dx.data() + row * c, c});
    } else {  // weight-grad: A = dy_e stored (m_e, F), B = x_e (m_e, C)
      groups.push_back({f, c, m, t.dy.data() + row * f, f, t.x.data() + row * c, c,
                        t.dw.data() + static_cast<int64_t>(e) * f * c, c});
    }
    row += m;
  }
  return groups;
}

std::string describe_rows(const std::vector<int64_t>& rows) {
  std::vector<int64_t> s = rows;
  std::sort(s.begin(), s.end());
  const auto tiny =
      std::count_if(s.begin(), s.end(), [](int64_t m) { return m <= cpu::kGemmSmallM; });
  std::string head;
  for (size_t e = 0; e < rows.size() && e < 8; ++e)
    head += fmt::format("{}{}", e ? " " : "", rows[e]);
  return fmt::format("m_e = {}{} (min {}, median {}, max {}; {} of {} with m_e <= {})", head,
                     rows.size() > 8 ? " ..." : "", s.front(), s[s.size() / 2], s.back(), tiny,
                     s.size(), cpu::kGemmSmallM);
}

}  // namespace

int run_grouped_gemm_bench(const GroupedBenchOptions& opt) {
  for (const std::string& pat : opt.patterns) {
    if (pat != "forward" && pat != "input-grad" && pat != "weight-grad") {
      fmt::print(
          stderr,
          "{}: --patterns {}: forward, input-grad or weight-grad expected\n",
          opt.command, pat);
      return kUserError;
    }
  }
  std::vector<std::vector<int64_t>> all_rows;
  for (const std::string& r : opt.routings) {
    auto rows = expert_rows(r, opt.tokens, opt.top_k);
    if (!rows.ok()) {
      fmt::print(stderr, "{}: {}\n", opt.command, rows.status().message());
      return kUserError;
    }
    all_rows.push_back(*rows);
  }
  std::vector<std::string> names = opt.routings;
  for (const auto& [name, rows] : opt.counted) {
    const int64_t sum = std::accumulate(rows.begin(), rows.end(), int64_t{0});
    KILN_CHECK_MSG(!rows.empty() && sum == opt.tokens * opt.top_k, "{}: {} rows, not {} x {}", name, sum,
                   opt.tokens, opt.top_k);
    names.push_back(name);
    all_rows.push_back(rows);
  }
  const int64_t c = opt.d_model, f = opt.ffn, r_total = opt.tokens * opt.top_k;
  fmt::print(
      "{}: MoE expert GEMMs, C = {}, F = {}, {} tokens top-{} ({} rows); {}; "
      "{}\n",
      opt.command, c, f, opt.tokens, opt.top_k, r_total, cpu_features().brand,
      cpu::gemm_path_name(cpu::GemmPath::kF32));
  fmt::print(
      "  forward y_e = x_e W_e^T (m_e, F, C); input-grad dx_e = dy_e W_e (m_e, C, F); "
      "weight-grad dW_e += dy_e^T x_e (F, C, m_e)\n");
  fmt::print(
      "  grouped: one cpu::grouped_gemm call; loop: cpu::gemm per expert; interleaved, median of "
      "{} rounds\n",
      opt.reps);
  Rng rng(1);
  MoeBuffers t;
  auto random = [&](std::vector<float>& v, int64_t n) {
    v.resize(static_cast<size_t>(n));
    for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
  };
  int64_t max_experts = 0;
  for (const auto& rows : all_rows)
    max_experts = std::max<int64_t>(max_experts, static_cast<int64_t>(rows.size()));
  random(t.x, r_total * c);
  random(t.dy, r_total * f);
  random(t.w, max_experts * f * c);
  t.y.assign(static_cast<size_t>(r_total * f), 0.0f);
  t.dx.assign(static_cast<size_t>(r_total * c), 0.0f);
  t.dw.assign(static_cast<size_t>(max_experts * f * c), 0.0f);
  fmt::print("{:<13} {:<12} {:>3} | {:>15} {:>12} |\n", "routing", "pattern", "thr",
             "grouped GFLOP/s", "loop GFLOP/s");
  for (size_t ri = 0; ri < all_rows.size(); ++ri) {
    fmt::print("{}: {}\n", names[ri], describe_rows(all_rows[ri]));
    for (const std::string& pat : opt.patterns) {
      const std::vector<GemmGroup> groups = moe_groups(pat, all_rows[ri], c, f, t);
      GroupedGemmParams p;
      p.groups = groups;
      p.trans_b = pat == "forward";
      p.trans_a = pat == "weight-grad";
      p.beta = pat == "weight-grad" ? 1.0f : 0.0f;  // dW accumulates (dropped experts keep theirs)
      const Status ok = check_grouped_gemm(p);
      KILN_CHECK_MSG(ok.ok(), "{}", ok.message());
      const double flops = grouped_gemm_flops(p);
      for (int threads : opt.threads) {
        set_num_threads(threads);
        const std::vector<bench::Summary> s =
            bench::time_interleaved(opt.reps, {[&] { cpu::grouped_gemm(p); },
                                               [&] {
                                                 for (size_t g = 0; g < groups.size(); ++g)
                                                   cpu::gemm(group_gemm_params(p, g));
                                               }});
        const double grouped = flops / s[0].median * 1e-9, loop = flops / s[1].median * 1e-9;
        fmt::print("{:<13} {:<12} {:>3} | {:>15.1f} {:>12.1f} | ratio: {:.2f}\n", names[ri],
                   pat, threads, grouped, loop, grouped / loop);
      }
    }
  }
  fmt::print("ratio = grouped GFLOP/s / loop GFLOP/s (> 1: the grouped call is faster)\n");
  return 0;
}


}  // namespace kiln::bench
