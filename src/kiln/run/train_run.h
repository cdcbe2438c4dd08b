// One training run end to end, what `kiln train` runs: the corpus (prepared once, then reused),
// the model from a preset, precision, activation checkpointing and QAT, the Trainer's loop with
// its checkpoints (--save-every, --resume), the progress line and the memory report, and at the
// end the saved model, the QAT export, the tokenizer, the chat template and the loss curve. This
// layer sits above train, quant, perf and serve, so the CLI only parses flags into a
// TrainRunOptions. Three seams are kept for runs on several ranks: everything the run prints or
// writes goes through one RunOutput (the main rank reports and saves, the others stay silent);
// the Trainer is built in one function (where a parallel plan will be passed); and the progress
// line is formatted from StepStats in one function (where per-layout fields will be appended).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "kiln/core/status.h"
#include "kiln/parallel/context_parallel_plan.h"
#include "kiln/parallel/data_parallel.h"
#include "kiln/parallel/expert_parallel.h"
#include "kiln/parallel/pipeline.h"
#include "kiln/parallel/tensor_parallel.h"
#include "kiln/train/corpus.h"
#include "kiln/train/trainer.h"

namespace kiln::run {

// A run in the terms of `kiln train`'s flags; the errors about a field name its flag.
struct TrainRunOptions {
  PrepareOptions data;                      // --text, --data, --vocab-size
  std::string preset = "llama-tiny";        // --preset
  std::string out_dir = "runs/llama-tiny";  // --out: checkpoint, model, tokenizer, SVGs
  // --steps, --batch, --seq, --lr, ...: the precision, checkpoint and loss-scale fields are not
  // read here but set from the names below (resolve_train_options).
  TrainOptions train;
  double minutes = 0;                // --minutes: wall-time limit (0: none)
  bool resume = false;               // --resume from out_dir/checkpoint.bin
  int64_t save_every = 0;            // --save-every N steps (0: at the end only)
  std::string precision = "fp32";    // --precision: fp32 | bf16 | fp16 | fp8
  std::string checkpoint = "none";   // --checkpoint: none | selective | full
  std::string loss_scale;            // --loss-scale: "dynamic" or S; empty: dynamic for fp16, else 1
  double loss_scale_init = 65536;    // --loss-scale-init: S0 of dynamic loss scaling
  std::string qat;                   // --qat: fake-quantization scheme (w4g128, w8a8); empty: none
  bool memory_report = false;        // --memory-report: memory model vs step 2's measured peak
  // Data parallelism (under mpirun): --dp (0: the world size), --zero, --fsdp (= --zero 3),
  // --hsdp G, --bucket-mb, --overlap, --fsdp-unit, --reshard-after-forward, --prefetch.
  int dp = 0;
  bool fsdp = false;
  std::string reduce_dtype = "f32";  // --reduce-dtype: f32 | bf16
  parallel::DataParallelOptions parallel;
  // Tensor parallelism: --tp T (the world is dp × tp; --dp, when given, must be world / T), --sp.
  parallel::TensorParallelOptions tensor;
  // Pipeline parallelism: --pp P, --pp-layers, --micro-batches M, --schedule, --virtual-stages
  // (the world is pp × dp × tp); --timeline writes the last step's measured schedule.
  parallel::PipelineOptions pipeline;
  std::string schedule = "1f1b";
  std::string timeline;
  // Expert parallelism (MoE models): --ep E, --ep-chunks (the world is edp × ep; every rank a
  // data-parallel rank). A MoE model under mpirun without --ep runs it at ep 1 (DDP with the
  // single-process routing statistics) unless ZeRO/FSDP is asked for.
  parallel::ExpertParallelOptions expert;
  // Context parallelism: --cp C, --cp-layout zigzag|contiguous, --cp-method ring|ulysses (the world
  // is dp × cp).
  parallel::ContextParallelOptions context;
  std::string cp_layout = "zigzag", cp_method = "ring";
  // --offload-optimizer DIR: AdamW's m and v in a file in DIR (train/offload.h), streamed
  // through each optimizer step; empty: in memory.
  std::string offload_optimizer;
  std::string profile;  // --profile FILE.json: a Chrome/Perfetto trace of the steps, every rank (perf/profiler.h)
};

// Whether this process was started by mpirun (or another MPI launcher): a plain `kiln train`
// never starts MPI.
bool launched_by_mpi();

// Where a run's report and files go. All its printing and file writing passes through here, so
// one switch decides it: on several ranks only the main rank (rank 0) prints and saves; the
// others train silently. Reading (the corpus, --resume) is never gated; nor is preparing a corpus
// that is missing (prepare_corpus writes it), so ranks should start from a prepared --data.
class RunOutput {
 public:
  explicit RunOutput(bool is_main_rank = true, std::FILE* stream = stdout)
      : is_main_rank_(is_main_rank), stream_(stream) {}
  bool is_main_rank() const { return is_main_rank_; }

  // Report text; buffered until flush().
  template <class... Args>
  void print(fmt::format_string<Args...> format, Args&&... args) const {
    if (is_main_rank_) fmt::print(stream_, format, std::forward<Args>(args)...);
  }
  void flush() const;
  // A picture of the run (an SVG): best effort, a failed write does not stop the run.
  void write_text(const std::string& path, const std::string& text) const;
  // State of the run (checkpoint, model, export): `write` runs on the main rank; elsewhere ok.
  Status save(const std::function<Status()>& write) const;

 private:
  bool is_main_rank_;
  std::FILE* stream_;
};

// The TrainOptions of a run: `options.train` with --precision, --checkpoint and the loss
// scaling parsed, after every check CLI11 cannot make alone (names, combinations, the preset's
// context). Cheap and silent: a bad flag costs no corpus preparation.
Expected<TrainOptions> resolve_train_options(const TrainRunOptions& options);

// What the progress line rates a step against; fixed for a run.
struct ProgressContext {
  double flops_per_token = 0;            // model FLOPs of a training token (MFU)
  double recompute_flops_per_token = 0;  // activation checkpointing's recomputation (HFU)
  double peak_gflops = 0;                // the machine peak MFU and HFU are against
  bool show_loss_scale = false;          // S and skipped steps (dynamic, or static S != 1)
  bool show_flushed = false;             // fp16: output gradients flushed to zero
  bool show_parallel = false;            // per-rank memory and communication
};

// The progress line of step `s` of `total_steps` (Trainer::total_steps(), which a time budget
// lowers after the first steps), without a newline:
// "step    10/100 | loss 7.3830 val 7.5261 | lr 6.00e-04 | gnorm 10.67 | 812 tok/s | 0.1 GFLOP/s |
//  MFU 0.1% | HFU 0.1% | ETA 12s"; a data-parallel run adds "| mem 41 MiB/rank | comm 12 ms,
//  exposed 3%" (the allocator peak of this rank; communication of the step, exposed share).
std::string format_progress(const StepStats& s, int64_t total_steps, const ProgressContext& c);

// Runs `options` to the end: prepares or reuses the corpus, trains (resuming when asked), then
// saves the checkpoint, the model with its tokenizer and chat template, the QAT export and the
// loss curve under options.out_dir. Bad flags, a --batch × --seq too large for this machine and
// unreadable data are refused before the first step.
Status run_training(const TrainRunOptions& options, const RunOutput& out = RunOutput());

}  // namespace kiln::run
