// The safetensors reader (safetensors.h). The header is read by a streaming (SAX) pass rather
// than into a JSON tree: the reference rejects a repeated "__metadata__" or a repeated tensor
// field and checks every copy of a repeated tensor name, and a tree keeps only the last copy.
#include "kiln/model/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "kiln/core/checked_math.h"
#include "kiln/core/json.h"

namespace kiln {
namespace {

// Every dtype the reference knows (its Dtype enum), with its size in bits.
struct DtypeBits {
  std::string_view name;
  int bits;
};
constexpr DtypeBits kDtypes[] = {
    {"BOOL", 8},     {"F4", 4},          {"F6_E2M3", 6},     {"F6_E3M2", 6}, {"U8", 8},   {"I8", 8},
    {"F8_E5M2", 8},  {"F8_E4M3", 8},     {"F8_E8M0", 8},     {"F8_E4M3FNUZ", 8},          {"F8_E5M2FNUZ", 8},
    {"I16", 16},     {"U16", 16},        {"F16", 16},        {"BF16", 16},   {"I32", 32}, {"U32", 32},
    {"F32", 32},     {"C64", 64},        {"F64", 64},        {"I64", 64},    {"U64", 64},
};

// Reads the header JSON event by event into the tensors and metadata, enforcing the reference's
// schema (safetensors.h). The first error stops the parse and is kept in `error`.
class HeaderSax {
 public:
  using json = nlohmann::json;

  std::string error;
  std::optional<std::map<std::string, std::string>> metadata;
  std::map<std::string, SafetensorsTensor> tensors;  // a repeated name: the last entry wins

  bool null() { return scalar("null"); }
  bool boolean(bool) { return scalar("a boolean"); }
  bool number_integer(json::number_integer_t) { return scalar("a negative integer"); }
  bool number_unsigned(json::number_unsigned_t v) {
    if (state_ == State::kShape) {
      cur_.shape.push_back(v);
      return true;
    }
    if (state_ == State::kOffsets) {
      if (num_offsets_ == 2) return fail("tensor '{}': data_offsets has more than 2 elements", cur_.name);
      (num_offsets_++ == 0 ? cur_.begin : cur_.end) = v;
      return true;
    }
    return scalar("an integer");
  }
  bool number_float(json::number_float_t, const json::string_t&) { return scalar("a fractional number"); }
  bool binary(json::binary_t&) { return fail("binary values are not JSON"); }
  bool string(json::string_t& s) {
    if (state_ == State::kMetaMap) {
      (*metadata)[meta_key_] = s;
      return true;
    }
    if (state_ == State::kTensor && field_ == Field::kDtype) {
      const int bits = safetensors_dtype_bits(s);
      if (bits == 0) return fail("tensor '{}' has unknown dtype '{}'", cur_.name, s);
      cur_.dtype = s;
      cur_.dtype_bits = bits;
      return true;
    }
    return scalar("a string");
  }
  bool start_object(std::size_t) {
    ++depth_;
    switch (state_) {
      case State::kStart: state_ = State::kTop; return true;
      case State::kTop:
        if (key_ == "__metadata__") {
          metadata.emplace();
          state_ = State::kMetaMap;
          return true;
        }
        cur_ = SafetensorsTensor{};
        cur_.name = key_;
        seen_dtype_ = seen_shape_ = seen_offsets_ = false;
        state_ = State::kTensor;
        return true;
      case State::kTensor:
        if (field_ == Field::kOther) return skip();
        return fail("tensor '{}': {} is an object", cur_.name, field_name());
      case State::kSkip: return true;
      default: return scalar("an object");
    }
  }
  bool start_array(std::size_t) {
    ++depth_;
    if (state_ == State::kSkip) return true;
    if (state_ == State::kTensor) {
      if (field_ == Field::kShape) {
        state_ = State::kShape;
        return true;
      }
      if (field_ == Field::kOffsets) {
        state_ = State::kOffsets;
        num_offsets_ = 0;
        return true;
      }
      if (field_ == Field::kOther) return skip();
    }
    return scalar("an array");
  }
  bool key(json::string_t& k) {
    if (state_ == State::kTop) {
      if (k == "__metadata__") {
        if (seen_metadata_) return fail("__metadata__ appears twice");
        seen_metadata_ = true;
      }
      key_ = k;
    } else if (state_ == State::kMetaMap) {
      meta_key_ = k;
    } else if (state_ == State::kTensor) {
      bool* seen = nullptr;
      if (k == "dtype") field_ = Field::kDtype, seen = &seen_dtype_;
      else if (k == "shape") field_ = Field::kShape, seen = &seen_shape_;
      else if (k == "data_offsets") field_ = Field::kOffsets, seen = &seen_offsets_;
      else field_ = Field::kOther;
      if (seen != nullptr) {
        if (*seen) return fail("tensor '{}': field {} appears twice", cur_.name, k);
        *seen = true;
      }
    }
    return true;
  }
  bool end_object() {
    --depth_;
    if (state_ == State::kSkip) return end_skip();
    if (state_ == State::kMetaMap) {
      state_ = State::kTop;
    } else if (state_ == State::kTensor) {
      if (!seen_dtype_ || !seen_shape_ || !seen_offsets_)
        return fail("tensor '{}' lacks {}", cur_.name, !seen_dtype_ ? "dtype" : !seen_shape_ ? "shape" : "data_offsets");
      tensors[cur_.name] = std::move(cur_);
      state_ = State::kTop;
    } else if (state_ == State::kTop) {
      state_ = State::kDone;
    }
    return true;
  }
  bool end_array() {
    --depth_;
    if (state_ == State::kSkip) return end_skip();
    if (state_ == State::kOffsets && num_offsets_ != 2)
      return fail("tensor '{}': data_offsets has {} elements, not 2", cur_.name, num_offsets_);
    state_ = State::kTensor;  // kShape or kOffsets: back in the tensor's object
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    std::string_view msg = e.what();  // "[json.exception.parse_error.101] parse error at ..."
    if (const size_t at = msg.find("] "); at != std::string_view::npos) msg.remove_prefix(at + 2);
    if (error.empty()) error = fmt::format("header is not valid JSON (byte {}: {})", position, msg);
    return false;
  }

 private:
  enum class State { kStart, kTop, kMetaMap, kTensor, kShape, kOffsets, kSkip, kDone };
  enum class Field { kDtype, kShape, kOffsets, kOther };

  template <class... Args>
  bool fail(fmt::format_string<Args...> f, Args&&... args) {
    if (error.empty()) error = fmt::format(f, std::forward<Args>(args)...);
    return false;
  }
  // A value that is not allowed where it stands (unless inside an ignored field).
  bool scalar(const char* what) {
    switch (state_) {
      case State::kSkip: return true;
      case State::kStart: return fail("header is {}, not a JSON object", what);
      case State::kTop:
        if (key_ == "__metadata__" && std::string_view(what) == "null") return true;  // as if absent
        if (key_ == "__metadata__") return fail("__metadata__ is {}, not an object of strings", what);
        return fail("tensor '{}' is {}, not an object", key_, what);
      case State::kMetaMap: return fail("__metadata__ '{}' is {}, not a string", meta_key_, what);
      case State::kTensor:
        if (field_ == Field::kOther) return true;
        return fail("tensor '{}': {} is {}", cur_.name, field_name(), what);
      case State::kShape: return fail("tensor '{}': a shape dimension is {}", cur_.name, what);
      case State::kOffsets: return fail("tensor '{}': a data offset is {}", cur_.name, what);
      case State::kDone: return fail("header has text after its object");
    }
    return false;
  }
  // Starts ignoring a nested value (an unknown tensor field); depth_ already counts it.
  bool skip() {
    skip_depth_ = depth_;
    state_ = State::kSkip;
    return true;
  }
  bool end_skip() {
    if (depth_ < skip_depth_) state_ = State::kTensor;
    return true;
  }
  const char* field_name() const {
    return field_ == Field::kDtype ? "dtype" : field_ == Field::kShape ? "shape" : "data_offsets";
  }

  State state_ = State::kStart;
  Field field_ = Field::kOther;
  int64_t depth_ = 0, skip_depth_ = 0;
  std::string key_, meta_key_;
  SafetensorsTensor cur_;
  bool seen_metadata_ = false, seen_dtype_ = false, seen_shape_ = false, seen_offsets_ = false;
  int num_offsets_ = 0;
};

}  // namespace

bool SafetensorsTensor::shape_is(std::span<const int64_t> want) const {
  if (want.size() != shape.size()) return false;
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i] < 0 || static_cast<uint64_t>(want[i]) != shape[i]) return false;
  return true;
}

const SafetensorsTensor* SafetensorsHeader::find(std::string_view name) const {
  auto it = index.find(name);
  return it == index.end() ? nullptr : &tensors[it->second];
}

std::string SafetensorsHeader::metadata_value(const std::string& key) const {
  if (!metadata) return "";
  auto it = metadata->find(key);
  return it == metadata->end() ? "" : it->second;
}

int safetensors_dtype_bits(std::string_view dtype) {
  for (const DtypeBits& d : kDtypes)
    if (d.name == dtype) return d.bits;
  return 0;
}

Expected<uint64_t> safetensors_header_length(std::string_view first8, uint64_t file_size) {
  if (first8.size() < 8 || file_size < 8)
    return data_loss("{} bytes is too short for a safetensors file (8-byte header length first)", file_size);
  uint64_t n = 0;
  std::memcpy(&n, first8.data(), 8);  // little-endian, as kiln's targets are
  if (n > kMaxSafetensorsHeaderBytes)
    return data_loss("header length {} is more than the {} allowed", n, kMaxSafetensorsHeaderBytes);
  if (n > file_size - 8) return data_loss("header length {} passes the end of the {}-byte file", n, file_size);
  return n;
}

Expected<SafetensorsHeader> parse_safetensors_header(std::string_view prefix, uint64_t file_size) {
  KILN_ASSIGN_OR_RETURN(const uint64_t n, safetensors_header_length(prefix, file_size));
  if (prefix.size() - 8 < n)
    return data_loss("header length {}: only {} header bytes given", n, prefix.size() - 8);
  const std::string_view text = prefix.substr(8, n);
  // nlohmann skips a byte-order mark and stops at a NUL byte; the reference does neither (and a
  // NUL is never valid in JSON text).
  if (text.starts_with("\xEF\xBB\xBF")) return data_loss("header starts with a byte-order mark");
  if (text.find('\0') != std::string_view::npos) return data_loss("header holds a NUL byte");
  if (json_depth(text, kMaxSafetensorsJsonDepth) > kMaxSafetensorsJsonDepth)
    return data_loss("header JSON is nested deeper than {} levels", kMaxSafetensorsJsonDepth);
  HeaderSax sax;
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(text, &sax);
  } catch (const std::exception& e) {  // the parser reports through parse_error; belt and braces
    return data_loss("header is not valid JSON ({})", e.what());
  }
  if (!ok) return data_loss("{}", sax.error.empty() ? std::string("header is not valid JSON") : sax.error);

  SafetensorsHeader h;
  h.header_bytes = n;
  h.data_start = 8 + n;
  h.data_bytes = file_size - h.data_start;
  h.metadata = std::move(sax.metadata);
  h.tensors.reserve(sax.tensors.size());
  for (auto& [name, t] : sax.tensors) h.tensors.push_back(std::move(t));
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
  uint64_t next = 0;  // where the next tensor must begin
  for (const SafetensorsTensor& t : h.tensors) {
    if (t.begin != next || t.end < t.begin)
      return data_loss("tensor '{}' data [{}, {}) does not begin where the previous tensor ends ({}): a hole or an "
                       "overlap",
                       t.name, t.begin, t.end, next);
    next = t.end;
    std::optional<uint64_t> elems = uint64_t{1};
    for (const uint64_t d : t.shape)
      if (elems) elems = checked_mul(*elems, d);
    const std::optional<uint64_t> bits = elems ? checked_mul(*elems, static_cast<uint64_t>(t.dtype_bits)) : elems;
    if (!bits) return data_loss("tensor '{}': the size of shape [{}] overflows", t.name, fmt::join(t.shape, ", "));
    if (*bits % 8 != 0)
      return data_loss("tensor '{}': {} x {} bits is not a whole number of bytes", t.name, *elems, t.dtype_bits);
    if (*bits / 8 != t.num_bytes())
      return data_loss("tensor '{}': {} [{}] needs {} bytes, data_offsets [{}, {}) hold {}", t.name, t.dtype,
                       fmt::join(t.shape, ", "), *bits / 8, t.begin, t.end, t.num_bytes());
  }
  if (next != h.data_bytes)
    return data_loss("the tensors cover {} data bytes, the file holds {} after the header{}", next, h.data_bytes,
                     next > h.data_bytes ? " (file truncated?)" : "");
  for (size_t i = 0; i < h.tensors.size(); ++i) h.index.emplace(h.tensors[i].name, i);
  return h;
}

Expected<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return not_found("{}: {}", path, ec.message());
  auto in = std::make_unique<std::ifstream>(path, std::ios::binary);
  if (!*in) return not_found("cannot open {}", path);
  auto with_path = [&](const Status& s) { return Status(s.code(), fmt::format("{}: {}", path, s.message())); };
  std::string prefix(8, '\0');
  if (size >= 8 && !in->read(prefix.data(), 8)) return data_loss("{}: short read", path);
  auto n = safetensors_header_length(size >= 8 ? std::string_view(prefix) : std::string_view(), size);
  if (!n.ok()) return with_path(n.status());
  prefix.resize(8 + *n);
  if (!in->read(prefix.data() + 8, static_cast<std::streamsize>(*n))) return data_loss("{}: short read", path);
  auto header = parse_safetensors_header(prefix, size);
  if (!header.ok()) return with_path(header.status());
  SafetensorsFile f;
  f.path_ = path;
  f.header_ = std::move(*header);
  f.in_ = std::move(in);
  return f;
}

Expected<const SafetensorsTensor*> SafetensorsFile::tensor(std::string_view name) const {
  const SafetensorsTensor* t = header_.find(name);
  if (t == nullptr) return data_loss("{}: tensor {} is missing", path_, name);
  return t;
}

Status SafetensorsFile::read_into(const SafetensorsTensor& t, std::span<char> out) {
  KILN_CHECK_MSG(out.size() == t.num_bytes(), "{}: {} bytes asked for tensor {} of {}", path_, out.size(), t.name,
                 t.num_bytes());
  in_->clear();
  in_->seekg(static_cast<std::streamoff>(header_.data_start + t.begin));
  if (!in_->read(out.data(), static_cast<std::streamsize>(out.size())))
    return data_loss("{}: short read of tensor {} (the file changed since it was opened?)", path_, t.name);
  return {};
}

Expected<std::string> SafetensorsFile::read(const SafetensorsTensor& t) {
  std::string bytes(t.num_bytes(), '\0');
  KILN_RETURN_IF_ERROR(read_into(t, bytes));
  return bytes;
}

}  // namespace kiln
