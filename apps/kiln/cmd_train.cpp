// `kiln data prepare`, `kiln train` and `kiln generate`: the main job end to end. `kiln train`
// only parses its flags into a TrainRunOptions; the run itself lives in src/kiln/run.
#include <fmt/format.h>

#include <filesystem>

#include "apps/kiln/commands.h"
#include "kiln/comm/communicator.h"
#include "kiln/kernels/attention.h"
#include "kiln/model/weights.h"
#include "kiln/perf/profiler.h"
#include "kiln/quant/qmodel.h"
#include "kiln/run/train_run.h"
#include "kiln/serve/engine.h"
#include "kiln/serve/generate.h"
#include "kiln/serve/kv_cache_manager.h"
#include "kiln/serve/sampler.h"
#include "kiln/serve/server.h"
#include "kiln/serve/speculative.h"
#include "kiln/tokenizer/bpe.h"
#include "kiln/core/file_io.h"
#include "kiln/core/trace.h"
#include "kiln/model/hf_config.h"
#include "kiln/train/corpus.h"
#include "kiln/train/sharded_checkpoint.h"

namespace kiln::app {
namespace {

[[noreturn]] void fail(const char* cmd, const Status& s) {
  fmt::print(stderr, "kiln {}: {}\n", cmd, s.message());
  throw CLI::RuntimeError(kUserError);
}

struct GenArgs {
  std::string model, prompt = "And", stop;
  int64_t max_tokens = 64;
  SamplingParams sampling;
  uint64_t seed = 1;
  int samples = 1;
  std::string draft_model;     // speculative decoding when set
  std::string checkpoint;      // weights from a training checkpoint (file or sharded directory)
  int64_t num_speculative = 4;  // γ
  int tp = 1;                   // --tp: tensor-parallel ranks (mpirun -np T)
  std::string profile;          // --profile FILE.json: a trace of the generation (rank 0)
  std::string graph = "eager";  // --graph eager | capture (decode steps replay captured graphs)
};

// `generate --draft-model`: speculative decoding, then plain generation of the same prompt
// (not printed) for the speed comparison.
// An engine for one request at a time: KV blocks for a whole context (target and draft), the
// draft speculating whatever the batch.
std::unique_ptr<Engine> generation_engine(std::unique_ptr<Transformer> model, std::unique_ptr<Transformer> draft,
                                          const GenArgs& a) {
  EngineConfig ec;
  apply_graph_mode(a.graph, ec.graph_capture, ec.graph_pass);
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
// --checkpoint: the model of --model's config.json with the parameters of a training
// checkpoint, a single file or a sharded directory written at any number of ranks (read whole).
Expected<std::unique_ptr<Transformer>> model_from_checkpoint(const GenArgs& a) {
  const std::string config_path = (std::filesystem::path(a.model) / "config.json").string();
  KILN_ASSIGN_OR_RETURN(const std::string text, read_file(config_path, int64_t{1} << 20));
  auto cfg = config_from_hf_json(text);
  if (!cfg.ok()) return invalid_argument("{}: {}", config_path, cfg.status().message());
  KILN_ASSIGN_OR_RETURN(auto model, Transformer::create(*cfg, 0));
  KILN_ASSIGN_OR_RETURN(const FullCheckpoint ck, load_checkpoint_whole(a.checkpoint));
  if (ck.meta.num_params != model->num_params() || ck.meta.model != cfg->describe())
    return invalid_argument("{} was written by {} ({} parameters); {} describes {} ({})", a.checkpoint, ck.meta.model,
                            ck.meta.num_params, config_path, cfg->describe(), model->num_params());
  std::copy(ck.params.begin(), ck.params.end(), model->params().begin());
  return model;
}

void run_generate(const GenArgs& a) {
  // A model directory (fp32, bf16/f16 or kiln-quantized) or a .gguf file, with its tokenizer; or
  // --checkpoint's weights with --model's config and tokenizer.
  auto served = a.checkpoint.empty() ? load_served_model(a.model) : Expected<ServedModel>(ServedModel{});
  if (!served.ok()) fail("generate", served.status());
  quant::QuantizedState& quantized = served->quantized;  // a kiln-quantized model's weights (sliced too under --tp)
  auto model = a.checkpoint.empty() ? Expected<std::unique_ptr<Transformer>>(std::move(served->model))
                                    : model_from_checkpoint(a);
  if (!model.ok()) fail("generate", model.status());
  auto tk = a.checkpoint.empty()
                ? Expected<tok::Tokenizer>(std::move(served->tokenizer))
                : tok::Tokenizer::load_hf_json((std::filesystem::path(a.model) / "tokenizer.json").string());
  if (!tk.ok()) fail("generate", tk.status());
  if (a.tp > 1 && !a.draft_model.empty()) {  // one message, rank 0's
    if (comm::Communicator::world().rank() == 0)
      fmt::print(stderr, "kiln generate: --draft-model with --tp: generate times speculative against plain decoding "
                         "in two engines, which one tp group cannot run; kiln serve --tp --draft-model speculates\n");
    comm::finalize();
    throw CLI::RuntimeError(kUserError);
  }
  if (!a.draft_model.empty()) return run_speculative(a, std::move(*model), *tk);
  if (a.tp > 1 && !serve_tensor_parallel(*model, a.tp, "generate", &quantized)) return;  // a follower: done
  auto engine = generation_engine(std::move(*model), nullptr, a);
  const std::vector<int32_t> ids = prompt_ids(a, *tk, *engine);
  if (!a.profile.empty()) trace::start();
  for (int sample = 0; sample < a.samples; ++sample) {
    fmt::print("{}", a.prompt);
    std::string text;
    auto r = generate(*engine, ids, generation_params(a, *engine, static_cast<int64_t>(ids.size()), sample, *tk),
                      text_sink(a, *tk, text, true));
    if (!r.ok()) fail("generate", r.status());
    fmt::print("\n---\n");
  }
  if (const GraphStats* g = engine->graph_stats()) fmt::print("{}\n", describe(*g));
  if (!a.profile.empty()) {
    auto report = perf::finish_profile(a.profile, nullptr, perf::run_profile_meta("generate " + a.model));
    if (!report.ok()) fail("generate", report.status());
    fmt::print("{}", *report);
  }
  if (a.tp > 1) {
    engine.reset();  // its executor tells the other ranks to stop
    comm::finalize();
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

  auto ta = std::make_shared<run::TrainRunOptions>();
  CLI::App* t = app.add_subcommand("train", "Train a model on a corpus (default: llama-tiny on the KJV Bible)");
  t->add_option("--preset", ta->preset, "gpt2-124m | w1a | llama-tiny | w2-s | w2-l");
  t->add_option("--text", ta->data.text_file, "UTF-8 text file (default: the bundled King James Bible)");
  t->add_option("--data", ta->data.out_dir, "Prepared-data directory");
  t->add_option("--vocab-size", ta->data.vocab_size, "BPE vocabulary size when preparing")->check(CLI::Range(257, 65536));
  t->add_option("--out", ta->out_dir, "Where to save the model (config.json, model.safetensors, tokenizer.json)");
  t->add_option("--steps", ta->train.max_steps, "Optimizer steps")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  t->add_option("--minutes", ta->minutes, "Stop after this many minutes (wall time)")->check(CLI::Range(0.0, 1e6));
  t->add_option("--batch", ta->train.batch, "Sequences per micro-batch")->check(CLI::Range(1, 4096));
  t->add_option("--seq,--seq-len", ta->train.seq_len, "Tokens per sequence (a Llama preset's context widens to it)")->check(CLI::Range(2, 1 << 20));
  t->add_option("--grad-accum", ta->train.grad_accum, "Micro-batches per step")->check(CLI::Range(1, 4096));
  t->add_option("--lr", ta->train.lr, "Peak learning rate")->check(CLI::Range(0.0, 10.0));
  t->add_option("--warmup", ta->train.warmup_steps, "Warm-up steps")->check(CLI::Range(0, 1 << 30));
  t->add_option("--weight-decay", ta->train.weight_decay, "AdamW decoupled weight decay (matrices only)")->check(CLI::Range(0.0, 10.0));
  t->add_option("--clip", ta->train.clip_norm, "Clip gradients to this global norm (0: off)")->check(CLI::Range(0.0, 1e9));
  t->add_option("--eval-every", ta->train.eval_every, "Validation loss every N steps")->check(CLI::Range(0, 1 << 30));
  t->add_option("--eval-batches", ta->train.eval_batches, "Validation batches per evaluation")->check(CLI::Range(1, 1 << 20));
  t->add_option("--seed", ta->train.seed, "Seed for weights and data order");
  t->add_option("--attention", "Attention kernels: flash (default) or naive (the T×T GEMM path, for comparison)")
      ->check(CLI::IsMember({"naive", "flash"}))
      ->each([](const std::string& s) { set_attention_impl(parse_attention_impl(s).value()); });
  t->add_option("--graph", "eager (default) | capture: each step (data, forwards, backwards, optimizer) replays a "
                           "captured graph | fused: and its elementwise chains run as JIT-compiled kernels")
      ->check(CLI::IsMember({"eager", "capture", "fused"}))
      ->each([ta](const std::string& s) { apply_graph_mode(s, ta->train.graph_capture, ta->train.graph_pass); });
  t->add_flag("--split-epilogues", ta->train.split_epilogues,
              "Each GEMM's bias and residual as kernels of their own (PyTorch eager's shape; --graph fused fuses them)");
  t->add_flag("--resume", ta->resume, "Continue from OUT/checkpoint.bin (same options give the same losses)");
  t->add_option("--save-every", ta->save_every, "Write OUT/checkpoint.bin every N steps (and always at the end)")
      ->check(CLI::Range(0, 1 << 30));
  t->add_option("--precision", ta->precision, "fp32 | bf16 (bf16 GEMM, fp32 master weights) | fp16, fp8 (emulated)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16", "fp8"}));
  t->add_option("--loss-scale", ta->loss_scale, "Loss scaling: 'dynamic' or a fixed S (default: dynamic for fp16, else none)");
  t->add_option("--loss-scale-init", ta->loss_scale_init, "Initial S of dynamic loss scaling")->check(CLI::Range(1e-30, 1e30));
  t->add_option("--loss-scale-window", ta->train.loss_scale_window, "Dynamic loss scaling: good steps before S doubles")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  t->add_option("--amax-history", ta->train.amax_history, "fp8 delayed scaling: amaxes remembered per tensor")
      ->check(CLI::Range(1, 1 << 16));
  t->add_option("--checkpoint", ta->checkpoint, "Activation checkpointing: none | full | selective")
      ->check(CLI::IsMember({"none", "full", "selective"}));
  t->add_option("--offload-optimizer", ta->offload_optimizer,
                "Keep AdamW's moments in a file in DIR (8 bytes a parameter less memory), streamed through each "
                "optimizer step")
      ->type_name("DIR");
  t->add_flag("--memory-report", ta->memory_report,
              "Print the memory model beside the allocator's measured peak of step 2; write OUT/memory.svg");
  t->add_option("--qat", ta->qat, "Quantization-aware training: w4g128 | w8a8 (exports OUT/quantized)");
  // Data parallelism (under mpirun -np P): the layouts of src/kiln/parallel/data_parallel.h.
  t->add_option("--dp", ta->dp, "Data-parallel ranks (default: every rank of mpirun)")->check(CLI::Range(1, 1 << 16));
  t->add_option("--zero", ta->parallel.zero, "ZeRO stage: 0 DDP, 1 moments, 2 + gradients, 3 + parameters (FSDP)")
      ->check(CLI::Range(0, 3));
  t->add_flag("--fsdp", ta->fsdp, "FSDP: --zero 3 with units gathered around their forward and backward");
  t->add_option("--hsdp", ta->parallel.shard_group, "HSDP: shard within groups of G ranks, replicate across them")
      ->check(CLI::Range(1, 1 << 16));
  t->add_option("--bucket-mb", ta->parallel.bucket_mb, "DDP / ZeRO-1 gradient bucket size in MiB (default 25)")
      ->check(CLI::Range(1e-3, 65536.0));
  t->add_option("--overlap", ta->parallel.overlap, "Start gradient reductions during backward (on) or after it (off)");
  t->add_option("--reduce-dtype", ta->reduce_dtype, "Gradients on the wire: f32 or bf16 (fp32 master weights either way)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  t->add_option("--fsdp-unit", ta->parallel.fsdp_unit_blocks, "Transformer blocks per FSDP unit")->check(CLI::Range(1, 1 << 16));
  t->add_option("--reshard-after-forward", ta->parallel.reshard_after_forward,
                "FSDP: free a unit's parameters after its forward (on) or keep them for its backward (off)");
  t->add_option("--prefetch", ta->parallel.prefetch, "FSDP: units gathered ahead, forward and backward")
      ->check(CLI::Range(0, 1 << 16));
  // Tensor parallelism (src/kiln/parallel/tensor_parallel.h): dp × tp = the ranks of mpirun.
  t->add_option("--tp", ta->tensor.tp, "Tensor-parallel ranks (Megatron column/row splits; dp = ranks / tp)")
      ->check(CLI::Range(1, 1 << 16));
  t->add_flag("--sp", ta->tensor.sequence_parallel,
              "Sequence parallelism with --tp: norms and residuals over seq / tp tokens per rank");
  // Pipeline parallelism (src/kiln/parallel/pipeline.h): pp × dp × tp = the ranks of mpirun.
  t->add_option("--pp", ta->pipeline.pp, "Pipeline stages (blocks split over pp ranks; dp = ranks / (pp × tp))")
      ->check(CLI::Range(1, 1 << 10));
  t->add_option("--pp-layers", ta->pipeline.layers, "Blocks per stage, e.g. 3,3,2 (default: balanced by FLOPs)")
      ->delimiter(',');
  t->add_option("--micro-batches", ta->pipeline.micro_batches, "Micro-batches per pipeline step (the batch split M ways)")
      ->check(CLI::Range(1, 1 << 12));
  t->add_option("--schedule", ta->schedule, "Pipeline schedule: gpipe | 1f1b | interleaved | zb-h1");
  t->add_option("--virtual-stages", ta->pipeline.virtual_stages, "Model chunks per rank (interleaved 1F1B)")
      ->check(CLI::Range(1, 1 << 10));
  t->add_option("--timeline", ta->timeline, "Pipeline: draw the last step's measured schedule beside the ideal (SVG)");
  // Context parallelism (src/kiln/parallel/context_parallel_plan.h): each sequence over cp ranks, dp × cp = the ranks.
  t->add_option("--cp", ta->context.cp, "Context-parallel ranks (each sequence split over them; attention across)")
      ->check(CLI::Range(1, 1 << 16));
  t->add_option("--cp-layout", ta->cp_layout, "--cp: zigzag (balanced causal work) or contiguous");
  t->add_option("--cp-method", ta->cp_method,
                "--cp: ring attention, ulysses (all-to-all to head shards) or hybrid (Ulysses inside, ring across)");
  t->add_option("--cp-ulysses", ta->context.ulysses, "--cp-method hybrid: ranks of each Ulysses group (default 2)")
      ->check(CLI::Range(1, 1 << 16));
  // Expert parallelism (src/kiln/parallel/expert_parallel.h): MoE experts over ep ranks, edp × ep = the ranks.
  t->add_option("--ep", ta->expert.ep, "Expert-parallel ranks (each holds num_experts / ep experts; tokens move by all-to-all)")
      ->check(CLI::Range(1, 1 << 16));
  t->add_option("--ep-chunks", ta->expert.chunks,
                "--ep: dispatch chunks per MoE layer, each chunk's all-to-all overlapping the previous chunk's experts")
      ->check(CLI::Range(1, 1 << 10));
  t->add_option("--profile", ta->profile, "Write a Chrome/Perfetto trace (FILE.json): every kernel, collective and phase, all ranks merged");
  t->callback([ta] {
    const bool mpi = run::launched_by_mpi();
    Status st = run::run_training(*ta);
    const int rank = mpi ? comm::Communicator::world().rank() : 0;
    // Every rank has the same verdict: rank 0 says it, before MPI_Finalize (which the others
    // wait in), so mpirun cannot end the job on another rank's exit before the message is out.
    if (!st.ok() && rank == 0) {
      fmt::print(stderr, "kiln train: {}\n", st.message());
      std::fflush(stderr);
    }
    if (mpi) comm::finalize();
    if (!st.ok()) throw CLI::RuntimeError(kUserError);
  });

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
  g->add_option("--checkpoint", ga->checkpoint,
                "Weights from a training checkpoint instead of --model's (OUT/checkpoint.bin, or OUT/checkpoint of a run "
                "on several ranks); --model gives config.json and tokenizer.json");
  g->add_option("--samples", ga->samples, "Number of samples")->check(CLI::Range(1, 100));
  g->add_option("--tp", ga->tp, "Tensor-parallel ranks (run under mpirun -np T; rank 0 prints)")
      ->check(CLI::Range(1, 1 << 16));
  g->add_option("--draft-model", ga->draft_model, "Speculative decoding with this draft model (same tokenizer)");
  g->add_option("--num-speculative", ga->num_speculative, "Draft tokens per target pass (γ)")->check(CLI::Range(1, 16));
  g->add_option("--profile", ga->profile, "Write a Chrome/Perfetto trace of the generation (FILE.json; rank 0 under --tp)");
  g->add_option("--graph", ga->graph, "eager (default) | capture: decode steps replay a captured graph per batch size "
                                      "| fused: and its elementwise chains run as JIT-compiled kernels")
      ->check(CLI::IsMember({"eager", "capture", "fused"}));
  g->callback([ga] { run_generate(*ga); });
}

}  // namespace kiln::app
