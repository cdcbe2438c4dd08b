// One training run end to end (train_run.h): flags resolved, corpus and model, the Trainer's
// loop, the progress line, the memory report, and the files saved at the end.
#include "kiln/run/train_run.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include <unistd.h>

#include "kiln/core/allocator.h"
#include "kiln/core/thread_pool.h"
#include "kiln/core/trace.h"
#include "kiln/model/weights.h"
#include "kiln/perf/memory_model.h"
#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/perf/peak.h"
#include "kiln/perf/profiler.h"
#include "kiln/perf/svg.h"
#include "kiln/quant/qat.h"
#include "kiln/serve/chat_template.h"
#include "kiln/tokenizer/bpe.h"

namespace kiln::run {

void RunOutput::flush() const {
  if (is_main_rank_) std::fflush(stream_);
}

void RunOutput::write_text(const std::string& path, const std::string& text) const {
  if (is_main_rank_) std::ofstream(path) << text;
}

Status RunOutput::save(const std::function<Status()>& write) const { return is_main_rank_ ? write() : Status(); }

namespace {

// The loss-scaling flags: fp16 defaults to dynamic from S0 = 2^16; other precisions to none.
Status parse_loss_scale(const TrainRunOptions& o, TrainOptions& t) {
  const std::string ls = o.loss_scale.empty() ? (t.precision == Precision::kF16 ? "dynamic" : "1") : o.loss_scale;
  if (ls == "dynamic") {
    t.dynamic_loss_scale = true;
    t.loss_scale = o.loss_scale_init;
    return {};
  }
  char* end = nullptr;
  const double v = std::strtod(ls.c_str(), &end);
  if (end == ls.c_str() || *end != '\0' || !(v > 0) || !std::isfinite(v))
    return invalid_argument("--loss-scale '{}': expected 'dynamic' or a positive number", ls);
  t.loss_scale = v;
  t.dynamic_loss_scale = false;
  return {};
}

// The memory one training step needs (the memory model: weights, gradients, AdamW, activations),
// against this machine's RAM, before anything is allocated: a --batch × --seq too large for the
// machine is one clear error, not an allocator abort minutes later.
Status check_train_memory(const ModelConfig& cfg, const TrainOptions& t, bool offload_optimizer) {
  perf::MemoryPrediction pred = perf::predict_memory(cfg, t.batch, t.seq_len, t.precision, t.checkpoint);
  if (offload_optimizer) perf::offload_optimizer_state(pred, OffloadedMoments::staging_bytes_for());
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return {};
  const double ram = static_cast<double>(pages) * static_cast<double>(page);
  const double need = static_cast<double>(pred.total_block_bytes());
  if (!(need <= ram))
    return resource_exhausted("--batch {} × --seq {} needs about {:.1f} GiB for a training step of this model; this "
                              "machine has {:.1f} GiB (lower --batch or --seq, or use --checkpoint full)",
                              t.batch, t.seq_len, need / (1 << 30), ram / (1 << 30));
  return {};
}

// Entropy (nats) of the unigram distribution of a shard: the loss of a model that ignores context.
double unigram_entropy(const TokenShard& s) {
  std::map<int32_t, int64_t> counts;
  for (int32_t t : s.tokens) ++counts[t];
  double h = 0;
  const double n = static_cast<double>(s.tokens.size());
  for (const auto& [t, c] : counts) h -= c / n * std::log(c / n);
  return h;
}

// The data of a run and the model config that fits it.
struct RunData {
  CorpusPaths paths;
  TokenShard train, val;
  ModelConfig config;  // the preset with the corpus's vocabulary and end-of-text id
};

// The preset a run trains: a Llama-family preset's context widens to --seq when it is longer
// (RoPE has no position table: only the cos/sin table grows); GPT-2's learned position table
// cannot, so a longer --seq is refused.
Expected<ModelConfig> run_config(const TrainRunOptions& o) {
  auto cfg = preset(o.preset);
  if (!cfg.ok()) return invalid_argument("--preset: {}", cfg.status().message());
  if (o.train.seq_len > cfg->max_seq_len) {
    if (!cfg->is_llama())
      return invalid_argument("--seq {} exceeds the context of --preset {} ({}: its learned position table has that many rows)",
                              o.train.seq_len, o.preset, cfg->max_seq_len);
    cfg->max_seq_len = o.train.seq_len;
  }
  return cfg;
}

Expected<RunData> load_run_data(const TrainRunOptions& o, const RunOutput& out) {
  RunData d;
  std::string log;
  KILN_ASSIGN_OR_RETURN(d.paths, prepare_corpus(o.data, &log));
  out.print("{}\n", log);
  KILN_ASSIGN_OR_RETURN(d.train, read_shard(d.paths.train));
  KILN_ASSIGN_OR_RETURN(d.val, read_shard(d.paths.val));
  KILN_ASSIGN_OR_RETURN(d.config, run_config(o));
  if (const auto base = preset(o.preset); base.ok() && base->max_seq_len < d.config.max_seq_len)
    out.print("context: {} tokens (--seq; --preset {} has {}, RoPE positions extend)\n", d.config.max_seq_len, o.preset,
              base->max_seq_len);
  d.config.vocab_size = d.train.vocab_size;
  // config.json gets the end-of-text id as bos and eos (what generation stops at)
  KILN_ASSIGN_OR_RETURN(const tok::Tokenizer tk, tok::Tokenizer::load_hf_json(d.paths.tokenizer));
  d.config.bos_token_id = d.config.eos_token_id = tk.eot_id();  // -1 (written as null) when it has none
  return d;
}

// Every batch samples windows of seq_len + 1 tokens: a split shorter than one is refused here
// (the validation split only when it is evaluated), not met as a failed check mid-run.
Status check_windows(const RunData& d, const TrainOptions& t) {
  const auto need = static_cast<size_t>(t.seq_len) + 2;
  if (d.train.tokens.size() < need)
    return invalid_argument("the training split ({}) has {} tokens: fewer than one --seq {} window plus one; use a "
                            "shorter --seq or a longer --text", d.paths.train, d.train.tokens.size(), t.seq_len);
  if (t.eval_every > 0 && d.val.tokens.size() < need)
    return invalid_argument("the validation split ({}) has {} tokens: fewer than one --seq {} window plus one; use a "
                            "shorter --seq, a longer --text or --eval-every 0", d.paths.val, d.val.tokens.size(),
                            t.seq_len);
  return {};
}

// The one place a run's Trainer is made, over the run's parallel plan (null: one process).
std::unique_ptr<Trainer> make_trainer(Transformer& model, const RunData& d, const TrainOptions& t, ParallelPlan* plan) {
  return std::make_unique<Trainer>(model, d.train, &d.val, t, plan);
}

// The data-parallel options of a run, checked with no communication (the same verdict on
// every rank): --fsdp is --zero 3, --hsdp alone implies it, --dp must be the world size.
Expected<parallel::DataParallelOptions> resolve_parallel(const TrainRunOptions& o, const TrainOptions& t, int world) {
  parallel::DataParallelOptions p = o.parallel;
  if (o.reduce_dtype == "bf16") p.reduce_dtype = DType::kBF16;
  else if (o.reduce_dtype != "f32") return invalid_argument("--reduce-dtype {}: f32 or bf16", o.reduce_dtype);
  if (o.fsdp) {
    if (p.zero != 0 && p.zero != 3) return invalid_argument("--fsdp is --zero 3; it cannot be combined with --zero {}", p.zero);
    p.zero = 3;
  }
  if (p.shard_group > 0 && p.zero == 0) p.zero = 3;
  const int tp = o.tensor.tp, pp = o.pipeline.pp, cp = std::max(1, o.context.cp);
  if (o.context.cp > 1 && (pp > 1 || o.expert.ep > 1))
    return invalid_argument("--cp {} composes with data and tensor parallelism only; with --pp or --ep it is not "
                            "implemented", o.context.cp);
  if (o.tensor.sequence_parallel && tp < 2)
    return invalid_argument("--sp splits the sequence over the --tp ranks: it needs --tp 2 or more");
  if (world % (tp * pp) != 0)
    return invalid_argument("--pp {} × --tp {} does not divide the {} ranks of this job (mpirun -np): pp × dp × tp "
                            "must be the world", pp, tp, world);
  if (world % (tp * pp * cp) != 0)
    return invalid_argument("--cp {} does not divide the {} ranks of this job (mpirun -np): dp × cp × tp must be the "
                            "world", cp, world);
  const int dp = o.dp > 0 ? o.dp : world / (tp * pp * cp);
  if (dp * tp * pp * cp != world)
    return invalid_argument("--dp {} × --tp {} × --pp {} does not match the {} ranks of this job (mpirun -np): every "
                            "rank is one data-parallel rank of one tensor-parallel group of one pipeline stage",
                            dp, tp, pp, world);
  KILN_RETURN_IF_ERROR(parallel::check_data_parallel(p, dp, t));
  if (pp > 1 && o.pipeline.schedule == pipeline::ScheduleKind::kZeroBubbleH1 && !o.qat.empty())
    return invalid_argument("--schedule zb-h1 splits each Linear's backward in fp32; --qat installs a backend that "
                            "computes both halves at once");
  if (p.zero == 3 && !o.qat.empty())
    return invalid_argument("--qat installs a backend on every whole weight; it needs --zero 0, 1 or 2 (got 3)");
  if (o.expert.ep > 1 && (tp > 1 || pp > 1))
    return invalid_argument("--ep {} composes with data parallelism only; with --tp or --pp it is not implemented",
                            o.expert.ep);
  return p;
}

// The FMA peak MFU is quoted against: threads × the one-core peak, since a register-only loop
// scales linearly over cores, and one core is less often disturbed by other processes than both
// (no MFU above 100%). bf16 runs on the peak of the products its GEMM issues (vdpbf16ps, or AMX
// tiles where it runs on them); fp16 and fp8 are emulated in f32; bf16 widened to f32 (CPUs
// with a slow vdpbf16ps and no AMX) runs on the f32 peak.
struct MachinePeak {
  double gflops = 0;
  bool bf16 = false;  // the bf16 products' peak, else the f32 FMA peak
};
MachinePeak machine_peak(Precision p) {
  const bool bf16 = p == Precision::kBF16 && cpu::bf16_gemm_on_bf16_products() && perf::fma_peak_gflops(1, DType::kBF16) > 0;
  return {perf::gemm_peak_gflops(1, bf16 ? DType::kBF16 : DType::kF32) * num_threads(), bf16};
}

// What the run is, before it starts: precision and peak, the model, the data, the unigram baseline.
void print_run_header(const RunData& d, const TrainOptions& t, const MachinePeak& peak, const ProgressContext& progress,
                      double unigram, const RunOutput& out) {
  out.print("precision {}{}, checkpoint {}; MFU and HFU against {:.0f} GFLOP/s ({} peak){}\n", precision_name(t.precision),
            t.precision == Precision::kF16 || t.precision == Precision::kFP8 ? " (emulated: rounded, f32 GEMM)" : "",
            checkpoint_mode_name(t.checkpoint), peak.gflops,
            !peak.bf16 ? "f32" : cpu::bf16_gemm_kernel() == cpu::Bf16Kernel::kAmx ? "bf16 AMX" : "bf16",
            t.checkpoint == CheckpointMode::kNone
                ? ""
                : fmt::format("; recomputation {:.1f} MFLOP/token", progress.recompute_flops_per_token / 1e6));
  out.print("model: {}\n", d.config.describe());
  out.print("train: {} tokens, val: {} tokens; batch {} × seq {} × accum {}; {} threads\n", d.train.tokens.size(),
            d.val.tokens.size(), t.batch, t.seq_len, t.grad_accum, num_threads());
  out.print("unigram entropy of the validation text: {:.3f} nats/token (loss of a context-free model)\n", unigram);
}

// --qat: fake quantization on every block Linear, refreshed after each step.
Expected<quant::QatConfig> install_qat(const std::string& name, Transformer& model, const RunOutput& out) {
  KILN_ASSIGN_OR_RETURN(quant::QatConfig q, quant::parse_qat(name));
  KILN_RETURN_IF_ERROR(quant::install_qat(model, q));
  out.print("QAT: fake-quantized {} weights{}, straight-through estimator\n", q.weight.describe(),
            q.act_int8 ? " and int8 per-token activations" : "");
  return q;
}

// The model's memory by kind, after one forward of a (batch, seq) probe sized the activations.
// `seq`: the tokens of a sequence this rank runs (T, or T / cp under context parallelism).
void print_model_memory(Transformer& model, const TrainOptions& t, int64_t rows, int64_t seq, double flops_per_token,
                        const RunOutput& out) {
  std::vector<int32_t> probe(static_cast<size_t>(rows * seq), 0);  // (rows, seq): this rank's part of a batch
  (void)model.forward(probe.data(), nullptr, rows, seq);
  const double mib = static_cast<double>(model.num_params()) * sizeof(float) / 1048576.0;
  out.print("memory: weights {:.1f} MiB, grads {:.1f} MiB, AdamW {:.1f} MiB, activations {:.1f} MiB{}; "
            "{:.1f} MFLOP/token (train)\n", mib, mib, 2 * mib, model.activation_bytes() / 1048576.0,
            rows == t.batch ? "" : " (before sharding; per rank: see the progress line)", flops_per_token / 1e6);
}

// `--memory-report`: the memory model beside the caching allocator's numbers for the step just
// run (peak since `reset_peak`, over `base`, what was live before the model existed), and an SVG
// of the breakdown: predicted for each checkpointing mode, and measured.
void memory_report(const TrainRunOptions& o, const ModelConfig& cfg, const TrainOptions& t, const AllocatorStats& base,
                   const RunOutput& out) {
  const AllocatorStats st = default_allocator().stats();
  perf::MemoryPrediction pred = perf::predict_memory(cfg, t.batch, t.seq_len, t.precision, t.checkpoint);
  const int64_t staging = OffloadedMoments::staging_bytes_for();
  if (!o.offload_optimizer.empty()) perf::offload_optimizer_state(pred, staging);
  const auto mib = [](double b) { return b / 1048576.0; };
  out.print("{}", perf::format_memory_prediction(pred));
  const double measured = static_cast<double>(st.peak_bytes_in_use - base.bytes_in_use);
  const double measured_req = static_cast<double>(st.peak_bytes_requested - base.bytes_requested);
  out.print("measured (caching allocator, peak of step 2): {:.2f} MiB in blocks ({:+.2f}% vs predicted), {:.2f} MiB "
            "requested ({:+.2f}%)\n",
            mib(measured), 100 * (measured / static_cast<double>(pred.total_block_bytes()) - 1), mib(measured_req),
            100 * (measured_req / static_cast<double>(pred.total_bytes()) - 1));
  out.print("allocator now: allocated {:.2f} MiB, reserved {:.2f} MiB ({:.1f}% reserved but unused), cached {:.2f} MiB, "
            "largest free block {:.2f} MiB, external fragmentation {:.3f}, internal fragmentation {:.3f}, "
            "{} OS allocations of {} calls\n",
            mib(static_cast<double>(st.bytes_in_use)), mib(static_cast<double>(st.bytes_reserved)),
            100 * st.reserved_unused(), mib(static_cast<double>(st.bytes_cached)),
            mib(static_cast<double>(st.largest_free_block)), st.external_fragmentation(), st.fragmentation(),
            st.num_os_allocs, st.num_allocs);
  std::vector<Bar> bars;
  for (CheckpointMode m : {CheckpointMode::kNone, CheckpointMode::kSelective, CheckpointMode::kFull}) {
    perf::MemoryPrediction p = perf::predict_memory(cfg, t.batch, t.seq_len, t.precision, m);
    if (!o.offload_optimizer.empty()) perf::offload_optimizer_state(p, staging);
    Bar b{fmt::format("predicted {}", checkpoint_mode_name(m)), {}};
    for (const char* g : {"model states", "layer activations", "other activations", "scratch", "kernel scratch"})
      b.segments.push_back({g, mib(static_cast<double>(p.group_block_bytes(g))), ""});
    bars.push_back(std::move(b));
  }
  Bar m{fmt::format("measured {}", checkpoint_mode_name(t.checkpoint)), {}};
  const double states = static_cast<double>(pred.group_block_bytes("model states"));
  m.segments.push_back({"model states", mib(states), ""});
  m.segments.push_back({"measured: rest of peak", mib(measured - states), "#7f7f7f"});
  bars.push_back(std::move(m));
  ChartOptions chart;
  chart.title = fmt::format("{}, B {} × T {}, {}: memory of a training step (MiB, allocator blocks)", o.preset, t.batch,
                            t.seq_len, precision_name(t.precision));
  chart.y_label = "MiB";
  chart.width = 980;
  chart.height = 460;
  const std::string path = (std::filesystem::path(o.out_dir) / "memory.svg").string();
  out.write_text(path, stacked_bar_svg(bars, chart));
  out.print("memory breakdown: {}\n", path);
}

// The progress line is printed on the first and every 10th step, on evaluations and at the end.
bool progress_due(const StepStats& s, bool done) { return s.step % 10 == 0 || s.step == 1 || s.val_loss >= 0 || done; }

// The training and validation losses of the steps this process ran, for loss.svg.
struct LossCurves {
  Series train{"train loss", {}, "", false}, val{"validation loss", {}, "", true};
  double last_val = -1;

  void add(const StepStats& s) {
    train.points.emplace_back(static_cast<double>(s.step), s.loss);
    if (s.val_loss >= 0) {
      last_val = s.val_loss;
      val.points.emplace_back(static_cast<double>(s.step), s.val_loss);
    }
  }
};

// The end of a run (after the final checkpoint): the model (fp32, and the quantized export after QAT)
// with its tokenizer, and the chat template `kiln serve` uses for /v1/chat/completions.
Status save_run(const TrainRunOptions& o, const RunData& d, Transformer& model,
                const std::optional<quant::QatConfig>& qat, const RunOutput& out) {
  return out.save([&]() -> Status {
    KILN_RETURN_IF_ERROR(save_model(o.out_dir, model));
    if (qat) {  // the real quantized model on the grid QAT trained for
      const std::string qdir = (std::filesystem::path(o.out_dir) / "quantized").string();
      const quant::QuantizedState qs = quant::export_qat(model, *qat);
      KILN_RETURN_IF_ERROR(quant::save_quantized_model(qdir, model, qs));
      std::filesystem::copy_file(d.paths.tokenizer, std::filesystem::path(qdir) / "tokenizer.json",
                                 std::filesystem::copy_options::overwrite_existing);
      out.print("QAT export: {} ({})\n", qdir, qs.scheme.describe());
    }
    std::filesystem::copy_file(d.paths.tokenizer, std::filesystem::path(o.out_dir) / "tokenizer.json",
                               std::filesystem::copy_options::overwrite_existing);
    return save_chat_template(o.out_dir, ChatTemplate{});
  });
}

// loss.svg: the losses of the steps run, against the unigram entropy. Returns its path.
std::string write_loss_curve(const TrainRunOptions& o, const RunData& d, const LossCurves& curves, double unigram,
                             int64_t steps_done, const RunOutput& out) {
  ChartOptions chart;
  chart.title = fmt::format("{} on {}", o.preset, d.paths.dir);
  chart.x_label = "step";
  chart.y_label = "loss (nats/token)";
  const Series unigram_line{"unigram entropy", {{1.0, unigram}, {static_cast<double>(steps_done), unigram}}, "#999", false};
  const std::string path = (std::filesystem::path(o.out_dir) / "loss.svg").string();
  out.write_text(path, line_chart_svg({curves.train, curves.val, unigram_line}, chart));
  return path;
}

}  // namespace

Expected<TrainOptions> resolve_train_options(const TrainRunOptions& o) {
  TrainOptions t = o.train;
  KILN_RETURN_IF_ERROR(run_config(o).status());
  auto p = parse_precision(o.precision);
  if (!p.ok()) return invalid_argument("--precision: {}", p.status().message());
  t.precision = *p;
  auto m = parse_checkpoint_mode(o.checkpoint);
  if (!m.ok()) return invalid_argument("--checkpoint: {}", m.status().message());
  t.checkpoint = *m;
  KILN_RETURN_IF_ERROR(parse_loss_scale(o, t));
  if (!o.qat.empty()) {
    if (auto q = quant::parse_qat(o.qat); !q.ok()) return invalid_argument("--qat: {}", q.status().message());
    if (t.precision != Precision::kF32)
      return invalid_argument("--qat needs --precision fp32 (both install Linear backends; got {})", o.precision);
  }
  if (!o.offload_optimizer.empty()) {
    if (t.graph_capture)
      return invalid_argument("--offload-optimizer does not combine with --graph capture or fused (a captured step "
                              "updates the moments in place)");
    std::error_code ec;
    if (!std::filesystem::is_directory(o.offload_optimizer, ec))
      return invalid_argument("--offload-optimizer {}: not an existing directory", o.offload_optimizer);
  }
  return t;
}

std::string format_progress(const StepStats& s, int64_t total_steps, const ProgressContext& c) {
  const double remaining = (total_steps - s.step) * s.seconds;
  const double achieved = s.tokens_per_second * c.flops_per_token;  // FLOP/s of the model
  const double hardware = s.tokens_per_second * (c.flops_per_token + c.recompute_flops_per_token);  // recomputation too
  std::string scaling =
      c.show_loss_scale ? fmt::format(" | S {:g}{}", s.loss_scale, s.skipped ? " SKIPPED (inf/NaN)" : "") : std::string();
  if (c.show_flushed && s.grads_rounded > 0)  // output gradients lost to f16 underflow
    scaling += fmt::format(" | flushed {:.3f}%", 100.0 * static_cast<double>(s.grads_flushed) / s.grads_rounded);
  if (c.show_parallel) {
    const double mib = static_cast<double>(default_allocator().stats().peak_bytes_in_use) / (1 << 20);
    scaling += fmt::format(" | mem {:.0f} MiB/rank | comm {:.0f} ms, exposed {:.0f}%", mib, s.comm.comm_seconds * 1e3,
                           s.comm.comm_seconds > 0 ? 100.0 * s.comm.exposed_seconds / s.comm.comm_seconds : 0.0);
  }
  // Offloaded moments: the step's traffic, its rate, and what the update waited for.
  if (const auto moved = static_cast<double>(s.offload.bytes_read + s.offload.bytes_written); moved > 0)
    scaling += fmt::format(" | offload {:.0f} MiB, {:.2f} GB/s, exposed {:.0f} ms", moved / (1 << 20),
                           s.offload.io_seconds > 0 ? moved / s.offload.io_seconds / 1e9 : 0.0,
                           s.offload.exposed_seconds * 1e3);
  if (s.moe.blocks > 0) {  // MoE: the router losses, the load (max / mean tokens per expert), drops
    scaling += fmt::format(" | aux {:.3f} z {:.2f} load {:.2f}x drop {:.1f}%", s.moe.aux_mean(), s.moe.z_mean(),
                           s.moe.max_over_mean(), 100.0 * s.moe.drop_rate());
    if (s.moe.all_to_all_seconds > 0)
      scaling += fmt::format(" | a2a {:.0f} ms, exposed {:.0f}%", s.moe.all_to_all_seconds * 1e3,
                             100.0 * s.moe.exposed_seconds / s.moe.all_to_all_seconds);
  }
  return fmt::format("step {:5d}/{} | loss {:.4f}{} | lr {:.2e} | gnorm {:.2f}{} | {:.0f} tok/s | {:.1f} GFLOP/s | "
                     "MFU {:.1f}% | HFU {:.1f}% | ETA {:.0f}s",
                     s.step, total_steps, s.loss, s.val_loss >= 0 ? fmt::format(" val {:.4f}", s.val_loss) : std::string(),
                     s.lr, s.grad_norm, scaling, s.tokens_per_second, achieved / 1e9,
                     100.0 * achieved / (c.peak_gflops * 1e9), 100.0 * hardware / (c.peak_gflops * 1e9), remaining);
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

namespace {
// The checkpoint of a run: a directory of shards over several ranks, one file for one process;
// resuming reads whichever of the two exists (resharding between them).
std::string checkpoint_path(const TrainRunOptions& o, bool sharded) {
  return (std::filesystem::path(o.out_dir) / (sharded ? "checkpoint" : "checkpoint.bin")).string();
}
std::string resume_path(const TrainRunOptions& o, bool sharded) {
  const std::string mine = checkpoint_path(o, sharded), other = checkpoint_path(o, !sharded);
  return !std::filesystem::exists(mine) && std::filesystem::exists(other) ? other : mine;
}
// A pipeline run's last step: the measured bubble beside the same lists simulated at each
// stage's own measured costs and at the mean costs of every stage (measure_bubble), and the
// formula's; each stage's peak activation memory beside its schedule's bound; the timeline
// drawn (--timeline). Collective: every rank calls it.
void report_pipeline(const TrainRunOptions& o, const parallel::PipelineParallelPlan& plan, const RunOutput& out) {
  const pipeline::Schedule& sched = plan.schedule();
  const parallel::PipelineBubble b = parallel::measure_bubble(plan);
  const std::vector<parallel::StagePeak> peaks = plan.gather_peaks();
  out.print("pipeline {} P={} M={}: last step {:.1f} ms, bubble measured {:.1f}% | at these stages' costs {:.1f}% "
            "({:.1f} ms) | ideal {:.1f}% ({:.1f} ms) | formula {:.1f}%  (mean F {:.2f} ms, B {:.2f} ms{})\n",
            pipeline::schedule_name(sched.spec.kind), sched.spec.ranks, sched.spec.micro_batches,
            1e3 * b.measured_stats.makespan, 100 * b.measured_stats.bubble_fraction,
            100 * b.staged_stats.bubble_fraction, 1e3 * b.staged_stats.makespan, 100 * b.ideal_stats.bubble_fraction,
            1e3 * b.ideal_stats.makespan, 100 * b.formula, 1e3 * b.costs.forward, 1e3 * b.backward_seconds,
            b.split_backward ? fmt::format(", W {:.2f} ms", 1e3 * b.costs.backward_weight) : std::string());
  const std::vector<int> bound = pipeline::activation_bound(sched.spec);
  for (size_t r = 0; r < peaks.size(); ++r) {
    std::string blocks;  // the rank's chunks: virtual stages r, r + P, …
    for (size_t v = r; v < plan.stages().size(); v += peaks.size())
      blocks += fmt::format("{}[{}, {})", blocks.empty() ? "" : " ", plan.stages()[v].begin, plan.stages()[v].end);
    out.print("  stage {} blocks {}: peak {} micro-batches' activations (bound {}), {:.2f} MiB\n", r, blocks,
              peaks[r].micro_batches, bound[r], static_cast<double>(peaks[r].bytes) / (1 << 20));
  }
  if (!o.timeline.empty()) {
    const std::string title = fmt::format("{} pipeline, P = {}, M = {}", pipeline::schedule_name(sched.spec.kind),
                                          sched.spec.ranks, sched.spec.micro_batches);
    out.write_text(o.timeline,
                   pipeline::timeline_svg({{"measured (last step)", b.measured, sched.spec.ranks},
                                           {"ideal at each stage's measured mean costs", b.staged, sched.spec.ranks},
                                           {"ideal, balanced (the mean costs of every stage)", b.ideal,
                                            sched.spec.ranks}},
                                          title));
    out.print("timeline: {}\n", o.timeline);
  }
}
}  // namespace

Status run_training(const TrainRunOptions& o_in, const RunOutput& out_in) {
  TrainRunOptions o = o_in;
  {
    auto layout = parallel::parse_layout_kind(o.cp_layout);
    if (!layout.ok()) return invalid_argument("--cp-layout: {}", layout.status().message());
    auto method = parallel::parse_cp_method(o.cp_method);
    if (!method.ok()) return invalid_argument("--cp-method: {}", method.status().message());
    o.context.layout = *layout;
    o.context.method = *method;
  }
  {
    auto kind = pipeline::parse_schedule(o.schedule);
    if (!kind.ok()) return invalid_argument("--schedule: {}", kind.status().message());
    o.pipeline.schedule = *kind;
  }
  if (!o.timeline.empty() && o.pipeline.pp < 2)
    return invalid_argument("--timeline draws a pipeline's schedule: it needs --pp 2 or more");
  KILN_ASSIGN_OR_RETURN(TrainOptions t, resolve_train_options(o));
  // Data parallelism: every flag checked before MPI is asked for anything but the world size.
  const bool parallel_run = launched_by_mpi() || o.dp > 0 || o.fsdp || o.parallel.zero > 0 || o.parallel.shard_group > 0 ||
                            o.reduce_dtype != "f32" || o.tensor.tp > 1 || o.tensor.sequence_parallel ||
                            o.pipeline.pp > 1 || o.expert.ep > 1 || o.context.cp > 1;
  const bool pipeline_parallel = o.pipeline.pp > 1;
  const bool tensor_parallel = o.tensor.tp > 1 && !pipeline_parallel;
  comm::Communicator* world = parallel_run ? &comm::Communicator::world() : nullptr;
  std::optional<parallel::DataParallelOptions> dpo;
  if (world) {
    KILN_ASSIGN_OR_RETURN(dpo, resolve_parallel(o, t, world->size()));
  }
  const RunOutput out = world && world->rank() != 0 ? RunOutput(false) : out_in;
  // Rank 0 prepares the corpus (if it is missing); the others read it once it is there.
  auto load = [&] { return load_run_data(o, out); };
  Expected<RunData> loaded = world == nullptr || world->rank() == 0 ? load() : Expected<RunData>(RunData{});
  if (world) {
    world->barrier();
    if (world->rank() != 0) loaded = load();
  }
  KILN_ASSIGN_OR_RETURN(const RunData d, std::move(loaded));
  KILN_RETURN_IF_ERROR(check_windows(d, t));
  KILN_RETURN_IF_ERROR(check_train_memory(d.config, t, !o.offload_optimizer.empty()));
  if (pipeline_parallel) {  // the stages and the schedule, on every rank alike, before any communication
    KILN_RETURN_IF_ERROR(
        parallel::check_pipeline_parallel(o.pipeline, d.config, world->size(), o.tensor, *dpo, t));
  }
  if (tensor_parallel || (pipeline_parallel && o.tensor.tp > 1)) {  // the model's split, before any communication
    KILN_RETURN_IF_ERROR(parallel::check_tensor_parallel(o.tensor, d.config, world->size() / o.pipeline.pp, *dpo, t));
    if (!o.qat.empty()) {  // the shards fake-quantize on the single process's grid
      KILN_ASSIGN_OR_RETURN(const quant::QatConfig q, quant::parse_qat(o.qat));
      KILN_RETURN_IF_ERROR(quant::check_qat_tensor_split(q, d.config, o.tensor.tp));
    }
  }
  // A MoE model's data-parallel layouts: expert parallelism (ep 1 is DDP with the single-process
  // routing statistics), unless ZeRO/FSDP is asked for without --ep.
  const bool context_parallel = o.context.cp > 1;
  if (context_parallel)
    KILN_RETURN_IF_ERROR(parallel::check_context_parallel(o.context, o.tensor, d.config, world->size(), *dpo, t));
  const bool expert_parallel = world && !pipeline_parallel && !tensor_parallel && !context_parallel && d.config.is_moe() &&
                               (o.expert.ep > 1 || (dpo->zero == 0 && dpo->shard_group == 0));
  if (expert_parallel || o.expert.ep > 1)
    KILN_RETURN_IF_ERROR(parallel::check_expert_parallel(o.expert, d.config, world->size(), *dpo, t));
  const int dp_size = world ? world->size() / (o.tensor.tp * o.pipeline.pp * std::max(1, o.context.cp)) : 1;
  // The plan first: a tensor-parallel model is built for its shard of the mesh, a pipeline
  // stage for its blocks.
  std::unique_ptr<ParallelPlan> plan;
  parallel::PipelineParallelPlan* pp_plan = nullptr;
  parallel::TensorParallelPlan* tp_plan = nullptr;
  parallel::DataParallelPlan* dp_plan = nullptr;
  parallel::ExpertParallelPlan* ep_plan = nullptr;
  parallel::ContextParallelPlan* cp_plan = nullptr;
  if (context_parallel) {
    KILN_ASSIGN_OR_RETURN(auto p, parallel::ContextParallelPlan::create(*world, o.context, o.tensor, *dpo, d.config, t));
    cp_plan = p.get();
    plan = std::move(p);
  } else if (expert_parallel) {
    KILN_ASSIGN_OR_RETURN(auto p, parallel::ExpertParallelPlan::create(*world, o.expert, *dpo, d.config, t));
    ep_plan = p.get();
    plan = std::move(p);
  } else if (pipeline_parallel) {
    KILN_ASSIGN_OR_RETURN(auto p,
                          parallel::PipelineParallelPlan::create(*world, o.pipeline, o.tensor, *dpo, d.config, t));
    pp_plan = p.get();
    plan = std::move(p);
  } else if (tensor_parallel) {
    KILN_ASSIGN_OR_RETURN(auto p, parallel::TensorParallelPlan::create(*world, o.tensor, *dpo, d.config, t));
    tp_plan = p.get();
    plan = std::move(p);
  } else if (world) {
    KILN_ASSIGN_OR_RETURN(auto p, parallel::DataParallelPlan::create(*world, *dpo, t));
    dp_plan = p.get();
    plan = std::move(p);
  }
  const AllocatorStats mem_base = default_allocator().stats();  // what was live before the model
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> model,
                        Transformer::create(d.config, t.seed,
                                            pp_plan   ? pp_plan->shard()
                                            : tp_plan ? tp_plan->shard()
                                            : cp_plan ? cp_plan->tensor_shard()
                                                      : TensorShard{},
                                            pp_plan ? pp_plan->stage() : PipelineStage{},
                                            ep_plan ? ep_plan->shard() : ExpertShard{},
                                            cp_plan ? cp_plan->shard() : ContextShard{}));
  t.max_seconds = o.minutes * 60.0;
  if (t.max_seconds > 0 && t.max_steps <= 0) t.max_steps = 1'000'000;

  const MachinePeak peak = machine_peak(t.precision);
  ProgressContext progress;
  progress.flops_per_token = d.config.train_flops_per_token(t.seq_len);
  progress.recompute_flops_per_token = perf::recompute_flops_per_token(d.config, t.seq_len, t.checkpoint);
  progress.peak_gflops = peak.gflops * (world ? world->size() : 1);  // MFU against every rank's peak
  progress.show_loss_scale = t.dynamic_loss_scale || t.loss_scale != 1.0;
  progress.show_flushed = t.precision == Precision::kF16;
  progress.show_parallel = world != nullptr;
  const double unigram = unigram_entropy(d.val);
  print_run_header(d, t, peak, progress, unigram, out);

  std::optional<quant::QatConfig> qat;
  if (!o.qat.empty()) {
    KILN_ASSIGN_OR_RETURN(qat, install_qat(o.qat, *model, out));
  }
  if (plan) {
    out.print("{}: {} (global batch {}, {} per data-parallel rank)\n",
              pp_plan   ? "pipeline parallel"
              : tp_plan ? "tensor parallel"
              : ep_plan ? "expert parallel"
              : cp_plan ? "context parallel"
                        : "data parallel",
              plan->describe(), t.batch,
              t.batch / dp_size);
  }
  const std::unique_ptr<Trainer> trainer = make_trainer(*model, d, t, plan.get());
  print_model_memory(*model, t, t.batch / dp_size, cp_plan ? cp_plan->layout().local_len() : t.seq_len,
                     progress.flops_per_token, out);

  const bool sharded = world != nullptr;
  const std::string ckpt = checkpoint_path(o, sharded);
  KILN_RETURN_IF_ERROR(out.save([&] {
    std::error_code ec;  // unwritable: the first checkpoint or save names the path
    std::filesystem::create_directories(o.out_dir, ec);
    return Status();
  }));
  // Sharded checkpoints are written by every rank; one process's file by the main rank.
  auto save_checkpoint = [&] { return sharded ? trainer->save_checkpoint(ckpt) : out.save([&] { return trainer->save_checkpoint(ckpt); }); };
  if (!o.offload_optimizer.empty()) {
    KILN_RETURN_IF_ERROR(trainer->offload_optimizer_state(o.offload_optimizer));
    const OffloadedMoments& f = *trainer->offloaded_moments();
    out.print("optimizer state offloaded: AdamW m and v ({:.1f} MiB{}) in a file in {} ({}), {:.1f} MiB of staging in "
              "memory\n",
              static_cast<double>(f.file_bytes()) / (1 << 20), sharded ? " on this rank" : "", f.dir(),
              f.direct_io() ? "direct I/O" : "through the page cache: this file system refuses O_DIRECT",
              static_cast<double>(f.staging_bytes()) / (1 << 20));
  }
  if (o.resume) {
    const std::string from = resume_path(o, sharded);
    KILN_RETURN_IF_ERROR(trainer->load_checkpoint(from));
    out.print("resumed from {} at step {}\n", from, trainer->steps_done());
  }
  LossCurves curves;
  if (!o.profile.empty()) trace::start();
  while (!trainer->done()) {
    if (o.memory_report && trainer->steps_done() == 1) default_allocator().reset_peak();
    const StepStats s = trainer->step();
    if (o.memory_report && (trainer->steps_done() == 2 || (trainer->done() && trainer->steps_done() < 2)))
      memory_report(o, d.config, t, mem_base, out);
    curves.add(s);
    if (progress_due(s, trainer->done())) {
      out.print("{}\n", format_progress(s, trainer->total_steps(), progress));
      out.flush();
    }
    if (o.save_every > 0 && s.step % o.save_every == 0) KILN_RETURN_IF_ERROR(save_checkpoint());
  }
  if (!o.profile.empty()) {
    KILN_ASSIGN_OR_RETURN(const std::string report,
                          perf::finish_profile(o.profile, world, perf::train_profile_meta(d.config, t, world ? world->size() : 1, peak.gflops)));
    out.print("{}", report);
  }
  KILN_RETURN_IF_ERROR(save_checkpoint());
  if (dp_plan) {  // the whole model on the main rank, to export (ZeRO-3 gathers it)
    const std::vector<float> full = dp_plan->gather_full_params();
    model->set_hooks(nullptr);
    model->restore_storage();
    std::copy(full.begin(), full.end(), model->params().begin());
  }
  if (pp_plan) report_pipeline(o, *pp_plan, out);
  std::unique_ptr<Transformer> whole;  // tensor and pipeline parallelism: the single-process model, from the shards
  if (tp_plan || pp_plan || ep_plan || (cp_plan && model->tensor_shard().size > 1)) {
    const std::vector<float> full = pp_plan   ? pp_plan->gather_full(model->params())
                                    : tp_plan ? tp_plan->gather_full(model->params())
                                    : cp_plan ? cp_plan->gather_full(model->params())
                                              : ep_plan->gather_full(model->params());
    KILN_ASSIGN_OR_RETURN(whole, Transformer::create(d.config, t.seed));
    std::copy(full.begin(), full.end(), whole->params().begin());
  }
  KILN_RETURN_IF_ERROR(save_run(o, d, whole ? *whole : *model, qat, out));
  const std::string svg_path = write_loss_curve(o, d, curves, unigram, trainer->steps_done(), out);
  const std::string val =
      curves.last_val >= 0 ? fmt::format("validation loss {:.4f} vs unigram entropy {:.4f} nats/token", curves.last_val,
                                         unigram)
      : t.eval_every > 0   ? fmt::format("no validation loss (every {} steps; the run ended first)", t.eval_every)
                           : std::string("no validation (--eval-every 0)");
  out.print("{}; saved {} (loss curve {})\n", val, o.out_dir, svg_path);
  if (const graph::GraphStats* g = trainer->graph_stats()) out.print("{}\n", describe(*g));
  if (world) world->barrier();
  return {};
}

}  // namespace kiln::run
