// The alpha-beta model: each algorithm's latency and bandwidth terms, the selection that
// `auto` uses, the relative-error fit of measured times and the calibration cache file.
#include "kiln/comm/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <sched.h>

#include <nlohmann/json.hpp>

#include "kiln/core/file_io.h"
#include "kiln/core/json.h"
#include "kiln/comm/communicator.h"
#include "kiln/comm/detail.h"

namespace kiln::comm {
namespace {

int ilog2(int x) {
  int l = 0;
  while ((2 << l) <= x) ++l;
  return l;
}

}  // namespace

AlgoCost algo_cost(CollOp op, Algo algo, int p, double n, int ranks_per_node) {
  AlgoCost c;
  if (p <= 1 || algo == Algo::kAuto || algo == Algo::kMpi) return c;
  const int p2 = detail::floor_pow2(p), lg = ilog2(p2);
  const double extra = p > p2 ? 1.0 : 0.0;  // non-power-of-two: fold and unfold
  const double frac = (p - 1.0) / p, frac2 = (p2 - 1.0) / p2;
  switch (op) {
    case CollOp::kAllReduce:
      switch (algo) {
        case Algo::kRing:
          c = {2.0 * (p - 1), 2 * frac * n, frac * n};
          break;
        case Algo::kRecursiveDoubling:
          c = {lg + 2 * extra, (lg + 2 * extra) * n, (lg + extra) * n};
          break;
        case Algo::kRabenseifner:
          c = {2.0 * lg + 2 * extra, 2 * frac2 * n + 2 * extra * n, frac2 * n + extra * n};
          break;
        case Algo::kDoubleBinaryTree: {
          // Pipeline of K chunks per tree through h levels, up then down: 2(h + K - 1) steps;
          // per step an inner node moves fanout f chunks each way (f = 2, or 1 when p = 2).
          const double h = detail::tree_height(p), f = std::min(2, p - 1);
          const double chunk = static_cast<double>(detail::tree_chunk_bytes(static_cast<size_t>(n)));
          const double K = std::max(1.0, std::ceil(n / 2 / chunk));
          c = {2 * (h + K - 1), f * n * (h + K - 1) / K, f / 2 * n * (h + K - 1) / K};
          break;
        }
        case Algo::kHierarchical: {
          const int L = (ranks_per_node <= 0 || ranks_per_node >= p) ? p : ranks_per_node;
          const double N = std::ceil(static_cast<double>(p) / L);
          const double fl = (L - 1.0) / L, fn = (N - 1) / N;
          c = {2.0 * (L - 1) + 2 * (N - 1), 2 * fl * n + 2 * fn * n / L, fl * n + fn * n / L};
          break;
        }
        default:
          break;
      }
      break;
    case CollOp::kAllGather:
      if (algo == Algo::kRing) c = {p - 1.0, frac * n, 0};
      if (algo == Algo::kRecursiveDoubling)
        c = {lg + 2 * extra, frac2 * n + extra * (n / p + n), 0};
      break;
    case CollOp::kReduceScatter:
      if (algo == Algo::kRing) c = {p - 1.0, frac * n, frac * n};
      if (algo == Algo::kRecursiveHalving)
        c = {lg + 2 * extra, frac2 * n + extra * (n + n / p), frac2 * n + extra * n};
      break;
    case CollOp::kAllToAll:
      if (algo == Algo::kPairwise) c = {p - 1.0, frac * n, 0};
      // All exchanges of a window in flight at once: one latency per window of peers; the
      // bytes still leave each rank one after the other.
      if (algo == Algo::kScattered)
        c = {std::ceil((p - 1.0) / detail::kAllToAllWindow), frac * n, 0};
      break;
    case CollOp::kBroadcast:
      if (algo == Algo::kBinomialTree) {
        const double rounds = std::ceil(std::log2(static_cast<double>(p)));
        c = {rounds, rounds * n, 0};
      }
      if (algo == Algo::kChain) {
        const double chunk = static_cast<double>(detail::chain_chunk_bytes(static_cast<size_t>(n)));
        const double K = std::max(1.0, std::ceil(n / chunk));
        c = {p - 2 + K, (p - 2 + K) * n / K, 0};
      }
      break;
    default:
      break;
  }
  // An algorithm that implements the op must have terms here: one without them would be
  // priced 0 and chosen by `auto` for every size (a broken invariant, not a user error).
  KILN_CHECK_MSG(!algo_implements(algo, op) || c.steps > 0,
                 "algo_cost has no terms for {} {} (p = {}): add them beside the others", algo_name(algo),
                 coll_op_name(op), p);
  return c;
}

AlphaBeta PiecewiseAlphaBeta::at(double nbytes) const {
  KILN_CHECK(num_knots > 0);
  if (nbytes <= knots[0].bytes) return knots[0].ab;
  if (nbytes >= knots[num_knots - 1].bytes) return knots[num_knots - 1].ab;
  int i = 0;
  while (knots[i + 1].bytes <= nbytes) ++i;  // knots[i].bytes <= nbytes < knots[i + 1].bytes
  const Knot &a = knots[i], &b = knots[i + 1];
  const double w = std::log2(nbytes / a.bytes) / std::log2(b.bytes / a.bytes);
  return {a.ab.alpha_s + w * (b.ab.alpha_s - a.ab.alpha_s),
          a.ab.beta_s_per_byte + w * (b.ab.beta_s_per_byte - a.ab.beta_s_per_byte)};
}

PiecewiseAlphaBeta fit_piecewise(const double* sizes, const double* steps, const double* bw_bytes,
                                 const double* seconds, int n) {
  PiecewiseAlphaBeta f;
  KILN_CHECK(n >= 1 && n <= PiecewiseAlphaBeta::kMaxKnots);
  // The algorithm's latency per step, from the sizes where latency dominates: 16 KiB is
  // below OpenMPI's switch to single-copy transfers, so those sizes share one protocol.
  constexpr double kLatencyBoundBytes = 16 << 10;
  int m = 0;
  while (m < n && sizes[m] <= kLatencyBoundBytes) ++m;
  double alpha = 0;
  if (m >= 2) alpha = fit_alpha_beta(steps, bw_bytes, seconds, m).alpha_s;
  else if (steps[0] > 0) alpha = seconds[0] / steps[0];
  for (int i = 0; i < n; ++i) {
    KILN_CHECK(i == 0 || sizes[i] > sizes[i - 1]);
    AlphaBeta ab{alpha, 0};
    if (steps[i] > 0 && ab.alpha_s * steps[i] > seconds[i]) ab.alpha_s = seconds[i] / steps[i];
    const double rest = seconds[i] - ab.alpha_s * steps[i];
    if (bw_bytes[i] > 0) ab.beta_s_per_byte = std::max(0.0, rest / bw_bytes[i]);
    else if (steps[i] > 0) ab.alpha_s = seconds[i] / steps[i];
    f.knots[i] = {sizes[i], ab};
  }
  f.num_knots = n;
  return f;
}

double predict_seconds(const AlphaBetaTable& t, CollOp op, Algo algo, int p, double nbytes,
                       int ranks_per_node) {
  const AlgoCost c = algo_cost(op, algo, p, nbytes, ranks_per_node);
  const PiecewiseAlphaBeta& f = t.fit_of(op, algo);
  const bool fit_applies =
      t.fitted_p == p && f.valid() &&
      (algo != Algo::kHierarchical || ranks_per_node == t.hier_ranks_per_node);
  if (fit_applies) {
    const AlphaBeta ab = f.at(nbytes);
    return ab.alpha_s * c.steps + ab.beta_s_per_byte * c.bw_bytes;
  }
  return t.link.alpha_s * c.steps + t.link.beta_s_per_byte * c.bw_bytes +
         t.gamma_s_per_byte * c.reduce_bytes;
}

Algo select_algo(const AlphaBetaTable& t, CollOp op, int p, double nbytes, int ranks_per_node) {
  Algo best = Algo::kAuto;
  double best_s = std::numeric_limits<double>::infinity();
  for (const AlgoInfo& info : kAlgoInfos) {
    if (info.algo == Algo::kAuto || info.algo == Algo::kMpi || !algo_implements(info.algo, op))
      continue;
    if (info.algo == Algo::kHierarchical && !(ranks_per_node > 1 && ranks_per_node < p)) continue;
    const double s = predict_seconds(t, op, info.algo, p, nbytes, ranks_per_node);
    if (s < best_s) {  // ties keep the earlier row of kAlgoInfos
      best_s = s;
      best = info.algo;
    }
  }
  KILN_CHECK(best != Algo::kAuto);
  return best;
}

std::vector<std::pair<Algo, double>> rank_algos(const AlphaBetaTable& t, CollOp op, int p,
                                                double nbytes, int ranks_per_node) {
  std::vector<std::pair<Algo, double>> out;
  for (const AlgoInfo& info : kAlgoInfos) {
    if (info.algo == Algo::kAuto || info.algo == Algo::kMpi || !algo_implements(info.algo, op))
      continue;
    if (info.algo == Algo::kHierarchical && !(ranks_per_node > 1 && ranks_per_node < p)) continue;
    out.emplace_back(info.algo, predict_seconds(t, op, info.algo, p, nbytes, ranks_per_node));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.second < b.second; });
  return out;
}

namespace {

double median_of(std::vector<double> v) {
  KILN_CHECK(!v.empty());
  const size_t h = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + h, v.end());
  if (v.size() % 2) return v[h];
  return 0.5 * (v[h] + *std::max_element(v.begin(), v.begin() + h));
}

}  // namespace

double median_ratio(const std::vector<double>& num, const std::vector<double>& den) {
  KILN_CHECK(!num.empty() && num.size() == den.size());
  std::vector<double> q(num.size());
  for (size_t r = 0; r < num.size(); ++r) q[r] = num[r] / den[r];
  return median_of(std::move(q));
}

std::vector<double> paired_times(const std::vector<std::vector<double>>& rounds) {
  std::vector<double> out(rounds.size());
  if (rounds.empty()) return out;
  std::vector<double> med(rounds.size());
  size_t ref = 0;
  for (size_t a = 0; a < rounds.size(); ++a) {
    KILN_CHECK(rounds[a].size() == rounds[0].size());
    med[a] = median_of(rounds[a]);
    if (med[a] < med[ref]) ref = a;
  }
  for (size_t a = 0; a < rounds.size(); ++a)
    out[a] = a == ref ? med[ref] : med[ref] * median_ratio(rounds[a], rounds[ref]);
  return out;
}

std::vector<CalibrationLaunch> pool_launches(const std::vector<CalibrationLaunch>& stored,
                                             const CalibrationLaunch& now) {
  std::vector<CalibrationLaunch> out;
  for (const CalibrationLaunch& l : stored)
    if (l.placement == now.placement && l.hier_ranks_per_node == now.hier_ranks_per_node)
      out.push_back(l);
  out.push_back(now);
  if (out.size() > static_cast<size_t>(kMaxPooledLaunches))
    out.erase(out.begin(), out.end() - kMaxPooledLaunches);
  return out;
}

PiecewiseAlphaBeta fit_pooled(const std::vector<CalibrationLaunch>& launches, CollOp op, Algo algo,
                              int p) {
  if (launches.empty()) return {};
  const auto& last = launches.back().times[static_cast<int>(op)][static_cast<int>(algo)];
  const int n = std::min(static_cast<int>(last.size()), PiecewiseAlphaBeta::kMaxKnots);
  if (n == 0) return {};
  std::vector<double> sizes(n), steps(n), bw(n), secs(n);
  for (int i = 0; i < n; ++i) {
    sizes[i] = last[i].first;
    std::vector<double> at_size;
    for (const CalibrationLaunch& l : launches)
      for (const auto& [bytes, seconds] : l.times[static_cast<int>(op)][static_cast<int>(algo)])
        if (bytes == sizes[i] && seconds > 0) at_size.push_back(seconds);
    secs[i] = at_size.empty() ? last[i].second : median_of(std::move(at_size));
    const AlgoCost terms = algo_cost(op, algo, p, sizes[i], launches.back().hier_ranks_per_node);
    steps[i] = terms.steps;
    bw[i] = terms.bw_bytes;
  }
  return fit_piecewise(sizes.data(), steps.data(), bw.data(), secs.data(), n);
}

AlphaBeta fit_alpha_beta(const double* steps, const double* bytes, const double* seconds, int n) {
  // Minimize sum ((alpha s_i + beta b_i - T_i) / T_i)^2: normal equations of a 2x2 system.
  double ss = 0, sb = 0, bb = 0, st = 0, bt = 0;
  for (int i = 0; i < n; ++i) {
    const double w = 1.0 / (seconds[i] * seconds[i]);
    ss += w * steps[i] * steps[i];
    sb += w * steps[i] * bytes[i];
    bb += w * bytes[i] * bytes[i];
    st += w * steps[i] * seconds[i];
    bt += w * bytes[i] * seconds[i];
  }
  AlphaBeta f;
  const double det = ss * bb - sb * sb;
  if (std::abs(det) > 1e-300 * (ss * bb)) {
    f.alpha_s = (st * bb - sb * bt) / det;
    f.beta_s_per_byte = (ss * bt - sb * st) / det;
  }
  // A negative term means the other one explains the data alone: refit with one parameter.
  if (!(f.alpha_s >= 0)) {
    f.alpha_s = 0;
    f.beta_s_per_byte = bb > 0 ? bt / bb : 0;
  } else if (!(f.beta_s_per_byte >= 0)) {
    f.beta_s_per_byte = 0;
    f.alpha_s = ss > 0 ? st / ss : 0;
  }
  return f;
}

std::string describe_placement(const std::vector<std::vector<int>>& cpus_of_rank) {
  if (cpus_of_rank.empty()) return "";
  const bool all_same = std::all_of(cpus_of_rank.begin(), cpus_of_rank.end(),
                                    [&](const std::vector<int>& v) { return v == cpus_of_rank[0]; });
  if (all_same && cpus_of_rank[0].size() > 1) return "unbound";
  std::string out;
  for (size_t r = 0; r < cpus_of_rank.size(); ++r) {
    if (r > 0) out += '|';
    for (size_t k = 0; k < cpus_of_rank[r].size(); ++k)
      out += (k > 0 ? "," : "") + std::to_string(cpus_of_rank[r][k]);
  }
  return out;
}

std::string rank_placement(Communicator& comm) {
  // Each rank's affinity as a bit mask of kMaskWords 64-bit words (CPU_SETSIZE bits).
  constexpr int kMaskWords = CPU_SETSIZE / 64;
  std::vector<uint64_t> mine(kMaskWords, 0), all(static_cast<size_t>(kMaskWords) * comm.size(), 0);
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) mine[cpu / 64] |= uint64_t{1} << (cpu % 64);
  if (comm.size() > 1)
    MPI_Allgather(mine.data(), kMaskWords, MPI_UINT64_T, all.data(), kMaskWords, MPI_UINT64_T,
                  comm.handle());
  else
    all = mine;
  std::vector<std::vector<int>> cpus(comm.size());
  for (int r = 0; r < comm.size(); ++r)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (all[static_cast<size_t>(r) * kMaskWords + cpu / 64] >> (cpu % 64) & 1) cpus[r].push_back(cpu);
  return describe_placement(cpus);
}

std::string calibration_path() {
  if (const char* env = std::getenv("KILN_COMM_CALIBRATION"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/kiln/comm_calibration.json";
}

namespace {

using nlohmann::json;

// Flat form of a table for MPI_Bcast: link, gamma, fitted_p, hier_ranks_per_node, then every
// fit as its number of knots and (bytes, alpha, beta) per knot.
constexpr int kKnotDoubles = 1 + 3 * PiecewiseAlphaBeta::kMaxKnots;
constexpr int kFlatSize = 5 + kNumCollOps * kNumAlgos * kKnotDoubles;

void to_flat(const AlphaBetaTable& t, double* v) {
  v[0] = t.link.alpha_s;
  v[1] = t.link.beta_s_per_byte;
  v[2] = t.gamma_s_per_byte;
  v[3] = t.fitted_p;
  v[4] = t.hier_ranks_per_node;
  for (int o = 0; o < kNumCollOps; ++o)
    for (int a = 0; a < kNumAlgos; ++a) {
      double* f = v + 5 + (o * kNumAlgos + a) * kKnotDoubles;
      const PiecewiseAlphaBeta& pw = t.fits[o][a];
      f[0] = pw.num_knots;
      for (int k = 0; k < PiecewiseAlphaBeta::kMaxKnots; ++k) {
        f[1 + 3 * k] = pw.knots[k].bytes;
        f[2 + 3 * k] = pw.knots[k].ab.alpha_s;
        f[3 + 3 * k] = pw.knots[k].ab.beta_s_per_byte;
      }
    }
}

AlphaBetaTable from_flat(const double* v) {
  AlphaBetaTable t;
  t.link = {v[0], v[1]};
  t.gamma_s_per_byte = v[2];
  t.fitted_p = static_cast<int>(v[3]);
  t.hier_ranks_per_node = static_cast<int>(v[4]);
  for (int o = 0; o < kNumCollOps; ++o)
    for (int a = 0; a < kNumAlgos; ++a) {
      const double* f = v + 5 + (o * kNumAlgos + a) * kKnotDoubles;
      PiecewiseAlphaBeta& pw = t.fits[o][a];
      pw.num_knots = static_cast<int>(f[0]);
      for (int k = 0; k < PiecewiseAlphaBeta::kMaxKnots; ++k)
        pw.knots[k] = {f[1 + 3 * k], {f[2 + 3 * k], f[3 + 3 * k]}};
    }
  return t;
}

json read_json_file(const std::string& path) {
  auto text = read_file(path, int64_t{64} << 20);
  if (!text.ok()) return json::object();  // absent: no calibration yet
  auto j = parse_json(*text, path);
  if (!j.ok() || !j->is_object()) {
    std::fprintf(stderr, "kiln: ignoring malformed calibration file %s\n", path.c_str());
    return json::object();
  }
  return std::move(*j);
}

// A fit is {"knots": [[bytes, alpha_s, beta_s_per_byte], ...]} with ascending bytes; anything
// else (version 1's two-regime fits) is skipped, leaving that algorithm on the link model.
PiecewiseAlphaBeta piecewise_from_json(const json& j) {
  PiecewiseAlphaBeta pw;
  if (!j.is_object() || !j.contains("knots") || !j["knots"].is_array()) return pw;
  const json& ks = j["knots"];
  if (ks.empty() || ks.size() > PiecewiseAlphaBeta::kMaxKnots) return pw;
  for (size_t k = 0; k < ks.size(); ++k) {
    const json& e = ks[k];
    if (!e.is_array() || e.size() != 3) return PiecewiseAlphaBeta{};
    const PiecewiseAlphaBeta::Knot knot{e[0].get<double>(), {e[1].get<double>(), e[2].get<double>()}};
    if (!(knot.bytes > 0) || !knot.ab.valid() || (k > 0 && knot.bytes <= pw.knots[k - 1].bytes))
      return PiecewiseAlphaBeta{};
    pw.knots[k] = knot;
  }
  pw.num_knots = static_cast<int>(ks.size());
  return pw;
}

AlphaBetaTable table_from_json(const json& j, int p) {
  AlphaBetaTable t;
  try {
    if (j.contains("link")) {
      t.link.alpha_s = j["link"].value("alpha_s", t.link.alpha_s);
      t.link.beta_s_per_byte = j["link"].value("beta_s_per_byte", t.link.beta_s_per_byte);
    }
    t.gamma_s_per_byte = j.value("gamma_s_per_byte", t.gamma_s_per_byte);
    const std::string key = std::to_string(p);
    if (j.contains("fits") && j["fits"].contains(key) && j["fits"][key].is_object()) {
      const json& at_p = j["fits"][key];
      t.fitted_p = p;
      t.hier_ranks_per_node = at_p.value("hierarchical_ranks_per_node", 0);
      t.placement = at_p.value("placement", std::string());
      for (const auto& [op_name, algos] : at_p.items()) {
        const auto op = parse_coll_op(op_name);
        if (!op || !algos.is_object()) continue;
        for (const auto& [algo_name_str, fit] : algos.items()) {
          const auto a = parse_algo(algo_name_str);
          if (a) t.fit_of(*op, *a) = piecewise_from_json(fit);
        }
      }
    }
  } catch (const json::exception& e) {
    std::fprintf(stderr, "kiln: ignoring bad calibration entries: %s\n", e.what());
    return AlphaBetaTable{};
  }
  return t;
}

json launch_to_json(const CalibrationLaunch& l) {
  json times = json::object();
  for (int o = 0; o < kNumCollOps; ++o)
    for (int a = 0; a < kNumAlgos; ++a) {
      if (l.times[o][a].empty()) continue;
      json pts = json::array();
      for (const auto& [bytes, seconds] : l.times[o][a]) pts.push_back({bytes, seconds});
      times[std::string(kCollOpNames[o])][std::string(kAlgoInfos[a].name)] = pts;
    }
  return {{"placement", l.placement}, {"hierarchical_ranks_per_node", l.hier_ranks_per_node},
          {"times", times}};
}

// Malformed launches are skipped (a pooled calibration then pools fewer launches).
std::vector<CalibrationLaunch> launches_from_json(const json& j) {
  std::vector<CalibrationLaunch> out;
  if (!j.is_array()) return out;
  for (const json& e : j) {
    try {
      if (!e.is_object() || !e.contains("times") || !e["times"].is_object()) continue;
      CalibrationLaunch l;
      l.placement = e.value("placement", std::string());
      l.hier_ranks_per_node = e.value("hierarchical_ranks_per_node", 0);
      for (const auto& [op_name, algos] : e["times"].items()) {
        const auto op = parse_coll_op(op_name);
        if (!op || !algos.is_object()) continue;
        for (const auto& [algo_name_str, pts] : algos.items()) {
          const auto a = parse_algo(algo_name_str);
          if (!a || !pts.is_array()) continue;
          auto& dst = l.times[static_cast<int>(*op)][static_cast<int>(*a)];
          for (const json& pt : pts)
            if (pt.is_array() && pt.size() == 2) dst.emplace_back(pt[0].get<double>(), pt[1].get<double>());
        }
      }
      out.push_back(std::move(l));
    } catch (const json::exception& ex) {
      std::fprintf(stderr, "kiln: ignoring a bad calibration launch: %s\n", ex.what());
    }
  }
  return out;
}

}  // namespace

std::vector<CalibrationLaunch> read_calibration_launches(const std::string& path, int p) {
  const json j = read_json_file(path);
  const std::string key = std::to_string(p);
  if (!j.contains("fits") || !j["fits"].is_object() || !j["fits"].contains(key) ||
      !j["fits"][key].is_object() || !j["fits"][key].contains("launches"))
    return {};
  return launches_from_json(j["fits"][key]["launches"]);
}

AlphaBetaTable load_cost_table(Communicator& comm) {
  std::vector<double> flat(kFlatSize);
  std::string placement;
  if (comm.rank() == 0) {
    const AlphaBetaTable read = table_from_json(read_json_file(calibration_path()), comm.size());
    to_flat(read, flat.data());
    placement = read.placement;
  }
  if (comm.size() > 1) MPI_Bcast(flat.data(), kFlatSize, MPI_DOUBLE, 0, comm.handle());
  // The placement string: its length, then its characters.
  int len = static_cast<int>(placement.size());
  if (comm.size() > 1) MPI_Bcast(&len, 1, MPI_INT, 0, comm.handle());
  placement.resize(static_cast<size_t>(len));
  if (comm.size() > 1 && len > 0) MPI_Bcast(placement.data(), len, MPI_CHAR, 0, comm.handle());
  AlphaBetaTable t = from_flat(flat.data());
  t.placement = placement;
  return t;
}

Status save_cost_table(const AlphaBetaTable& t, const std::string& path,
                       const std::vector<CalibrationLaunch>& launches) {
  json j = read_json_file(path);
  j["version"] = 2;
  j["link"] = {{"alpha_s", t.link.alpha_s}, {"beta_s_per_byte", t.link.beta_s_per_byte}};
  j["gamma_s_per_byte"] = t.gamma_s_per_byte;
  if (t.fitted_p > 0) {
    json fits = json::object();
    fits["hierarchical_ranks_per_node"] = t.hier_ranks_per_node;
    fits["placement"] = t.placement;
    for (int o = 0; o < kNumCollOps; ++o)
      for (int a = 0; a < kNumAlgos; ++a) {
        const PiecewiseAlphaBeta& pw = t.fits[o][a];
        if (!pw.valid()) continue;
        json knots = json::array();
        for (int k = 0; k < pw.num_knots; ++k)
          knots.push_back({pw.knots[k].bytes, pw.knots[k].ab.alpha_s, pw.knots[k].ab.beta_s_per_byte});
        fits[std::string(kCollOpNames[o])][std::string(kAlgoInfos[a].name)] = {{"knots", knots}};
      }
    if (!launches.empty()) {
      json ls = json::array();
      for (const CalibrationLaunch& l : launches) ls.push_back(launch_to_json(l));
      fits["launches"] = ls;
    }
    j["fits"][std::to_string(t.fitted_p)] = fits;
  }
  std::error_code ec;
  const std::filesystem::path fp(path);
  if (fp.has_parent_path()) std::filesystem::create_directories(fp.parent_path(), ec);
  // Write to a temporary file and rename, so a crash never leaves half a file.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) return failed_precondition("[bench comm] cannot write calibration file {}", tmp);
    out << j.dump(2) << "\n";
    if (!out) return data_loss("[bench comm] short write to {}", tmp);
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return failed_precondition("[bench comm] cannot rename {} to {}: {}", tmp, path, ec.message());
  return Status::ok_status();
}

}  // namespace kiln::comm
