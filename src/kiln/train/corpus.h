// Preparing a corpus once: text -> BPE tokenizer -> train/validation token shards in a
// directory, reused by later runs. The bundled default is the King James Bible from Debian's
// bible-kjv package (verse references stripped).
#pragma once

#include <string>

#include "kiln/core/status.h"

namespace kiln {

struct CorpusPaths {
  std::string dir, text, tokenizer, train, val;
};

struct PrepareOptions {
  std::string text_file;      // empty: the bundled KJV corpus
  std::string out_dir = "data/kjv";
  int vocab_size = 4096;
  double val_fraction = 0.02;  // the tail of the text
  bool force = false;          // redo even when the files exist
};

// Writes (or reuses) dir/{tokenizer.json,train.bin,val.bin}; returns the paths.
Expected<CorpusPaths> prepare_corpus(const PrepareOptions& options, std::string* log = nullptr);

// The KJV text from `bible -f "gen1:1-rev22:21"`, one verse per line, references removed.
Expected<std::string> kjv_text();

}  // namespace kiln
