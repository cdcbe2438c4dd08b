// The training checkpoint file (format kiln-checkpoint-2): a checksummed JSON header and the
// params, AdamW m and v sections, each with its own CRC-32C, so a byte flipped anywhere is
// refused on load, naming the section, instead of resuming with NaN or garbage.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/core/status.h"

namespace kiln {

// Layout (little-endian):
//   "KILNCKPT" | u64 n | header JSON (n bytes) | u32 CRC-32C of the 16 + n bytes before it |
//   params | m | v          (each num_params f32; sizes and CRC-32Cs named in the header)
// Format 1 (no checksums, no header CRC) is refused with a message saying so: a file that cannot
// be verified is not resumed from.
constexpr std::string_view kCheckpointFormat = "kiln-checkpoint-2";
constexpr uint64_t kMaxCheckpointHeaderBytes = uint64_t{1} << 20;

// The sections, in file order (also the order of a shard file's, sharded_checkpoint.h).
inline constexpr const char* kCheckpointSectionNames[3] = {"params", "m", "v"};

struct CheckpointSection {
  std::string name;     // "params", "m", "v"
  uint64_t offset = 0;  // from the start of the file
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

struct CheckpointHeader {
  int64_t step = 0;
  int64_t num_params = 0;
  std::string model;       // ModelConfig::describe() of the model that wrote it
  nlohmann::json options;  // the training options that decide the losses (an object)
  double loss_scale = 1.0;
  int64_t loss_scale_good_steps = 0;
  std::optional<int64_t> time_budget_steps;  // the step count a time budget fixed
  std::vector<CheckpointSection> sections;   // params, m, v in file order
};

// The bytes before the sections: magic, length, header JSON, header CRC-32C. Section offsets
// are computed here (the caller fills name, bytes and crc32c).
std::string encode_checkpoint_prefix(CheckpointHeader& h);

// How many bytes of the file parse_checkpoint_header needs (16 + n + 4), from its first 16.
Expected<uint64_t> checkpoint_prefix_bytes(std::string_view first16, uint64_t file_size);

// Fuzzer entry point. Checks magic, header length, the header's CRC-32C, every field's JSON type
// and that the sections are params, m, v of 4 * num_params bytes each, tiling the rest of a file
// of `file_size` bytes exactly. `prefix`: the file's first bytes, at least
// checkpoint_prefix_bytes of them. Never throws; errors are DataLoss (Unimplemented for format 1).
Expected<CheckpointHeader> parse_checkpoint_header(std::string_view prefix, uint64_t file_size);

}  // namespace kiln
