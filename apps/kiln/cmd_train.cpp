// `kiln data prepare`, `kiln train` and `kiln generate`: the main job end to end.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <unistd.h>

#include "apps/kiln/commands.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/attention.h"
#include "kiln/model/weights.h"
#include "kiln/core/allocator.h"
#include "kiln/perf/memory_model.h"
#include "kiln/perf/peak.h"
#include "kiln/perf/svg.h"
#include "kiln/serve/chat_template.h"
#include "kiln/serve/engine.h"
#include "kiln/serve/generate.h"
#include "kiln/serve/kv_cache_manager.h"
#include "kiln/serve/sampler.h"
#include "kiln/serve/speculative.h"
#include "kiln/tokenizer/bpe.h"
#include "kiln/train/corpus.h"
#include "kiln/train/trainer.h"
#include "kiln/quant/qat.h"

namespace kiln::app {
namespace {

[[noreturn]] void fail(const char* cmd, const Status& s) {
  fmt::print(stderr, "kiln {}: {}\n", cmd, s.message());
  throw CLI::RuntimeError(kUserError);
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

struct TrainArgs {
  PrepareOptions data;
  std::string preset = "llama-tiny", out = "runs/llama-tiny";
  TrainOptions opt;
  double minutes = 0;
  bool resume = false;
  int64_t save_every = 0;
  std::string qat;  // --qat: fake-quantization scheme (w4g128, w8a8)
  // Mixed precision and memory (precision.h, checkpoint_mode.h).
  std::string precision = "fp32", checkpoint = "none", loss_scale;  // loss_scale: "dynamic" or S
  double loss_scale_init = 65536;
  bool memory_report = false;
};

// The loss-scaling flags: fp16 defaults to dynamic from S0 = 2^16; other precisions to none.
Status parse_loss_scale(const TrainArgs& a, TrainOptions& o) {
  const std::string ls = a.loss_scale.empty() ? (o.precision == Precision::kF16 ? "dynamic" : "1") : a.loss_scale;
  if (ls == "dynamic") {
    o.dynamic_loss_scale = true;
    o.loss_scale = a.loss_scale_init;
    return {};
  }
  char* end = nullptr;
  const double v = std::strtod(ls.c_str(), &end);
  if (end == ls.c_str() || *end != '\0' || !(v > 0) || !std::isfinite(v))
    return invalid_argument("--loss-scale '{}': expected 'dynamic' or a positive number", ls);
  o.loss_scale = v;
  o.dynamic_loss_scale = false;
  return {};
}

// `--memory-report`: the memory model beside the caching allocator's numbers for the step just
// run (peak since `reset_peak`, over `base`, what was live before the model existed), and an SVG
// of the breakdown: predicted for each checkpointing mode, and measured.
void memory_report(const std::string& preset_name, const ModelConfig& cfg, const TrainOptions& o, const AllocatorStats& base,
                   const std::string& out) {
  const AllocatorStats st = default_allocator().stats();
  const perf::MemoryPrediction pred = perf::predict_memory(cfg, o.batch, o.seq_len, o.precision, o.checkpoint);
  const auto mib = [](double b) { return b / 1048576.0; };
  fmt::print("{}", perf::format_memory_prediction(pred));
  const double measured = static_cast<double>(st.peak_bytes_in_use - base.bytes_in_use);
  const double measured_req = static_cast<double>(st.peak_bytes_requested - base.bytes_requested);
  fmt::print("measured (caching allocator, peak of step 2): {:.2f} MiB in blocks ({:+.2f}% vs predicted), {:.2f} MiB "
             "requested ({:+.2f}%)\n",
             mib(measured), 100 * (measured / static_cast<double>(pred.total_block_bytes()) - 1), mib(measured_req),
             100 * (measured_req / static_cast<double>(pred.total_bytes()) - 1));
  fmt::print("allocator now: allocated {:.2f} MiB, reserved {:.2f} MiB ({:.1f}% reserved but unused), cached {:.2f} MiB, "
             "largest free block {:.2f} MiB, external fragmentation {:.3f}, internal fragmentation {:.3f}, "
             "{} OS allocations of {} calls\n",
             mib(static_cast<double>(st.bytes_in_use)), mib(static_cast<double>(st.bytes_reserved)),
             100 * st.reserved_unused(), mib(static_cast<double>(st.bytes_cached)),
             mib(static_cast<double>(st.largest_free_block)), st.external_fragmentation(), st.fragmentation(),
             st.num_os_allocs, st.num_allocs);
  std::vector<Bar> bars;
  for (CheckpointMode m : {CheckpointMode::kNone, CheckpointMode::kSelective, CheckpointMode::kFull}) {
    const perf::MemoryPrediction p = perf::predict_memory(cfg, o.batch, o.seq_len, o.precision, m);
    Bar b{fmt::format("predicted {}", checkpoint_mode_name(m)), {}};
    for (const char* g : {"model states", "layer activations", "other activations", "scratch"})
      b.segments.push_back({g, mib(static_cast<double>(p.group_block_bytes(g))), ""});
    bars.push_back(std::move(b));
  }
  Bar m{fmt::format("measured {}", checkpoint_mode_name(o.checkpoint)), {}};
  const double states = static_cast<double>(pred.group_block_bytes("model states"));
  m.segments.push_back({"model states", mib(states), ""});
  m.segments.push_back({"measured: rest of peak", mib(measured - states), "#7f7f7f"});
  bars.push_back(std::move(m));
  ChartOptions chart;
  chart.title = fmt::format("{}, B {} × T {}, {}: memory of a training step (MiB, allocator blocks)", preset_name, o.batch,
                            o.seq_len, precision_name(o.precision));
  chart.y_label = "MiB";
  chart.width = 980;
  chart.height = 460;
  const std::string path = (std::filesystem::path(out) / "memory.svg").string();
  std::ofstream(path) << stacked_bar_svg(bars, chart);
  fmt::print("memory breakdown: {}\n", path);
}

// Every flag that CLI11 cannot check alone (names, combinations, the preset's context), before
// any work: a bad flag costs no corpus preparation.
Expected<TrainOptions> check_train_flags(const TrainArgs& a) {
  TrainOptions opt = a.opt;
  auto cfg = preset(a.preset);
  if (!cfg.ok()) return invalid_argument("--preset: {}", cfg.status().message());
  if (opt.seq_len > cfg->max_seq_len)
    return invalid_argument("--seq {} exceeds the context of --preset {} ({})", opt.seq_len, a.preset, cfg->max_seq_len);
  auto p = parse_precision(a.precision);
  if (!p.ok()) return invalid_argument("--precision: {}", p.status().message());
  opt.precision = *p;
  auto m = parse_checkpoint_mode(a.checkpoint);
  if (!m.ok()) return invalid_argument("--checkpoint: {}", m.status().message());
  opt.checkpoint = *m;
  if (Status st = parse_loss_scale(a, opt); !st.ok()) return st;
  if (!a.qat.empty()) {
    if (auto q = quant::parse_qat(a.qat); !q.ok()) return invalid_argument("--qat: {}", q.status().message());
    if (opt.precision != Precision::kF32)
      return invalid_argument("--qat needs --precision fp32 (both install Linear backends; got {})", a.precision);
  }
  return opt;
}

// The memory one training step needs (the memory model: weights, gradients, AdamW, activations),
// against this machine's RAM, before anything is allocated: a --batch × --seq too large for the
// machine is one clear error, not an allocator abort minutes later.
Status check_train_memory(const ModelConfig& cfg, const TrainOptions& o) {
  const perf::MemoryPrediction pred = perf::predict_memory(cfg, o.batch, o.seq_len, o.precision, o.checkpoint);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return {};
  const double ram = static_cast<double>(pages) * static_cast<double>(page);
  const double need = static_cast<double>(pred.total_block_bytes());
  if (!(need <= ram))
    return resource_exhausted("--batch {} × --seq {} needs about {:.1f} GiB for a training step of this model; this "
                              "machine has {:.1f} GiB (lower --batch or --seq, or use --checkpoint full)",
                              o.batch, o.seq_len, need / (1 << 30), ram / (1 << 30));
  return {};
}

void run_train(const TrainArgs& a) {
  auto checked = check_train_flags(a);
  if (!checked.ok()) fail("train", checked.status());
  TrainOptions opt = *checked;
  std::string log;
  auto paths = prepare_corpus(a.data, &log);
  if (!paths.ok()) fail("train", paths.status());
  fmt::print("{}\n", log);
  auto train_data = read_shard(paths->train);
  if (!train_data.ok()) fail("train", train_data.status());
  auto val_data = read_shard(paths->val);
  if (!val_data.ok()) fail("train", val_data.status());
  auto cfg = preset(a.preset);
  if (!cfg.ok()) fail("train", cfg.status());
  cfg->vocab_size = train_data->vocab_size;
  {  // config.json gets the end-of-text id as bos and eos (what generation stops at)
    auto tk = tok::Tokenizer::load_hf_json(paths->tokenizer);
    if (!tk.ok()) fail("train", tk.status());
    cfg->bos_token_id = cfg->eos_token_id = tk->eot_id();  // -1 (written as null) when it has none
  }
  if (Status st = check_train_memory(*cfg, opt); !st.ok()) fail("train", st);
  const AllocatorStats mem_base = default_allocator().stats();
  auto model = Transformer::create(*cfg, a.opt.seed);
  if (!model.ok()) fail("train", model.status());
  opt.max_seconds = a.minutes * 60.0;
  if (opt.max_seconds > 0 && opt.max_steps <= 0) opt.max_steps = 1'000'000;
  const double flops_per_token = cfg->train_flops_per_token(opt.seq_len);
  // Peak = threads × the one-core FMA peak: a register-only loop scales linearly over cores,
  // and one core is less often disturbed by other processes than both (no MFU above 100%).
  // bf16 runs on the bf16 dot-product peak (when the CPU has one); fp16 and fp8 are emulated in f32.
  const double bf16_peak = opt.precision == Precision::kBF16 ? perf::fma_peak_gflops(1, DType::kBF16) : 0.0;
  const double peak = (bf16_peak > 0 ? bf16_peak : perf::fma_peak_gflops(1)) * num_threads();
  const double recompute_per_token = perf::recompute_flops_per_token(*cfg, opt.seq_len, opt.checkpoint);
  fmt::print("precision {}{}, checkpoint {}; MFU and HFU against {:.0f} GFLOP/s ({} peak){}\n", precision_name(opt.precision),
             opt.precision == Precision::kF16 || opt.precision == Precision::kFP8 ? " (emulated: rounded, f32 GEMM)" : "",
             checkpoint_mode_name(opt.checkpoint), peak, bf16_peak > 0 ? "bf16" : "f32",
             opt.checkpoint == CheckpointMode::kNone ? ""
                                                     : fmt::format("; recomputation {:.1f} MFLOP/token", recompute_per_token / 1e6));
  fmt::print("model: {}\n", cfg->describe());
  fmt::print("train: {} tokens, val: {} tokens; batch {} × seq {} × accum {}; {} threads\n",
             train_data->tokens.size(), val_data->tokens.size(), opt.batch, opt.seq_len, opt.grad_accum, num_threads());
  const double unigram = unigram_entropy(*val_data);
  fmt::print("unigram entropy of the validation text: {:.3f} nats/token (loss of a context-free model)\n", unigram);
  std::unique_ptr<quant::QatConfig> qat;
  if (!a.qat.empty()) {  // fake quantization on every block Linear, refreshed after each step
    auto q = quant::parse_qat(a.qat);
    if (!q.ok()) fail("train", q.status());
    if (Status st = quant::install_qat(**model, *q); !st.ok()) fail("train", st);
    qat = std::make_unique<quant::QatConfig>(*q);
    fmt::print("QAT: fake-quantized {} weights{}, straight-through estimator\n", q->weight.describe(),
               q->act_int8 ? " and int8 per-token activations" : "");
  }
  Trainer trainer(**model, *train_data, &*val_data, opt);
  {
    std::vector<int32_t> probe(static_cast<size_t>(opt.batch * opt.seq_len), 0);
    (void)(*model)->forward(probe.data(), nullptr, opt.batch, opt.seq_len);
    fmt::print("memory: weights {:.1f} MiB, grads {:.1f} MiB, AdamW {:.1f} MiB, activations {:.1f} MiB; "
               "{:.1f} MFLOP/token (train)\n", (*model)->params().size_bytes() / 1048576.0,
               (*model)->grads().size_bytes() / 1048576.0, 2 * (*model)->params().size_bytes() / 1048576.0,
               (*model)->activation_bytes() / 1048576.0, flops_per_token / 1e6);
  }
  const std::string ckpt = (std::filesystem::path(a.out) / "checkpoint.bin").string();
  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  if (a.resume) {
    if (Status st = trainer.load_checkpoint(ckpt); !st.ok()) fail("train", st);
    fmt::print("resumed from {} at step {}\n", ckpt, trainer.steps_done());
  }
  double last_val = -1;
  Series train_curve{"train loss", {}, "", false}, val_curve{"validation loss", {}, "", true};
  while (!trainer.done()) {
    if (a.memory_report && trainer.steps_done() == 1) default_allocator().reset_peak();
    const StepStats s = trainer.step();
    if (a.memory_report && (trainer.steps_done() == 2 || (trainer.done() && trainer.steps_done() < 2)))
      memory_report(a.preset, *cfg, opt, mem_base, a.out);
    train_curve.points.emplace_back(static_cast<double>(s.step), s.loss);
    if (s.val_loss >= 0) {
      last_val = s.val_loss;
      val_curve.points.emplace_back(static_cast<double>(s.step), s.val_loss);
    }
    if (s.step % 10 == 0 || s.step == 1 || s.val_loss >= 0 || trainer.done()) {
      const double remaining = (trainer.total_steps() - s.step) * s.seconds;
      const double achieved = s.tokens_per_second * flops_per_token;  // FLOP/s of the model
      const double hardware = s.tokens_per_second * (flops_per_token + recompute_per_token);  // recomputation too
      std::string scaling = opt.dynamic_loss_scale || opt.loss_scale != 1.0
                                ? fmt::format(" | S {:g}{}", s.loss_scale, s.skipped ? " SKIPPED (inf/NaN)" : "")
                                : std::string();
      if (opt.precision == Precision::kF16 && s.grads_rounded > 0)  // output gradients lost to f16 underflow
        scaling += fmt::format(" | flushed {:.3f}%", 100.0 * static_cast<double>(s.grads_flushed) / s.grads_rounded);
      fmt::print("step {:5d}/{} | loss {:.4f}{} | lr {:.2e} | gnorm {:.2f}{} | {:.0f} tok/s | {:.1f} GFLOP/s | MFU {:.1f}% | "
                 "HFU {:.1f}% | ETA {:.0f}s\n",
                 s.step, trainer.total_steps(), s.loss, s.val_loss >= 0 ? fmt::format(" val {:.4f}", s.val_loss) : std::string(),
                 s.lr, s.grad_norm, scaling, s.tokens_per_second, achieved / 1e9, 100.0 * achieved / (peak * 1e9),
                 100.0 * hardware / (peak * 1e9), remaining);
      std::fflush(stdout);
    }
    if (a.save_every > 0 && s.step % a.save_every == 0) {
      if (Status st = trainer.save_checkpoint(ckpt); !st.ok()) fail("train", st);
    }
  }
  if (Status st = trainer.save_checkpoint(ckpt); !st.ok()) fail("train", st);
  if (Status st = save_model(a.out, **model); !st.ok()) fail("train", st);
  if (qat) {  // the real quantized model on the grid QAT trained for
    const std::string qdir = (std::filesystem::path(a.out) / "quantized").string();
    const quant::QuantizedState qs = quant::export_qat(**model, *qat);
    if (Status st = quant::save_quantized_model(qdir, **model, qs); !st.ok()) fail("train", st);
    std::filesystem::copy_file(paths->tokenizer, std::filesystem::path(qdir) / "tokenizer.json",
                               std::filesystem::copy_options::overwrite_existing);
    fmt::print("QAT export: {} ({})\n", qdir, qs.scheme.describe());
  }
  std::filesystem::copy_file(paths->tokenizer, std::filesystem::path(a.out) / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  // The chat template `kiln serve` uses for /v1/chat/completions, stored with the model.
  if (Status st = save_chat_template(a.out, ChatTemplate{}); !st.ok()) fail("train", st);
  ChartOptions chart;
  chart.title = fmt::format("{} on {}", a.preset, paths->dir);
  chart.x_label = "step";
  chart.y_label = "loss (nats/token)";
  Series unigram_line{"unigram entropy", {{1.0, unigram}, {static_cast<double>(trainer.steps_done()), unigram}}, "#999", false};
  const std::string svg_path = (std::filesystem::path(a.out) / "loss.svg").string();
  std::ofstream(svg_path) << line_chart_svg({train_curve, val_curve, unigram_line}, chart);
  fmt::print("validation loss {:.4f} vs unigram entropy {:.4f} nats/token; saved {} (loss curve {})\n", last_val,
             unigram, a.out, svg_path);
}

struct GenArgs {
  std::string model, prompt = "And", stop;
  int64_t max_tokens = 64;
  SamplingParams sampling;
  uint64_t seed = 1;
  int samples = 1;
  std::string draft_model;     // speculative decoding when set
  int64_t num_speculative = 4;  // γ
};

// `generate --draft-model`: speculative decoding, then plain generation of the same prompt
// (not printed) for the speed comparison.
// An engine for one request at a time: KV blocks for a whole context (target and draft), the
// draft speculating whatever the batch.
std::unique_ptr<Engine> generation_engine(std::unique_ptr<Transformer> model, std::unique_ptr<Transformer> draft,
                                          const GenArgs& a) {
  EngineConfig ec;
  ec.num_speculative = a.num_speculative;
  ec.speculative_max_batch = 0;
  const int64_t ctx = std::max(model->config().max_seq_len, draft ? draft->config().max_seq_len : 0);
  const int64_t per_token = kv_bytes_per_token(model->config(), DType::kF32) +
                            (draft ? kv_bytes_per_token(draft->config(), DType::kF32) : 0);
  ec.kv_cache_mem_bytes = (ctx + 2 * ec.block_size) * per_token;
  auto e = Engine::create(std::move(model), ec, std::move(draft));
  if (!e.ok()) fail("generate", e.status());
  return std::move(*e);
}

// Sample `sample` of the prompt: seeded seed + sample, ends at the end-of-text token, at the
// stop string, at --max-tokens or at the context.
GenerationParams generation_params(const GenArgs& a, const Engine& e, int64_t prompt_len, int sample,
                                   const tok::Tokenizer& tk) {
  GenerationParams p;
  p.max_tokens = std::min(a.max_tokens, e.context_len() - prompt_len);
  p.sampling = a.sampling;
  p.seed = a.seed + static_cast<uint64_t>(sample);
  if (tk.eot_id() >= 0) p.stop_token_ids.push_back(tk.eot_id());
  return p;
}

// Prints (when asked) and collects each token's text; false once the stop string appears.
SampleCallback text_sink(const GenArgs& a, const tok::Tokenizer& tk, std::string& text, bool print) {
  return [&a, &tk, &text, print](int64_t, int32_t t) {
    if (t == tk.eot_id() || t >= tk.vocab_size()) return true;  // (the stop token ends it anyway)
    const std::string piece(tk.token_bytes(t));
    text += piece;
    if (print) {
      fmt::print("{}", piece);
      std::fflush(stdout);
    }
    return a.stop.empty() || text.find(a.stop) == std::string::npos;
  };
}

std::vector<int32_t> prompt_ids(const GenArgs& a, const tok::Tokenizer& tk, const Engine& e) {
  std::vector<int32_t> ids = tk.encode(a.prompt);
  if (ids.empty()) fail("generate", invalid_argument("--prompt is empty"));
  if (static_cast<int64_t>(ids.size()) >= e.context_len())
    fail("generate", invalid_argument("--prompt has {} tokens; the context is {}", ids.size(), e.context_len()));
  return ids;
}

// Speculative decoding beside plain decoding of the same target (a second copy of it), each
// sample both ways: acceptance, tokens per target pass against the formula, tokens/s.
void run_speculative(const GenArgs& a, std::unique_ptr<Transformer> target, const tok::Tokenizer& tk) {
  auto draft = load_model(a.draft_model);
  if (!draft.ok()) fail("generate", draft.status());
  auto plain_target = quant::load_any_model(a.model);
  if (!plain_target.ok()) fail("generate", plain_target.status());
  fmt::print("target: {}\ndraft:  {}\n", target->config().describe(), (*draft)->config().describe());
  auto spec_engine = generation_engine(std::move(target), std::move(*draft), a);
  auto plain_engine = generation_engine(std::move(*plain_target), nullptr, a);
  const std::vector<int32_t> ids = prompt_ids(a, tk, *spec_engine);
  // Warm both up (first-touch page faults, packed weights) so neither timing pays it.
  for (Engine* e : {spec_engine.get(), plain_engine.get()}) {
    GenerationParams warm = generation_params(a, *e, static_cast<int64_t>(ids.size()), 0, tk);
    warm.max_tokens = std::min<int64_t>(warm.max_tokens, 8);
    if (auto w = generate(*e, ids, warm); !w.ok()) fail("generate", w.status());
  }
  for (int sample = 0; sample < a.samples; ++sample) {
    std::string text;
    fmt::print("{}", a.prompt);
    auto spec = generate(*spec_engine, ids, generation_params(a, *spec_engine, static_cast<int64_t>(ids.size()), sample, tk),
                         text_sink(a, tk, text, true));
    if (!spec.ok()) fail("generate", spec.status());
    text.clear();
    auto plain = generate(*plain_engine, ids, generation_params(a, *spec_engine, static_cast<int64_t>(ids.size()), sample, tk),
                          text_sink(a, tk, text, false));
    if (!plain.ok()) fail("generate", plain.status());
    const SpeculativeStats& s = spec->spec;
    const double alpha = s.acceptance_rate();
    const auto spec_n = static_cast<double>(spec->samples[0].tokens.size());
    const auto plain_n = static_cast<double>(plain->samples[0].tokens.size());
    const double spec_tps = spec_n / spec->seconds, plain_tps = plain_n / plain->seconds;
    fmt::print("\n---\nspeculative γ {}: α {:.3f} ({} of {} proposed accepted), {:.2f} tokens/target pass "
               "(predicted (1 − α^(γ+1))/(1 − α) = {:.2f}), {} tokens in {:.3f} s = {:.1f} tok/s\n",
               a.num_speculative, alpha, s.num_accepted, s.num_proposed, s.tokens_per_pass(),
               expected_tokens_per_pass(alpha, a.num_speculative), spec_n, spec->seconds, spec_tps);
    fmt::print("plain:            {} tokens in {:.3f} s = {:.1f} tok/s; speculative / plain = {:.2f}×{}\n", plain_n,
               plain->seconds, plain_tps, spec_tps / plain_tps,
               a.sampling.temperature <= 0.0f
                   ? (spec->samples[0].tokens == plain->samples[0].tokens ? "; greedy output identical"
                                                                          : "; greedy output DIFFERS")
                   : "");
  }
}

// `kiln generate`: each sample is one request through the serving engine (the decode loop
// `kiln serve` runs), printed as it is sampled.
void run_generate(const GenArgs& a) {
  auto model = quant::load_any_model(a.model);  // fp32 or kiln-quantized
  if (!model.ok()) fail("generate", model.status());
  auto tk = tok::Tokenizer::load_hf_json((std::filesystem::path(a.model) / "tokenizer.json").string());
  if (!tk.ok()) fail("generate", tk.status());
  if (!a.draft_model.empty()) return run_speculative(a, std::move(*model), *tk);
  auto engine = generation_engine(std::move(*model), nullptr, a);
  const std::vector<int32_t> ids = prompt_ids(a, *tk, *engine);
  for (int sample = 0; sample < a.samples; ++sample) {
    fmt::print("{}", a.prompt);
    std::string text;
    auto r = generate(*engine, ids, generation_params(a, *engine, static_cast<int64_t>(ids.size()), sample, *tk),
                      text_sink(a, *tk, text, true));
    if (!r.ok()) fail("generate", r.status());
    fmt::print("\n---\n");
  }
}

}  // namespace

void register_train(CLI::App& app) {
  auto data = std::make_shared<PrepareOptions>();
  CLI::App* d = app.add_subcommand("data", "Corpus preparation");
  d->require_subcommand(1);
  CLI::App* prep = d->add_subcommand("prepare", "Text -> BPE tokenizer -> train/val token shards (reused later)");
  prep->add_option("--text", data->text_file, "UTF-8 text file (default: the bundled King James Bible)");
  prep->add_option("--out", data->out_dir, "Output directory");
  prep->add_option("--vocab-size", data->vocab_size, "BPE vocabulary size")->check(CLI::Range(257, 65536));
  prep->add_flag("--force", data->force, "Redo even when the files exist");
  prep->callback([data] {
    std::string log;
    auto p = prepare_corpus(*data, &log);
    if (!p.ok()) fail("data prepare", p.status());
    fmt::print("{}\n", log);
  });

  auto ta = std::make_shared<TrainArgs>();
  CLI::App* t = app.add_subcommand("train", "Train a model on a corpus (default: llama-tiny on the KJV Bible)");
  t->add_option("--preset", ta->preset, "gpt2-124m | w1a | llama-tiny | w2-s | w2-l");
  t->add_option("--text", ta->data.text_file, "UTF-8 text file (default: the bundled King James Bible)");
  t->add_option("--data", ta->data.out_dir, "Prepared-data directory");
  t->add_option("--vocab-size", ta->data.vocab_size, "BPE vocabulary size when preparing")->check(CLI::Range(257, 65536));
  t->add_option("--out", ta->out, "Where to save the model (config.json, model.safetensors, tokenizer.json)");
  t->add_option("--steps", ta->opt.max_steps, "Optimizer steps")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  t->add_option("--minutes", ta->minutes, "Stop after this many minutes (wall time)")->check(CLI::Range(0.0, 1e6));
  t->add_option("--batch", ta->opt.batch, "Sequences per micro-batch")->check(CLI::Range(1, 4096));
  t->add_option("--seq", ta->opt.seq_len, "Tokens per sequence")->check(CLI::Range(2, 1 << 20));
  t->add_option("--grad-accum", ta->opt.grad_accum, "Micro-batches per step")->check(CLI::Range(1, 4096));
  t->add_option("--lr", ta->opt.lr, "Peak learning rate")->check(CLI::Range(0.0, 10.0));
  t->add_option("--warmup", ta->opt.warmup_steps, "Warm-up steps")->check(CLI::Range(0, 1 << 30));
  t->add_option("--weight-decay", ta->opt.weight_decay, "AdamW decoupled weight decay (matrices only)")->check(CLI::Range(0.0, 10.0));
  t->add_option("--clip", ta->opt.clip_norm, "Clip gradients to this global norm (0: off)")->check(CLI::Range(0.0, 1e9));
  t->add_option("--eval-every", ta->opt.eval_every, "Validation loss every N steps")->check(CLI::Range(0, 1 << 30));
  t->add_option("--eval-batches", ta->opt.eval_batches, "Validation batches per evaluation")->check(CLI::Range(1, 1 << 20));
  t->add_option("--seed", ta->opt.seed, "Seed for weights and data order");
  t->add_option("--attention", "Attention kernels: flash (default) or naive (the T×T GEMM path, for comparison)")
      ->check(CLI::IsMember({"naive", "flash"}))
      ->each([](const std::string& s) { set_attention_impl(parse_attention_impl(s).value()); });
  t->add_flag("--resume", ta->resume, "Continue from OUT/checkpoint.bin (same options give the same losses)");
  t->add_option("--save-every", ta->save_every, "Write OUT/checkpoint.bin every N steps (and always at the end)")
      ->check(CLI::Range(0, 1 << 30));
  t->add_option("--precision", ta->precision, "fp32 | bf16 (bf16 GEMM, fp32 master weights) | fp16, fp8 (emulated)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16", "fp8"}));
  t->add_option("--loss-scale", ta->loss_scale, "Loss scaling: 'dynamic' or a fixed S (default: dynamic for fp16, else none)");
  t->add_option("--loss-scale-init", ta->loss_scale_init, "Initial S of dynamic loss scaling")->check(CLI::Range(1e-30, 1e30));
  t->add_option("--loss-scale-window", ta->opt.loss_scale_window, "Dynamic loss scaling: good steps before S doubles")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  t->add_option("--amax-history", ta->opt.amax_history, "fp8 delayed scaling: amaxes remembered per tensor")
      ->check(CLI::Range(1, 1 << 16));
  t->add_option("--checkpoint", ta->checkpoint, "Activation checkpointing: none | full | selective")
      ->check(CLI::IsMember({"none", "full", "selective"}));
  t->add_flag("--memory-report", ta->memory_report,
              "Print the memory model beside the allocator's measured peak of step 2; write OUT/memory.svg");
  t->add_option("--qat", ta->qat, "Quantization-aware training: w4g128 | w8a8 (exports OUT/quantized)");
  t->callback([ta] { run_train(*ta); });

  auto ga = std::make_shared<GenArgs>();
  CLI::App* g = app.add_subcommand("generate", "Generate text from a saved model");
  g->add_option("--model", ga->model, "Model directory (config.json, model.safetensors, tokenizer.json)")->required();
  g->add_option("--prompt", ga->prompt, "Prompt text");
  g->add_option("--max-tokens", ga->max_tokens, "Tokens to generate")->check(CLI::Range(1, 1 << 20));
  g->add_option("--temperature", ga->sampling.temperature, "0: greedy")->check(CLI::Range(0.0, 100.0));
  g->add_option("--top-k", ga->sampling.top_k, "Keep the k most likely tokens (0: off)")->check(CLI::Range(0, 1 << 30));
  g->add_option("--top-p", ga->sampling.top_p, "Nucleus sampling mass (1: off)")->check(CLI::Range(0.0, 1.0));
  g->add_option("--stop", ga->stop, "Stop when this string appears");
  g->add_option("--seed", ga->seed, "Sampling seed");
  g->add_option("--attention", "Attention kernels: flash (default) or naive (the T×T GEMM path, for comparison)")
      ->check(CLI::IsMember({"naive", "flash"}))
      ->each([](const std::string& s) { set_attention_impl(parse_attention_impl(s).value()); });
  g->add_option("--samples", ga->samples, "Number of samples")->check(CLI::Range(1, 100));
  g->add_option("--draft-model", ga->draft_model, "Speculative decoding with this draft model (same tokenizer)");
  g->add_option("--num-speculative", ga->num_speculative, "Draft tokens per target pass (γ)")->check(CLI::Range(1, 16));
  g->callback([ga] { run_generate(*ga); });
}

}  // namespace kiln::app
