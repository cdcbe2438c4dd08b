// Model directories: save_model writes config.json + model.safetensors; load_model checks the
// file against the config (safetensors.h reads it) before allocating the model.
#include "kiln/model/weights.h"

#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "kiln/core/file_io.h"
#include "kiln/model/gguf.h"
#include "kiln/model/safetensors.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// HF GPT-2 keeps these as Conv1D weights, (in, out): transposed from kiln's (out, in).
bool hf_transposed(const ModelConfig& c, const std::string& name) {
  if (c.family != ModelFamily::kGpt2) return false;
  return name.ends_with("attn.c_attn.weight") || name.ends_with("attn.c_proj.weight") ||
         name.ends_with("mlp.c_fc.weight") || name.ends_with("mlp.c_proj.weight");
}


// The float dtypes load_model converts to fp32.
std::optional<DType> float_dtype(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return std::nullopt;
}

// Tensors a checkpoint may hold that are no parameter: buffers transformers derives from the
// config (RoPE inverse frequencies; GPT-2's causal masks), which kiln computes itself.
bool is_derived_buffer(const ModelConfig& c, std::string_view name) {
  if (name.ends_with(".rotary_emb.inv_freq")) return true;
  return c.family == ModelFamily::kGpt2 && (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"));
}

}  // namespace

Expected<std::vector<const SafetensorsTensor*>> match_params(SafetensorsFile& st, const ModelConfig& c,
                                                              const std::vector<ParamEntry>& entries) {
  const std::string& path = st.path();
  std::vector<const SafetensorsTensor*> out;
  std::set<std::string_view> used;
  for (const ParamEntry& e : entries) {
    const SafetensorsTensor* t = st.header().find(e.name);
    if (t == nullptr) {
      if (st.header().find(e.name.substr(0, e.name.rfind('.')) + ".qweight"))  // kiln quantized format
        return failed_precondition("{} holds a kiln-quantized model; this command needs an fp32, bf16 or f16 one "
                                   "(kiln serve, generate and eval run quantized models)", path);
      return data_loss("{}: tensor {} is missing (config.json: {})", path, e.name, c.describe());
    }
    if (!float_dtype(t->dtype))
      return unimplemented("{}: tensor {} has dtype '{}' (F32, F16 and BF16 load)", path, e.name, t->dtype);
    std::vector<int64_t> want(e.shape.begin(), e.shape.end());
    if (hf_transposed(c, e.name)) std::swap(want[0], want[1]);
    if (!t->shape_is(want))
      return invalid_argument("{}: tensor {} has shape [{}], the config needs [{}]", path, e.name,
                              fmt::join(t->shape, ", "), fmt::join(want, ", "));
    out.push_back(t);
    used.insert(t->name);
  }
  // A tensor the config does not use means config.json misdescribes the file (a bias, a layer,
  // an untied head kiln would silently drop): an error naming them.
  std::vector<std::string_view> extra;
  for (const SafetensorsTensor& t : st.header().tensors) {
    if (used.count(t.name) || is_derived_buffer(c, t.name)) continue;
    if (c.tied_embeddings && t.name == "lm_head.weight" && !entries.empty()) {
      // A tied head stored anyway is fine when it is the embedding's copy.
      const SafetensorsTensor* emb = st.header().find(entries[0].name);
      if (emb && emb->dtype == t.dtype && emb->shape == t.shape) {
        KILN_ASSIGN_OR_RETURN(const std::string a, st.read(*emb));
        KILN_ASSIGN_OR_RETURN(const std::string b, st.read(t));
        if (a == b) continue;
      }
      return invalid_argument("{}: config.json ties the LM head to the embedding (tie_word_embeddings), but the file "
                              "holds an lm_head.weight that differs from {}", path, entries[0].name);
    }
    extra.push_back(t.name);
  }
  if (!extra.empty()) {
    const size_t shown = std::min<size_t>(extra.size(), 5);
    return invalid_argument("{}: {} tensor(s) the config does not use: {}{} (config.json: {})", path, extra.size(),
                            fmt::join(extra.begin(), extra.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
                            extra.size() > shown ? ", ..." : "", c.describe());
  }
  return out;
}

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
  if (cfg.ok()) {
    if (Status s = check_config(*cfg); !s.ok()) cfg = s;
  }
  if (!cfg.ok()) return Status(cfg.status().code(), fmt::format("{}: {}", cfg_path.string(), cfg.status().message()));
  KILN_ASSIGN_OR_RETURN(SafetensorsFile st, SafetensorsFile::open(st_path.string()));
  if (!st.header().metadata_value("kiln.quant.method").empty())
    return failed_precondition("{} holds a kiln-quantized model; this command needs an fp32, bf16 or f16 one "
                               "(kiln serve, generate and eval run quantized models)", st_path.string());
  // Every name, dtype and shape against the header before the model is allocated.
  const std::vector<ParamEntry> entries = Transformer::param_entries_for(*cfg);
  KILN_ASSIGN_OR_RETURN(std::vector<const SafetensorsTensor*> tensors, match_params(st, *cfg, entries));
  KILN_ASSIGN_OR_RETURN(auto model, Transformer::create(*cfg, 0));
  KILN_CHECK(model->param_entries().size() == entries.size());

  std::string raw;
  for (size_t k = 0; k < entries.size(); ++k) {
    const ParamEntry& e = model->param_entries()[k];
    const SafetensorsTensor& t = *tensors[k];
    const DType dtype = *float_dtype(t.dtype);
    raw.resize(t.num_bytes());
    KILN_RETURN_IF_ERROR(st.read_into(t, raw));
    float* w = model->params().data() + e.offset;
    const int64_t n = e.shape.numel();
    if (hf_transposed(*cfg, e.name)) {
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
