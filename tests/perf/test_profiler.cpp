// The profiler (perf/profiler.h): the Chrome trace JSON it writes (schema, nesting, round trip),
// the FLOPs a profiled llama-tiny training step records against the formula for what kiln
// executes, nothing recorded while off, and the summary's exposed communication, self times and
// straggler report on synthetic traces with known answers.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "kiln/core/trace.h"
#include "kiln/kernels/gemm.h"
#include "kiln/model/config.h"
#include "kiln/model/transformer.h"
#include "kiln/perf/profiler.h"
#include "kiln/train/trainer.h"

namespace kiln::perf {
namespace {

// A few real scopes on two threads: nested phases, kernels with costs, a comm event.
Profile small_trace() {
  trace::start();
  {
    trace::Scope step(trace::Category::kTrain, "step", [](trace::Event& e) { e.add_arg("step", 1); });
    {
      KILN_TRACE_SCOPE(kModel, "forward");
      GemmParams g;
      g.m = 4; g.n = 5; g.k = 6;
      trace::Scope k(trace::Category::kKernel, "gemm", [&](trace::Event& e) { describe_gemm(e, g); });
    }
    std::thread t([] {
      trace::set_thread_name("comm thread \"test\"");  // a name that needs escaping
      trace::Scope c(trace::Category::kComm, "allreduce", [](trace::Event& e) {
        e.op = "allreduce";
        e.algo = "ring";
        e.bytes = 4096;
        e.peers = "0,1";
      });
    });
    t.join();
  }
  trace::stop();
  return local_profile(0);
}

TEST(Profiler, TraceJsonFollowsTheChromeSchema) {
  const Profile p = small_trace();
  const nlohmann::json j = nlohmann::json::parse(chrome_trace_json(p));  // throws if not JSON
  EXPECT_EQ(j.at("displayTimeUnit"), "ns");
  ASSERT_TRUE(j.at("traceEvents").is_array());
  std::set<std::pair<int, int>> named_threads, used_threads;
  std::set<int> named_processes;
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> spans;
  int complete = 0;
  for (const nlohmann::json& e : j["traceEvents"]) {
    const std::string ph = e.at("ph");
    const std::pair<int, int> thread{e.at("pid").get<int>(), e.at("tid").get<int>()};
    if (ph == "M") {
      if (e.at("name") == "thread_name") named_threads.insert(thread);
      if (e.at("name") == "process_name") {
        named_processes.insert(e.at("pid").get<int>());
        EXPECT_EQ(e.at("args").at("name"), fmt::format("rank {}", e.at("pid").get<int>()));
      }
      continue;
    }
    ASSERT_EQ(ph, "X");
    ++complete;
    for (const char* key : {"name", "cat", "ts", "dur", "pid", "tid"}) ASSERT_TRUE(e.contains(key)) << key;
    EXPECT_GE(e.at("dur").get<double>(), 0);
    used_threads.insert(thread);
    spans[thread].emplace_back(e.at("ts").get<double>(), e.at("ts").get<double>() + e.at("dur").get<double>());
    if (e.at("name") == "gemm") {
      EXPECT_EQ(e.at("args").at("flops"), 2.0 * 4 * 5 * 6);
      EXPECT_EQ(e.at("args").at("shape"), (std::vector<int64_t>{4, 5, 6}));
      EXPECT_EQ(e.at("args").at("dtype"), "f32");
    }
    if (e.at("name") == "allreduce") {
      EXPECT_EQ(e.at("args").at("algo"), "ring");
      EXPECT_EQ(e.at("args").at("peers"), "0,1");
      EXPECT_EQ(e.at("args").at("bytes"), 4096);
    }
  }
  EXPECT_EQ(complete, 4);
  for (const auto& t : used_threads) EXPECT_TRUE(named_threads.count(t)) << "thread " << t.second << " has no name";
  for (const auto& t : used_threads) EXPECT_TRUE(named_processes.count(t.first));
  // Events of one thread nest: any two are disjoint or one contains the other.
  for (const auto& [thread, v] : spans)
    for (const auto& a : v)
      for (const auto& b : v) {
        const bool disjoint = a.second <= b.first || b.second <= a.first;
        const bool nested = (a.first <= b.first && b.second <= a.second) || (b.first <= a.first && a.second <= b.second);
        EXPECT_TRUE(disjoint || nested);
      }
}

TEST(Profiler, TraceRoundTripsExactly) {
  Profile p = small_trace();
  p.meta.ranks = 2;
  p.meta.model_flops_per_step = 1.5e9;
  p.offsets.push_back({1, 250.5, 3.25});
  const Expected<Profile> back = parse_chrome_trace(chrome_trace_json(p));
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->events.size(), p.events.size());
  for (size_t i = 0; i < p.events.size(); ++i) {
    const ProfileEvent &a = p.events[i], &b = back->events[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.ts_ns, b.ts_ns);  // to the nanosecond
    EXPECT_EQ(a.dur_ns, b.dur_ns);
    EXPECT_EQ(a.flops, b.flops);
    EXPECT_EQ(a.shape, b.shape);
    EXPECT_EQ(a.args, b.args);
    EXPECT_EQ(a.peers, b.peers);
  }
  EXPECT_EQ(back->meta.ranks, 2);
  EXPECT_EQ(back->meta.model_flops_per_step, 1.5e9);
  ASSERT_EQ(back->offsets.size(), 1u);
  EXPECT_EQ(back->offsets[0].offset_ns, 250.5);
  EXPECT_FALSE(parse_chrome_trace("{\"traceEvents\": 3}").ok());
  EXPECT_FALSE(parse_chrome_trace("not json").ok());
}

// ---- FLOPs of a training step ------------------------------------------------------------------

struct StepRun {
  ModelConfig cfg;
  TrainOptions opt;
  std::unique_ptr<Transformer> model;
  TokenShard data;
};

StepRun llama_tiny_step_setup() {
  StepRun r;
  r.cfg = preset("llama-tiny").value();
  r.opt.batch = 2;
  r.opt.seq_len = 32;
  r.opt.max_steps = 1;
  r.opt.eval_every = 0;
  r.model = Transformer::create(r.cfg, 1).value();
  r.data.vocab_size = r.cfg.vocab_size;
  for (int i = 0; i < 4096; ++i) r.data.tokens.push_back((i * 7919) % static_cast<int>(r.cfg.vocab_size));
  return r;
}

TEST(Profiler, OffRecordsNothingInATrainingStep) {
  StepRun r = llama_tiny_step_setup();
  trace::start();
  trace::stop();
  Trainer trainer(*r.model, r.data, nullptr, r.opt);
  trainer.step();
  EXPECT_TRUE(local_profile(0).events.empty());
}

// What one llama-tiny step (no checkpointing, one process) executes, kernel by kernel, from the
// model's code: N = B·T tokens; per layer q, k, v, o, gate, up, down Linears and the LM head
// (forward 2·in·out·N, backward dx and dW as much again: 6·in·out·N each); causal attention of
// T(T+1)/2 visible pairs per (sequence, head), forward (4D + 3) and backward (10D + 6) FLOPs a
// pair (attention.h); RMSNorm before attention, before the MLP and at the end; RoPE on q and k
// forward and backward; SwiGLU; in backward the two norms of each layer add their input gradient
// into the residual stream's (accumulate_dx: one more FLOP an element; the forward's residual
// adds ride in the GEMM epilogue, uncounted); the embedding's backward scatter-add;
// cross-entropy over V; AdamW over every parameter. The costs are the kernel headers' *_cost.
std::map<std::string, double> llama_step_flops(const ModelConfig& c, double B, double T, double num_params) {
  const double N = B * T, C = static_cast<double>(c.d_model), H = static_cast<double>(c.n_heads);
  const double Hkv = static_cast<double>(c.n_kv_heads), D = static_cast<double>(c.head_dim());
  const double F = static_cast<double>(c.d_ff), V = static_cast<double>(c.vocab_size), L = static_cast<double>(c.n_layers);
  const double layer_matmul = C * H * D + 2 * C * Hkv * D + H * D * C + 3 * C * F;
  const double pairs = B * H * T * (T + 1) / 2;
  return {
      {"gemm", 6 * N * (L * layer_matmul + V * C)},
      {"attention_forward", L * pairs * (4 * D + 3)},
      {"attention_backward", L * pairs * (10 * D + 6)},
      {"rmsnorm_forward", (2 * L + 1) * 4 * N * C},
      {"rmsnorm_backward", (2 * L + 1) * 11 * N * C + 2 * L * N * C},
      {"rope_forward", L * 3 * N * (H + Hkv) * D},
      {"rope_backward", L * 3 * N * (H + Hkv) * D},
      {"swiglu_forward", L * 5 * N * F},
      {"swiglu_backward", L * 10 * N * F},
      {"embedding_backward", N * C},
      {"cross_entropy_forward", 4 * N * V},
      {"cross_entropy_backward", 7 * N * V},
      {"adamw", 14 * num_params},
  };
}

// The formula's FLOPs of one plain step of r, summed over the ops.
double step_formula_total(const StepRun& r) {
  double total = 0;
  for (const auto& [name, flops] : llama_step_flops(r.cfg, static_cast<double>(r.opt.batch),
                                                    static_cast<double>(r.opt.seq_len),
                                                    static_cast<double>(r.model->num_params())))
    total += flops;
  return total;
}

TEST(Profiler, FlopTotalsOfALlamaTinyStepEqualTheFormula) {
  StepRun r = llama_tiny_step_setup();
  Trainer trainer(*r.model, r.data, nullptr, r.opt);
  trace::start();
  trainer.step();
  trace::stop();
  const ProfileSummary s = summarize(local_profile(0));
  std::map<std::string, double> measured;
  for (const OpStats& o : s.ops)
    if (o.cat == "kernel" && o.flops > 0) measured[o.name] = o.flops;
  const auto want = llama_step_flops(r.cfg, static_cast<double>(r.opt.batch), static_cast<double>(r.opt.seq_len),
                                     static_cast<double>(r.model->num_params()));
  // Every op that did work is in the formula and vice versa; each total to double rounding.
  double total = 0;
  for (const auto& [name, flops] : want) {
    ASSERT_TRUE(measured.count(name)) << name << " recorded no FLOPs";
    EXPECT_NEAR(measured[name], flops, 1e-12 * flops) << name;
    total += flops;
  }
  for (const auto& [name, flops] : measured) EXPECT_TRUE(want.count(name)) << name << " is not in the formula";
  EXPECT_NEAR(s.executed_flops, total, 1e-12 * total);
  EXPECT_EQ(s.recompute_flops, 0);
  EXPECT_EQ(s.steps, 1);
  // The analytic 6·N·tokens figure counts full attention; kiln runs the causal half.
  const ProfileMeta meta = train_profile_meta(r.cfg, r.opt, 1, 100.0);
  EXPECT_GT(meta.attention_flops_per_step, s.attention_flops);
}

// A step that ends in validation: its forwards are not the training step's FLOPs (MFU would
// count them as model work), they are listed apart.
TEST(Profiler, EvaluationForwardsAreNotStepFlops) {
  StepRun r = llama_tiny_step_setup();
  r.opt.eval_every = 1;
  r.opt.eval_batches = 2;
  Trainer trainer(*r.model, r.data, &r.data, r.opt);
  trace::start();
  trainer.step();
  trace::stop();
  const ProfileSummary s = summarize(local_profile(0));
  const double plain_total = step_formula_total(r);
  EXPECT_NEAR(s.executed_flops, plain_total, 1e-12 * plain_total);
  EXPECT_GT(s.eval_flops, 0);
}

TEST(Profiler, CheckpointingShowsAsRecomputation) {
  StepRun r = llama_tiny_step_setup();
  r.opt.checkpoint = CheckpointMode::kFull;
  Trainer trainer(*r.model, r.data, nullptr, r.opt);
  trace::start();
  trainer.step();
  trace::stop();
  const ProfileSummary s = summarize(local_profile(0));
  const double plain_total = step_formula_total(r);
  // Full checkpointing re-runs the forward of every layer but the last: more executed FLOPs,
  // exactly the recomputed ones on top of the plain step.
  EXPECT_GT(s.recompute_flops, 0);
  EXPECT_NEAR(s.executed_flops - s.recompute_flops, plain_total, 1e-12 * plain_total);
}

// ---- the summary on synthetic traces -------------------------------------------------------------

ProfileEvent ev(const char* name, const char* cat, int pid, int tid, int64_t ts, int64_t dur, double flops = 0) {
  ProfileEvent e;
  e.name = name;
  e.cat = cat;
  e.pid = pid;
  e.tid = tid;
  e.ts_ns = ts;
  e.dur_ns = dur;
  e.flops = flops;
  return e;
}

TEST(Profiler, ExposedCommunicationIsCommNotCoveredByComputeOnItsRank) {
  Profile p;
  // Rank 0: compute [0, 100) and [120, 130) on the main thread; comm [50, 150) and [60, 70) on
  // the comm thread (union [50, 150): 100 ns), covered by compute on [50, 100) and [120, 130).
  p.events.push_back(ev("gemm", "kernel", 0, 1, 0, 100));
  p.events.push_back(ev("gemm", "kernel", 0, 1, 120, 10));
  p.events.push_back(ev("allreduce", "comm", 0, 2, 50, 100));
  p.events.push_back(ev("allgather", "comm", 0, 2, 60, 10));
  // A blocking collective on the main thread: nothing overlaps it.
  p.events.push_back(ev("allreduce", "comm", 0, 1, 200, 40));
  // Rank 1: compute of rank 0's times does not hide rank 1's communication.
  p.events.push_back(ev("allreduce", "comm", 1, 2, 0, 100));
  p.events.push_back(ev("step", "train", 1, 1, 0, 300));  // not compute
  const std::vector<ExposedComm> x = exposed_communication(p);
  ASSERT_EQ(x.size(), 2u);
  EXPECT_EQ(x[0].rank, 0);
  EXPECT_DOUBLE_EQ(x[0].comm_ns, 140);
  EXPECT_DOUBLE_EQ(x[0].exposed_ns, 140 - 50 - 10);
  EXPECT_EQ(x[1].rank, 1);
  EXPECT_DOUBLE_EQ(x[1].comm_ns, 100);
  EXPECT_DOUBLE_EQ(x[1].exposed_ns, 100);
}

TEST(Profiler, SelfTimeSubtractsNestedEventsOfTheSameThread) {
  Profile p;
  p.events.push_back(ev("step", "train", 0, 1, 0, 1000));
  p.events.push_back(ev("forward", "model", 0, 1, 100, 500));
  p.events.push_back(ev("gemm", "kernel", 0, 1, 150, 200, 4e3));
  p.events.push_back(ev("gemm", "kernel", 0, 1, 400, 100, 1e3));
  p.events.push_back(ev("allreduce", "comm", 0, 2, 100, 800));  // another thread: not nested in step
  const ProfileSummary s = summarize(p);
  std::map<std::string, OpStats> by;
  for (const OpStats& o : s.ops) by[o.name] = o;
  EXPECT_DOUBLE_EQ(by["step"].self_ns, 500);
  EXPECT_DOUBLE_EQ(by["forward"].self_ns, 200);
  EXPECT_DOUBLE_EQ(by["gemm"].self_ns, 300);
  EXPECT_EQ(by["gemm"].calls, 2);
  EXPECT_DOUBLE_EQ(by["gemm"].gflops(), 5e3 / 300);
  EXPECT_DOUBLE_EQ(by["allreduce"].self_ns, 800);
  EXPECT_EQ(s.steps, 1);
  EXPECT_DOUBLE_EQ(s.step_ns, 1000);
  EXPECT_DOUBLE_EQ(s.executed_flops, 5e3);
  EXPECT_DOUBLE_EQ(s.gemm_flops, 5e3);
  // MFU against 1 rank × 10 GFLOP/s: 5e3 FLOP in a 1000 ns step is 5 GFLOP/s, 50%.
  ProfileMeta m;
  m.peak_gflops_per_rank = 10;
  m.model_flops_per_step = 6e3;
  const Utilization u = utilization(s, m);
  EXPECT_DOUBLE_EQ(u.hfu, 0.5);
  EXPECT_DOUBLE_EQ(u.mfu, 0.5);
  EXPECT_DOUBLE_EQ(u.analytic_mfu, 0.6);
  EXPECT_FALSE(u.explanation.empty());
}

TEST(Profiler, StragglerIsTheSlowestRankAndItsLaggingOp) {
  Profile p;
  for (int rank = 0; rank < 3; ++rank) {
    for (int step = 0; step < 2; ++step) {
      const int64_t t0 = step * 10000;
      const int64_t slow = rank == 2 ? 3000 : 0;  // rank 2's attention takes 3 µs longer
      p.events.push_back(ev("step", "train", rank, 1, t0, 6000 + slow));
      p.events.push_back(ev("gemm", "kernel", rank, 1, t0 + 100, 2000));
      p.events.push_back(ev("attention_forward", "kernel", rank, 1, t0 + 2200, 1000 + slow));
    }
  }
  const StragglerReport r = straggler_report(p);
  ASSERT_EQ(r.ranks.size(), 3u);
  EXPECT_DOUBLE_EQ(r.ranks[0].median_ns, 6000);
  EXPECT_EQ(r.slowest_rank, 2);
  EXPECT_EQ(r.op, "attention_forward");
  EXPECT_DOUBLE_EQ(r.op_ns_per_step, 4000);
  EXPECT_DOUBLE_EQ(r.others_ns_per_step, 1000);
  const std::string text = format_summary(summarize(p), ProfileMeta{}, HierarchicalRoofline{});
  EXPECT_NE(text.find("straggler: rank 2"), std::string::npos) << text;
}

TEST(Profiler, RooflinePlotHasEveryKernelAndCeiling) {
  Profile p;
  ProfileEvent g = ev("gemm", "kernel", 0, 1, 0, 1000, 2e3);
  g.bytes = 100;
  ProfileEvent a = ev("accumulate", "kernel", 0, 1, 2000, 1000, 10);
  a.bytes = 120;
  p.events = {g, a};
  HierarchicalRoofline roof;
  roof.peak_gflops = 100;
  roof.threads = 1;
  roof.memory = {{"L1", 400, 48}, {"L2", 150, 512 << 10}, {"DRAM", 20, 0}};
  const ProfileSummary s = summarize(p);
  const std::string svg = roofline_svg(s, roof, "test");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  for (const char* text : {">gemm<", ">accumulate<", "L1 400 GB/s", "L2 150 GB/s", "DRAM 20 GB/s"})
    EXPECT_NE(svg.find(text), std::string::npos) << text;
  // gemm: 20 FLOP/B, past the ridge (its 100 bytes fit in L2: 0.67; DRAM: 5): compute-bound at
  // 2 GFLOP/s = 2% of the roof. accumulate: 0.083 FLOP/B, memory-bound; its 120 bytes fit in L2
  // (not in a 48-byte L1): 0.01 GFLOP/s of 150 · 0.083 = 12.5, 0.1%.
  const std::string table = format_summary(s, ProfileMeta{}, roof);
  EXPECT_NE(table.find(" compute   2.0%"), std::string::npos) << table;
  EXPECT_NE(table.find("  mem L2   0.1%"), std::string::npos) << table;
  EXPECT_EQ(roof.level_for(1e6)->name, "DRAM");
  EXPECT_EQ(roof.level_for(40)->name, "L1");
}

}  // namespace
}  // namespace kiln::perf
