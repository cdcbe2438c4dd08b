// File helpers shared by every format kiln writes (shards, checkpoints, weights, tokenizers).
#include "kiln/core/file_io.h"

#include <filesystem>
#include <fstream>

namespace kiln {

Expected<std::string> read_file(const std::string& path, int64_t max_bytes) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return not_found("cannot read {}: {}", path, ec.message());
  if (static_cast<int64_t>(size) > max_bytes)
    return invalid_argument("{} is {} bytes, more than the {} allowed here", path, size, max_bytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open {}", path);
  std::string data(size, '\0');
  if (!in.read(data.data(), static_cast<std::streamsize>(size))) return data_loss("short read from {}", path);
  return data;
}

Status write_file_atomic(const std::string& path, std::initializer_list<std::string_view> pieces) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) return not_found("cannot write {}", tmp);
    for (std::string_view p : pieces) out.write(p.data(), static_cast<std::streamsize>(p.size()));
    if (!out) return data_loss("write to {} failed", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return internal_error("rename {} -> {}: {}", tmp, path, ec.message());
  return {};
}

}  // namespace kiln
