// Byte-level BPE: training (pair counts with incremental updates and a lazy max-heap),
// encoding (lowest-rank merge first, a min-heap per piece), and the file formats.
#include "kiln/tokenizer/bpe.h"
#include "kiln/core/json.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <queue>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "kiln/core/file_io.h"
#include "kiln/tokenizer/pretokenize.h"
#include "kiln/tokenizer/unicode.h"

namespace kiln::tok {
namespace {

// Bytes GPT-2 keeps as themselves in vocab files; the others map to U+0100 upward in order.
bool printable_byte(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); }

uint32_t byte_code_point(uint8_t b) {
  if (printable_byte(b)) return b;
  int n = 0;
  for (int i = 0; i < b; ++i) n += printable_byte(i) ? 0 : 1;
  return 256u + static_cast<uint32_t>(n);
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Limits for files we parse: far above any real tokenizer, low enough to refuse garbage.
constexpr int64_t kMaxFileBytes = int64_t{1} << 30;
constexpr size_t kMaxVocab = size_t{1} << 22;


}  // namespace

std::string byte_to_unicode(uint8_t b) {
  std::string s;
  append_utf8(s, byte_code_point(b));
  return s;
}

Expected<std::string> unicode_to_bytes(std::string_view s) {
  static const auto table = [] {
    std::vector<int> t(256 + 256, -1);
    for (int b = 0; b < 256; ++b) t[byte_code_point(static_cast<uint8_t>(b))] = b;
    return t;
  }();
  std::string out;
  while (!s.empty()) {
    CodePoint c = decode_utf8(s);
    if (c.cp == kInvalidCodePoint || c.cp >= table.size() || table[c.cp] < 0)
      return invalid_argument("token string has a character outside the byte-level alphabet");
    out += static_cast<char>(table[c.cp]);
    s.remove_prefix(static_cast<size_t>(c.nbytes));
  }
  return out;
}

Status Tokenizer::finalize() {
  token_ids_.clear();
  merge_rank_.clear();
  if (tokens_.size() > kMaxVocab) return invalid_argument("vocabulary of {} tokens is too large", tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (!token_ids_.emplace(tokens_[i], static_cast<int32_t>(i)).second &&
        std::find(specials_.begin(), specials_.end(), static_cast<int32_t>(i)) == specials_.end())
      return invalid_argument("token {} appears twice in the vocabulary", i);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = token_ids_.find(std::string(1, static_cast<char>(b)));
    if (it == token_ids_.end()) return invalid_argument("byte-level vocabulary lacks a token for byte {}", b);
    byte_ids_[b] = it->second;
  }
  for (size_t r = 0; r < merges_.size(); ++r) {
    const Merge& m = merges_[r];
    merge_rank_.emplace(pair_key(m.left, m.right), std::make_pair(static_cast<int32_t>(r), m.result));
  }
  return {};
}

int32_t Tokenizer::special_id(std::string_view token) const {
  for (int32_t id : specials_)
    if (tokens_[static_cast<size_t>(id)] == token) return id;
  return -1;
}

// ---- training ------------------------------------------------------------------------------
Expected<Tokenizer> Tokenizer::train(std::string_view corpus, const TrainOptions& options) {
  const int num_special = static_cast<int>(options.special_tokens.size());
  if (options.vocab_size < 256 + num_special)
    return invalid_argument("[tokenizer train] vocab size {} is below 256 bytes + {} special tokens",
                            options.vocab_size, num_special);
  Tokenizer t;
  for (int b = 0; b < 256; ++b) t.tokens_.push_back(std::string(1, static_cast<char>(b)));

  // Count pre-tokenized words (special tokens in the corpus are not learned from).
  std::unordered_map<std::string_view, int64_t> word_counts;
  auto count_text = [&](std::string_view text) {
    for (std::string_view piece : pretokenize(text)) ++word_counts[piece];
  };
  size_t pos = 0;
  while (pos < corpus.size()) {
    size_t next = std::string_view::npos, len = 0;
    for (const auto& s : options.special_tokens) {
      size_t f = s.empty() ? std::string_view::npos : corpus.find(s, pos);
      if (f < next) { next = f; len = s.size(); }
    }
    count_text(corpus.substr(pos, next == std::string_view::npos ? std::string_view::npos : next - pos));
    if (next == std::string_view::npos) break;
    pos = next + len;
  }

  // Words in a deterministic order (sorted by bytes), as symbol id sequences.
  std::vector<std::pair<std::string_view, int64_t>> sorted(word_counts.begin(), word_counts.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::vector<int32_t>> words(sorted.size());
  std::vector<int64_t> freq(sorted.size());
  std::unordered_map<uint64_t, int64_t, PairHash> pair_counts;
  std::unordered_map<uint64_t, std::vector<int32_t>, PairHash> pair_words;
  for (size_t w = 0; w < sorted.size(); ++w) {
    freq[w] = sorted[w].second;
    for (unsigned char c : sorted[w].first) words[w].push_back(c);
    for (size_t j = 0; j + 1 < words[w].size(); ++j) {
      const uint64_t k = pair_key(words[w][j], words[w][j + 1]);
      pair_counts[k] += freq[w];
      auto& list = pair_words[k];
      if (list.empty() || list.back() != static_cast<int32_t>(w)) list.push_back(static_cast<int32_t>(w));
    }
  }

  // Max-heap on count; ties go to the smaller pair key so training is deterministic.
  using Entry = std::pair<int64_t, uint64_t>;
  auto cmp = [](const Entry& a, const Entry& b) {
    return a.first != b.first ? a.first < b.first : a.second > b.second;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(cmp)> heap(cmp);
  for (const auto& [k, c] : pair_counts) heap.push({c, k});

  std::vector<int32_t> last_touched(words.size(), -1);
  std::unordered_map<uint64_t, int64_t, PairHash> changed;
  const int target = options.vocab_size - num_special;
  while (static_cast<int>(t.tokens_.size()) < target && !heap.empty()) {
    const auto [count, key] = heap.top();
    heap.pop();
    auto it = pair_counts.find(key);
    if (it == pair_counts.end() || it->second != count) continue;  // stale entry
    if (count < options.min_pair_count) break;
    const int32_t a = static_cast<int32_t>(key >> 32), b = static_cast<int32_t>(key & 0xffffffffu);
    const int32_t id = static_cast<int32_t>(t.tokens_.size());
    t.tokens_.push_back(t.tokens_[a] + t.tokens_[b]);
    t.merges_.push_back({a, b, id});
    changed.clear();
    const std::vector<int32_t> affected = std::move(pair_words[key]);
    pair_words.erase(key);
    for (int32_t w : affected) {
      if (last_touched[w] == id) continue;
      last_touched[w] = id;
      std::vector<int32_t>& s = words[w];
      for (size_t j = 0; j + 1 < s.size(); ++j) changed[pair_key(s[j], s[j + 1])] -= freq[w];
      std::vector<int32_t> merged;
      merged.reserve(s.size());
      for (size_t j = 0; j < s.size(); ++j) {
        if (j + 1 < s.size() && s[j] == a && s[j + 1] == b) {
          merged.push_back(id);
          ++j;
        } else {
          merged.push_back(s[j]);
        }
      }
      s = std::move(merged);
      for (size_t j = 0; j + 1 < s.size(); ++j) {
        const uint64_t k = pair_key(s[j], s[j + 1]);
        changed[k] += freq[w];
        if (s[j] == id || s[j + 1] == id) {
          auto& list = pair_words[k];
          if (list.empty() || list.back() != w) list.push_back(w);
        }
      }
    }
    for (const auto& [k, delta] : changed) {
      if (delta == 0) continue;
      int64_t& c = pair_counts[k];
      c += delta;
      if (c <= 0) {
        pair_counts.erase(k);
      } else {
        heap.push({c, k});
      }
    }
  }
  for (const auto& s : options.special_tokens) {
    t.specials_.push_back(static_cast<int32_t>(t.tokens_.size()));
    t.tokens_.push_back(s);
  }
  KILN_RETURN_IF_ERROR(t.finalize());
  return t;
}

// ---- encoding ------------------------------------------------------------------------------
void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const int n = static_cast<int>(piece.size());
  if (n == 1) {
    out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  std::vector<int32_t> id(static_cast<size_t>(n));
  std::vector<int> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    id[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  // Min-heap of (rank, position): the lowest-rank pair merges first, leftmost on ties.
  using Entry = std::pair<int32_t, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    auto it = merge_rank_.find(pair_key(id[i], id[next[i]]));
    if (it != merge_rank_.end()) heap.push({it->second.first, i});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const auto [rank, i] = heap.top();
    heap.pop();
    if (id[i] < 0 || next[i] < 0) continue;
    auto it = merge_rank_.find(pair_key(id[i], id[next[i]]));
    if (it == merge_rank_.end() || it->second.first != rank) continue;  // stale
    const int j = next[i];
    id[i] = it->second.second;
    id[j] = -1;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    push(prev[i]);
    push(i);
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  auto encode_text = [&](std::string_view segment) {
    if (segment.empty()) return;
    std::string prefixed;
    if (add_prefix_space_ && segment[0] != ' ') {
      prefixed = " " + std::string(segment);
      segment = prefixed;
    }
    for (std::string_view piece : pretokenize(segment)) encode_piece(piece, out);
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t next = std::string_view::npos;
    int32_t special = -1;
    if (allow_special) {
      for (int32_t sid : specials_) {
        const std::string& s = tokens_[static_cast<size_t>(sid)];
        const size_t f = text.find(s, pos);
        if (f < next || (f == next && f != std::string_view::npos && s.size() > tokens_[special].size())) {
          next = f;
          special = sid;
        }
      }
    }
    if (next == std::string_view::npos) {
      encode_text(text.substr(pos));
      break;
    }
    encode_text(text.substr(pos, next - pos));
    out.push_back(special);
    pos = next + tokens_[static_cast<size_t>(special)].size();
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id >= 0 && id < vocab_size()) out += tokens_[static_cast<size_t>(id)];
  }
  return out;
}

// ---- Hugging Face tokenizer.json -------------------------------------------------------------
std::string Tokenizer::to_hf_json() const {
  using ojson = nlohmann::ordered_json;
  ojson added = ojson::array();
  for (int32_t id : specials_) {
    added.push_back({{"id", id}, {"content", tokens_[static_cast<size_t>(id)]}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  ojson vocab = ojson::object();
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (std::find(specials_.begin(), specials_.end(), static_cast<int32_t>(i)) != specials_.end()) {
      vocab[tokens_[i]] = i;
      continue;
    }
    std::string s;
    for (unsigned char c : tokens_[i]) s += byte_to_unicode(c);
    vocab[s] = i;
  }
  ojson merges = ojson::array();
  for (const Merge& m : merges_) {
    std::string s;
    for (unsigned char c : tokens_[static_cast<size_t>(m.left)]) s += byte_to_unicode(c);
    s += ' ';
    for (unsigned char c : tokens_[static_cast<size_t>(m.right)]) s += byte_to_unicode(c);
    merges.push_back(s);
  }
  const ojson byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space_},
                            {"trim_offsets", true}, {"use_regex", true}};
  ojson j = {{"version", "1.0"},
             {"truncation", nullptr},
             {"padding", nullptr},
             {"added_tokens", added},
             {"normalizer", nullptr},
             {"pre_tokenizer", byte_level},
             {"post_processor", nullptr},
             {"decoder", byte_level},
             {"model",
              {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
               {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
               {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
               {"vocab", vocab}, {"merges", merges}}}};
  return j.dump(1);
}

Status Tokenizer::save_hf_json(const std::string& path) const {
  return write_file_atomic(path, {to_hf_json()});
}

namespace {
// obj[key] when present (a string or a bool, as T), else `fallback`; DataLoss naming the key when
// it has another type (nlohmann's value() would throw).
template <class T>
Expected<T> field_or(const nlohmann::json& obj, const char* where, const char* key, T fallback) {
  if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return fallback;
  const nlohmann::json& v = obj[key];
  const bool right = std::is_same_v<T, bool> ? v.is_boolean() : v.is_string();
  if (!right) return data_loss("tokenizer.json {}.{} must be a {}", where, key, std::is_same_v<T, bool> ? "boolean" : "string");
  return v.get<T>();
}
}  // namespace

Expected<Tokenizer> Tokenizer::parse_hf_json(std::string_view text) {
  auto parsed = parse_json(text, "tokenizer.json");
  if (!parsed.ok()) return data_loss("{}", parsed.status().message());
  const nlohmann::json j = std::move(*parsed);
  if (!j.is_object()) return data_loss("tokenizer.json is not a JSON object");
  if (!j.contains("model") || !j["model"].is_object()) return data_loss("tokenizer.json has no model");
  const auto& model = j["model"];
  KILN_ASSIGN_OR_RETURN(const std::string model_type, field_or(model, "model", "type", std::string("BPE")));
  if (model_type != "BPE") return unimplemented("tokenizer model type '{}' (only BPE is supported)", model_type);
  const auto& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json();
  KILN_ASSIGN_OR_RETURN(const std::string pre_type, field_or(pre, "pre_tokenizer", "type", std::string("?")));
  if (!pre.is_object() || pre_type != "ByteLevel")
    return unimplemented("pre-tokenizer {} (only a plain ByteLevel pre-tokenizer is supported)",
                         pre.is_object() ? pre_type : std::string("null"));
  KILN_ASSIGN_OR_RETURN(const bool use_regex, field_or(pre, "pre_tokenizer", "use_regex", true));
  if (!use_regex) return unimplemented("ByteLevel pre-tokenizer without its regex");
  KILN_ASSIGN_OR_RETURN(const bool add_prefix_space, field_or(pre, "pre_tokenizer", "add_prefix_space", false));
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    return unimplemented("tokenizer.json normalizers are not supported");
  if (!model.contains("vocab") || !model["vocab"].is_object()) return data_loss("tokenizer.json model has no vocab");
  if (!model.contains("merges") || !model["merges"].is_array()) return data_loss("tokenizer.json model has no merges");

  VocabFile raw;
  for (const auto& [k, v] : model["vocab"].items()) {
    if (!v.is_number_integer()) return data_loss("vocab entry '{}' has a non-integer id", k);
    raw.vocab.emplace_back(k, v.get<int64_t>());
  }
  for (const auto& m : model["merges"]) {
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return data_loss("merge '{}' is not two tokens separated by one space", s);
      raw.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      raw.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return data_loss("a merge is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a.contains("content") || !a["id"].is_number_integer() ||
          !a["content"].is_string())
        return data_loss("malformed added_tokens entry");
      raw.specials.emplace_back(a["content"].get<std::string>(), a["id"].get<int64_t>());
    }
  }
  return from_vocab_file(raw, add_prefix_space);
}

Expected<Tokenizer> Tokenizer::from_vocab_file(const VocabFile& file, bool add_prefix_space) {
  if (file.vocab.size() + file.specials.size() > kMaxVocab)
    return invalid_argument("vocabulary of {} tokens is too large", file.vocab.size() + file.specials.size());
  int64_t max_id = -1;
  for (const auto& e : file.vocab) max_id = std::max(max_id, e.second);
  for (const auto& e : file.specials) max_id = std::max(max_id, e.second);
  if (max_id >= static_cast<int64_t>(kMaxVocab)) return data_loss("token id {} is too large", max_id);
  const size_t n = static_cast<size_t>(max_id + 1);
  Tokenizer t;
  t.add_prefix_space_ = add_prefix_space;
  t.tokens_.assign(n, std::string());
  std::vector<bool> seen(n, false);
  std::unordered_map<std::string, int32_t> by_string;  // byte-level string -> id
  for (const auto& [s, id] : file.vocab) {
    if (id < 0 || static_cast<size_t>(id) >= n)
      return data_loss("vocab id {} of '{}' is outside [0, {})", id, s, n);
    auto bytes = unicode_to_bytes(s);
    if (!bytes.ok()) return data_loss("vocab token '{}': {}", s, bytes.status().message());
    if (seen[id]) return data_loss("vocab id {} is used twice", id);
    seen[id] = true;
    t.tokens_[id] = std::move(bytes).value();
    by_string.emplace(s, static_cast<int32_t>(id));
  }
  for (const auto& [s, id] : file.specials) {
    if (id < 0 || static_cast<size_t>(id) >= n)
      return data_loss("special token id {} of '{}' is outside [0, {})", id, s, n);
    if (seen[id]) {
      if (t.tokens_[id] != s && by_string.count(s) == 0)
        return data_loss("special token '{}' reuses id {}", s, id);
    }
    seen[id] = true;
    t.tokens_[id] = s;
    t.specials_.push_back(static_cast<int32_t>(id));
  }
  for (size_t i = 0; i < n; ++i)
    if (!seen[i]) return data_loss("token ids are not dense: id {} is missing", i);
  for (const auto& [l, r] : file.merges) {
    auto li = by_string.find(l), ri = by_string.find(r), mi = by_string.find(l + r);
    if (li == by_string.end() || ri == by_string.end())
      return data_loss("merge '{} {}' names a token not in the vocab", l, r);
    if (mi == by_string.end()) return data_loss("merge '{} {}' makes a token not in the vocab", l, r);
    t.merges_.push_back({li->second, ri->second, mi->second});
  }
  KILN_RETURN_IF_ERROR(t.finalize());
  return t;
}

Expected<Tokenizer> Tokenizer::load_hf_json(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(path, kMaxFileBytes));
  auto t = parse_hf_json(text);
  if (!t.ok()) return Status(t.status().code(), fmt::format("{}: {}", path, t.status().message()));
  return t;
}

Expected<Tokenizer> Tokenizer::load_gpt2(const std::string& encoder_json, const std::string& vocab_bpe) {
  KILN_ASSIGN_OR_RETURN(std::string enc_text, read_file(encoder_json, kMaxFileBytes));
  KILN_ASSIGN_OR_RETURN(std::string bpe_text, read_file(vocab_bpe, kMaxFileBytes));
  auto parsed = parse_json(enc_text, encoder_json);
  if (!parsed.ok()) return data_loss("{}", parsed.status().message());
  const nlohmann::json j = std::move(*parsed);
  if (!j.is_object()) return data_loss("{} is not a JSON object", encoder_json);
  VocabFile raw;
  for (const auto& [k, v] : j.items()) {
    if (!v.is_number_integer()) return data_loss("{}: entry '{}' has a non-integer id", encoder_json, k);
    if (k.size() > 2 && k.front() == '<' && k.back() == '>' && k.find('|') != std::string::npos)
      raw.specials.emplace_back(k, v.get<int64_t>());  // e.g. <|endoftext|>
    else
      raw.vocab.emplace_back(k, v.get<int64_t>());
  }
  std::istringstream lines(bpe_text);
  std::string line;
  int line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
      return data_loss("{}:{}: a merge line must be two tokens separated by one space", vocab_bpe, line_no);
    raw.merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  auto t = from_vocab_file(raw, false);
  if (!t.ok()) return Status(t.status().code(), fmt::format("{}: {}", encoder_json, t.status().message()));
  return t;
}

}  // namespace kiln::tok
