// safetensors writer/reader and HF config.json mapping.
#include "kiln/model/weights.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kiln/core/file_io.h"
#include "kiln/model/gguf.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// HF GPT-2 keeps these as Conv1D weights, (in, out): transposed from kiln's (out, in).
bool hf_transposed(const ModelConfig& c, const std::string& name) {
  if (c.family != ModelFamily::kGpt2) return false;
  return name.ends_with("attn.c_attn.weight") || name.ends_with("attn.c_proj.weight") ||
         name.ends_with("mlp.c_fc.weight") || name.ends_with("mlp.c_proj.weight");
}


}  // namespace

Status save_model(const std::string& dir, Transformer& model) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return not_found("cannot create {}: {}", dir, ec.message());
  const ModelConfig& c = model.config();
  KILN_RETURN_IF_ERROR(write_file_atomic((fs::path(dir) / "config.json").string(), {config_to_hf_json(c)}));
  // Data: each tensor in HF layout, in entry order.
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}, {"writer", "kiln"}};
  std::vector<float> data;
  data.reserve(model.params().size());
  for (const ParamEntry& e : model.param_entries()) {
    const float* w = model.params().data() + e.offset;
    const uint64_t begin = data.size() * 4;
    std::vector<int64_t> shape(e.shape.begin(), e.shape.end());
    if (hf_transposed(c, e.name)) {
      const int64_t rows = e.shape[0], cols = e.shape[1];
      for (int64_t j = 0; j < cols; ++j)
        for (int64_t i = 0; i < rows; ++i) data.push_back(w[i * cols + j]);
      std::swap(shape[0], shape[1]);
    } else {
      data.insert(data.end(), w, w + e.shape.numel());
    }
    header[e.name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size() * 4}}};
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h += ' ';  // align the data to 8 bytes
  std::string prefix(8, '\0');
  const uint64_t hlen = h.size();
  std::memcpy(prefix.data(), &hlen, 8);
  return write_file_atomic((fs::path(dir) / "model.safetensors").string(),
                           {prefix, h, as_bytes(data.data(), data.size())});
}

Expected<std::unique_ptr<Transformer>> load_model(const std::string& dir) {
  if (dir.ends_with(".gguf")) {  // a llama.cpp file: dequantized to fp32 (gguf.h)
    KILN_ASSIGN_OR_RETURN(gguf::LoadedModel m, gguf::load_llama(dir));
    return std::move(m.model);
  }
  const fs::path cfg_path = fs::path(dir) / "config.json", st_path = fs::path(dir) / "model.safetensors";
  auto cfg_text = read_file(cfg_path.string(), int64_t{1} << 20);
  if (!cfg_text.ok())
    return Status(cfg_text.status().code(),
                  fmt::format("{} (a model directory holds config.json and model.safetensors)", cfg_text.status().message()));
  auto cfg = config_from_hf_json(*cfg_text);
  if (!cfg.ok()) return Status(cfg.status().code(), fmt::format("{}: {}", cfg_path.string(), cfg.status().message()));
  KILN_ASSIGN_OR_RETURN(auto model, Transformer::create(*cfg, 0));

  std::error_code ec;
  const uint64_t size = fs::file_size(st_path, ec);
  if (ec) return not_found("{}: {}", st_path.string(), ec.message());
  std::ifstream in(st_path, std::ios::binary);
  uint64_t hlen = 0;
  if (size < 8 || !in.read(reinterpret_cast<char*>(&hlen), 8)) return data_loss("{}: too short", st_path.string());
  if (hlen > kMaxHeaderBytes || hlen > size - 8)
    return data_loss("{}: header length {} does not fit the file of {} bytes", st_path.string(), hlen, size);
  std::string h(hlen, '\0');
  if (!in.read(h.data(), static_cast<std::streamsize>(hlen))) return data_loss("{}: truncated header", st_path.string());
  const nlohmann::json header = nlohmann::json::parse(h, nullptr, false);
  if (header.is_discarded() || !header.is_object()) return data_loss("{}: header is not JSON", st_path.string());
  const uint64_t data_start = 8 + hlen, data_bytes = size - data_start;
  const ModelConfig& c = model->config();
  std::vector<char> raw;
  for (const ParamEntry& e : model->param_entries()) {
    if (!header.contains(e.name)) {
      if (header.contains(e.name.substr(0, e.name.rfind('.')) + ".qweight"))  // kiln quantized format
        return failed_precondition("{} holds a quantized model: load it with quant::load_any_model (kiln eval and "
                                   "generate do)", st_path.string());
      return data_loss("{}: tensor {} is missing", st_path.string(), e.name);
    }
    const auto& t = header[e.name];
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
      return data_loss("{}: tensor {} has a malformed entry", st_path.string(), e.name);
    const std::string dt = t["dtype"].is_string() ? t["dtype"].get<std::string>() : "";
    DType dtype;
    if (dt == "F32") dtype = DType::kF32;
    else if (dt == "F16") dtype = DType::kF16;
    else if (dt == "BF16") dtype = DType::kBF16;
    else return unimplemented("{}: tensor {} has dtype '{}' (F32, F16 and BF16 load)", st_path.string(), e.name, dt);
    std::vector<int64_t> want(e.shape.begin(), e.shape.end());
    if (hf_transposed(c, e.name)) std::swap(want[0], want[1]);
    std::vector<int64_t> got;
    if (!t["shape"].is_array()) return data_loss("{}: tensor {} shape is not a list", st_path.string(), e.name);
    for (const auto& d : t["shape"]) {
      if (!d.is_number_integer()) return data_loss("{}: tensor {} shape is not integers", st_path.string(), e.name);
      got.push_back(d.get<int64_t>());
    }
    if (got != want)
      return invalid_argument("{}: tensor {} has shape [{}], the config needs [{}]", st_path.string(), e.name,
                              fmt::join(got, ", "), fmt::join(want, ", "));
    const auto& off = t["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return data_loss("{}: tensor {} has malformed data_offsets", st_path.string(), e.name);
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    const uint64_t need = static_cast<uint64_t>(e.shape.numel()) * static_cast<uint64_t>(dtype_bits(dtype) / 8);
    if (b > en || en > data_bytes || en - b != need)
      return data_loss("{}: tensor {} data [{}, {}) is outside the file or not {} bytes (file truncated?)",
                       st_path.string(), e.name, b, en, need);
    raw.resize(need);
    in.seekg(static_cast<std::streamoff>(data_start + b));
    if (!in.read(raw.data(), static_cast<std::streamsize>(need)))
      return data_loss("{}: short read of tensor {}", st_path.string(), e.name);
    float* w = model->params().data() + e.offset;
    const int64_t n = e.shape.numel();
    if (hf_transposed(c, e.name)) {
      const int64_t rows = e.shape[0], cols = e.shape[1];  // kiln (rows, cols) from HF (cols, rows)
      for (int64_t j = 0; j < cols; ++j)
        for (int64_t i = 0; i < rows; ++i) w[i * cols + j] = load_as_f32(raw.data(), dtype, j * rows + i);
    } else {
      for (int64_t i = 0; i < n; ++i) w[i] = load_as_f32(raw.data(), dtype, i);
    }
  }
  return model;
}

}  // namespace kiln
