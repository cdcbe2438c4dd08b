// `kiln bench tokenizer`: byte-level BPE encoding speed in MB/s on a text file (median of N).
// bench/compare_tokenizers.py runs Hugging Face `tokenizers` on the same file beside it.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "apps/kiln/commands.h"
#include "kiln/core/file_io.h"
#include "kiln/tokenizer/bpe.h"

namespace kiln::app {

void register_bench_tokenizer(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  struct Args {
    std::string tokenizer = "data/kjv/tokenizer.json", text = "data/kjv/corpus.txt";
    int reps = 5;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = bench->add_subcommand("tokenizer", "BPE encoding speed (MB/s) on a text file");
  cmd->add_option("--tokenizer", a->tokenizer, "tokenizer.json (default: the prepared KJV one)");
  cmd->add_option("--text", a->text, "Text file to encode");
  cmd->add_option("--reps", a->reps, "Timed repetitions")->check(CLI::Range(1, 1000));
  cmd->add_flag("--json", a->json, "One JSON object");
  cmd->callback([a] {
    auto tk = tok::Tokenizer::load_hf_json(a->tokenizer);
    if (!tk.ok()) {
      fmt::print(stderr, "kiln bench tokenizer: {} (run `kiln data prepare` first?)\n", tk.status().message());
      throw CLI::RuntimeError(kUserError);
    }
    auto file = read_file(a->text);
    if (!file.ok()) {
      fmt::print(stderr, "kiln bench tokenizer: {}\n", file.status().message());
      throw CLI::RuntimeError(kUserError);
    }
    const std::string& text = *file;
    std::vector<double> secs;
    size_t n = tk->encode(text).size();  // warm-up
    for (int r = 0; r < a->reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      n = tk->encode(text).size();
      secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(secs.begin(), secs.end());
    const double med = secs[secs.size() / 2];
    const double mbs = static_cast<double>(text.size()) / med / 1e6;
    if (a->json) {
      fmt::print("{{\"impl\": \"kiln\", \"bytes\": {}, \"tokens\": {}, \"seconds\": {:.4f}, \"mb_per_s\": {:.3f}}}\n",
                 text.size(), n, med, mbs);
    } else {
      fmt::print("kiln encode: {} bytes -> {} tokens in {:.3f} s (min {:.3f}, max {:.3f}): {:.2f} MB/s, 1 thread\n",
                 text.size(), n, med, secs.front(), secs.back(), mbs);
    }
  });
}

}  // namespace kiln::app
