// Corpus preparation.
#include "kiln/train/corpus.h"

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "kiln/core/file_io.h"
#include "kiln/tokenizer/bpe.h"
#include "kiln/train/data.h"

namespace kiln {
namespace fs = std::filesystem;

Expected<std::string> kjv_text() {
  FILE* pipe = popen("bible -f 'gen1:1-rev22:21' 2>/dev/null", "r");
  if (!pipe) return not_found("cannot run `bible` (install the bible-kjv package: scripts/install-deps.sh)");
  std::string raw;
  char buf[1 << 16];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, pipe)) > 0) raw.append(buf, got);
  const int rc = pclose(pipe);
  if (rc != 0 || raw.size() < 1000000)
    return not_found("`bible -f` failed or printed too little ({} bytes): install bible-kjv (scripts/install-deps.sh)",
                     raw.size());
  // Lines look like "Ge1:1 In the beginning ..."; drop the reference up to the first space.
  std::string out;
  out.reserve(raw.size());
  std::istringstream in(raw);
  std::string line;
  while (std::getline(in, line)) {
    const size_t sp = line.find(' ');
    const bool has_ref = sp != std::string::npos && line.find(':') < sp;
    out += has_ref ? line.substr(sp + 1) : line;
    out += '\n';
  }
  return out;
}

Expected<CorpusPaths> prepare_corpus(const PrepareOptions& o, std::string* log) {
  CorpusPaths p;
  p.dir = o.out_dir;
  p.text = (fs::path(o.out_dir) / "corpus.txt").string();
  p.tokenizer = (fs::path(o.out_dir) / "tokenizer.json").string();
  p.train = (fs::path(o.out_dir) / "train.bin").string();
  p.val = (fs::path(o.out_dir) / "val.bin").string();
  if (!o.force && fs::exists(p.tokenizer) && fs::exists(p.train) && fs::exists(p.val)) {
    if (log) *log = fmt::format("reusing {}", o.out_dir);
    return p;
  }
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return not_found("cannot create {}: {}", o.out_dir, ec.message());
  std::string text;
  if (o.text_file.empty()) {
    KILN_ASSIGN_OR_RETURN(text, kjv_text());
  } else {
    KILN_ASSIGN_OR_RETURN(text, read_file(o.text_file));
    if (text.size() < 1000) return invalid_argument("--text {} has only {} bytes; a corpus needs more", o.text_file, text.size());
  }
  KILN_RETURN_IF_ERROR(write_file_atomic(p.text, {text}));
  // Split at a line boundary near (1 - val_fraction) of the bytes.
  size_t cut = static_cast<size_t>(static_cast<double>(text.size()) * (1.0 - o.val_fraction));
  cut = text.find('\n', cut);
  if (cut == std::string::npos) cut = text.size();
  const std::string_view train_text(text.data(), cut), val_text(text.data() + cut, text.size() - cut);
  tok::TrainOptions topt;
  topt.vocab_size = o.vocab_size;
  KILN_ASSIGN_OR_RETURN(tok::Tokenizer tk, tok::Tokenizer::train(train_text, topt));
  KILN_RETURN_IF_ERROR(tk.save_hf_json(p.tokenizer));
  const auto train_ids = tk.encode(train_text, false), val_ids = tk.encode(val_text, false);
  KILN_RETURN_IF_ERROR(write_shard(p.train, train_ids, tk.vocab_size()));
  KILN_RETURN_IF_ERROR(write_shard(p.val, val_ids, tk.vocab_size()));
  if (log)
    *log = fmt::format("prepared {}: {} bytes of text, vocab {}, {} train / {} val tokens ({:.2f} bytes/token)",
                       o.out_dir, text.size(), tk.vocab_size(), train_ids.size(), val_ids.size(),
                       static_cast<double>(train_text.size()) / std::max<size_t>(train_ids.size(), 1));
  return p;
}

}  // namespace kiln
