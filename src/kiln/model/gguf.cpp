// GGUF reader/writer, ggml's Q8_0/Q4_0 block formats, and the kiln Llama <-> llama.cpp mapping
// (gguf.h). The parser reads through a bounded cursor: every count and length is checked
// against the bytes left before anything is allocated.
#include "kiln/model/gguf.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "kiln/core/dtype.h"
#include "kiln/core/file_io.h"
#include "kiln/core/json.h"
#include "kiln/core/utf8.h"

namespace kiln::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kMaxStringBytes = uint64_t{1} << 24;
constexpr int kMaxGgufDims = 4;              // GGML_MAX_DIMS
constexpr int64_t kMaxElements = int64_t{1} << 40;
// Elements of one metadata array: a tokenizer's tokens and merges are under a million; the cap
// keeps a small file from claiming an array that would need 8x its size in memory.
constexpr uint64_t kMaxArrayElements = uint64_t{1} << 24;
constexpr size_t kMaxTensorName = 63;  // GGML_MAX_NAME - 1: llama.cpp refuses longer names
constexpr int64_t kQK = 32;              // elements per Q8_0 / Q4_0 block

// ---- the bounded cursor -----------------------------------------------------------------------
class Cursor {
 public:
  explicit Cursor(std::string_view b) : b_(b) {}
  size_t pos() const { return pos_; }
  size_t left() const { return b_.size() - pos_; }
  template <class T>
  bool get(T& v) {
    if (left() < sizeof(T)) return false;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool get_string(std::string& s) {
    uint64_t n = 0;
    if (!get(n) || n > kMaxStringBytes || n > left()) return false;
    s.assign(b_.data() + pos_, n);
    pos_ += n;
    return true;
  }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::kU8: case ValueType::kI8: case ValueType::kBool: return 1;
    case ValueType::kU16: case ValueType::kI16: return 2;
    case ValueType::kU32: case ValueType::kI32: case ValueType::kF32: return 4;
    case ValueType::kU64: case ValueType::kI64: case ValueType::kF64: return 8;
    default: return 0;  // string, array: not fixed-size
  }
}
bool is_float(ValueType t) { return t == ValueType::kF32 || t == ValueType::kF64; }

// A fixed-size scalar of type t into (i or f).
bool read_scalar(Cursor& c, ValueType t, int64_t& i, double& f) {
  switch (t) {
    case ValueType::kU8: { uint8_t v; if (!c.get(v)) return false; i = v; return true; }
    case ValueType::kI8: { int8_t v; if (!c.get(v)) return false; i = v; return true; }
    case ValueType::kBool: { uint8_t v; if (!c.get(v)) return false; i = v != 0; return true; }
    case ValueType::kU16: { uint16_t v; if (!c.get(v)) return false; i = v; return true; }
    case ValueType::kI16: { int16_t v; if (!c.get(v)) return false; i = v; return true; }
    case ValueType::kU32: { uint32_t v; if (!c.get(v)) return false; i = v; return true; }
    case ValueType::kI32: { int32_t v; if (!c.get(v)) return false; i = v; return true; }
    case ValueType::kU64: { uint64_t v; if (!c.get(v)) return false; i = static_cast<int64_t>(v); return true; }
    case ValueType::kI64: { int64_t v; if (!c.get(v)) return false; i = v; return true; }
    case ValueType::kF32: { float v; if (!c.get(v)) return false; f = v; return true; }
    case ValueType::kF64: { double v; if (!c.get(v)) return false; f = v; return true; }
    default: return false;
  }
}

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void put_string(std::string& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.append(s);
}
void write_scalar(std::string& out, ValueType t, int64_t i, double f) {
  switch (t) {
    case ValueType::kU8: case ValueType::kBool: put<uint8_t>(out, static_cast<uint8_t>(i)); break;
    case ValueType::kI8: put<int8_t>(out, static_cast<int8_t>(i)); break;
    case ValueType::kU16: put<uint16_t>(out, static_cast<uint16_t>(i)); break;
    case ValueType::kI16: put<int16_t>(out, static_cast<int16_t>(i)); break;
    case ValueType::kU32: put<uint32_t>(out, static_cast<uint32_t>(i)); break;
    case ValueType::kI32: put<int32_t>(out, static_cast<int32_t>(i)); break;
    case ValueType::kU64: put<uint64_t>(out, static_cast<uint64_t>(i)); break;
    case ValueType::kI64: put<int64_t>(out, i); break;
    case ValueType::kF32: put<float>(out, static_cast<float>(f)); break;
    case ValueType::kF64: put<double>(out, f); break;
    default: KILN_CHECK_MSG(false, "gguf: not a scalar type {}", static_cast<uint32_t>(t));
  }
}

bool known_tensor_type(uint32_t t) { return t == 0 || t == 1 || t == 2 || t == 8; }

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

// ---- values -------------------------------------------------------------------------------------
Value Value::u32(uint32_t v) { Value x; x.type = ValueType::kU32; x.i = v; return x; }
Value Value::i32(int32_t v) { Value x; x.type = ValueType::kI32; x.i = v; return x; }
Value Value::f32(float v) { Value x; x.type = ValueType::kF32; x.f = v; return x; }
Value Value::boolean(bool v) { Value x; x.type = ValueType::kBool; x.i = v; return x; }
Value Value::str(std::string v) { Value x; x.type = ValueType::kString; x.s = std::move(v); return x; }
Value Value::str_array(std::vector<std::string> v) {
  Value x; x.type = ValueType::kArray; x.elem = ValueType::kString; x.strings = std::move(v); return x;
}
Value Value::i32_array(std::vector<int64_t> v) {
  Value x; x.type = ValueType::kArray; x.elem = ValueType::kI32; x.ints = std::move(v); return x;
}
Value Value::f32_array(std::vector<double> v) {
  Value x; x.type = ValueType::kArray; x.elem = ValueType::kF32; x.floats = std::move(v); return x;
}
bool Value::is_integer() const {
  return scalar_size(type) > 0 && !is_float(type) && type != ValueType::kBool;
}

// ---- tensor types and blocks ---------------------------------------------------------------------
std::string_view tensor_type_name(TensorType t) {
  switch (t) {
    case TensorType::kF32: return "F32";
    case TensorType::kF16: return "F16";
    case TensorType::kQ4_0: return "Q4_0";
    case TensorType::kQ8_0: return "Q8_0";
  }
  return "?";
}
int64_t block_elems(TensorType t) { return (t == TensorType::kQ4_0 || t == TensorType::kQ8_0) ? kQK : 1; }
int64_t block_bytes(TensorType t) {
  switch (t) {
    case TensorType::kF32: return 4;
    case TensorType::kF16: return 2;
    case TensorType::kQ4_0: return 2 + kQK / 2;
    case TensorType::kQ8_0: return 2 + kQK;
  }
  return 0;
}

void quantize_q8_0(const float* x, int64_t n, uint8_t* out) {
  KILN_CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK, out += 2 + kQK) {
    float amax = 0.0f;
    for (int64_t j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = f32_to_f16(d);
    std::memcpy(out, &dh, 2);
    for (int64_t j = 0; j < kQK; ++j) out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
  }
}

void dequantize_q8_0(const uint8_t* in, int64_t n, float* y) {
  KILN_CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b, in += 2 + kQK, y += kQK) {
    uint16_t dh;
    std::memcpy(&dh, in, 2);
    const float d = f16_to_f32(dh);
    for (int64_t j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(static_cast<int8_t>(in[2 + j]));
  }
}

void quantize_q4_0(const float* x, int64_t n, uint8_t* out) {
  KILN_CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK, out += 2 + kQK / 2) {
    float amax = 0.0f, max = 0.0f;  // the value of largest magnitude, sign kept (first one wins)
    for (int64_t j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = f32_to_f16(d);
    std::memcpy(out, &dh, 2);
    for (int64_t j = 0; j < kQK / 2; ++j) {
      // x·id + 8.5 lies in [0.5, 16.5]: truncation is floor, i.e. round to nearest of x·id + 8.
      const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
      const int q1 = std::min(15, static_cast<int>(x[j + kQK / 2] * id + 8.5f));
      out[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void dequantize_q4_0(const uint8_t* in, int64_t n, float* y) {
  KILN_CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b, in += 2 + kQK / 2, y += kQK) {
    uint16_t dh;
    std::memcpy(&dh, in, 2);
    const float d = f16_to_f32(dh);
    for (int64_t j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(q4_0_code(in + 2, j) - 8);
  }
}

std::string encode_tensor(const float* x, int64_t n, TensorType t) {
  KILN_CHECK(n % block_elems(t) == 0);
  std::string out(static_cast<size_t>(n / block_elems(t) * block_bytes(t)), '\0');
  auto* o = reinterpret_cast<uint8_t*>(out.data());
  switch (t) {
    case TensorType::kF32: std::memcpy(o, x, static_cast<size_t>(n) * 4); break;
    case TensorType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_f16(x[i]);
        std::memcpy(o + 2 * i, &h, 2);
      }
      break;
    case TensorType::kQ8_0: quantize_q8_0(x, n, o); break;
    case TensorType::kQ4_0: quantize_q4_0(x, n, o); break;
  }
  return out;
}

void decode_tensor(std::string_view bytes, int64_t n, TensorType t, float* y) {
  KILN_CHECK(n % block_elems(t) == 0 &&
             static_cast<int64_t>(bytes.size()) == n / block_elems(t) * block_bytes(t));
  const auto* b = reinterpret_cast<const uint8_t*>(bytes.data());
  switch (t) {
    case TensorType::kF32: std::memcpy(y, b, static_cast<size_t>(n) * 4); break;
    case TensorType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, b + 2 * i, 2);
        y[i] = f16_to_f32(h);
      }
      break;
    case TensorType::kQ8_0: dequantize_q8_0(b, n, y); break;
    case TensorType::kQ4_0: dequantize_q4_0(b, n, y); break;
  }
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

const Value* File::find(std::string_view key) const {
  for (const auto& [k, v] : metadata)
    if (k == key) return &v;
  return nullptr;
}
const TensorInfo* File::tensor(std::string_view name) const {
  for (const TensorInfo& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

// ---- parsing ----------------------------------------------------------------------------------------
Expected<File> parse(std::string_view bytes, std::string_view what) {
  Cursor c(bytes);
  File f;
  uint32_t magic = 0;
  if (!c.get(magic)) return data_loss("{}: {} bytes is too short for a GGUF header", what, bytes.size());
  if (magic != kMagic) return data_loss("{}: bad magic 0x{:08x} (not a GGUF file)", what, magic);
  if (!c.get(f.version)) return data_loss("{}: truncated header", what);
  if (f.version != 2 && f.version != 3)
    return unimplemented("{}: GGUF version {} (kiln reads versions 2 and 3)", what, f.version);
  uint64_t num_tensors = 0, num_kv = 0;
  if (!c.get(num_tensors) || !c.get(num_kv)) return data_loss("{}: truncated header", what);
  // Smallest encodings: a KV is a key length (8) + type (4) + a 1-byte value; a tensor info is
  // a name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
  if (num_kv > c.left() / 13) return data_loss("{}: {} metadata entries cannot fit in {} bytes", what, num_kv, c.left());
  if (num_tensors > c.left() / 32)
    return data_loss("{}: {} tensors cannot fit in {} bytes", what, num_tensors, c.left());

  f.metadata.reserve(num_kv);
  std::set<std::string> keys, names;
  for (uint64_t n = 0; n < num_kv; ++n) {
    std::string key;
    uint32_t type = 0;
    if (!c.get_string(key) || !c.get(type)) return data_loss("{}: metadata entry {} is truncated", what, n);
    Value v;
    v.type = static_cast<ValueType>(type);
    if (type > static_cast<uint32_t>(ValueType::kF64))
      return data_loss("{}: metadata '{}' has unknown type {}", what, key, type);
    bool ok = true;
    if (v.type == ValueType::kString) {
      ok = c.get_string(v.s);
    } else if (v.type == ValueType::kArray) {
      uint32_t elem = 0;
      uint64_t count = 0;
      if (!c.get(elem) || !c.get(count)) return data_loss("{}: metadata '{}' array header is truncated", what, key);
      v.elem = static_cast<ValueType>(elem);
      if (elem > static_cast<uint32_t>(ValueType::kF64))
        return data_loss("{}: metadata '{}' array has unknown element type {}", what, key, elem);
      if (v.elem == ValueType::kArray) return unimplemented("{}: metadata '{}' is a nested array", what, key);
      const size_t min_size = v.elem == ValueType::kString ? 8 : scalar_size(v.elem);
      if (count > c.left() / min_size)
        return data_loss("{}: metadata '{}' claims {} elements, more than the {} bytes left", what, key, count, c.left());
      if (count > kMaxArrayElements)
        return data_loss("{}: metadata '{}' has {} elements (at most {} read)", what, key, count, kMaxArrayElements);
      if (v.elem == ValueType::kString) {
        v.strings.resize(count);
        for (uint64_t e = 0; e < count && ok; ++e) ok = c.get_string(v.strings[e]);
      } else if (is_float(v.elem)) {
        v.floats.resize(count);
        int64_t dummy;
        for (uint64_t e = 0; e < count && ok; ++e) ok = read_scalar(c, v.elem, dummy, v.floats[e]);
      } else {
        v.ints.resize(count);
        double dummy;
        for (uint64_t e = 0; e < count && ok; ++e) ok = read_scalar(c, v.elem, v.ints[e], dummy);
      }
    } else {
      ok = read_scalar(c, v.type, v.i, v.f);
    }
    if (!ok) return data_loss("{}: metadata '{}' is truncated or too long", what, key);
    // llama.cpp refuses a repeated key; find() would silently take the first.
    if (!keys.insert(key).second) return data_loss("{}: metadata key '{}' appears twice", what, key);
    f.metadata.emplace_back(std::move(key), std::move(v));
  }
  if (const Value* a = f.find("general.alignment")) {
    if (!a->is_integer() || a->i < 1 || a->i > (1 << 20) || (a->i & (a->i - 1)) != 0)
      return data_loss("{}: general.alignment must be a power of two up to 1 MiB", what);
    f.alignment = static_cast<uint64_t>(a->i);
  }

  f.tensors.resize(num_tensors);
  for (uint64_t n = 0; n < num_tensors; ++n) {
    TensorInfo& t = f.tensors[n];
    uint32_t n_dims = 0, type = 0;
    if (!c.get_string(t.name) || !c.get(n_dims)) return data_loss("{}: tensor info {} is truncated", what, n);
    if (t.name.size() > kMaxTensorName)
      return data_loss("{}: tensor {} has a name of {} bytes (at most {})", what, n, t.name.size(), kMaxTensorName);
    if (!names.insert(t.name).second) return data_loss("{}: tensor '{}' appears twice", what, t.name);
    if (n_dims < 1 || n_dims > kMaxGgufDims)
      return data_loss("{}: tensor '{}' has {} dimensions (1 to {} allowed)", what, t.name, n_dims, kMaxGgufDims);
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne = 0;
      if (!c.get(ne)) return data_loss("{}: tensor '{}' dims are truncated", what, t.name);
      if (ne > static_cast<uint64_t>(kMaxElements) || (ne > 0 && numel > kMaxElements / static_cast<int64_t>(ne)))
        return data_loss("{}: tensor '{}' has an absurd size", what, t.name);
      numel *= static_cast<int64_t>(ne);
      t.dims.push_back(static_cast<int64_t>(ne));
    }
    if (!c.get(type) || !c.get(t.offset)) return data_loss("{}: tensor '{}' info is truncated", what, t.name);
    if (!known_tensor_type(type))
      return unimplemented("{}: tensor '{}' has ggml type {} (kiln reads F32=0, F16=1, Q4_0=2, Q8_0=8)", what, t.name,
                           type);
    t.type = static_cast<TensorType>(type);
    if (t.dims[0] % block_elems(t.type) != 0)
      return data_loss("{}: tensor '{}' {} rows of {} are not whole blocks of {}", what, t.name,
                       tensor_type_name(t.type), t.dims[0], block_elems(t.type));
  }
  const uint64_t data_start = align_up(c.pos(), f.alignment);
  if (data_start > bytes.size() && num_tensors > 0)
    return data_loss("{}: the tensor data section is missing (file truncated?)", what);
  const uint64_t data_size = data_start <= bytes.size() ? bytes.size() - data_start : 0;
  // As llama.cpp requires: the tensors lie in file order, each at the previous one's end rounded
  // up to the alignment, so none overlaps another.
  uint64_t expected_offset = 0;
  for (TensorInfo& t : f.tensors) {
    const uint64_t nbytes = static_cast<uint64_t>(t.numel() / block_elems(t.type) * block_bytes(t.type));
    if (t.offset % f.alignment != 0)
      return data_loss("{}: tensor '{}' offset {} is not a multiple of the alignment {}", what, t.name, t.offset,
                       f.alignment);
    if (t.offset != expected_offset)
      return data_loss("{}: tensor '{}' offset {} is not {}, where the previous tensor ends (aligned to {})", what,
                       t.name, t.offset, expected_offset, f.alignment);
    if (t.offset > data_size || nbytes > data_size - t.offset)
      return data_loss("{}: tensor '{}' data [{}, {}) lies outside the {} data bytes (file truncated?)", what, t.name,
                       t.offset, t.offset + nbytes, data_size);
    t.data.assign(bytes.data() + data_start + t.offset, nbytes);
    expected_offset = align_up(t.offset + nbytes, f.alignment);  // both within the file: no overflow
  }
  return f;
}

Expected<File> read(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return not_found("{}: {}", path, ec.message());
  KILN_ASSIGN_OR_RETURN(std::string bytes, read_file(path, static_cast<int64_t>(size) + 1));
  return parse(bytes, path);
}

std::string serialize(const File& f) {
  std::string out;
  put<uint32_t>(out, kMagic);
  put<uint32_t>(out, 3);
  put<uint64_t>(out, f.tensors.size());
  const bool add_alignment = f.alignment != 32 && !f.find("general.alignment");
  put<uint64_t>(out, f.metadata.size() + (add_alignment ? 1 : 0));
  auto put_kv = [&](const std::string& key, const Value& v) {
    put_string(out, key);
    put<uint32_t>(out, static_cast<uint32_t>(v.type));
    if (v.type == ValueType::kString) {
      put_string(out, v.s);
    } else if (v.type == ValueType::kArray) {
      put<uint32_t>(out, static_cast<uint32_t>(v.elem));
      if (v.elem == ValueType::kString) {
        put<uint64_t>(out, v.strings.size());
        for (const std::string& s : v.strings) put_string(out, s);
      } else if (is_float(v.elem)) {
        put<uint64_t>(out, v.floats.size());
        for (double x : v.floats) write_scalar(out, v.elem, 0, x);
      } else {
        put<uint64_t>(out, v.ints.size());
        for (int64_t x : v.ints) write_scalar(out, v.elem, x, 0);
      }
    } else {
      write_scalar(out, v.type, v.i, v.f);
    }
  };
  for (const auto& [k, v] : f.metadata) put_kv(k, v);
  if (add_alignment) put_kv("general.alignment", Value::u32(static_cast<uint32_t>(f.alignment)));
  uint64_t offset = 0;
  for (const TensorInfo& t : f.tensors) {
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) put<uint64_t>(out, static_cast<uint64_t>(d));
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put<uint64_t>(out, offset);
    offset = align_up(offset + t.data.size(), f.alignment);
  }
  out.resize(align_up(out.size(), f.alignment), '\0');
  for (const TensorInfo& t : f.tensors) {
    out.append(t.data);
    out.resize(align_up(out.size(), f.alignment), '\0');
  }
  return out;
}

Status write(const std::string& path, const File& f) {
  for (const TensorInfo& t : f.tensors) {
    const int64_t want = t.numel() / block_elems(t.type) * block_bytes(t.type);
    if (t.dims.empty() || t.dims.size() > kMaxGgufDims || t.dims[0] % block_elems(t.type) != 0 ||
        static_cast<int64_t>(t.data.size()) != want)
      return invalid_argument("gguf write {}: tensor '{}' ({} dims, {}) holds {} bytes, its shape needs {}", path,
                              t.name, t.dims.size(), tensor_type_name(t.type), t.data.size(), want);
  }
  return write_file_atomic(path, {serialize(f)});
}

// ---- kiln Llama <-> llama.cpp ---------------------------------------------------------------------
std::string llama_tensor_name(std::string_view hf) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  constexpr std::string_view kLayer = "model.layers.";
  if (!hf.starts_with(kLayer)) return "";
  const std::string_view rest = hf.substr(kLayer.size());
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos) return "";
  const std::string_view idx = rest.substr(0, dot), suffix = rest.substr(dot + 1);
  static constexpr std::pair<std::string_view, std::string_view> kMap[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},  // MoE (Mixtral): the router
  };
  for (const auto& [from, to] : kMap)
    if (suffix == from) return fmt::format("blk.{}.{}", idx, to);
  // An expert's matrix is one slice of its layer's stacked tensor (moe_expert_tensor).
  if (suffix.starts_with("block_sparse_moe.experts.")) {
    const std::string_view w = suffix.substr(suffix.size() - std::string_view("w1.weight").size());
    const char* stacked = w == "w1.weight" ? "ffn_gate_exps" : w == "w2.weight" ? "ffn_down_exps"
                          : w == "w3.weight" ? "ffn_up_exps" : nullptr;
    if (stacked) return fmt::format("blk.{}.{}.weight", idx, stacked);
  }
  return "";
}

Expected<std::pair<int64_t, int64_t>> moe_expert_slice(std::string_view hf) {
  // model.layers.L.block_sparse_moe.experts.J.wK.weight -> (J, K)
  constexpr std::string_view kExperts = ".block_sparse_moe.experts.";
  const size_t at = hf.find(kExperts);
  if (at == std::string_view::npos) return invalid_argument("{} is not a MoE expert's weight", hf);
  const std::string_view rest = hf.substr(at + kExperts.size());
  int64_t j = 0, k = 0;
  if (std::sscanf(std::string(rest).c_str(), "%" SCNd64 ".w%" SCNd64 ".weight", &j, &k) != 2)
    return invalid_argument("{} is not a MoE expert's weight", hf);
  return std::pair{j, k};
}

void permute_rope_rows_to_gguf(const float* hf, float* out, int64_t heads, int64_t head_dim, int64_t cols) {
  for (int64_t r = 0; r < heads * head_dim; ++r)
    std::memcpy(out + gguf_rope_row(r, head_dim) * cols, hf + r * cols, static_cast<size_t>(cols) * 4);
}

void permute_rope_rows_from_gguf(const float* gg, float* out, int64_t heads, int64_t head_dim, int64_t cols) {
  for (int64_t r = 0; r < heads * head_dim; ++r)
    std::memcpy(out + r * cols, gg + gguf_rope_row(r, head_dim) * cols, static_cast<size_t>(cols) * 4);
}

namespace {

// llama.cpp token types.
constexpr int64_t kTokenNormal = 1, kTokenControl = 3, kTokenUnused = 5;

uint32_t file_type_of(TensorType t) {  // general.file_type: ALL_F32, MOSTLY_F16, MOSTLY_Q4_0, MOSTLY_Q8_0
  switch (t) {
    case TensorType::kF32: return 0;
    case TensorType::kF16: return 1;
    case TensorType::kQ4_0: return 2;
    case TensorType::kQ8_0: return 7;
  }
  return 0;
}

// tokenizer.json (kiln / HF byte-level BPE) -> tokenizer.ggml.* metadata, padded to vocab_size.
Status add_tokenizer(File& f, std::string_view json_text, int64_t vocab_size) {
  auto parsed = parse_json(json_text, "tokenizer.json");
  if (!parsed.ok()) return data_loss("{}", parsed.status().message());
  const nlohmann::json& j = *parsed;
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    return data_loss("tokenizer.json is not a tokenizer");
  const auto& model = j["model"];
  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges") || !model["merges"].is_array())
    return data_loss("tokenizer.json lacks model.vocab or model.merges");
  std::vector<std::string> tokens;
  std::vector<int64_t> types;
  for (const auto& [tok, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size)
      return invalid_argument("tokenizer.json: token '{}' id is outside the model's vocabulary of {}", tok, vocab_size);
    const size_t i = id.get<size_t>();
    if (tokens.size() <= i) {
      tokens.resize(i + 1);
      types.resize(i + 1, kTokenUnused);
    }
    tokens[i] = tok;
    types[i] = kTokenNormal;
  }
  std::vector<int64_t> specials;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string())
        return data_loss("tokenizer.json: malformed added_tokens entry");
      const int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id >= vocab_size) return invalid_argument("tokenizer.json: added token id {} out of range", id);
      if (static_cast<int64_t>(tokens.size()) <= id) {
        tokens.resize(static_cast<size_t>(id + 1));
        types.resize(static_cast<size_t>(id + 1), kTokenUnused);
      }
      tokens[static_cast<size_t>(id)] = a["content"].get<std::string>();
      types[static_cast<size_t>(id)] = kTokenControl;
      specials.push_back(id);
    }
  }
  // Ids the tokenizer never produces (a model vocabulary padded past the tokenizer's).
  tokens.resize(static_cast<size_t>(vocab_size));
  types.resize(static_cast<size_t>(vocab_size), kTokenUnused);
  for (size_t i = 0; i < tokens.size(); ++i)
    if (types[i] == kTokenUnused) tokens[i] = fmt::format("[PAD{}]", i);
  std::vector<std::string> merges;
  for (const auto& m : model["merges"]) {
    if (m.is_string()) merges.push_back(m.get<std::string>());
    else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
      merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    else return data_loss("tokenizer.json: a merge is neither \"a b\" nor [\"a\", \"b\"]");
  }
  f.metadata.emplace_back("tokenizer.ggml.model", Value::str("gpt2"));
  f.metadata.emplace_back("tokenizer.ggml.pre", Value::str("gpt-2"));  // the GPT-2 split regex kiln uses
  f.metadata.emplace_back("tokenizer.ggml.tokens", Value::str_array(std::move(tokens)));
  f.metadata.emplace_back("tokenizer.ggml.token_type", Value::i32_array(std::move(types)));
  f.metadata.emplace_back("tokenizer.ggml.merges", Value::str_array(std::move(merges)));
  if (!specials.empty()) {  // <|endoftext|> (kiln's only special) ends and separates documents
    f.metadata.emplace_back("tokenizer.ggml.bos_token_id", Value::u32(static_cast<uint32_t>(specials[0])));
    f.metadata.emplace_back("tokenizer.ggml.eos_token_id", Value::u32(static_cast<uint32_t>(specials[0])));
  }
  f.metadata.emplace_back("tokenizer.ggml.add_bos_token", Value::boolean(false));
  return {};
}

// tokenizer.ggml.* (model "gpt2") -> tokenizer.json text in kiln's format; unused pads dropped.
Expected<std::string> tokenizer_json_from(const File& f) {
  const Value* model = f.find("tokenizer.ggml.model");
  if (!model) return not_found("the file has no tokenizer");
  if (model->type != ValueType::kString || model->s != "gpt2")
    return unimplemented("tokenizer.ggml.model '{}' (kiln reads byte-level BPE, 'gpt2')", model->s);
  const Value* tokens = f.find("tokenizer.ggml.tokens");
  const Value* merges = f.find("tokenizer.ggml.merges");
  const Value* types = f.find("tokenizer.ggml.token_type");
  if (!tokens || tokens->type != ValueType::kArray || tokens->elem != ValueType::kString)
    return data_loss("tokenizer.ggml.tokens is missing or not a string array");
  if (!merges || merges->type != ValueType::kArray || merges->elem != ValueType::kString)
    return data_loss("tokenizer.ggml.merges is missing or not a string array");
  if (types && (types->type != ValueType::kArray || types->ints.size() != tokens->strings.size()))
    return data_loss("tokenizer.ggml.token_type does not match the tokens");
  // tokenizer.json is JSON: every token and merge must be UTF-8 (byte-level BPE's always are).
  for (const auto* list : {&tokens->strings, &merges->strings})
    for (const std::string& t : *list)
      if (!valid_utf8(t))
        return data_loss("tokenizer.ggml.{} holds a string that is not UTF-8",
                         list == &tokens->strings ? "tokens" : "merges");
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object(), added = nlohmann::ordered_json::array();
  for (size_t i = 0; i < tokens->strings.size(); ++i) {
    const int64_t type = types ? types->ints[i] : kTokenNormal;
    if (type == kTokenUnused) continue;
    vocab[tokens->strings[i]] = i;
    if (type == kTokenControl || type == 4 /* user-defined */)
      added.push_back({{"id", i}, {"content", tokens->strings[i]}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  const nlohmann::ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  nlohmann::ordered_json j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr},
                              {"added_tokens", added}, {"normalizer", nullptr}, {"pre_tokenizer", byte_level},
                              {"post_processor", nullptr}, {"decoder", byte_level},
                              {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                                         {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                                         {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                                         {"vocab", vocab}, {"merges", merges->strings}}}};
  return j.dump(1);
}

Expected<int64_t> get_int(const File& f, const std::string& key, int64_t fallback) {
  const Value* v = f.find(key);
  if (!v) {
    if (fallback >= 0) return fallback;
    return data_loss("gguf: metadata '{}' is missing", key);
  }
  if (!v->is_integer() || v->i < 0) return data_loss("gguf: metadata '{}' is not a non-negative integer", key);
  return v->i;
}
double get_float(const File& f, const std::string& key, double fallback) {
  const Value* v = f.find(key);
  if (!v) return fallback;
  if (is_float(v->type)) return v->f;
  if (v->is_integer()) return static_cast<double>(v->i);
  return fallback;
}

}  // namespace

Expected<File> llama_to_gguf(Transformer& model, std::string_view tokenizer_json, TensorType type,
                             std::string_view name) {
  const ModelConfig& c = model.config();
  if (!c.is_llama()) return unimplemented("GGUF export of a {} model (kiln writes the Llama family)", family_name(c.family));
  if (c.rope_scaling.type != RopeType::kDefault || c.attention_bias || c.mlp_bias)  // not written: refuse, not drop
    return unimplemented("GGUF export of a Llama with RoPE scaling or biases ({})", c.describe());
  if (c.is_moe() && (c.num_shared_experts > 0 || c.moe_layer_freq != 1))
    return unimplemented("GGUF export of a MoE model with shared experts or dense blocks between MoE ones: llama.cpp's "
                         "llama architecture has neither ({})", c.describe());
  if (model.expert_shard().size != 1)
    return invalid_argument("GGUF export needs every expert, not an expert shard ({} of {})", model.expert_shard().rank,
                            model.expert_shard().size);
  File f;
  f.metadata.emplace_back("general.architecture", Value::str("llama"));
  f.metadata.emplace_back("general.name", Value::str(std::string(name)));
  f.metadata.emplace_back("general.file_type", Value::u32(file_type_of(type)));
  f.metadata.emplace_back("llama.vocab_size", Value::u32(static_cast<uint32_t>(c.vocab_size)));
  f.metadata.emplace_back("llama.context_length", Value::u32(static_cast<uint32_t>(c.max_seq_len)));
  f.metadata.emplace_back("llama.embedding_length", Value::u32(static_cast<uint32_t>(c.d_model)));
  f.metadata.emplace_back("llama.block_count", Value::u32(static_cast<uint32_t>(c.n_layers)));
  f.metadata.emplace_back("llama.feed_forward_length", Value::u32(static_cast<uint32_t>(c.d_ff)));
  f.metadata.emplace_back("llama.attention.head_count", Value::u32(static_cast<uint32_t>(c.n_heads)));
  f.metadata.emplace_back("llama.attention.head_count_kv", Value::u32(static_cast<uint32_t>(c.n_kv_heads)));
  f.metadata.emplace_back("llama.rope.dimension_count", Value::u32(static_cast<uint32_t>(c.head_dim())));
  f.metadata.emplace_back("llama.rope.freq_base", Value::f32(static_cast<float>(c.rope_theta)));
  f.metadata.emplace_back("llama.attention.layer_norm_rms_epsilon", Value::f32(c.norm_eps));
  if (c.is_moe()) {  // Mixtral: feed_forward_length is the experts' width
    for (auto& [key, v] : f.metadata)
      if (key == "llama.feed_forward_length") v = Value::u32(static_cast<uint32_t>(c.expert_d_ff()));
    f.metadata.emplace_back("llama.expert_count", Value::u32(static_cast<uint32_t>(c.num_experts)));
    f.metadata.emplace_back("llama.expert_used_count", Value::u32(static_cast<uint32_t>(c.num_experts_per_tok)));
  }
  if (!tokenizer_json.empty()) KILN_RETURN_IF_ERROR(add_tokenizer(f, tokenizer_json, c.vocab_size));

  std::vector<float> tmp;
  for (const ParamEntry& e : model.param_entries()) {
    TensorInfo t;
    t.name = llama_tensor_name(e.name);
    if (t.name.empty()) return internal_error("no llama.cpp name for tensor {}", e.name);
    const float* w = model.params().data() + e.offset;
    int64_t n = e.shape.numel();
    if (auto slice = moe_expert_slice(e.name); slice.ok()) {
      // The layer's experts stacked into one (E, rows, cols) tensor, written at expert 0.
      if (slice->first != 0) continue;
      const std::string prefix = e.name.substr(0, e.name.find(".experts.") + 9);
      tmp.resize(static_cast<size_t>(n * c.num_experts));
      for (int64_t j = 0; j < c.num_experts; ++j)
        std::copy_n(model.param(fmt::format("{}{}.w{}.weight", prefix, j, slice->second)), n, tmp.data() + j * n);
      t.dims = {e.shape[1], e.shape[0], c.num_experts};
      t.type = (e.shape[1] % block_elems(type) == 0) ? type : TensorType::kF16;
      t.data = encode_tensor(tmp.data(), n * c.num_experts, t.type);
      f.tensors.push_back(std::move(t));
      continue;
    }
    if (e.shape.rank() == 2) {
      const int64_t rows = e.shape[0], cols = e.shape[1];
      t.dims = {cols, rows};
      const bool is_q = e.name.ends_with("q_proj.weight"), is_k = e.name.ends_with("k_proj.weight");
      if (is_q || is_k) {
        tmp.resize(static_cast<size_t>(n));
        permute_rope_rows_to_gguf(w, tmp.data(), is_q ? c.n_heads : c.n_kv_heads, c.head_dim(), cols);
        w = tmp.data();
      }
      t.type = (cols % block_elems(type) == 0) ? type : TensorType::kF16;
    } else {
      t.dims = {n};
      t.type = TensorType::kF32;
    }
    t.data = encode_tensor(w, n, t.type);
    f.tensors.push_back(std::move(t));
  }
  return f;
}

Expected<LoadedModel> llama_from_gguf(const File& f) {
  const Value* arch = f.find("general.architecture");
  if (!arch || arch->type != ValueType::kString)
    return data_loss("gguf: general.architecture is missing");
  if (arch->s != "llama") return unimplemented("gguf: architecture '{}' (kiln loads 'llama')", arch->s);
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  const TensorInfo* embd = f.tensor("token_embd.weight");
  if (!embd || embd->dims.size() != 2) return data_loss("gguf: token_embd.weight is missing or not 2-D");
  KILN_ASSIGN_OR_RETURN(c.vocab_size, get_int(f, "llama.vocab_size", embd->dims[1]));
  KILN_ASSIGN_OR_RETURN(c.d_model, get_int(f, "llama.embedding_length", -1));
  KILN_ASSIGN_OR_RETURN(c.n_layers, get_int(f, "llama.block_count", -1));
  KILN_ASSIGN_OR_RETURN(c.d_ff, get_int(f, "llama.feed_forward_length", -1));
  KILN_ASSIGN_OR_RETURN(c.n_heads, get_int(f, "llama.attention.head_count", -1));
  KILN_ASSIGN_OR_RETURN(c.n_kv_heads, get_int(f, "llama.attention.head_count_kv", c.n_heads));
  KILN_ASSIGN_OR_RETURN(c.max_seq_len, get_int(f, "llama.context_length", 2048));
  c.rope_theta = get_float(f, "llama.rope.freq_base", 10000.0);
  c.norm_eps = static_cast<float>(get_float(f, "llama.attention.layer_norm_rms_epsilon", 1e-5));
  c.tied_embeddings = f.tensor("output.weight") == nullptr;
  KILN_ASSIGN_OR_RETURN(c.num_experts, get_int(f, "llama.expert_count", 0));
  if (c.is_moe()) {  // Mixtral: every block MoE, feed_forward_length the experts' width
    KILN_ASSIGN_OR_RETURN(c.num_experts_per_tok, get_int(f, "llama.expert_used_count", -1));
    if (c.num_experts > 4096) return data_loss("gguf: llama.expert_count {} is absurd", c.num_experts);
  }
  if (f.find("llama.rope.scaling.type") || f.find("llama.rope.scaling.factor"))
    return unimplemented("gguf: Llama RoPE scaling is not supported");
  if (c.n_layers > 4096 || c.d_model > (1 << 20) || c.d_ff > (1 << 22) || c.vocab_size > (1 << 24) ||
      c.max_seq_len > (1 << 24))
    return data_loss("gguf: model sizes are absurd ({})", c.describe());
  if (Status s = check_config(c); !s.ok()) return Status(s.code(), fmt::format("gguf: {}", s.message()));
  // Every tensor the config needs against the file before the model is allocated (a file
  // whose metadata claims a huge model must fail at once, not after allocating it).
  const std::vector<ParamEntry> entries = Transformer::param_entries_for(c);
  std::vector<const TensorInfo*> infos;
  for (const ParamEntry& e : entries) {
    const std::string gname = llama_tensor_name(e.name);
    const TensorInfo* t = f.tensor(gname);
    if (!t) return data_loss("gguf: tensor {} (kiln's {}) is missing", gname, e.name);
    std::vector<int64_t> want;
    for (int64_t d = e.shape.rank() - 1; d >= 0; --d) want.push_back(e.shape[d]);
    if (moe_expert_slice(e.name).ok()) want.push_back(c.num_experts);  // the layer's experts stacked
    if (t->dims != want)
      return invalid_argument("gguf: tensor {} has dims [{}], the config needs [{}] (fastest first)", gname,
                              fmt::join(t->dims, ", "), fmt::join(want, ", "));
    infos.push_back(t);
  }
  KILN_ASSIGN_OR_RETURN(auto model, Transformer::create(c, 0));
  KILN_CHECK(model->param_entries().size() == entries.size());

  std::vector<float> tmp;
  std::map<const TensorInfo*, std::vector<float>> stacked;  // MoE: a layer's experts, decoded
  for (size_t k = 0; k < entries.size(); ++k) {
    const ParamEntry& e = model->param_entries()[k];
    const TensorInfo* t = infos[k];
    float* w = model->params().data() + e.offset;
    const int64_t n = e.shape.numel();
    const bool is_q = e.name.ends_with("q_proj.weight"), is_k = e.name.ends_with("k_proj.weight");
    if (auto slice = moe_expert_slice(e.name); slice.ok()) {  // expert j's slice of the stacked tensor
      std::vector<float>& all = stacked[t];  // decoded once per layer and projection
      if (all.empty()) {
        all.resize(static_cast<size_t>(n * c.num_experts));
        decode_tensor(t->data, n * c.num_experts, t->type, all.data());
      }
      std::copy_n(all.data() + slice->first * n, n, w);
      if (slice->first + 1 == c.num_experts) all = {};
    } else if (is_q || is_k) {
      tmp.resize(static_cast<size_t>(n));
      decode_tensor(t->data, n, t->type, tmp.data());
      permute_rope_rows_from_gguf(tmp.data(), w, is_q ? c.n_heads : c.n_kv_heads, c.head_dim(), e.shape[1]);
    } else {
      decode_tensor(t->data, n, t->type, w);
    }
  }
  LoadedModel out;
  out.model = std::move(model);
  auto tk = tokenizer_json_from(f);
  if (tk.ok()) out.tokenizer_json = std::move(*tk);
  else out.tokenizer_note = tk.status().message();
  return out;
}

Expected<LoadedModel> load_llama(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(File f, read(path));
  auto m = llama_from_gguf(f);
  if (!m.ok()) return Status(m.status().code(), fmt::format("{}: {}", path, m.status().message()));
  return m;
}

}  // namespace kiln::gguf
