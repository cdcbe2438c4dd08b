// The profiler (profiler.h): events from the recorder, the MPI merge with ping-pong clock
// alignment, the Chrome trace writer and reader, and the summary (key_averages, MFU/HFU,
// exposed communication, stragglers, the roofline plot).
#include "kiln/perf/profiler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/comm/communicator.h"
#include "kiln/core/file_io.h"
#include "kiln/core/json.h"
#include "kiln/core/median.h"
#include "kiln/core/thread_pool.h"
#include "kiln/core/trace.h"
#include "kiln/model/config.h"
#include "kiln/perf/peak.h"
#include "kiln/perf/svg.h"
#include "kiln/train/trainer.h"

namespace kiln::perf {

// ---- from the recorder ---------------------------------------------------------------------------

Profile local_profile(int rank) {
  Profile p;
  for (const trace::ThreadEvents& t : trace::snapshot()) {
    p.threads.push_back({rank, t.tid, t.name});
    for (const trace::Event& e : t.events) {
      ProfileEvent o;
      o.name = e.name ? e.name : "?";
      o.cat = std::string(trace::category_name(e.cat));
      o.pid = rank;
      o.tid = t.tid;
      o.ts_ns = e.start_ns;
      o.dur_ns = e.dur_ns;
      o.flops = e.flops;
      o.bytes = e.bytes;
      o.shape.assign(e.dims, e.dims + e.num_dims);
      if (e.dtype) o.dtype = e.dtype;
      if (e.op) o.op = e.op;
      if (e.algo) o.algo = e.algo;
      if (e.peers) o.peers = e.peers;
      for (int i = 0; i < e.num_args; ++i) o.args.emplace_back(e.args[i].key, e.args[i].value);
      p.events.push_back(std::move(o));
    }
  }
  return p;
}

// ---- Chrome trace JSON ---------------------------------------------------------------------------

namespace {

std::string quoted(const std::string& s) { return nlohmann::json(s).dump(); }

// ns as µs with three decimals, exactly (no double rounding).
std::string micros(int64_t ns) {
  const char* sign = ns < 0 ? "-" : "";
  const int64_t a = ns < 0 ? -ns : ns;
  return fmt::format("{}{}.{:03}", sign, a / 1000, a % 1000);
}

nlohmann::json meta_json(const ProfileMeta& m) {
  return {{"ranks", m.ranks},
          {"threads_per_rank", m.threads_per_rank},
          {"peak_gflops_per_rank", m.peak_gflops_per_rank},
          {"model_flops_per_step", m.model_flops_per_step},
          {"attention_flops_per_step", m.attention_flops_per_step},
          {"tokens_per_step", m.tokens_per_step},
          {"description", m.description}};
}

// `origin_ns` is subtracted from every timestamp and recorded, so reading adds it back.
std::string trace_json(const Profile& p, int64_t origin_ns) {
  fmt::memory_buffer out;
  auto put = [&](std::string_view s) { out.append(s.data(), s.data() + s.size()); };
  put("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
  bool first = true;
  auto sep = [&] {
    if (!first) put(",\n");
    first = false;
  };
  std::vector<int> pids;
  for (const ProfileThread& t : p.threads) pids.push_back(t.pid);
  for (const ProfileEvent& e : p.events) pids.push_back(e.pid);
  std::sort(pids.begin(), pids.end());
  pids.erase(std::unique(pids.begin(), pids.end()), pids.end());
  for (int pid : pids) {
    sep();
    fmt::format_to(std::back_inserter(out),
                   "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":\"rank {0}\"}}}},\n"
                   "{{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{0},\"tid\":0,\"args\":{{\"sort_index\":{0}}}}}",
                   pid);
  }
  for (const ProfileThread& t : p.threads) {
    sep();
    fmt::format_to(std::back_inserter(out),
                   "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":{}}}}}", t.pid,
                   t.tid, quoted(t.name));
  }
  for (const ProfileEvent& e : p.events) {
    sep();
    fmt::format_to(std::back_inserter(out), "{{\"ph\":\"X\",\"name\":{},\"cat\":{},\"pid\":{},\"tid\":{},\"ts\":{},\"dur\":{}",
                   quoted(e.name), quoted(e.cat), e.pid, e.tid, micros(e.ts_ns - origin_ns), micros(e.dur_ns));
    std::string args;
    auto arg = [&](std::string_view key, const std::string& value) {
      args += fmt::format("{}\"{}\":{}", args.empty() ? "" : ",", key, value);
    };
    if (e.flops > 0) arg("flops", fmt::format("{:.17g}", e.flops));
    if (e.bytes > 0) arg("bytes", fmt::format("{:.17g}", e.bytes));
    if (!e.shape.empty()) arg("shape", fmt::format("[{}]", fmt::join(e.shape, ",")));
    if (!e.dtype.empty()) arg("dtype", quoted(e.dtype));
    if (!e.op.empty()) arg("op", quoted(e.op));
    if (!e.algo.empty()) arg("algo", quoted(e.algo));
    if (!e.peers.empty()) arg("peers", quoted(e.peers));
    for (const auto& [k, v] : e.args) arg(k, std::to_string(v));
    if (!args.empty()) fmt::format_to(std::back_inserter(out), ",\"args\":{{{}}}", args);
    put("}");
  }
  nlohmann::json other = meta_json(p.meta);
  other["origin_ns"] = origin_ns;
  nlohmann::json offs = nlohmann::json::array();
  for (const ClockOffset& o : p.offsets) offs.push_back({{"rank", o.rank}, {"offset_ns", o.offset_ns}, {"error_ns", o.error_ns}});
  other["clock_offsets"] = offs;
  put("\n],\"otherData\":");
  put(other.dump());
  put("}\n");
  return fmt::to_string(out);
}

int64_t earliest(const Profile& p) {
  int64_t t = std::numeric_limits<int64_t>::max();
  for (const ProfileEvent& e : p.events) t = std::min(t, e.ts_ns);
  return p.events.empty() ? 0 : t;
}

int64_t ns_of(const nlohmann::json& us) { return std::llround(us.get<double>() * 1000.0); }

}  // namespace

std::string chrome_trace_json(const Profile& p) { return trace_json(p, earliest(p)); }

Expected<Profile> parse_chrome_trace(std::string_view text) {
  JsonLimits limits;
  limits.max_bytes = int64_t{1} << 34;
  KILN_ASSIGN_OR_RETURN(const nlohmann::json j, parse_json(text, "trace", limits));
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array())
    return invalid_argument("[profile] not a Chrome trace: no traceEvents array");
  Profile p;
  int64_t origin = 0;
  if (j.contains("otherData") && j["otherData"].is_object()) {
    const nlohmann::json& o = j["otherData"];
    origin = o.value("origin_ns", int64_t{0});
    ProfileMeta& m = p.meta;
    m.ranks = o.value("ranks", 1);
    m.threads_per_rank = o.value("threads_per_rank", 1);
    m.peak_gflops_per_rank = o.value("peak_gflops_per_rank", 0.0);
    m.model_flops_per_step = o.value("model_flops_per_step", 0.0);
    m.attention_flops_per_step = o.value("attention_flops_per_step", 0.0);
    m.tokens_per_step = o.value("tokens_per_step", 0.0);
    m.description = o.value("description", std::string());
    if (o.contains("clock_offsets") && o["clock_offsets"].is_array())
      for (const auto& c : o["clock_offsets"])
        p.offsets.push_back({c.value("rank", 0), c.value("offset_ns", 0.0), c.value("error_ns", 0.0)});
  }
  try {
    for (const nlohmann::json& e : j["traceEvents"]) {
      const std::string ph = e.value("ph", std::string());
      if (ph == "M") {
        if (e.value("name", std::string()) == "thread_name")
          p.threads.push_back({e.value("pid", 0), e.value("tid", 0), e["args"].value("name", std::string())});
        continue;
      }
      if (ph != "X") continue;
      ProfileEvent o;
      o.name = e.at("name").get<std::string>();
      o.cat = e.value("cat", std::string());
      o.pid = e.at("pid").get<int>();
      o.tid = e.at("tid").get<int>();
      o.ts_ns = ns_of(e.at("ts")) + origin;
      o.dur_ns = ns_of(e.at("dur"));
      if (e.contains("args")) {
        for (const auto& [k, v] : e["args"].items()) {
          if (k == "flops") o.flops = v.get<double>();
          else if (k == "bytes") o.bytes = v.get<double>();
          else if (k == "shape") o.shape = v.get<std::vector<int64_t>>();
          else if (k == "dtype") o.dtype = v.get<std::string>();
          else if (k == "op") o.op = v.get<std::string>();
          else if (k == "algo") o.algo = v.get<std::string>();
          else if (k == "peers") o.peers = v.get<std::string>();
          else if (v.is_number_integer()) o.args.emplace_back(k, v.get<int64_t>());
        }
      }
      p.events.push_back(std::move(o));
    }
  } catch (const nlohmann::json::exception& ex) {
    return invalid_argument("[profile] malformed trace event: {}", ex.what());
  }
  return p;
}

Status write_chrome_trace(const Profile& p, const std::string& path) {
  const std::string text = chrome_trace_json(p);
  return write_file_atomic(path, {text});
}

Expected<Profile> read_chrome_trace(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(const std::string text, read_file(path, int64_t{1} << 34));
  auto p = parse_chrome_trace(text);
  if (!p.ok()) return invalid_argument("{}: {}", path, p.status().message());
  return p;
}

// ---- the merge -----------------------------------------------------------------------------------

namespace {
constexpr int kTagClock = 0x6b70;  // apart from the collectives' tags (comm/detail.h)
constexpr int kTagTrace = 0x6b71;
constexpr size_t kChunkBytes = size_t{1} << 30;

void send_text(comm::Communicator& c, const std::string& s, int dest) {
  const int64_t n = static_cast<int64_t>(s.size());
  c.send(&n, sizeof n, dest, kTagTrace);
  for (size_t at = 0; at < s.size(); at += kChunkBytes)
    c.send(s.data() + at, std::min(kChunkBytes, s.size() - at), dest, kTagTrace);
}

std::string recv_text(comm::Communicator& c, int source) {
  int64_t n = 0;
  c.recv(&n, sizeof n, source, kTagTrace);
  std::string s(static_cast<size_t>(n), '\0');
  for (size_t at = 0; at < s.size(); at += kChunkBytes)
    c.recv(s.data() + at, std::min(kChunkBytes, s.size() - at), source, kTagTrace);
  return s;
}
}  // namespace

Profile gather_profile(comm::Communicator* world, int rounds) {
  const int me = world ? world->rank() : 0;
  Profile mine = local_profile(me);
  if (!world || world->size() == 1) return mine;
  const int P = world->size();
  // Ping-pong with each rank in turn: rank 0 stamps t0, the peer stamps t_r on arrival and
  // answers; with t1 on return, offset = t_r − (t0 + rtt/2), exact when the two legs take as
  // long; the fastest round bounds the error by rtt/2.
  for (int r = 1; r < P; ++r) {
    if (me == 0) {
      ClockOffset best{r, 0, std::numeric_limits<double>::infinity()};
      for (int i = 0; i < rounds; ++i) {
        const int64_t t0 = trace::now_ns();
        world->send(&t0, sizeof t0, r, kTagClock);
        int64_t tr = 0;
        world->recv(&tr, sizeof tr, r, kTagClock);
        const double half = static_cast<double>(trace::now_ns() - t0) / 2;
        if (half < best.error_ns) best = {r, static_cast<double>(tr) - (static_cast<double>(t0) + half), half};
      }
      mine.offsets.push_back(best);
    } else if (me == r) {
      for (int i = 0; i < rounds; ++i) {
        int64_t t0 = 0;
        world->recv(&t0, sizeof t0, 0, kTagClock);
        const int64_t tr = trace::now_ns();
        world->send(&tr, sizeof tr, 0, kTagClock);
      }
    }
  }
  if (me != 0) {
    send_text(*world, trace_json(mine, earliest(mine)), 0);
    return mine;
  }
  for (int r = 1; r < P; ++r) {
    Expected<Profile> theirs = parse_chrome_trace(recv_text(*world, r));
    KILN_CHECK_MSG(theirs.ok(), "rank {}'s trace: {}", r, theirs.status().message());  // written just now by kiln
    const auto shift = static_cast<int64_t>(std::llround(mine.offsets[static_cast<size_t>(r - 1)].offset_ns));
    for (ProfileEvent& e : theirs->events) {
      e.ts_ns -= shift;
      mine.events.push_back(std::move(e));
    }
    for (ProfileThread& t : theirs->threads) mine.threads.push_back(std::move(t));
  }
  return mine;
}

std::string format_offsets(const std::vector<ClockOffset>& offsets) {
  if (offsets.empty()) return "clock offsets: one rank";
  std::string s = "clock offsets to rank 0 (ping-pong, fastest round):";
  for (const ClockOffset& o : offsets)
    s += fmt::format(" rank {} {:+.2f} us (± {:.2f} us)", o.rank, o.offset_ns / 1e3, o.error_ns / 1e3);
  return s;
}

// ---- the summary ---------------------------------------------------------------------------------

namespace {

// Self time and recomputation of every event (index-aligned with p.events): events of one
// thread in start order (longer first on ties) nest in the stack of the ones still open.
struct Nesting {
  std::vector<double> self_ns;
  std::vector<char> in_recompute;
  std::vector<char> in_eval;  // inside the trainer's "eval" (validation forwards)
};
Nesting nest(const Profile& p) {
  const size_t n = p.events.size();
  Nesting out{std::vector<double>(n), std::vector<char>(n, 0), std::vector<char>(n, 0)};
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const ProfileEvent &x = p.events[a], &y = p.events[b];
    return std::tie(x.pid, x.tid, x.ts_ns, y.dur_ns) < std::tie(y.pid, y.tid, y.ts_ns, x.dur_ns);
  });
  std::vector<size_t> open;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = order[k];
    const ProfileEvent& e = p.events[i];
    out.self_ns[i] = static_cast<double>(e.dur_ns);
    while (!open.empty()) {
      const ProfileEvent& top = p.events[open.back()];
      if (top.pid == e.pid && top.tid == e.tid && top.ts_ns <= e.ts_ns && e.end_ns() <= top.end_ns()) break;
      open.pop_back();
    }
    if (!open.empty()) {
      out.self_ns[open.back()] -= static_cast<double>(e.dur_ns);
      out.in_recompute[i] = out.in_recompute[open.back()];
      out.in_eval[i] = out.in_eval[open.back()];
    }
    if (e.name == "recompute") out.in_recompute[i] = 1;
    if (e.name == "eval" && e.cat == "train") out.in_eval[i] = 1;
    open.push_back(i);
  }
  return out;
}

using Interval = std::pair<int64_t, int64_t>;

std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& x : v) {
    if (!out.empty() && x.first <= out.back().second) out.back().second = std::max(out.back().second, x.second);
    else out.push_back(x);
  }
  return out;
}

double length(const std::vector<Interval>& v) {
  double n = 0;
  for (const Interval& x : v) n += static_cast<double>(x.second - x.first);
  return n;
}

// Length of the intersection of two merged interval lists.
double overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double n = 0;
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    const int64_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) n += static_cast<double>(hi - lo);
    (a[i].second < b[j].second ? i : j)++;
  }
  return n;
}

std::vector<int> ranks_of(const Profile& p) {
  std::vector<int> r;
  for (const ProfileEvent& e : p.events) r.push_back(e.pid);
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

bool is_step(const ProfileEvent& e) { return e.cat == "train" && e.name == "step"; }

}  // namespace

std::vector<ExposedComm> exposed_communication(const Profile& p) {
  std::vector<ExposedComm> out;
  for (int r : ranks_of(p)) {
    std::vector<Interval> comm, compute;
    for (const ProfileEvent& e : p.events) {
      if (e.pid != r) continue;
      if (e.cat == "comm") comm.emplace_back(e.ts_ns, e.end_ns());
      else if (e.cat == "kernel") compute.emplace_back(e.ts_ns, e.end_ns());
    }
    const auto c = merged(std::move(comm)), k = merged(std::move(compute));
    const double total = length(c);
    out.push_back({r, total, total - overlap(c, k)});
  }
  return out;
}

namespace {
StragglerReport stragglers_from(const Profile& p, const Nesting& nesting) {
  StragglerReport s;
  std::map<int, std::map<std::string, double>> self_by_rank;  // kernel and comm ops
  for (int r : ranks_of(p)) {
    RankSteps rs{r, {}, 0};
    std::vector<std::pair<int64_t, double>> steps;
    for (size_t i = 0; i < p.events.size(); ++i) {
      const ProfileEvent& e = p.events[i];
      if (e.pid != r) continue;
      if (is_step(e)) steps.emplace_back(e.ts_ns, static_cast<double>(e.dur_ns));
      if (e.cat == "kernel" || e.cat == "comm") self_by_rank[r][e.name] += nesting.self_ns[i];
    }
    std::sort(steps.begin(), steps.end());
    for (const auto& st : steps) rs.step_ns.push_back(st.second);
    rs.median_ns = median(rs.step_ns);
    if (!rs.step_ns.empty()) s.ranks.push_back(std::move(rs));
  }
  if (s.ranks.size() < 2) return s;
  const auto slow = std::max_element(s.ranks.begin(), s.ranks.end(),
                                     [](const RankSteps& a, const RankSteps& b) { return a.median_ns < b.median_ns; });
  s.slowest_rank = slow->rank;
  double best_excess = -std::numeric_limits<double>::infinity();
  for (const auto& [name, ns] : self_by_rank[s.slowest_rank]) {
    const double mine = ns / static_cast<double>(slow->step_ns.size());
    double others = 0;
    for (const RankSteps& r : s.ranks)
      if (r.rank != s.slowest_rank) others += self_by_rank[r.rank][name] / static_cast<double>(r.step_ns.size());
    others /= static_cast<double>(s.ranks.size() - 1);
    if (mine - others > best_excess) {
      best_excess = mine - others;
      s.op = name;
      s.op_ns_per_step = mine;
      s.others_ns_per_step = others;
    }
  }
  return s;
}
}  // namespace

StragglerReport straggler_report(const Profile& p) { return stragglers_from(p, nest(p)); }

ProfileSummary summarize(const Profile& p) {
  ProfileSummary s;
  const Nesting nesting = nest(p);
  std::map<std::pair<std::string, std::string>, OpStats> by_name;
  std::vector<double> steps;
  std::map<int, int64_t> steps_per_rank;
  int64_t t0 = std::numeric_limits<int64_t>::max(), t1 = std::numeric_limits<int64_t>::min();
  for (size_t i = 0; i < p.events.size(); ++i) {
    const ProfileEvent& e = p.events[i];
    t0 = std::min(t0, e.ts_ns);
    t1 = std::max(t1, e.end_ns());
    OpStats& o = by_name[{e.name, e.cat}];
    o.name = e.name;
    o.cat = e.cat;
    ++o.calls;
    o.total_ns += static_cast<double>(e.dur_ns);
    o.self_ns += nesting.self_ns[i];
    o.flops += e.flops;
    o.bytes += e.bytes;
    if (e.cat == "kernel" && nesting.in_eval[i]) {
      s.eval_flops += e.flops;  // validation is not the training step's work
    } else if (e.cat == "kernel") {
      s.executed_flops += e.flops;
      if (nesting.in_recompute[i]) {
        o.recompute_flops += e.flops;
        s.recompute_flops += e.flops;
      }
      if (e.name.rfind("attention", 0) == 0) s.attention_flops += e.flops;
      if (e.name.find("gemm") != std::string::npos) s.gemm_flops += e.flops;
    }
    if (is_step(e)) {
      steps.push_back(static_cast<double>(e.dur_ns));
      ++steps_per_rank[e.pid];
    }
  }
  for (auto& [key, o] : by_name) s.ops.push_back(o);
  std::sort(s.ops.begin(), s.ops.end(), [](const OpStats& a, const OpStats& b) { return a.self_ns > b.self_ns; });
  for (const auto& [r, n] : steps_per_rank) s.steps = std::max(s.steps, n);
  s.step_ns = median(steps);
  s.span_ns = p.events.empty() ? 0 : static_cast<double>(t1 - t0);
  s.comm = exposed_communication(p);
  s.stragglers = stragglers_from(p, nesting);
  return s;
}

Utilization utilization(const ProfileSummary& s, const ProfileMeta& m) {
  Utilization u;
  const double peak = m.peak_gflops_per_rank * std::max(m.ranks, 1);  // FLOP/ns
  if (s.steps == 0 || s.step_ns <= 0 || peak <= 0) return u;
  const double per_step = 1.0 / static_cast<double>(s.steps), denom = s.step_ns * peak;
  const double executed = s.executed_flops * per_step, recompute = s.recompute_flops * per_step;
  u.hfu = executed / denom;
  u.mfu = (executed - recompute) / denom;
  u.analytic_mfu = m.model_flops_per_step / denom;
  if (m.model_flops_per_step > 0) {
    const double attn = s.attention_flops * per_step, gemm = s.gemm_flops * per_step;
    const double other = executed - attn - gemm;
    u.explanation = fmt::format(
        "analytic {:.3f} GFLOP/step (6·N·tokens + 12·L·T·d·tokens) vs {:.3f} executed ({:.3f} without recomputation): "
        "attention {:.3f} in the formula (full T×T) vs {:.3f} run (causal: only the visible half is computed); "
        "GEMMs {:.3f} vs {:.3f}; {:.3f} of norms, activations, softmax/CE, embedding and AdamW the formula leaves out",
        m.model_flops_per_step / 1e9, executed / 1e9, (executed - recompute) / 1e9, m.attention_flops_per_step / 1e9,
        attn / 1e9, (m.model_flops_per_step - m.attention_flops_per_step) / 1e9, gemm / 1e9, other / 1e9);
  }
  return u;
}

std::string format_summary(const ProfileSummary& s, const ProfileMeta& m, const HierarchicalRoofline& roof,
                           int max_rows) {
  std::string out;
  const double ranks = std::max(m.ranks, 1);
  // % of step: of every rank's steps, or of the whole span when there are none (serving).
  const double step_total = (s.steps > 0 ? s.step_ns * static_cast<double>(s.steps) : s.span_ns) * ranks;
  out += fmt::format("profile: {}{}ranks × threads: {} × {}; {} steps, median step {:.2f} ms; span {:.1f} ms\n",
                     m.description, m.description.empty() ? "" : "; ", m.ranks, m.threads_per_rank, s.steps,
                     s.step_ns / 1e6, s.span_ns / 1e6);
  if (!roof.empty()) {
    out += fmt::format("roofline ({} thread{}): f32 FMA peak {:.1f} GFLOP/s;", roof.threads, roof.threads > 1 ? "s" : "",
                       roof.peak_gflops);
    for (const MemoryCeiling& c : roof.memory) out += fmt::format(" {} {:.1f} GB/s", c.name, c.gbs);
    out += fmt::format("; each op under the ceiling of the smallest level that holds one call's bytes (DRAM ridge "
                       "{:.2f} FLOP/B)\n", roof.dram().ridge());
  }
  out += fmt::format("{:<24} {:<6} {:>7} {:>10} {:>10} {:>7} {:>9} {:>8} {:>7} {:>8} {:>6}\n", "op", "cat", "calls",
                     "self ms", "total ms", "% step", "GFLOP/s", "GB/s", "FLOP/B", "bound", "% roof");
  int rows = 0;
  for (const OpStats& o : s.ops) {
    if (rows++ >= max_rows) break;
    const bool kernel = o.cat == "kernel";
    std::string tail;
    if (kernel && o.flops > 0) {
      tail = fmt::format(" {:>9.2f} {:>8.2f} {:>7.2f}", o.gflops(), o.gbs(), o.intensity());
      if (!roof.empty()) {  // under the ceiling of the level that holds one call's bytes
        const double per_call = o.bytes / static_cast<double>(o.calls);
        const Roofline r = roof.roof_for(per_call);
        const double att = r.attainable(o.intensity());
        const std::string bound = r.memory_bound(o.intensity()) ? "mem " + roof.level_for(per_call)->name : "compute";
        tail += fmt::format(" {:>8} {:>5.1f}%", bound, att > 0 ? 100 * o.gflops() / att : 0.0);
      }
    } else if (kernel || o.cat == "comm") {
      tail = fmt::format(" {:>9} {:>8.2f}", "", o.gbs());
    }
    out += fmt::format("{:<24} {:<6} {:>7} {:>10.3f} {:>10.3f} {:>6.1f}%{}\n", o.name, o.cat, o.calls, o.self_ns / 1e6,
                       o.total_ns / 1e6, step_total > 0 ? 100 * o.self_ns / step_total : 0.0, tail);
  }
  if (static_cast<int>(s.ops.size()) > max_rows) out += fmt::format("({} more ops)\n", s.ops.size() - max_rows);
  const Utilization u = utilization(s, m);
  if (u.hfu > 0) {
    out += fmt::format("MFU {:.2f}% (model FLOPs of the kernels that ran) | HFU {:.2f}% (with recomputation) | "
                       "analytic MFU {:.2f}% — against {} × {:.1f} GFLOP/s\n",
                       100 * u.mfu, 100 * u.hfu, 100 * u.analytic_mfu, m.ranks, m.peak_gflops_per_rank);
    if (!u.explanation.empty()) out += "  " + u.explanation + "\n";
  }
  if (!s.comm.empty() && std::any_of(s.comm.begin(), s.comm.end(), [](const ExposedComm& c) { return c.comm_ns > 0; })) {
    out += "exposed communication (comm time not overlapped by compute on the rank), per step:";
    const double steps = static_cast<double>(std::max<int64_t>(s.steps, 1));
    for (const ExposedComm& c : s.comm)
      out += fmt::format(" rank {}: comm {:.3f} ms, exposed {:.3f} ms ({:.0f}%);", c.rank, c.comm_ns / steps / 1e6,
                         c.exposed_ns / steps / 1e6, c.comm_ns > 0 ? 100 * c.exposed_ns / c.comm_ns : 0.0);
    out.back() = '\n';
  }
  const StragglerReport& st = s.stragglers;
  if (!st.ranks.empty()) {
    out += "step times (median):";
    for (const RankSteps& r : st.ranks) out += fmt::format(" rank {} {:.2f} ms;", r.rank, r.median_ns / 1e6);
    out.back() = '\n';
    if (st.slowest_rank >= 0)
      out += fmt::format("straggler: rank {}; its op furthest behind the others: {} {:.3f} ms/step vs {:.3f} ms on the others\n",
                         st.slowest_rank, st.op, st.op_ns_per_step / 1e6, st.others_ns_per_step / 1e6);
  }
  return out;
}

std::string roofline_svg(const ProfileSummary& s, const HierarchicalRoofline& roof, const std::string& title) {
  Series ops{"ops (kernels, measured)", {}, "#000000", true};
  std::vector<std::string> labels;
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (const OpStats& o : s.ops) {
    if (o.cat != "kernel" || o.flops <= 0 || o.bytes <= 0 || o.self_ns <= 0) continue;
    ops.points.emplace_back(o.intensity(), o.gflops());
    labels.push_back(o.name);
    lo = std::min(lo, o.intensity());
    hi = std::max(hi, o.intensity());
  }
  if (!std::isfinite(lo)) lo = hi = 1;
  if (!roof.empty()) hi = std::max(hi, roof.dram().ridge());
  lo /= 4;
  hi *= 4;
  std::vector<Series> series;
  const char* colors[] = {"#2ca02c", "#1f77b4", "#9467bd", "#d62728"};
  for (size_t c = 0; c < roof.memory.size(); ++c) {
    const MemoryCeiling& m = roof.memory[c];
    Series line{fmt::format("{} {:.0f} GB/s", m.name, m.gbs), {}, colors[std::min<size_t>(c, 3)], false};
    const Roofline r{roof.peak_gflops, m.gbs};
    for (int i = 0; i <= 48; ++i) {
      const double x = lo * std::pow(hi / lo, i / 48.0);
      line.points.emplace_back(x, r.attainable(x));
    }
    series.push_back(std::move(line));
  }
  ChartOptions o;
  o.point_labels[ops.name] = std::move(labels);
  series.push_back(std::move(ops));
  o.title = title;
  o.x_label = "arithmetic intensity (FLOP/byte of compulsory traffic)";
  o.y_label = fmt::format("GFLOP/s (f32 FMA peak {:.0f})", roof.peak_gflops);
  o.log_x = o.log_y = true;
  o.legend_left = true;
  o.width = 900;
  o.height = 560;
  return line_chart_svg(series, o);
}

// ---- what the commands call -----------------------------------------------------------------------

ProfileMeta run_profile_meta(std::string description) {
  ProfileMeta m;
  m.threads_per_rank = num_threads();
  m.peak_gflops_per_rank = fma_peak_gflops(1) * num_threads();
  m.description = std::move(description);
  return m;
}

ProfileMeta train_profile_meta(const ModelConfig& c, const TrainOptions& t, int ranks, double peak_gflops_per_rank) {
  ProfileMeta m;
  m.ranks = ranks;
  m.threads_per_rank = num_threads();
  m.peak_gflops_per_rank = peak_gflops_per_rank;
  m.tokens_per_step = static_cast<double>(t.batch * t.seq_len * t.grad_accum);
  m.model_flops_per_step = c.train_flops_per_token(t.seq_len) * m.tokens_per_step;
  m.attention_flops_per_step = 12.0 * static_cast<double>(c.n_layers * t.seq_len * c.d_model) * m.tokens_per_step;
  m.description = fmt::format("train {}, batch {} × seq {} × accum {}", c.describe(), t.batch, t.seq_len, t.grad_accum);
  return m;
}

Expected<std::string> finish_profile(const std::string& path, comm::Communicator* world, const ProfileMeta& meta) {
  trace::stop();
  Profile p = gather_profile(world);
  if (world && world->rank() != 0) return std::string();
  p.meta = meta;
  KILN_RETURN_IF_ERROR(write_chrome_trace(p, path));
  return fmt::format("profile: {} ({} events on {} thread{}, {} rank{}); {}\n", path, p.events.size(), p.threads.size(),
                     p.threads.size() > 1 ? "s" : "", meta.ranks, meta.ranks > 1 ? "s" : "", format_offsets(p.offsets));
}

Expected<std::string> profile_report(const std::string& trace_path, const std::string& svg_path) {
  KILN_ASSIGN_OR_RETURN(const Profile p, read_chrome_trace(trace_path));
  const ProfileSummary s = summarize(p);
  HierarchicalRoofline roof = measure_hierarchical_roofline(std::max(1, p.meta.threads_per_rank));
  // A peak measured on a busy machine only errs low: keep the run's own measurement when higher.
  roof.peak_gflops = std::max(roof.peak_gflops, p.meta.peak_gflops_per_rank);
  std::string out = format_summary(s, p.meta, roof);
  if (!svg_path.empty()) {
    const std::string title = fmt::format("kiln ops on this CPU's measured roofline ({} thread{} per rank)", roof.threads,
                                          roof.threads > 1 ? "s" : "");
    KILN_RETURN_IF_ERROR(write_file_atomic(svg_path, {roofline_svg(s, roof, title)}));
    out += fmt::format("roofline: {}\n", svg_path);
  }
  return out;
}

}  // namespace kiln::perf
