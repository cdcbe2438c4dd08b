// The checkpoint file format (checkpoint.h): writing the checksummed prefix and parsing it back
// with every field type-checked (a string where a number belongs is an error, never a throw).
#include "kiln/train/checkpoint.h"

#include <cmath>
#include <cstring>

#include "kiln/core/checked_math.h"
#include "kiln/core/crc32c.h"
#include "kiln/core/json.h"

namespace kiln {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'K', 'P', 'T'};
constexpr int64_t kMaxStep = int64_t{1} << 62;

using json = nlohmann::json;

const json* field(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

Expected<int64_t> get_count(const json& j, const char* key, const char* where) {
  const json* v = field(j, key);
  if (v == nullptr || !v->is_number_unsigned() || v->get<uint64_t>() > static_cast<uint64_t>(kMaxStep))
    return data_loss("checkpoint {}: '{}' is missing or not a non-negative integer", where, key);
  return static_cast<int64_t>(v->get<uint64_t>());
}

}  // namespace

std::string encode_checkpoint_prefix(CheckpointHeader& h) {
  json header = {{"format", std::string(kCheckpointFormat)}, {"step", h.step}, {"num_params", h.num_params},
                 {"model", h.model}, {"options", h.options}, {"loss_scale", h.loss_scale},
                 {"loss_scale_good_steps", h.loss_scale_good_steps}};
  if (h.time_budget_steps) header["time_budget_steps"] = *h.time_budget_steps;
  json sections = json::array();
  for (const CheckpointSection& s : h.sections)
    sections.push_back({{"name", s.name}, {"bytes", s.bytes}, {"crc32c", s.crc32c}});
  header["sections"] = sections;
  const std::string text = header.dump();
  const uint64_t n = text.size();
  std::string out(kMagic, 8);
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += text;
  const uint32_t crc = crc32c(out);
  out.append(reinterpret_cast<const char*>(&crc), 4);
  uint64_t offset = out.size();
  for (CheckpointSection& s : h.sections) {
    s.offset = offset;
    offset += s.bytes;
  }
  return out;
}

Expected<uint64_t> checkpoint_prefix_bytes(std::string_view first16, uint64_t file_size) {
  if (first16.size() < 16 || file_size < 16 || std::memcmp(first16.data(), kMagic, 8) != 0)
    return data_loss("not a kiln checkpoint (no KILNCKPT magic)");
  uint64_t n = 0;
  std::memcpy(&n, first16.data() + 8, 8);
  if (n > kMaxCheckpointHeaderBytes || n > file_size - 16)
    return data_loss("header length {} is corrupt (file of {} bytes)", n, file_size);
  return 16 + n + 4;  // may pass the end of a format-1 file, which has no header CRC
}

Expected<CheckpointHeader> parse_checkpoint_header(std::string_view prefix, uint64_t file_size) {
  KILN_ASSIGN_OR_RETURN(const uint64_t need, checkpoint_prefix_bytes(prefix, file_size));
  const uint64_t n = need - 20;
  if (prefix.size() < 16 + n) return data_loss("{} header bytes given, the header holds {}", prefix.size() - 16, n);
  const std::string_view text = prefix.substr(16, n);
  uint32_t stored = 0;
  const bool crc_ok = need <= file_size && prefix.size() >= need &&
                      (std::memcpy(&stored, prefix.data() + 16 + n, 4), crc32c(prefix.substr(0, 16 + n)) == stored);
  if (!crc_ok) {
    // Format 1 had no header CRC: say so rather than "corrupt" (the JSON is only looked at).
    auto old = parse_json(text, "checkpoint header", {.max_depth = 16, .max_bytes = static_cast<int64_t>(n)});
    if (old.ok() && old->is_object()) {
      const json* format = field(*old, "format");
      if (format && format->is_string() && format->get<std::string>() == "kiln-checkpoint-1")
        return unimplemented("format kiln-checkpoint-1 has no checksums, so its contents cannot be verified; "
                             "kiln resumes only from {} checkpoints (restart the run, or resume it with the kiln "
                             "that wrote it)",
                             kCheckpointFormat);
    }
    if (need > file_size) return data_loss("checkpoint is truncated inside its header");
    return data_loss("checkpoint section header: CRC-32C mismatch (the file is corrupted)");
  }
  KILN_ASSIGN_OR_RETURN(json j, parse_json(text, "checkpoint header", {.max_depth = 16, .max_bytes = static_cast<int64_t>(n)}));
  if (!j.is_object()) return data_loss("checkpoint header is not a JSON object");
  const json* format = field(j, "format");
  if (format == nullptr || !format->is_string() || format->get<std::string>() != kCheckpointFormat)
    return unimplemented("checkpoint format {} (kiln reads {})", format ? format->dump() : "missing", kCheckpointFormat);

  CheckpointHeader h;
  KILN_ASSIGN_OR_RETURN(h.step, get_count(j, "step", "header"));
  KILN_ASSIGN_OR_RETURN(h.num_params, get_count(j, "num_params", "header"));
  KILN_ASSIGN_OR_RETURN(h.loss_scale_good_steps, get_count(j, "loss_scale_good_steps", "header"));
  if (field(j, "time_budget_steps")) {
    KILN_ASSIGN_OR_RETURN(h.time_budget_steps, get_count(j, "time_budget_steps", "header"));
  }
  const json* model = field(j, "model");
  if (model == nullptr || !model->is_string()) return data_loss("checkpoint header: 'model' is missing or not a string");
  h.model = model->get<std::string>();
  const json* options = field(j, "options");
  if (options == nullptr || !options->is_object())
    return data_loss("checkpoint header: 'options' is missing or not an object");
  h.options = *options;
  const json* scale = field(j, "loss_scale");
  if (scale == nullptr || !scale->is_number() || !std::isfinite(scale->get<double>()) || !(scale->get<double>() > 0))
    return data_loss("checkpoint header: 'loss_scale' is missing or not a positive number");
  h.loss_scale = scale->get<double>();

  const json* sections = field(j, "sections");
  if (sections == nullptr || !sections->is_array() || sections->size() != 3)
    return data_loss("checkpoint header: 'sections' is not a list of 3 (params, m, v)");
  const std::optional<uint64_t> section_bytes = checked_mul(static_cast<uint64_t>(h.num_params), uint64_t{4});
  uint64_t offset = need;
  for (size_t i = 0; i < 3; ++i) {
    const json& s = (*sections)[i];
    if (!s.is_object()) return data_loss("checkpoint header: section {} is not an object", i);
    const json* name = field(s, "name");
    if (name == nullptr || !name->is_string() || name->get<std::string>() != kCheckpointSectionNames[i])
      return data_loss("checkpoint header: section {} is not '{}'", i, kCheckpointSectionNames[i]);
    CheckpointSection sec;
    sec.name = kCheckpointSectionNames[i];
    const json* bytes = field(s, "bytes");
    const json* crc = field(s, "crc32c");
    if (bytes == nullptr || !bytes->is_number_unsigned() || !section_bytes || bytes->get<uint64_t>() != *section_bytes)
      return data_loss("checkpoint section {}: 'bytes' is not 4 x num_params ({})", sec.name, h.num_params);
    if (crc == nullptr || !crc->is_number_unsigned() || crc->get<uint64_t>() > 0xFFFFFFFFu)
      return data_loss("checkpoint section {}: 'crc32c' is missing or not a 32-bit unsigned integer", sec.name);
    sec.bytes = *section_bytes;
    sec.crc32c = static_cast<uint32_t>(crc->get<uint64_t>());
    sec.offset = offset;
    const std::optional<uint64_t> next = checked_add(offset, sec.bytes);
    if (!next || *next > file_size)
      return data_loss("checkpoint section {} passes the end of the {}-byte file (truncated?)", sec.name, file_size);
    offset = *next;
    h.sections.push_back(std::move(sec));
  }
  if (offset != file_size)
    return data_loss("checkpoint holds {} bytes after its sections (size does not match its header)",
                     file_size - offset);
  return h;
}

}  // namespace kiln
