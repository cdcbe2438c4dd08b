// `auto` resolution: the model's pick pinned at once, or an in-process probe of the close
// candidates whose per-rank times are agreed across ranks (MAX) before one is pinned.
// Every decision depends only on the sequence of calls and on agreed values, never on a
// rank-local time, so every rank runs the same algorithm at every call.
#include "kiln/comm/auto_probe.h"

#include <algorithm>

#include "kiln/comm/communicator.h"
#include "kiln/comm/cost_model.h"

namespace kiln::comm {

std::string_view auto_source_name(AutoSource s) {
  switch (s) {
    case AutoSource::kModel: return "model";
    case AutoSource::kProbing: return "probing";
    case AutoSource::kProbe: return "probe";
  }
  return "?";
}

void set_auto_probe_cost_hook(Communicator& comm, ProbeCostHook hook) {
  comm.auto_probe_state().cost_hook = std::move(hook);
}

namespace detail {
namespace {

using Entry = AutoProbeState::Entry;

double median_of(std::vector<double> v) {
  KILN_CHECK(!v.empty());
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// The candidate that probe call `k` of `e` runs.
size_t candidate_of_call(const Entry& e, int k) {
  return static_cast<size_t>(k / kProbeBlock) % e.candidates.size();
}

// Whether probe call `k` of `e` is in a timed round.
bool timed_round(const Entry& e, int k) {
  return k / (kProbeBlock * static_cast<int>(e.candidates.size())) >= kProbeWarmRounds;
}

// First call at `key`: pin the model's pick, or start a probe of the close candidates.
// Deterministic in (table, p, op, bytes, setting), hence the same on every rank.
void decide(Communicator& comm, CollOp op, int64_t nbytes_total, uint64_t key) {
  auto& cache = comm.auto_cache();
  AutoProbeState& st = comm.auto_probe_state();
  if (cache.size() + st.entries.size() > 4096) {  // bounded: sizes in a training run are few
    cache.clear();
    st.entries.clear();
    st.model_why.clear();
  }
  const int p = comm.size();
  const int rpn = op == CollOp::kAllReduce ? comm.hierarchical_node_size() : 0;
  const AlphaBetaTable& t = comm.cost_table();
  const double n = static_cast<double>(nbytes_total);
  const Algo pick = select_algo(t, op, p, n, rpn);
  std::string_view why;
  Entry e;
  if (p < 2) {
    why = "one rank";
  } else if (!comm.auto_probe()) {
    why = "probe off";
  } else if (nbytes_total < kProbeMinBytes) {
    why = "below the probe floor";
  } else {
    const double best_s = predict_seconds(t, op, pick, p, n, rpn);
    e.model_pick = pick;
    e.candidates.push_back(pick);
    e.predicted_s.push_back(best_s);
    for (const auto& [a, s] : rank_algos(t, op, p, n, rpn)) {
      if (static_cast<int>(e.candidates.size()) >= kProbeMaxCandidates) break;
      if (a != pick && s <= kProbeCandidateFactor * best_s) {
        e.candidates.push_back(a);
        e.predicted_s.push_back(s);
      }
    }
    if (e.candidates.size() < 2) why = "no close runner-up";
  }
  if (!why.empty()) {
    cache.emplace(key, static_cast<uint8_t>(pick));
    st.model_why[key] = why;
    return;
  }
  e.samples.resize(e.candidates.size());
  st.entries.emplace(key, std::move(e));
}

// The probe entry under way at `key`, deciding first if the key is new; null when pinned.
Entry* probing_entry(Communicator& comm, CollOp op, int64_t nbytes_total, uint64_t key) {
  if (comm.auto_cache().count(key)) return nullptr;
  AutoProbeState& st = comm.auto_probe_state();
  auto it = st.entries.find(key);
  if (it == st.entries.end()) {
    decide(comm, op, nbytes_total, key);
    if (comm.auto_cache().count(key)) return nullptr;
    it = st.entries.find(key);
    KILN_CHECK(it != st.entries.end());
  }
  KILN_CHECK(!it->second.done);  // a finished probe is in the cache
  return &it->second;
}

// A call of an algorithm the probe pinned (a key with kWatchedBit): keeps its time, and every
// `window` calls, the same call on every rank, agrees on the window's median (the slowest
// rank's); the first window after a pin is the reference, and a later one beyond kDriftFactor
// of it runs the probe again.
void watch_call(Communicator& comm, CollOp op, const AutoTicket& t) {
  const double dt = auto_clock() - t.t0;
  AutoProbeState& st = comm.auto_probe_state();
  auto it = st.entries.find(t.key);
  KILN_CHECK(it != st.entries.end() && it->second.done);
  Entry& e = it->second;
  e.watch.push_back(st.cost_hook ? st.cost_hook(op, t.algo, dt) : dt);
  if (static_cast<int>(e.watch.size()) < e.window) return;
  const double local = median_of(e.watch);
  double agreed = 0;
  MPI_Allreduce(&local, &agreed, 1, MPI_DOUBLE, MPI_MAX, comm.handle());
  e.watch.clear();
  if (e.watch_ref_s <= 0) {  // the first window after the pin: the reference
    e.watch_ref_s = agreed;
    return;
  }
  if (agreed <= kDriftFactor * e.watch_ref_s && agreed * kDriftFactor >= e.watch_ref_s) return;
  // Drifted: the next calls at this key probe the same candidates again.
  comm.auto_cache().erase(t.key);
  e.done = false;
  e.calls_done = 0;
  e.samples.assign(e.candidates.size(), {});
  e.measured_s.clear();
  e.window = std::min(2 * e.window, kWatchMaxWindow);
  ++e.reprobes;
}

}  // namespace

AutoTicket auto_begin_unpinned(Communicator& comm, CollOp op, int64_t nbytes_total) {
  AutoTicket t;
  t.key = auto_key(op, nbytes_total);
  Entry* e = probing_entry(comm, op, nbytes_total, t.key);
  if (e == nullptr) {  // the model's pick, pinned now (no watch)
    t.algo = cached_algo(comm.auto_cache().at(t.key));
    return t;
  }
  const int k = e->calls_done;
  t.algo = e->candidates[candidate_of_call(*e, k)];
  t.probe = true;
  if (timed_round(*e, k) && k % kProbeBlock == kProbeBlock - kProbeKeep) {
    MPI_Barrier(comm.handle());  // the same call on every rank: the window starts together
    e->window_t0 = auto_clock();
  }
  return t;
}

void auto_finish_timed(Communicator& comm, CollOp op, const AutoTicket& t) {
  if (t.watch) return watch_call(comm, op, t);
  AutoProbeState& st = comm.auto_probe_state();
  auto it = st.entries.find(t.key);
  KILN_CHECK(it != st.entries.end() && !it->second.done);
  Entry& e = it->second;
  const int k = e.calls_done;
  const size_t c = candidate_of_call(e, k);
  KILN_CHECK(e.candidates[c] == t.algo);
  if (timed_round(e, k) && k % kProbeBlock == kProbeBlock - 1) {  // the window's last call
    const double dt = (auto_clock() - e.window_t0) / kProbeKeep;
    e.samples[c].push_back(st.cost_hook ? st.cost_hook(op, t.algo, dt) : dt);
  }
  ++e.calls_done;
  if (e.calls_done < probe_calls(static_cast<int>(e.candidates.size()))) return;
  // The last probe call, the same call on every rank: agree on the times (the slowest rank's
  // median per candidate, as the bench times a collective), then pin from agreed values only.
  const int nc = static_cast<int>(e.candidates.size());
  std::vector<double> local(nc);
  for (int i = 0; i < nc; ++i) local[i] = median_of(e.samples[i]);
  e.measured_s.assign(nc, 0.0);
  MPI_Allreduce(local.data(), e.measured_s.data(), nc, MPI_DOUBLE, MPI_MAX, comm.handle());
  int best = 0;
  for (int i = 1; i < nc; ++i)
    if (e.measured_s[i] < e.measured_s[best]) best = i;
  // Index 0 is the model's pick: another candidate must beat it by more than the tolerance.
  const bool switch_pick = e.measured_s[best] * (1.0 + kProbeTieTolerance) < e.measured_s[0];
  const int pick = switch_pick ? best : 0;
  e.done = true;
  e.samples.clear();
  e.watch_ref_s = 0;  // a new pin: the watch's next window is its reference
  e.watch.clear();
  comm.auto_cache().emplace(t.key, static_cast<uint8_t>(static_cast<uint8_t>(e.candidates[pick]) | kWatchedBit));
}

AutoChoice auto_choice(Communicator& comm, CollOp op, int64_t nbytes_total) {
  const uint64_t key = auto_key(op, nbytes_total);
  AutoChoice ch;
  const Entry* e = probing_entry(comm, op, nbytes_total, key);
  AutoProbeState& st = comm.auto_probe_state();
  if (e == nullptr) {
    ch.algo = cached_algo(comm.auto_cache().at(key));
    auto it = st.entries.find(key);
    if (it == st.entries.end()) {  // pinned by the model at once
      ch.model_pick = ch.algo;
      ch.source = AutoSource::kModel;
      if (auto w = st.model_why.find(key); w != st.model_why.end()) ch.why = w->second;
      return ch;
    }
    e = &it->second;
    ch.source = AutoSource::kProbe;
  } else {
    ch.algo = e->candidates[candidate_of_call(*e, e->calls_done)];
    ch.source = AutoSource::kProbing;
  }
  ch.model_pick = e->model_pick;
  ch.candidates = e->candidates;
  ch.predicted_s = e->predicted_s;
  ch.measured_s = e->measured_s;
  ch.calls_done = e->calls_done;
  ch.reprobes = e->reprobes;
  return ch;
}

}  // namespace detail
}  // namespace kiln::comm
