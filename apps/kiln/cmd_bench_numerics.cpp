// `kiln bench numerics`: relative error of naive, pairwise, Kahan and Neumaier summation with
// fp32 and bf16 accumulators against the exact (double-double) sum as n grows 1e3 … 1e8, beside
// the theory's n·u, log2(n)·u and u; a table (or JSON lines) and a log-log SVG chart.
// Values are uniform [0, 1) (so S1 = |s|), generated on the fly in one streaming pass.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "apps/kiln/commands.h"
#include "kiln/core/rng.h"
#include "kiln/kernels/summation.h"
#include "kiln/perf/svg.h"

namespace kiln::app {
namespace {

struct NumericsOptions {
  double max_n = 1e8;
  uint64_t seed = 1;
  bool json = false;
  std::string svg = "bench_numerics.svg";
};

// Pairwise summation of a stream (the usual binary-counter form): leaves of kLeaf values are
// summed pairwise (ref::sum), and leaf sums merge like a binary counter, equal sizes first.
// value() folds the pending partial sums from the smallest up: a pairwise tree of depth at most
// ceil(log2 n) + 1, whose error bound is the pairwise one.
class PairwiseStream {
 public:
  explicit PairwiseStream(DType accum) : accum_(accum) { leaf_.reserve(kLeaf); }
  void add(const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      leaf_.push_back(x[i]);
      if (static_cast<int64_t>(leaf_.size()) == kLeaf) {
        push(ref::sum(leaf_.data(), kLeaf, SumMethod::kPairwise, accum_), 0);
        leaf_.clear();
      }
    }
  }
  float value() const {
    float acc = ref::sum(leaf_.data(), static_cast<int64_t>(leaf_.size()), SumMethod::kPairwise, accum_);
    bool have = !leaf_.empty();
    for (auto it = stack_.rbegin(); it != stack_.rend(); ++it) {
      acc = have ? round_accum(it->value + acc, accum_) : it->value;
      have = true;
    }
    return acc;
  }

 private:
  static constexpr int64_t kLeaf = 4096;
  struct Entry { float value; int level; };
  void push(float v, int level) {
    while (!stack_.empty() && stack_.back().level == level) {
      v = round_accum(stack_.back().value + v, accum_);
      stack_.pop_back();
      ++level;
    }
    stack_.push_back({v, level});
  }
  DType accum_;
  std::vector<float> leaf_;
  std::vector<Entry> stack_;  // levels strictly decreasing from bottom to top
};

struct Row {
  int64_t n;
  double exact;
  double rel[2][4];  // [accum f32, bf16][method]
};

constexpr DType kAccums[2] = {DType::kF32, DType::kBF16};

// n = 1e3, 3e3, 1e4, 3e4, ... up to max_n.
std::vector<int64_t> checkpoints(double max_n) {
  std::vector<int64_t> out;
  for (int64_t d = 1000; d <= max_n; d *= 10) {
    out.push_back(d);
    if (3 * d <= max_n) out.push_back(3 * d);
  }
  return out;
}

int run_numerics(const NumericsOptions& o) {
  const std::vector<int64_t> ns = checkpoints(o.max_n);
  if (ns.empty()) {
    fmt::print(stderr, "kiln bench numerics: --max-n must be at least 1000\n");
    return kUserError;
  }
  const auto t0 = std::chrono::steady_clock::now();
  Rng rng(o.seed);
  ref::ExactSum exact;
  SumState seq[2][3];  // [accum][naive, kahan, neumaier]
  const SumMethod seq_methods[3] = {SumMethod::kNaive, SumMethod::kKahan, SumMethod::kNeumaier};
  PairwiseStream pw[2] = {PairwiseStream(DType::kF32), PairwiseStream(DType::kBF16)};
  constexpr int64_t kChunk = int64_t{1} << 20;  // 4 MiB of values generated at a time
  std::vector<float> chunk(kChunk);             // (kChunk,)
  std::vector<Row> rows;
  int64_t done = 0;
  for (int64_t n : ns) {
    while (done < n) {
      const int64_t len = std::min(kChunk, n - done);
      for (int64_t i = 0; i < len; ++i) chunk[i] = rng.uniform();
      exact.add(chunk.data(), len);
      for (int a = 0; a < 2; ++a) {
        for (int m = 0; m < 3; ++m) ref::sum_continue(seq[a][m], chunk.data(), len, seq_methods[m], kAccums[a]);
        pw[a].add(chunk.data(), len);
      }
      done += len;
    }
    Row r{n, exact.value(), {}};
    for (int a = 0; a < 2; ++a) {
      const double got[4] = {ref::sum_value(seq[a][0], SumMethod::kNaive, kAccums[a]), pw[a].value(),
                             ref::sum_value(seq[a][1], SumMethod::kKahan, kAccums[a]),
                             ref::sum_value(seq[a][2], SumMethod::kNeumaier, kAccums[a])};
      for (int m = 0; m < 4; ++m) r.rel[a][m] = std::fabs(got[m] - r.exact) / std::fabs(r.exact);
    }
    rows.push_back(r);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const double u[2] = {std::ldexp(1.0, -24), std::ldexp(1.0, -8)};
  if (o.json) {
    for (const Row& r : rows) {
      for (int a = 0; a < 2; ++a) {
        for (int m = 0; m < 4; ++m) {
          fmt::print("{{\"bench\":\"numerics\",\"n\":{},\"method\":\"{}\",\"accum\":\"{}\",\"rel_error\":{:.6e},"
                     "\"n_u\":{:.6e},\"log2n_u\":{:.6e},\"u\":{:.6e}}}\n",
                     r.n, sum_method_name(kSumMethods[m]), dtype_name(kAccums[a]), r.rel[a][m],
                     r.n * u[a], std::log2(static_cast<double>(r.n)) * u[a], u[a]);
        }
      }
    }
  } else {
    fmt::print("relative error |ŝ - s| / |s| of a sum of n uniform [0,1) floats, s exact (double-double)\n");
    fmt::print("u: f32 2^-24 = {:.2e}, bf16 2^-8 = {:.2e}\n\n", u[0], u[1]);
    fmt::print("{:>10} | {:>9} {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} {:>9} | {:>9} {:>9}\n", "n",
               "naive32", "pairw32", "kahan32", "neum32", "naive16b", "pairw16b", "kahan16b", "neum16b",
               "n·u32", "log2n·u32");
    for (const Row& r : rows) {
      fmt::print("{:>10} | {:9.2e} {:9.2e} {:9.2e} {:9.2e} | {:9.2e} {:9.2e} {:9.2e} {:9.2e} | {:9.2e} {:9.2e}\n",
                 r.n, r.rel[0][0], r.rel[0][1], r.rel[0][2], r.rel[0][3], r.rel[1][0], r.rel[1][1],
                 r.rel[1][2], r.rel[1][3], r.n * u[0], std::log2(static_cast<double>(r.n)) * u[0]);
    }
    fmt::print("\n{} values streamed in {:.1f} s (all methods, one pass)\n", rows.back().n, seconds);
  }

  if (!o.svg.empty()) {
    // Zero errors (exact results) cannot sit on a log axis: they are drawn at kFloor.
    constexpr double kFloor = 1e-12;
    const char* colors[2][4] = {{"#08306b", "#2171b5", "#41ab5d", "#00441b"},
                                {"#a50f15", "#fb6a4a", "#ff7f0e", "#6a3d9a"}};
    std::vector<Series> series;
    for (int a = 0; a < 2; ++a) {
      for (int m = 0; m < 4; ++m) {
        Series s{fmt::format("{} {}", sum_method_name(kSumMethods[m]), dtype_name(kAccums[a])), {}, colors[a][m]};
        for (const Row& r : rows) s.points.emplace_back(r.n, std::max(r.rel[a][m], kFloor));
        series.push_back(std::move(s));
      }
    }
    for (int a = 0; a < 2; ++a) {
      Series nu{fmt::format("n·u {}", dtype_name(kAccums[a])), {}, "#999999", true};
      Series lu{fmt::format("log2(n)·u {}", dtype_name(kAccums[a])), {}, "#bbbbbb", true};
      Series cu{fmt::format("u {}", dtype_name(kAccums[a])), {}, "#dddddd", true};
      for (const Row& r : rows) {
        const double n = static_cast<double>(r.n);
        if (n * u[a] <= 1) nu.points.emplace_back(n, n * u[a]);
        lu.points.emplace_back(n, std::log2(n) * u[a]);
        cu.points.emplace_back(n, u[a]);
      }
      series.push_back(std::move(nu));
      series.push_back(std::move(lu));
      series.push_back(std::move(cu));
    }
    ChartOptions chart;
    chart.title = "Summation error vs n (uniform [0,1)): naive ~ n·u, pairwise ~ log2(n)·u, Kahan ~ u";
    chart.x_label = "n";
    chart.y_label = "relative error";
    chart.log_x = chart.log_y = true;
    chart.width = 900;
    chart.height = 560;
    const std::filesystem::path path(o.svg);
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
    std::ofstream f(path);
    if (!f) {
      fmt::print(stderr, "kiln bench numerics: cannot write {}\n", o.svg);
      return kUserError;
    }
    f << line_chart_svg(series, chart);
    if (!o.json) fmt::print("chart: {}\n", o.svg);
  }
  return 0;
}

}  // namespace

void register_bench_numerics(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto opt = std::make_shared<NumericsOptions>();
  CLI::App* cmd = bench->add_subcommand(
      "numerics", "Summation error (naive, pairwise, Kahan, Neumaier; f32 and bf16 accumulators) vs n");
  cmd->add_option("--max-n", opt->max_n, "Largest n (n = 1e3, 3e3, 1e4, ...; default 1e8)")
      ->check(CLI::Range(1e3, 1e9));
  cmd->add_option("--seed", opt->seed, "Seed of the uniform [0,1) values");
  cmd->add_flag("--json", opt->json, "One JSON object per line: n, method, accum, rel_error, n_u, log2n_u, u");
  cmd->add_option("--svg", opt->svg, "Write the log-log chart here ('' for none)");
  cmd->callback([opt] {
    const int rc = run_numerics(*opt);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace kiln::app
