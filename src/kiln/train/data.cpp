// Shard I/O (temporary file + rename; every header field checked on read) and batch sampling.
#include "kiln/train/data.h"

#include "kiln/core/file_io.h"

#include <cstring>
#include <filesystem>
#include <fstream>

namespace kiln {
namespace {
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'T', 'O', 'K', '1'};
constexpr int kHeaderBytes = 64;
}  // namespace

Status write_shard(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size) {
  const uint32_t width = vocab_size <= 65536 ? 2 : 4;
  char header[kHeaderBytes] = {};
  std::memcpy(header, kMagic, 8);
  const uint32_t version = 1, vocab = static_cast<uint32_t>(vocab_size);
  const uint64_t n = tokens.size();
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &width, 4);
  std::memcpy(header + 16, &n, 8);
  std::memcpy(header + 24, &vocab, 4);
  if (width == 2) {
    const std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
    return write_file_atomic(path, {std::string_view(header, kHeaderBytes), as_bytes(narrow.data(), narrow.size())});
  }
  return write_file_atomic(path, {std::string_view(header, kHeaderBytes), as_bytes(tokens.data(), tokens.size())});
}

Expected<TokenShard> read_shard(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return not_found("cannot read token shard {}: {}", path, ec.message());
  std::ifstream in(path, std::ios::binary);
  char header[kHeaderBytes];
  if (size < kHeaderBytes || !in.read(header, kHeaderBytes))
    return data_loss("{}: shorter than the {}-byte shard header", path, kHeaderBytes);
  if (std::memcmp(header, kMagic, 8) != 0) return data_loss("{}: not a kiln token shard (bad magic)", path);
  uint32_t version, width, vocab;
  uint64_t n;
  std::memcpy(&version, header + 8, 4);
  std::memcpy(&width, header + 12, 4);
  std::memcpy(&n, header + 16, 8);
  std::memcpy(&vocab, header + 24, 4);
  if (version != 1) return data_loss("{}: shard version {} (expected 1)", path, version);
  if (width != 2 && width != 4) return data_loss("{}: {} bytes per token (expected 2 or 4)", path, width);
  if (n > (size - kHeaderBytes) / width || kHeaderBytes + n * width != size)
    return data_loss("{}: header says {} tokens of {} bytes but the file has {} bytes", path, n, width, size);
  if (vocab == 0) return data_loss("{}: vocabulary size 0", path);
  TokenShard s;
  s.vocab_size = vocab;
  s.tokens.resize(n);
  if (width == 2) {
    std::vector<uint16_t> t(n);
    in.read(reinterpret_cast<char*>(t.data()), static_cast<std::streamsize>(n * 2));
    std::copy(t.begin(), t.end(), s.tokens.begin());
  } else {
    in.read(reinterpret_cast<char*>(s.tokens.data()), static_cast<std::streamsize>(n * 4));
  }
  if (!in) return data_loss("{}: short read", path);
  for (uint64_t i = 0; i < n; ++i)
    if (s.tokens[i] < 0 || s.tokens[i] >= static_cast<int32_t>(vocab))
      return data_loss("{}: token {} at position {} is outside the vocabulary of {}", path, s.tokens[i], i, vocab);
  return s;
}

BatchLoader::BatchLoader(const TokenShard* shard, int64_t batch, int64_t seq_len, uint64_t seed)
    : shard_(shard), batch_(batch), seq_len_(seq_len), seed_(seed) {
  KILN_CHECK_MSG(static_cast<int64_t>(shard->tokens.size()) > seq_len + 1, "shard of {} tokens is shorter than a window of {}",
                 shard->tokens.size(), seq_len + 1);
}

void BatchLoader::batch_at(int64_t index, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) const {
  inputs.resize(static_cast<size_t>(batch_ * seq_len_));
  targets.resize(inputs.size());
  batch_at(index, inputs.data(), targets.data());
}

void BatchLoader::batch_at(int64_t index, int32_t* inputs, int32_t* targets) const {
  Rng rng(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index));
  const uint64_t starts = shard_->tokens.size() - static_cast<uint64_t>(seq_len_) - 1;
  for (int64_t b = 0; b < batch_; ++b) {
    const int32_t* src = shard_->tokens.data() + rng.below(starts + 1);
    std::copy(src, src + seq_len_, inputs + b * seq_len_);
    std::copy(src + 1, src + 1 + seq_len_, targets + b * seq_len_);
  }
}

bool BatchLoader::eval_batch(int64_t index, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) const {
  inputs.resize(static_cast<size_t>(batch_ * seq_len_));
  targets.resize(inputs.size());
  for (int64_t b = 0; b < batch_; ++b) {
    const uint64_t start = static_cast<uint64_t>((index * batch_ + b) * seq_len_);
    if (start + seq_len_ + 1 > shard_->tokens.size()) return false;
    const int32_t* src = shard_->tokens.data() + start;
    std::copy(src, src + seq_len_, inputs.begin() + b * seq_len_);
    std::copy(src + 1, src + 1 + seq_len_, targets.begin() + b * seq_len_);
  }
  return true;
}

}  // namespace kiln
