// The one safetensors reader (every model, quantized model and test dump goes through it). It
// accepts exactly the files the reference implementation (huggingface/safetensors) accepts,
// and parses from bytes in memory, so a fuzzer can drive it without files.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/status.h"

namespace kiln {

// The rules, as the reference applies them (safetensors/src/tensor.rs, read_metadata + validate):
//  * u64 little-endian header length n, n <= 100'000'000, 8 + n <= file size;
//  * the n bytes are one JSON object (UTF-8, no byte-order mark; whitespace around it is fine,
//    anything else after it is not), nested at most kMaxSafetensorsJsonDepth deep;
//  * "__metadata__" at most once, null or an object of string -> string;
//  * every other key a tensor: an object with exactly one each of "dtype" (a known name,
//    case-sensitive), "shape" (an array of non-negative integers) and "data_offsets" (an array of
//    exactly two non-negative integers); other fields are ignored; a name given twice keeps
//    its last entry (each must still be valid);
//  * shape product x dtype bits a whole number of bytes, with no u64 overflow along the way
//    (folded left to right, as the reference does), equal to end - begin;
//  * sorted by (begin, end), the tensors tile the data buffer from 0: each begins where the
//    previous ended (no hole, no overlap), and the last ends exactly at the end of the file.
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
constexpr int64_t kMaxSafetensorsJsonDepth = 127;  // serde_json's recursion limit, as measured

struct SafetensorsTensor {
  std::string name;
  std::string dtype;             // as in the file: "F32", "BF16", "F8_E4M3", ...
  int dtype_bits = 0;            // 4, 6, 8, 16, 32 or 64
  std::vector<uint64_t> shape;   // (u64: a dim may be huge when another is 0)
  uint64_t begin = 0, end = 0;   // byte offsets into the data buffer (after the header)

  uint64_t num_bytes() const { return end - begin; }
  bool shape_is(std::span<const int64_t> want) const;
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;  // n
  uint64_t data_start = 0;    // 8 + n: where the data buffer starts in the file
  uint64_t data_bytes = 0;    // file size - data_start (every byte belongs to a tensor)
  std::optional<std::map<std::string, std::string>> metadata;  // absent or null: nullopt
  std::vector<SafetensorsTensor> tensors;                      // sorted by data offset

  // Null when there is no tensor of that name.
  const SafetensorsTensor* find(std::string_view name) const;
  // The __metadata__ value of `key`, "" when absent.
  std::string metadata_value(const std::string& key) const;

  std::map<std::string, size_t, std::less<>> index;  // name -> position in tensors
};

// The bits of one element of a safetensors dtype name; 0 when the reference does not know it.
int safetensors_dtype_bits(std::string_view dtype);

// The header length n from the file's first 8 bytes (`first8` may be longer): DataLoss when the
// file is shorter than 8 bytes, n is above the limit or 8 + n passes the end of the file.
Expected<uint64_t> safetensors_header_length(std::string_view first8, uint64_t file_size);

// Fuzzer entry point. Parses and validates a header. `prefix` holds the file's first bytes, at
// least 8 + n of them (the whole file is fine); `file_size` is the whole file's size, which the
// tensors must tile. Never throws; every rejection is DataLoss naming the rule broken.
Expected<SafetensorsHeader> parse_safetensors_header(std::string_view prefix, uint64_t file_size);

// A safetensors file on disk: open() reads and validates the header only; tensors are read one
// at a time, so a loader can check every name and shape before allocating anything.
class SafetensorsFile {
 public:
  static Expected<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  // The entry of `name`, or DataLoss naming the file and the tensor.
  Expected<const SafetensorsTensor*> tensor(std::string_view name) const;
  // The tensor's bytes into out (exactly t.num_bytes() of them).
  Status read_into(const SafetensorsTensor& t, std::span<char> out);
  Expected<std::string> read(const SafetensorsTensor& t);

 private:
  std::string path_;
  SafetensorsHeader header_;
  std::unique_ptr<std::ifstream> in_;
};

}  // namespace kiln
