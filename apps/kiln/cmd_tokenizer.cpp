// `kiln tokenizer train|encode|decode`: byte-level BPE from the command line.
#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <sstream>

#include "apps/kiln/commands.h"
#include "kiln/core/file_io.h"
#include "kiln/tokenizer/bpe.h"

namespace kiln::app {
namespace {

[[noreturn]] void fail(const Status& s) {
  fmt::print(stderr, "kiln tokenizer: {}\n", s.message());
  throw CLI::RuntimeError(kUserError);
}

Expected<tok::Tokenizer> load(const std::string& path) {
  return tok::Tokenizer::load_hf_json(path);
}

}  // namespace

void register_tokenizer(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("tokenizer", "Byte-level BPE: train, encode, decode");
  cmd->require_subcommand(1);

  struct TrainArgs {
    std::string text, out = "tokenizer.json";
    int vocab_size = 4096;
  };
  auto train = std::make_shared<TrainArgs>();
  CLI::App* t = cmd->add_subcommand("train", "Learn BPE merges on a UTF-8 text file");
  t->add_option("--text", train->text, "Corpus file")->required();
  t->add_option("--vocab-size", train->vocab_size, "Target vocabulary size (256 bytes + merges + <|endoftext|>)")
      ->check(CLI::Range(257, 1 << 20));
  t->add_option("--out", train->out, "Where to write the Hugging Face tokenizer.json");
  t->callback([train] {
    auto text = read_file(train->text);
    if (!text.ok()) fail(text.status());
    tok::TrainOptions opt;
    opt.vocab_size = train->vocab_size;
    const auto t0 = std::chrono::steady_clock::now();
    auto tk = tok::Tokenizer::train(*text, opt);
    if (!tk.ok()) fail(tk.status());
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (Status s = tk->save_hf_json(train->out); !s.ok()) fail(s);
    const size_t n = tk->encode(*text).size();
    fmt::print("trained {} merges (vocab {}) on {} bytes in {:.2f} s; {:.2f} bytes/token; wrote {}\n",
               tk->num_merges(), tk->vocab_size(), text->size(), secs,
               static_cast<double>(text->size()) / std::max<size_t>(n, 1), train->out);
  });

  struct CodeArgs {
    std::string tokenizer, text, file, ids;
  };
  auto enc = std::make_shared<CodeArgs>();
  CLI::App* e = cmd->add_subcommand("encode", "Print the token ids of a text (JSON array)");
  e->add_option("--tokenizer", enc->tokenizer, "tokenizer.json")->required();
  auto* text_opt = e->add_option("--text", enc->text, "Text to encode");
  e->add_option("--file", enc->file, "File to encode")->excludes(text_opt);
  e->callback([enc] {
    auto tk = load(enc->tokenizer);
    if (!tk.ok()) fail(tk.status());
    std::string text = enc->text;
    if (!enc->file.empty()) {
      auto f = read_file(enc->file);
      if (!f.ok()) fail(f.status());
      text = *f;
    }
    fmt::print("[{}]\n", fmt::join(tk->encode(text), ", "));
  });

  auto dec = std::make_shared<CodeArgs>();
  CLI::App* d = cmd->add_subcommand("decode", "Print the text of comma- or space-separated ids");
  d->add_option("--tokenizer", dec->tokenizer, "tokenizer.json")->required();
  d->add_option("--ids", dec->ids, "Ids, e.g. \"15496, 11\"")->required();
  d->callback([dec] {
    auto tk = load(dec->tokenizer);
    if (!tk.ok()) fail(tk.status());
    std::vector<int32_t> ids;
    std::string s = dec->ids;
    for (char& c : s)
      if (c == ',' || c == '[' || c == ']') c = ' ';
    std::istringstream in(s);
    // Each word whole, as an integer: stream extraction would stop silently at an overflow.
    for (std::string word; in >> word;) {
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
      if (ec != std::errc() || end != word.data() + word.size() || v < 0 || v >= tk->vocab_size())
        fail(invalid_argument("--ids: '{}' is not a token id in [0, {})", word, tk->vocab_size()));
      ids.push_back(static_cast<int32_t>(v));
    }
    fmt::print("{}", tk->decode(ids));
  });
}

}  // namespace kiln::app
