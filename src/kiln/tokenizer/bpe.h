// Byte-level BPE (GPT-2 style): text is pre-tokenized, each piece is a byte string, and
// learned merges join adjacent tokens in order of rank. Every byte has a token, so encode →
// decode is the identity on any bytes, invalid UTF-8 included.
// Formats: Hugging Face `tokenizer.json` (read and write) and GPT-2's encoder.json + vocab.bpe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/core/status.h"

namespace kiln::tok {

struct TrainOptions {
  int vocab_size = 4096;  // bytes (256) + merges + special tokens
  std::vector<std::string> special_tokens = {"<|endoftext|>"};
  int64_t min_pair_count = 2;  // stop early when no pair is this frequent
};

class Tokenizer {
 public:
  // Learns merges on `corpus` until the vocabulary reaches options.vocab_size.
  static Expected<Tokenizer> train(std::string_view corpus, const TrainOptions& options);
  static Expected<Tokenizer> load_hf_json(const std::string& path);
  static Expected<Tokenizer> parse_hf_json(std::string_view json_text);
  // A vocabulary as files store it: token strings in GPT-2's byte-level alphabet.
  struct VocabFile {
    std::vector<std::pair<std::string, int64_t>> vocab;                // token -> id
    std::vector<std::pair<std::string, std::string>> merges;          // in rank order
    std::vector<std::pair<std::string, int64_t>> specials;            // raw content -> id
  };
  static Expected<Tokenizer> from_vocab_file(const VocabFile& file, bool add_prefix_space);
  static Expected<Tokenizer> load_gpt2(const std::string& encoder_json, const std::string& vocab_bpe);
  Status save_hf_json(const std::string& path) const;  // temporary file + rename
  std::string to_hf_json() const;

  // Special tokens in `text` become their ids when `allow_special` (else they are plain text).
  std::vector<int32_t> encode(std::string_view text, bool allow_special = true) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string_view token_bytes(int32_t id) const { return tokens_[static_cast<size_t>(id)]; }

  int vocab_size() const { return static_cast<int>(tokens_.size()); }
  int num_merges() const { return static_cast<int>(merges_.size()); }
  int32_t special_id(std::string_view token) const;  // -1 when absent
  int32_t eot_id() const { return special_id("<|endoftext|>"); }

 private:
  struct Merge {
    int32_t left, right, result;
  };
  struct PairHash {
    size_t operator()(uint64_t k) const { return std::hash<uint64_t>()(k * 0x9E3779B97F4A7C15ull); }
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Rebuilds the lookup tables from tokens_, merges_ and specials_; checks consistency.
  Status finalize();
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;               // id -> bytes
  std::vector<Merge> merges_;                     // in rank order
  std::vector<int32_t> specials_;                 // ids of special tokens
  bool add_prefix_space_ = false;
  // Derived:
  std::unordered_map<std::string, int32_t> token_ids_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>, PairHash> merge_rank_;  // -> (rank, result)
  int32_t byte_ids_[256] = {};
};

// GPT-2's reversible map from bytes to printable characters (used in vocab files), as UTF-8.
std::string byte_to_unicode(uint8_t b);
// Inverse over a whole token string; fails on characters outside the map.
Expected<std::string> unicode_to_bytes(std::string_view s);

}  // namespace kiln::tok
