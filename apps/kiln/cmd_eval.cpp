// `kiln eval`: a saved model on given token ids — next-token loss, and optionally the logits
// as a .npy file, so reference implementations (tests/reference/hf_load_check.py) can compare.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/kiln/commands.h"
#include "kiln/kernels/cross_entropy.h"
#include "kiln/model/weights.h"
#include "kiln/quant/qmodel.h"
#include "kiln/train/trainer.h"

namespace kiln::app {
namespace {

struct EvalArgs {
  std::string model, dump_logits, data;
  std::vector<int32_t> tokens;
  int64_t seq = 256, batches = 64;
};

[[noreturn]] void fail(const Status& s) {
  fmt::print(stderr, "kiln eval: {}\n", s.message());
  throw CLI::RuntimeError(kUserError);
}

// NumPy .npy v1.0: magic, header length, a Python-dict header padded to 64 bytes, raw data.
Status write_npy(const std::string& path, const float* data, int64_t rows, int64_t cols) {
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, cols);
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return not_found("cannot write {}", path);
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const uint16_t len = static_cast<uint16_t>(header.size());
  const size_t n = static_cast<size_t>(rows * cols);
  bool ok = std::fwrite(magic, 1, 8, f.get()) == 8 && std::fwrite(&len, 2, 1, f.get()) == 1 &&
            std::fwrite(header.data(), 1, header.size(), f.get()) == header.size() &&
            std::fwrite(data, sizeof(float), n, f.get()) == n;
  if (!ok) return data_loss("write to {} failed", path);
  return {};
}

void run_eval(const EvalArgs& a) {
  auto model = quant::load_any_model(a.model);  // fp32/f16/bf16, kiln-quantized or a .gguf file
  if (!model.ok()) fail(model.status());
  Transformer& m = **model;
  if (!a.data.empty()) {  // validation perplexity over sequential windows of DIR/val.bin
    auto val = read_shard(a.data + "/val.bin");
    if (!val.ok()) fail(val.status());
    if (val->vocab_size != m.config().vocab_size)
      fail(invalid_argument("{}/val.bin has vocabulary {}, the model {}", a.data, val->vocab_size, m.config().vocab_size));
    const int64_t seq = std::min(a.seq, m.config().max_seq_len);
    const int64_t windows = (static_cast<int64_t>(val->tokens.size()) - 1) / seq;
    if (windows < 1)
      fail(invalid_argument("{}/val.bin holds {} tokens: too few for one window of --seq {}", a.data, val->tokens.size(), seq));
    const int64_t batches = std::min<int64_t>(a.batches, windows);
    const double loss = evaluate(m, *val, 1, seq, batches);
    fmt::print("model: {}\n", m.config().describe());
    fmt::print("validation: {} tokens: loss {:.4f} nats (perplexity {:.3f})\n", batches * seq, loss, std::exp(loss));
    if (a.tokens.empty()) return;
  }
  if (a.tokens.empty()) fail(invalid_argument("give --tokens or --data"));
  const int64_t T = static_cast<int64_t>(a.tokens.size()), V = m.config().vocab_size;
  // Next-token targets; the last position has none.
  std::vector<int32_t> targets(a.tokens.begin() + 1, a.tokens.end());
  targets.push_back(kIgnoreTarget);
  auto loss = m.forward(a.tokens.data(), T > 1 ? targets.data() : nullptr, 1, T);
  if (!loss.ok()) fail(loss.status());
  fmt::print("model: {}\n", m.config().describe());
  if (T > 1) fmt::print("{} tokens: next-token loss {:.6f} nats (perplexity {:.3f})\n", T, *loss, std::exp(*loss));
  if (!a.dump_logits.empty()) {
    if (Status s = write_npy(a.dump_logits, m.logits(), T, V); !s.ok()) fail(s);
    fmt::print("logits ({}, {}) written to {}\n", T, V, a.dump_logits);
  }
}

}  // namespace

void register_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* e = app.add_subcommand("eval", "Run a saved model on token ids: loss, logits (.npy)");
  e->add_option("--model", a->model, "Model directory (config.json, model.safetensors) or a .gguf file")->required();
  e->add_option("--tokens", a->tokens, "Token ids, e.g. 1,2,3")->delimiter(',');
  e->add_option("--data", a->data, "Prepared corpus dir: validation perplexity over DIR/val.bin");
  e->add_option("--seq", a->seq, "--data: tokens per window")->check(CLI::Range(2, 1 << 20));
  e->add_option("--batches", a->batches, "--data: windows (at most what val.bin holds)")->check(CLI::Range(1, 1 << 20));
  e->add_option("--dump-logits", a->dump_logits, "Write the logits (T, V) as float32 .npy");
  e->callback([a] { run_eval(*a); });
}

}  // namespace kiln::app
