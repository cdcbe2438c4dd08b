// Sharded checkpoints (sharded_checkpoint.h): shard files and the manifest written, the manifest
// parsed back with every field type-checked and every size bounded, and any layout's ranges read
// out of whichever files hold them, each file's sections verified whole.
#include "kiln/train/sharded_checkpoint.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

#include "kiln/comm/collectives.h"
#include "kiln/core/crc32c.h"
#include "kiln/core/file_io.h"
#include "kiln/core/json.h"

namespace kiln {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr char kShardMagic[8] = {'K', 'I', 'L', 'N', 'S', 'H', 'R', 'D'};
constexpr uint64_t kMaxCount = uint64_t{1} << 62;  // steps, parameters, bytes
constexpr uint64_t kShardPrefixOverhead = 20;      // magic, length, CRC-32C around the header
// A view's ranges at most: its shard header (~30 B a range) then stays under
// kMaxShardHeaderBytes, and a peer's manifest entry under kMaxManifestBytes.
constexpr size_t kMaxRangesPerShard = size_t{1} << 20;
// Sections are read in pieces of this size, checksummed, and the pieces of this rank's ranges
// copied out: a 4 MiB read costs far more than the call, and the buffer stays small. A multiple
// of 4, so a piece holds whole f32s.
constexpr uint64_t kReadPieceBytes = uint64_t{4} << 20;
// The point-to-point messages that carry manifest entries to rank 0 (collectives use 11-24).
constexpr int kTagShardEntry = 0x4b43;
// The longest status agree() carries to every rank, code and length included.
constexpr size_t kAgreeBytes = 4096;

using Staged = std::array<std::vector<float>, 3>;  // params, m, v of one view

std::span<float> section_of(const ShardView& v, int i) {
  return i == 0 ? v.params : i == 1 ? v.m : v.v;
}

// Collective: ok on every rank when `local` is ok on every rank; otherwise, on every rank, the
// error of the lowest failing rank, so all of them say the same.
Status agree(comm::Communicator& comm, const Status& local) {
  const int p = comm.size();
  // The max over ranks of p - rank where failing names the lowest failing rank (exact in f32).
  const float flag = local.ok() ? 0.0f : static_cast<float>(p - comm.rank());
  float worst = 0.0f;
  KILN_RETURN_IF_ERROR(comm::all_reduce(comm, &flag, &worst, 1, DType::kF32, comm::ReduceOp::kMax));
  if (worst == 0.0f) return {};
  const int root = p - static_cast<int>(worst);
  // Code, length and message as bytes (in f32 words: a broadcast moves them unchanged).
  alignas(float) std::array<char, kAgreeBytes> buf{};
  if (comm.rank() == root) {
    const auto code = static_cast<uint32_t>(local.code());
    const auto len = static_cast<uint32_t>(std::min(local.message().size(), kAgreeBytes - 8));
    std::memcpy(buf.data(), &code, 4);
    std::memcpy(buf.data() + 4, &len, 4);
    std::memcpy(buf.data() + 8, local.message().data(), len);
  }
  KILN_RETURN_IF_ERROR(comm::broadcast(comm, buf.data(), kAgreeBytes / 4, DType::kF32, root));
  uint32_t code = 0, len = 0;
  std::memcpy(&code, buf.data(), 4);
  std::memcpy(&len, buf.data() + 4, 4);
  return {static_cast<StatusCode>(code), std::string(buf.data() + 8, len)};
}

// Collective: every rank's `text` at rank 0, in rank order (nothing elsewhere). Point to point,
// since the texts differ in length.
std::vector<std::string> gather_at_root(comm::Communicator& comm, const std::string& text) {
  if (comm.rank() != 0) {
    const uint64_t n = text.size();
    comm.send(&n, sizeof(n), 0, kTagShardEntry);
    comm.send(text.data(), n, 0, kTagShardEntry);
    return {};
  }
  std::vector<std::string> out(comm.size());
  out[0] = text;
  for (int q = 1; q < comm.size(); ++q) {
    uint64_t n = 0;
    comm.recv(&n, sizeof(n), q, kTagShardEntry);
    KILN_CHECK_MSG(n <= static_cast<uint64_t>(kMaxManifestBytes), "rank {} sent a {}-byte entry", q,
                   n);
    out[q].resize(n);
    comm.recv(out[q].data(), n, q, kTagShardEntry);
  }
  return out;
}

// Sorted, disjoint, begin <= end, inside [0, num_params): their total size.
Expected<int64_t> total_size(std::span<const FlatRange> ranges, int64_t num_params) {
  int64_t prev_end = 0, total = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const FlatRange& r = ranges[i];
    if (r.end > num_params)
      return out_of_range("range {} [{}, {}) passes the end of the {} parameters", i, r.begin,
                          r.end, num_params);
    if (r.begin < prev_end || r.end < r.begin)
      return invalid_argument("range {} [{}, {}) is not sorted, disjoint and of size >= 0", i,
                              r.begin, r.end);
    total += r.size();
    prev_end = r.end;
  }
  return total;
}

Status check_view(const ShardView& v, std::string_view op) {
  if (v.num_params < 0 || static_cast<uint64_t>(v.num_params) > kMaxCount)
    return invalid_argument("[{}] num_params {} is out of range", op, v.num_params);
  if (v.ranges.size() > kMaxRangesPerShard)
    return invalid_argument("[{}] {} ranges in one view (at most {})", op, v.ranges.size(),
                            kMaxRangesPerShard);
  const Expected<int64_t> total = total_size(v.ranges, v.num_params);
  if (!total.ok())
    return {total.status().code(), fmt::format("[{}] {}", op, total.status().message())};
  for (int i = 0; i < 3; ++i)
    if (static_cast<int64_t>(section_of(v, i).size()) != *total)
      return invalid_argument("[{}] the ranges hold {} elements, {} holds {}", op, *total,
                              kCheckpointSectionNames[i], section_of(v, i).size());
  return {};
}

json ranges_json(std::span<const FlatRange> ranges) {
  json a = json::array();
  for (const FlatRange& r : ranges) a.push_back(json::array({r.begin, r.end}));
  return a;
}

// ---- Writing ----

struct EncodedShard {
  std::string prefix;            // magic, length, header JSON, its CRC-32C
  std::string_view sections[3];  // params, m, v
  std::string entry;             // the manifest's entry for this file (JSON)
};

EncodedShard encode_shard(const ShardView& mine, int shard, int num_shards) {
  EncodedShard e;
  const json ranges = ranges_json(mine.ranges);
  uint32_t crcs[3];
  json header_sections = json::array();
  for (int i = 0; i < 3; ++i) {
    e.sections[i] = as_bytes(section_of(mine, i).data(), section_of(mine, i).size());
    crcs[i] = crc32c(e.sections[i]);
    header_sections.push_back(
        {{"name", kCheckpointSectionNames[i]}, {"bytes", e.sections[i].size()}, {"crc32c", crcs[i]}});
  }
  const json header = {
      {"format", std::string(kShardFileFormat)}, {"shard", shard},   {"num_shards", num_shards},
      {"num_params", mine.num_params},           {"ranges", ranges}, {"sections", header_sections}};
  const std::string text = header.dump();
  const uint64_t n = text.size();
  e.prefix.assign(kShardMagic, 8);
  e.prefix.append(reinterpret_cast<const char*>(&n), 8);
  e.prefix += text;
  const uint32_t header_crc = crc32c(e.prefix);
  e.prefix.append(reinterpret_cast<const char*>(&header_crc), 4);
  uint64_t offset = e.prefix.size();
  json entry_sections = json::array();
  for (int i = 0; i < 3; ++i) {
    entry_sections.push_back({{"name", kCheckpointSectionNames[i]},
                              {"offset", offset},
                              {"bytes", e.sections[i].size()},
                              {"crc32c", crcs[i]}});
    offset += e.sections[i].size();
  }
  e.entry = json{{"file", shard_file_name(shard, num_shards)},
                 {"bytes", offset},
                 {"header_crc32c", header_crc},
                 {"ranges", ranges},
                 {"sections", entry_sections}}
                .dump();
  return e;
}

json meta_json(const CheckpointHeader& h) {
  json j = {{"step", h.step},
            {"num_params", h.num_params},
            {"model", h.model},
            {"options", h.options},
            {"loss_scale", h.loss_scale},
            {"loss_scale_good_steps", h.loss_scale_good_steps}};
  if (h.time_budget_steps) j["time_budget_steps"] = *h.time_budget_steps;
  return j;
}

// Rank 0 before any shard is written: the directory exists and holds no manifest, so a save that
// fails part-way leaves an incomplete checkpoint, never an old manifest naming new files.
Status prepare_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec))
    return failed_precondition("cannot make directory {}: {}", dir, ec.message());
  fs::remove(fs::path(dir) / kManifestFileName, ec);
  if (ec)
    return failed_precondition("cannot remove the old {}/{}: {}", dir, kManifestFileName,
                               ec.message());
  return {};
}

// ---- Reading ----

// A file of params | m | v sections as a load reads it.
struct SourceFile {
  std::string path;
  uint64_t bytes = 0;             // the file's size
  std::vector<FlatRange> ranges;  // what its sections hold, in order
  std::array<CheckpointSection, 3> sections;
  std::optional<uint32_t> header_crc32c;  // a shard file: its prefix's, as the manifest names it
};

// A checkpoint: the run metadata and the files that hold its state.
struct Source {
  CheckpointHeader meta;
  std::vector<SourceFile> files;
};

const json* field(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

// j[key] as an integer in [0, max], or DataLoss naming where and key.
Expected<uint64_t> get_uint(const json& j, const char* key, uint64_t max,
                            const std::string& where) {
  const json* v = field(j, key);
  if (v == nullptr || !v->is_number_unsigned() || v->get<uint64_t>() > max)
    return data_loss("{}: '{}' is missing or not an integer in [0, {}]", where, key, max);
  return v->get<uint64_t>();
}

Expected<CheckpointHeader> parse_meta(const json& j, const std::string& where) {
  CheckpointHeader h;
  KILN_ASSIGN_OR_RETURN(const uint64_t step, get_uint(j, "step", kMaxCount, where));
  KILN_ASSIGN_OR_RETURN(const uint64_t num_params, get_uint(j, "num_params", kMaxCount, where));
  KILN_ASSIGN_OR_RETURN(const uint64_t good_steps,
                        get_uint(j, "loss_scale_good_steps", kMaxCount, where));
  h.step = static_cast<int64_t>(step);
  h.num_params = static_cast<int64_t>(num_params);
  h.loss_scale_good_steps = static_cast<int64_t>(good_steps);
  if (field(j, "time_budget_steps")) {
    KILN_ASSIGN_OR_RETURN(const uint64_t budget,
                          get_uint(j, "time_budget_steps", kMaxCount, where));
    h.time_budget_steps = static_cast<int64_t>(budget);
  }
  const json* model = field(j, "model");
  const json* options = field(j, "options");
  const json* scale = field(j, "loss_scale");
  if (model == nullptr || !model->is_string())
    return data_loss("{}: 'model' is missing or not a string", where);
  if (options == nullptr || !options->is_object())
    return data_loss("{}: 'options' is missing or not an object", where);
  if (scale == nullptr || !scale->is_number() || !std::isfinite(scale->get<double>()) ||
      !(scale->get<double>() > 0))
    return data_loss("{}: 'loss_scale' is missing or not a positive number", where);
  h.model = model->get<std::string>();
  h.options = *options;
  h.loss_scale = scale->get<double>();
  return h;
}

Expected<std::vector<FlatRange>> parse_ranges(const json& j, int64_t num_params,
                                              const std::string& where) {
  const json* a = field(j, "ranges");
  if (a == nullptr || !a->is_array())
    return data_loss("{}: 'ranges' is missing or not a list", where);
  std::vector<FlatRange> out;
  for (const json& r : *a) {
    if (!r.is_array() || r.size() != 2 || !r[0].is_number_unsigned() ||
        !r[1].is_number_unsigned() || r[0].get<uint64_t>() > kMaxCount ||
        r[1].get<uint64_t>() > kMaxCount)
      return data_loss("{}: range {} is not [begin, end] of non-negative integers", where,
                       out.size());
    out.push_back(
        {static_cast<int64_t>(r[0].get<uint64_t>()), static_cast<int64_t>(r[1].get<uint64_t>())});
  }
  const Expected<int64_t> total = total_size(out, num_params);
  if (!total.ok()) return data_loss("{}: {}", where, total.status().message());
  return out;
}

// Manifest entry i of n: the file's name is the one shard i of n has (nothing else is opened), and
// its sections follow a prefix of bounded size, each 4 bytes per element of its ranges, and end
// where the file ends.
Expected<SourceFile> parse_entry(const json& s, int i, int n, int64_t num_params,
                                 const std::string& dir, const std::string& where) {
  if (!s.is_object()) return data_loss("{}: not an object", where);
  const std::string name = shard_file_name(i, n);
  const json* file = field(s, "file");
  if (file == nullptr || !file->is_string() || file->get<std::string>() != name)
    return data_loss("{}: 'file' is not \"{}\"", where, name);
  SourceFile f;
  f.path = (fs::path(dir) / name).string();
  KILN_ASSIGN_OR_RETURN(f.bytes, get_uint(s, "bytes", kMaxCount, where));
  KILN_ASSIGN_OR_RETURN(const uint64_t header_crc,
                        get_uint(s, "header_crc32c", 0xFFFFFFFFu, where));
  f.header_crc32c = static_cast<uint32_t>(header_crc);
  KILN_ASSIGN_OR_RETURN(f.ranges, parse_ranges(s, num_params, where));
  int64_t elements = 0;
  for (const FlatRange& r : f.ranges) elements += r.size();
  const uint64_t section_bytes =
      static_cast<uint64_t>(elements) * 4;  // elements <= num_params <= 2^62
  const json* sections = field(s, "sections");
  if (sections == nullptr || !sections->is_array() || sections->size() != 3)
    return data_loss("{}: 'sections' is not a list of 3 (params, m, v)", where);
  for (int k = 0; k < 3; ++k) {
    const json& sec = (*sections)[k];
    const std::string at = fmt::format("{}: section {}", where, kCheckpointSectionNames[k]);
    const json* sec_name = field(sec, "name");
    if (!sec.is_object() || sec_name == nullptr || !sec_name->is_string() ||
        *sec_name != kCheckpointSectionNames[k])
      return data_loss("{} is not an object named '{}'", at, kCheckpointSectionNames[k]);
    KILN_ASSIGN_OR_RETURN(const uint64_t offset, get_uint(sec, "offset", kMaxCount, at));
    KILN_ASSIGN_OR_RETURN(const uint64_t bytes, get_uint(sec, "bytes", kMaxCount, at));
    KILN_ASSIGN_OR_RETURN(const uint64_t crc, get_uint(sec, "crc32c", 0xFFFFFFFFu, at));
    const uint64_t expected_offset = k == 0 ? offset : f.sections[k - 1].offset + section_bytes;
    if (k == 0 &&
        (offset < kShardPrefixOverhead || offset > kShardPrefixOverhead + kMaxShardHeaderBytes))
      return data_loss("{}: 'offset' {} is not a shard header's end", at, offset);
    if (offset != expected_offset)
      return data_loss("{}: 'offset' {} does not follow the section before it", at, offset);
    if (bytes != section_bytes)
      return data_loss("{}: 'bytes' {} is not 4 x the {} elements of the ranges", at, bytes,
                       elements);
    f.sections[k] = {kCheckpointSectionNames[k], offset, bytes, static_cast<uint32_t>(crc)};
  }
  if (f.sections[2].offset + section_bytes != f.bytes)
    return data_loss("{}: 'bytes' {} is not where the sections end ({})", where, f.bytes,
                     f.sections[2].offset + section_bytes);
  return f;
}

// Every element of [0, num_params) in exactly one shard.
Status check_tiling(const Source& src, const std::string& where) {
  std::vector<FlatRange> all;
  for (const SourceFile& f : src.files)
    for (const FlatRange& r : f.ranges)
      if (r.size() > 0) all.push_back(r);
  std::sort(all.begin(), all.end(),
            [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  int64_t at = 0;
  for (const FlatRange& r : all) {
    if (r.begin != at)
      return data_loss("{}: the shards' ranges do not tile [0, {}): {} at element {}", where,
                       src.meta.num_params,
                       r.begin < at ? "two shards overlap" : "no shard holds the elements",
                       std::min(r.begin, at));
    at = r.end;
  }
  if (at != src.meta.num_params)
    return data_loss("{}: the shards' ranges do not tile [0, {}): no shard holds [{}, {})", where,
                     src.meta.num_params, at, src.meta.num_params);
  return {};
}

Expected<Source> parse_manifest(std::string_view text, const std::string& dir,
                                const std::string& path) {
  Expected<json> parsed =
      parse_json(text, "manifest", {.max_depth = 32, .max_bytes = kMaxManifestBytes});
  if (!parsed.ok()) return data_loss("{}: {}", path, parsed.status().message());
  const json& j = *parsed;
  const json* format = field(j, "format");
  if (!j.is_object() || format == nullptr || !format->is_string())
    return data_loss("{}: not a kiln sharded checkpoint manifest (no 'format')", path);
  if (format->get<std::string>() != kShardedCheckpointFormat)
    return unimplemented("{}: format {} (kiln reads {})", path, format->dump(),
                         kShardedCheckpointFormat);
  Source src;
  KILN_ASSIGN_OR_RETURN(src.meta, parse_meta(j, path));
  KILN_ASSIGN_OR_RETURN(const uint64_t n, get_uint(j, "num_shards", kMaxShards, path));
  const json* shards = field(j, "shards");
  if (n == 0 || shards == nullptr || !shards->is_array() || shards->size() != n)
    return data_loss("{}: 'shards' is not a list of 'num_shards' ({}) entries", path, n);
  for (int i = 0; i < static_cast<int>(n); ++i) {
    KILN_ASSIGN_OR_RETURN(
        SourceFile f, parse_entry((*shards)[i], i, static_cast<int>(n), src.meta.num_params, dir,
                                  fmt::format("{}: shard {}", path, i)));
    src.files.push_back(std::move(f));
  }
  KILN_RETURN_IF_ERROR(check_tiling(src, path));
  return src;
}

Expected<std::string> read_at(std::ifstream& in, const std::string& path, uint64_t offset,
                              uint64_t len) {
  std::string out(len, '\0');
  in.clear();
  in.seekg(static_cast<std::streamoff>(offset));
  if (!in.read(out.data(), static_cast<std::streamsize>(len)))
    return data_loss("{}: short read of {} bytes at offset {} (truncated?)", path, len, offset);
  return out;
}

// A single-process checkpoint file: one file holding [0, num_params).
Expected<Source> open_checkpoint_file(const std::string& path) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) return not_found("checkpoint {}: {}", path, ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open checkpoint {}", path);
  auto with_path = [&](const Status& s) {
    return Status(s.code(), fmt::format("{}: {}", path, s.message()));
  };
  KILN_ASSIGN_OR_RETURN(const std::string first,
                        read_at(in, path, 0, std::min<uint64_t>(16, size)));
  const Expected<uint64_t> need = checkpoint_prefix_bytes(first, size);
  if (!need.ok()) return with_path(need.status());
  KILN_ASSIGN_OR_RETURN(const std::string prefix, read_at(in, path, 0, std::min(*need, size)));
  Expected<CheckpointHeader> h = parse_checkpoint_header(prefix, size);
  if (!h.ok()) return with_path(h.status());
  SourceFile f{path,
               size,
               {{0, h->num_params}},
               {h->sections[0], h->sections[1], h->sections[2]},
               std::nullopt};
  Source src{std::move(*h), {}};
  src.files.push_back(std::move(f));
  return src;
}

// A sharded directory (through its manifest) or a single-process checkpoint file.
Expected<Source> open_source(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const std::string manifest = (fs::path(path) / kManifestFileName).string();
    if (!fs::exists(manifest, ec))
      return failed_precondition(
          "{}: no {}: the checkpoint is incomplete (its save did not finish)", path,
          kManifestFileName);
    KILN_ASSIGN_OR_RETURN(const std::string text, read_file(manifest, kMaxManifestBytes));
    return parse_manifest(text, path, manifest);
  }
  if (!fs::is_regular_file(path, ec)) return not_found("no checkpoint at {}", path);
  return open_checkpoint_file(path);
}

Status check_size(const SourceFile& f) {
  std::error_code ec;
  const uint64_t size = fs::file_size(f.path, ec);
  if (ec) return not_found("{}: missing ({}), but the manifest names it", f.path, ec.message());
  if (size != f.bytes)
    return data_loss("{} is {} bytes; the manifest says {} (truncated or replaced)", f.path, size,
                     f.bytes);
  return {};
}

// Files i = rank, rank + nranks, ...: each exists with its size, whether or not any rank reads it.
Status check_sizes(const Source& src, int rank, int nranks) {
  for (size_t i = rank; i < src.files.size(); i += nranks)
    KILN_RETURN_IF_ERROR(check_size(src.files[i]));
  return {};
}

// A shard file's prefix is the one the manifest names: magic, a header that ends where params
// starts, and its CRC-32C as stored and as the manifest recorded it.
Status check_shard_prefix(std::ifstream& in, const SourceFile& f) {
  const uint64_t len = f.sections[0].offset;  // in [20, 20 + kMaxShardHeaderBytes] (parse_entry)
  KILN_ASSIGN_OR_RETURN(const std::string p, read_at(in, f.path, 0, len));
  uint64_t n = 0;
  uint32_t stored = 0;
  std::memcpy(&n, p.data() + 8, 8);
  std::memcpy(&stored, p.data() + len - 4, 4);
  if (std::memcmp(p.data(), kShardMagic, 8) != 0 || n != len - kShardPrefixOverhead)
    return data_loss(
        "{}: not a kiln shard file, or not the one the manifest names (magic, header length)",
        f.path);
  const uint32_t computed = crc32c(std::string_view(p).substr(0, len - 4));
  if (computed != stored || stored != *f.header_crc32c)
    return data_loss(
        "{}: shard header: CRC-32C {:08x}, stored {:08x}, manifest {:08x}: the file is corrupted "
        "or "
        "not the one the manifest names",
        f.path, computed, stored, *f.header_crc32c);
  return {};
}

// `count` elements from element `from` of a file's sections to element `to` of a view's.
struct Copy {
  int64_t from, to, count;
};

// The overlaps of a file's ranges and a view's (both sorted), in file order.
std::vector<Copy> copies_between(std::span<const FlatRange> file, std::span<const FlatRange> view) {
  std::vector<Copy> out;
  int64_t file_at = 0, view_at = 0;  // element offsets of file[i] and view[j]
  for (size_t i = 0, j = 0; i < file.size() && j < view.size();) {
    const FlatRange& a = file[i];
    const FlatRange& b = view[j];
    const int64_t lo = std::max(a.begin, b.begin), hi = std::min(a.end, b.end);
    if (lo < hi) out.push_back({file_at + lo - a.begin, view_at + lo - b.begin, hi - lo});
    if (a.end <= b.end) {
      file_at += a.size();
      ++i;
    } else {
      view_at += b.size();
      ++j;
    }
  }
  return out;
}

// The parts of f that `view` holds, into `out`; every section of f is read whole and its
// CRC-32C checked. A file that holds none of the view is not opened.
Status read_overlap(const SourceFile& f, std::span<const FlatRange> view, Staged& out) {
  const std::vector<Copy> copies = copies_between(f.ranges, view);
  if (copies.empty()) return {};
  KILN_RETURN_IF_ERROR(check_size(f));
  std::ifstream in(f.path, std::ios::binary);
  if (!in) return not_found("cannot open {}", f.path);
  if (f.header_crc32c) KILN_RETURN_IF_ERROR(check_shard_prefix(in, f));
  std::string piece;
  for (int s = 0; s < 3; ++s) {
    const CheckpointSection& sec = f.sections[s];
    in.clear();
    in.seekg(static_cast<std::streamoff>(sec.offset));
    uint32_t crc = 0;
    size_t first = 0;  // the first copy not yet done
    for (uint64_t done = 0; done < sec.bytes;) {
      piece.resize(std::min(kReadPieceBytes, sec.bytes - done));
      if (!in.read(piece.data(), static_cast<std::streamsize>(piece.size())))
        return data_loss("{}: section {}: short read (truncated?)", f.path, sec.name);
      crc = crc32c(piece, crc);
      const auto lo = static_cast<int64_t>(done / 4),
                 hi = static_cast<int64_t>((done + piece.size()) / 4);
      while (first < copies.size() && copies[first].from + copies[first].count <= lo) ++first;
      for (size_t c = first; c < copies.size() && copies[c].from < hi; ++c) {
        const int64_t a = std::max(copies[c].from, lo),
                      b = std::min(copies[c].from + copies[c].count, hi);
        std::memcpy(out[s].data() + copies[c].to + (a - copies[c].from),
                    piece.data() + (a - lo) * 4, static_cast<size_t>(b - a) * 4);
      }
      done += piece.size();
    }
    if (crc != sec.crc32c)
      return data_loss(
          "{}: section {}: CRC-32C mismatch (stored {:08x}, computed {:08x}): the file is "
          "corrupted",
          f.path, sec.name, sec.crc32c, crc);
  }
  return {};
}

Expected<Staged> read_ranges(const Source& src, std::span<const FlatRange> view, int64_t elements) {
  Staged out;
  for (std::vector<float>& s : out) s.resize(static_cast<size_t>(elements));
  for (const SourceFile& f : src.files) KILN_RETURN_IF_ERROR(read_overlap(f, view, out));
  return out;
}

// One rank's part of a load: everything but agreeing and copying into place.
Expected<std::pair<CheckpointHeader, Staged>> stage(const std::string& path, const ShardView& mine,
                                                    int rank, int nranks) {
  KILN_RETURN_IF_ERROR(check_view(mine, "load_sharded_checkpoint"));
  KILN_ASSIGN_OR_RETURN(Source src, open_source(path));
  if (src.meta.num_params != mine.num_params)
    return invalid_argument("{} holds {} parameters; this run's flat vector has {} ({})", path,
                            src.meta.num_params, mine.num_params, src.meta.model);
  KILN_RETURN_IF_ERROR(check_sizes(src, rank, nranks));
  KILN_ASSIGN_OR_RETURN(Staged staged,
                        read_ranges(src, mine.ranges, static_cast<int64_t>(mine.params.size())));
  return std::pair{std::move(src.meta), std::move(staged)};
}

}  // namespace

std::string shard_file_name(int shard, int num_shards) {
  return fmt::format("shard-{:05d}-of-{:05d}.bin", shard, num_shards);
}

Status save_sharded_checkpoint(comm::Communicator& comm, const std::string& dir,
                               const CheckpointHeader& meta, const ShardView& mine) {
  const int p = comm.size(), r = comm.rank();
  Status local = check_view(mine, "save_sharded_checkpoint");
  if (local.ok() && meta.num_params != mine.num_params)
    local = invalid_argument("[save_sharded_checkpoint] meta.num_params is {}, the view's {}",
                             meta.num_params, mine.num_params);
  if (local.ok() && p > kMaxShards)
    local = invalid_argument("[save_sharded_checkpoint] {} ranks (at most {})", p, kMaxShards);
  if (local.ok() && r == 0) local = prepare_dir(dir);
  KILN_RETURN_IF_ERROR(agree(comm, local));

  const EncodedShard shard = encode_shard(mine, r, p);
  const std::string path = (fs::path(dir) / shard_file_name(r, p)).string();
  KILN_RETURN_IF_ERROR(agree(
      comm, write_file_atomic(
                path, {shard.prefix, shard.sections[0], shard.sections[1], shard.sections[2]})));

  // Every shard is on disk: rank 0 names them in the manifest, after making the checks a load
  // makes, so shards that do not tile [0, num_params) never become a checkpoint.
  const std::vector<std::string> entries = gather_at_root(comm, shard.entry);
  Status written;
  if (r == 0) {
    json manifest = meta_json(meta);
    manifest["format"] = std::string(kShardedCheckpointFormat);
    manifest["num_shards"] = p;
    json shards = json::array();
    for (const std::string& e : entries)
      shards.push_back(json::parse(e));  // from encode_shard: well-formed
    manifest["shards"] = std::move(shards);
    const std::string text = manifest.dump();
    const std::string manifest_path = (fs::path(dir) / kManifestFileName).string();
    written = parse_manifest(text, dir, manifest_path).status();
    if (written.ok()) written = write_file_atomic(manifest_path, {text});
  }
  return agree(comm, written);
}

Expected<CheckpointHeader> load_sharded_checkpoint(comm::Communicator& comm,
                                                   const std::string& path, const ShardView& mine) {
  auto staged = stage(path, mine, comm.rank(), comm.size());
  KILN_RETURN_IF_ERROR(agree(comm, staged.status()));
  // Every rank verified all it read: now into place.
  for (int i = 0; i < 3; ++i)
    std::copy(staged->second[i].begin(), staged->second[i].end(), section_of(mine, i).begin());
  return std::move(staged->first);
}

Expected<FullCheckpoint> load_checkpoint_whole(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(Source src, open_source(path));
  // The files' sizes on disk bound num_params (their sections hold 12 bytes an element) before
  // anything is allocated.
  KILN_RETURN_IF_ERROR(check_sizes(src, 0, 1));
  const FlatRange all[1] = {{0, src.meta.num_params}};
  KILN_ASSIGN_OR_RETURN(Staged s, read_ranges(src, all, src.meta.num_params));
  return FullCheckpoint{std::move(src.meta), std::move(s[0]), std::move(s[1]), std::move(s[2])};
}

Status save_checkpoint_file(const std::string& path, const CheckpointHeader& meta,
                            const ShardView& all) {
  KILN_RETURN_IF_ERROR(check_view(all, "save_checkpoint_file"));
  if (meta.num_params != all.num_params ||
      static_cast<int64_t>(all.params.size()) != all.num_params)
    return invalid_argument(
        "[save_checkpoint_file] the view must hold all {} parameters (it holds {}; meta says {})",
        all.num_params, all.params.size(), meta.num_params);
  CheckpointHeader h = meta;
  h.sections.clear();
  std::string_view bytes[3];
  for (int i = 0; i < 3; ++i) {
    bytes[i] = as_bytes(section_of(all, i).data(), section_of(all, i).size());
    h.sections.push_back({kCheckpointSectionNames[i], 0, bytes[i].size(), crc32c(bytes[i])});
  }
  const std::string prefix = encode_checkpoint_prefix(h);
  return write_file_atomic(path, {prefix, bytes[0], bytes[1], bytes[2]});
}

}  // namespace kiln
