// `kiln quantize`: a saved model -> a quantized model directory (RTN, GPTQ, AWQ, SmoothQuant
// W8A8, fp8 W8A8), with validation perplexity before/after; and `kiln bench quant-decode`:
// decode tokens/s of fp32, bf16, W8A16, W4A16 and W8A8 weights on a preset (random weights).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "apps/kiln/commands.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/cpu/quant_tiles.h"
#include "kiln/model/packed_linear.h"
#include "kiln/model/weights.h"
#include "kiln/quant/qmodel.h"
#include "kiln/train/trainer.h"

namespace kiln::app {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const char* cmd, const Status& s) {
  fmt::print(stderr, "kiln {}: {}\n", cmd, s.message());
  throw CLI::RuntimeError(kUserError);
}

struct QuantizeArgs {
  std::string model, out, method = "rtn", data = "data/kjv", range = "minmax";
  int bits = 4;
  int64_t group = 128;
  bool sym = false, act_order = false, report = false, quantize_head = false, eval = false;
  double alpha = -1;
  quant::CalibOptions calib;
  int64_t eval_batches = 16, eval_seq = 256;
};

double val_loss(Transformer& m, const TokenShard& val, int64_t seq, int64_t batches) {
  return evaluate(m, val, 1, std::min(seq, m.config().max_seq_len), batches);
}

void run_quantize(const QuantizeArgs& a) {
  auto method = quant::parse_method(a.method);
  if (!method.ok()) fail("quantize", method.status());
  quant::QuantizeOptions o;
  o.method = *method;
  o.scheme.bits = a.bits;
  o.scheme.group = a.group;
  o.scheme.symmetric = a.sym || a.bits == 8;
  o.scheme.range = a.range == "mse" ? quant::RangeMethod::kMse
                   : a.range == "percentile" ? quant::RangeMethod::kPercentile : quant::RangeMethod::kMinMax;
  o.gptq.act_order = a.act_order;
  o.alpha = a.alpha;
  o.calib = a.calib;
  o.report = a.report;
  o.quantize_head = a.quantize_head;
  auto model = quant::load_any_model(a.model);  // a model directory (any kind) or a .gguf file
  if (!model.ok()) fail("quantize", model.status());
  Transformer& m = **model;
  for (Linear* l : m.linears()) l->backend.reset();  // its masters hold the values: quantize those
  fmt::print("model: {}\n", m.config().describe());
  const fs::path data_dir(a.data);
  auto train = read_shard((data_dir / "train.bin").string());
  auto val = read_shard((data_dir / "val.bin").string());
  const bool need_data = o.method == quant::Method::kGptq || o.method == quant::Method::kAwq ||
                         o.method == quant::Method::kSmoothQuant || o.report;
  if (need_data && !train.ok()) fail("quantize", train.status());
  if ((need_data || a.eval) && train.ok() && train->vocab_size != m.config().vocab_size)
    fail("quantize", invalid_argument("--data {} has vocabulary {}, the model {}", a.data, train->vocab_size,
                                      m.config().vocab_size));
  if (a.eval && !val.ok()) fail("quantize", val.status());
  double before = 0;
  if (a.eval) {
    before = val_loss(m, *val, a.eval_seq, a.eval_batches);
    fmt::print("fp32 validation loss {:.4f} (perplexity {:.3f})\n", before, std::exp(before));
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string log;
  auto st = quant::quantize_model(m, train.ok() ? &*train : nullptr, o, &log);
  if (!st.ok()) fail("quantize", st.status());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("{}", log);
  fmt::print("{} in {:.1f} s; weights streamed per token {:.2f} MiB\n", quant::method_name(o.method), secs,
             quant::weight_bytes_per_token(m) / 1048576.0);
  if (a.eval) {
    const double after = val_loss(m, *val, a.eval_seq, a.eval_batches);
    fmt::print("quantized validation loss {:.4f} (perplexity {:.3f}; fp32 {:.3f}, {:+.2f}%)\n", after, std::exp(after),
               std::exp(before), 100.0 * (std::exp(after) - std::exp(before)) / std::exp(before));
  }
  if (!a.out.empty()) {
    if (Status s = quant::save_quantized_model(a.out, m, *st); !s.ok()) fail("quantize", s);
    std::error_code ec;
    const fs::path tok = fs::path(a.model) / "tokenizer.json";
    if (fs::exists(tok, ec))
      fs::copy_file(tok, fs::path(a.out) / "tokenizer.json", fs::copy_options::overwrite_existing, ec);
    fmt::print("saved {}\n", a.out);
  }
}

// ---- decode speed ------------------------------------------------------------------------------
struct DecodeArgs {
  std::string preset = "w2-s";
  std::vector<std::string> schemes = {"f32", "bf16", "w8a16", "w4a16", "w8a8", "q8_0", "q4_0"};
  std::vector<std::string> gguf;  // instead: these files, as served (quantized kept) and decoded to fp32
  int64_t tokens = 32, prompt = 16, reps = 3;
  int64_t prefill = 128;  // --gguf: the prompt of the prefill timing (llama-bench's pp128)
  bool tune = false;      // time the quantized tiles first (quant_tiles.h) and save the choice
};

// Best-of-reps decode tokens/s of m at batch 1 after a prompt of a.prompt tokens (greedy).
// Prompt tokens per second of one forward over a.prefill tokens (llama-bench's pp), best of reps.
double prefill_tokens_per_s(Transformer& m, const DecodeArgs& a) {
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> prompt(static_cast<size_t>(a.prefill));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % V);
  double best = 1e30;
  for (int64_t rep = 0; rep < a.reps; ++rep) {
    KVCache cache = m.make_kv_cache(a.prefill + 1);
    const auto t0 = std::chrono::steady_clock::now();
    auto lg = m.forward_cached(prompt.data(), a.prefill, cache);
    if (!lg.ok()) fail("bench quant-decode", lg.status());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return static_cast<double>(a.prefill) / best;
}

double decode_tokens_per_s(Transformer& m, const DecodeArgs& a) {
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> prompt(static_cast<size_t>(a.prompt));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % V);
  double best = 1e30;
  for (int64_t rep = 0; rep < a.reps; ++rep) {
    KVCache cache = m.make_kv_cache(a.prompt + a.tokens + 1);
    auto lg = m.forward_cached(prompt.data(), a.prompt, cache);
    if (!lg.ok()) fail("bench quant-decode", lg.status());
    int32_t next = 1;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t t = 0; t < a.tokens; ++t) {
      auto r = m.forward_cached(&next, 1, cache);
      if (!r.ok()) fail("bench quant-decode", r.status());
      next = static_cast<int32_t>(std::max_element(*r, *r + V) - *r);
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return static_cast<double>(a.tokens) / best;
}

void print_decode_row(const std::string& name, double tps, int64_t bytes, double base_tps, double pp = 0) {
  fmt::print("{:<8} {:>10.2f} {:>12.2f} {:>14.1f} {:>12.1f} {:>10}", name, tps, 1e3 / tps, bytes / 1048576.0,
             tps * static_cast<double>(bytes) / 1e9, base_tps > 0 ? fmt::format("{:.2f}x", tps / base_tps) : "-");
  if (pp > 0) fmt::print(" {:>12.1f}", pp);
  fmt::print("\n");
  std::fflush(stdout);
}

// --gguf: each file as every command loads it (Q8_0 / Q4_0 kept quantized), then the same model
// with its backends removed (the file decoded to fp32, as kiln loaded GGUF files before).
void run_decode_gguf(const DecodeArgs& a) {
  fmt::print("GGUF decode: prompt {} tokens, then {} decoded tokens, batch 1, {} threads; prefill: one forward over "
             "{} tokens; best of {} runs\n",
             a.prompt, a.tokens, num_threads(), a.prefill, a.reps);
  fmt::print("{:<8} {:>10} {:>12} {:>14} {:>12} {:>10} {:>12}\n", "weights", "tok/s", "ms/token", "MiB/token",
             "eff. GB/s", "vs fp32", "pp tok/s");
  for (const std::string& path : a.gguf) {
    quant::QuantizedState kept_weights;
    auto model = quant::load_any_model(path, &kept_weights);
    if (!model.ok()) fail("bench quant-decode", model.status());
    Transformer& m = **model;
    install_packed_weights(m);  // the fp32 matrices packed once, as the serving engine runs them
    fmt::print("# {}: {}; {} matrices kept quantized\n", path, m.config().describe(), kept_weights.weights.size());
    const int64_t a8_bytes = quant::weight_bytes_per_token(m);
    const double a8 = decode_tokens_per_s(m, a), a8_pp = prefill_tokens_per_s(m, a);
    for (Linear* l : m.linears()) {  // the same codes on the weight-only kernels (f32 activations)
      auto it = kept_weights.weights.find(l->name);
      if (it != kept_weights.weights.end())
        l->backend = std::make_shared<quant::QuantizedLinear>(it->second, quant::ActQuant::kNone);
    }
    const int64_t a16_bytes = quant::weight_bytes_per_token(m);
    const double a16 = decode_tokens_per_s(m, a), a16_pp = prefill_tokens_per_s(m, a);
    for (Linear* l : m.linears()) l->backend.reset();
    install_packed_weights(m);
    const double fp32 = decode_tokens_per_s(m, a), fp32_pp = prefill_tokens_per_s(m, a);
    print_decode_row("fp32", fp32, quant::weight_bytes_per_token(m), 0, fp32_pp);
    print_decode_row("kept-a16", a16, a16_bytes, fp32, a16_pp);
    print_decode_row("kept-a8", a8, a8_bytes, fp32, a8_pp);
  }
}

// Installs the named configuration on every Linear (head included); f32 removes backends.
void install(Transformer& m, const std::string& name) {
  for (Linear* l : m.linears()) l->backend.reset();
  if (name == "f32") return;
  if (name == "bf16") {
    for (Linear* l : m.linears()) l->backend = std::make_shared<quant::Bf16Linear>(*l);
    return;
  }
  quant::QuantScheme s;
  quant::ActQuant act = quant::ActQuant::kNone;
  if (name == "w8a16" || name == "w8a8") {
    s.bits = 8;
    s.symmetric = true;
    s.group = quant::QuantScheme::kPerChannel;
    if (name == "w8a8") act = quant::ActQuant::kInt8;
  } else if (name == "w4a16") {
    s.bits = 4;
    s.group = 128;
  } else if (name == "q8_0" || name == "q4_0") {  // llama.cpp's recipe: the block kernels
    s.bits = name == "q8_0" ? 8 : 4;
    s.symmetric = true;
    s.group = kQuantBlock;
    act = quant::ActQuant::kInt8Block;
  } else if (name == "fp8") {
    s.format = quant::QFormat::kFp8E4M3;
    s.bits = 8;
    s.group = quant::QuantScheme::kPerChannel;
    act = quant::ActQuant::kNone;
  }
  for (Linear* l : m.linears())
    l->backend = std::make_shared<quant::QuantizedLinear>(quant::quantize_rtn(l->w, l->out, l->in, s), act);
}

// --tune: the first-use search of the quantized GEMMs' tiles, logged, then saved.
void tune_quant_tiles() {
  cpu::QuantTuneOptions o;
  o.log = [](const std::string& line) { fmt::print("{}\n", line); };
  const cpu::QuantTuneResult r = cpu::autotune_quant_tiles(o);
  const Status st = cpu::save_quant_tuning("bench quant-decode --tune");
  if (!st.ok()) fail("bench quant-decode", st);
  fmt::print("tune chose {} in {:.2f} s at {} threads (time vs default: bq decode {:.3f}, batch {:.3f}, prefill {:.3f}, "
             "wo gemv {:.3f}, rows {:.3f}){}; saved to {}\n",
             cpu::quant_tiles_name(r.best), r.seconds, num_threads(), r.bq_decode_ratio, r.bq_batch_ratio,
             r.bq_prefill_ratio, r.wo_gemv_ratio, r.wo_rows_ratio, r.searched ? "" : " (one shape on this target)",
             cpu::gemm_tune_file());
}

void run_decode(const DecodeArgs& a) {
  if (a.tune) tune_quant_tiles();
  if (!a.gguf.empty()) return run_decode_gguf(a);
  auto cfg = preset(a.preset);
  if (!cfg.ok()) fail("bench quant-decode", cfg.status());
  for (const auto& s : a.schemes)
    if (s != "f32" && s != "bf16" && s != "w8a16" && s != "w4a16" && s != "w8a8" && s != "fp8" && s != "q8_0" &&
        s != "q4_0")
      fail("bench quant-decode", invalid_argument("scheme '{}' (f32, bf16, w8a16, w4a16, w8a8, fp8, q8_0, q4_0)", s));
  auto model = Transformer::create(*cfg, 1);
  if (!model.ok()) fail("bench quant-decode", model.status());
  Transformer& m = **model;
  fmt::print("{}: {}; prompt {} tokens, then {} decoded tokens, batch 1, {} threads; best of {} runs\n", a.preset,
             cfg->describe(), a.prompt, a.tokens, num_threads(), a.reps);

  fmt::print("{:<8} {:>10} {:>12} {:>14} {:>12} {:>10}\n", "weights", "tok/s", "ms/token", "MiB/token", "eff. GB/s",
             "vs f32");
  double f32_tps = 0;
  for (const std::string& name : a.schemes) {
    install(m, name);
    const double tps = decode_tokens_per_s(m, a);
    if (name == "f32") f32_tps = tps;
    print_decode_row(name, tps, quant::weight_bytes_per_token(m), f32_tps);
  }
  install(m, "f32");
  // After the runs: a first-use search (no tune-file entry yet) runs inside the first quantized one.
  fmt::print("quant tiles: {} ({})\n", cpu::quant_tiles_name(cpu::quant_tiles()), cpu::quant_tiles_source());
}

}  // namespace

void register_quantize(CLI::App& app) {
  auto a = std::make_shared<QuantizeArgs>();
  CLI::App* q = app.add_subcommand("quantize", "Quantize a saved model (RTN, GPTQ, AWQ, SmoothQuant W8A8, fp8 W8A8)");
  q->add_option("--model", a->model, "Model directory (config.json, model.safetensors) or a .gguf file")->required();
  q->add_option("--out", a->out, "Where to write the quantized model (omit to only evaluate)");
  q->add_option("--method", a->method, "rtn | gptq | awq | smoothquant | fp8")
      ->check(CLI::IsMember({"rtn", "gptq", "awq", "smoothquant", "fp8"}));
  q->add_option("--bits", a->bits, "Weight bits (2, 3, 4, 8)")->check(CLI::IsMember({2, 3, 4, 8}));
  q->add_option("--group", a->group, "Group size along the input dim; 0: per output channel; -1: per tensor")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 20));
  q->add_flag("--sym", a->sym, "Symmetric weights (no zero point; 8-bit always is)");
  q->add_option("--range", a->range, "Weight range per group: minmax | percentile | mse")
      ->check(CLI::IsMember({"minmax", "percentile", "mse"}));
  q->add_flag("--act-order", a->act_order, "GPTQ: quantize columns by descending diag(H)");
  q->add_option("--alpha", a->alpha, "AWQ: fixed exponent (default: grid search); SmoothQuant: strength (0.5)")
      ->check(CLI::Range(0.0, 1.0));
  q->add_option("--data", a->data, "Prepared corpus (train.bin for calibration, val.bin for --eval)");
  q->add_option("--calib-samples", a->calib.samples, "Calibration sequences")->check(CLI::Range(1, 1 << 20));
  q->add_option("--calib-seq", a->calib.seq_len, "Tokens per calibration sequence")->check(CLI::Range(2, 1 << 20));
  q->add_flag("--report", a->report, "Per-layer clipping vs rounding error for min-max / percentile / MSE ranges");
  q->add_flag("--quantize-head", a->quantize_head, "Also quantize the LM head (when not tied to the embedding)");
  q->add_flag("--eval", a->eval, "Validation perplexity before and after");
  q->add_option("--eval-batches", a->eval_batches, "Validation sequences for --eval")->check(CLI::Range(1, 1 << 20));
  q->callback([a] { run_quantize(*a); });

  auto d = std::make_shared<DecodeArgs>();
  CLI::App* bench = app.get_subcommand("bench");
  CLI::App* b = bench->add_subcommand("quant-decode", "Decode tokens/s with fp32, bf16, W8A16, W4A16, W8A8 weights");
  b->add_option("--preset", d->preset, "Model shape (random weights): w2-s | w2-l | llama-tiny");
  b->add_option("--schemes", d->schemes, "f32,bf16,w8a16,w4a16,w8a8,fp8,q8_0,q4_0 (q8_0/q4_0: groups of 32, int8 activations per block)")->delimiter(',');
  b->add_option("--gguf", d->gguf, "GGUF files instead of a preset: each as served (Q8_0/Q4_0 kept, int8 activations per block), on the weight-only kernels, and decoded to fp32")
      ->check(CLI::ExistingFile);
  b->add_option("--tokens", d->tokens, "Decoded tokens per run")->check(CLI::Range(1, 4096));
  b->add_option("--prompt", d->prompt, "Prompt tokens (prefilled first)")->check(CLI::Range(1, 4096));
  b->add_option("--prefill", d->prefill, "--gguf: prompt tokens of the prefill timing (llama-bench pp)")->check(CLI::Range(1, 4096));
  b->add_option("--reps", d->reps, "Runs per scheme (the best is reported)")->check(CLI::Range(1, 100));
  b->add_flag("--tune", d->tune, "Time the quantized GEMMs' tile shapes first (K = N = 2048; m = 1, 8, 128) and save the fastest in the tune file");
  b->callback([d] { run_decode(*d); });
}

}  // namespace kiln::app
