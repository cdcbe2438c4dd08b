// Whole-file reads with a size bound, and atomic writes (temporary file + rename, so a reader
// or a crash never leaves a half-written checkpoint, shard or tokenizer behind).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "kiln/core/status.h"

namespace kiln {

// NotFound when the file cannot be opened; InvalidArgument when it is larger than max_bytes.
Expected<std::string> read_file(const std::string& path, int64_t max_bytes = int64_t{1} << 32);

// Writes the pieces, in order, to path + ".tmp" and renames it over path.
Status write_file_atomic(const std::string& path, std::initializer_list<std::string_view> pieces);

// Bytes of a trivially copyable array, for write_file_atomic.
template <class T>
std::string_view as_bytes(const T* data, size_t count) {
  return {reinterpret_cast<const char*>(data), count * sizeof(T)};
}

}  // namespace kiln
