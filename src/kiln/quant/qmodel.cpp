// Whole-model quantization drivers and the quantized safetensors format.
#include "kiln/quant/qmodel.h"

#include "kiln/model/packed_linear.h"

#include "kiln/quant/gguf_weights.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "kiln/core/file_io.h"
#include "kiln/model/safetensors.h"
#include "kiln/model/weights.h"
#include "kiln/quant/smooth.h"

namespace kiln::quant {

namespace {
namespace fs = std::filesystem;

Linear* find_linear(Transformer& m, const std::string& name) {
  for (Linear* l : m.linears())
    if (l->name == name) return l;
  return nullptr;
}

// Block index of a layer weight name ("model.layers.3." / "transformer.h.3."), -1 otherwise.
int64_t layer_index(const std::string& name) {
  static const std::regex re(R"((?:layers|h)\.(\d+)\.)");
  std::smatch m;
  if (std::regex_search(name, m, re)) return std::stoll(m[1].str());
  return -1;
}

// HF GPT-2 stores its Conv1D weights (in, out), transposed from kiln's (out, in).
bool hf_transposed(const ModelConfig& c, const std::string& name) {
  if (c.family != ModelFamily::kGpt2) return false;
  return name.ends_with("attn.c_attn.weight") || name.ends_with("attn.c_proj.weight") ||
         name.ends_with("mlp.c_fc.weight") || name.ends_with("mlp.c_proj.weight");
}

// The Linears a method quantizes: every block Linear; the head only on request and untied.
std::vector<Linear*> targets(Transformer& model, bool quantize_head) {
  std::vector<Linear*> all = model.linears(), out;
  for (size_t i = 0; i + 1 < all.size(); ++i) out.push_back(all[i]);
  if (quantize_head && !model.config().tied_embeddings) out.push_back(all.back());
  return out;
}

std::string base_name(const std::string& weight_name) {
  return weight_name.ends_with(".weight") ? weight_name.substr(0, weight_name.size() - 7) : weight_name;
}

constexpr const char* kMetaMethod = "kiln.quant.method";
}  // namespace

Expected<Method> parse_method(const std::string& name) {
  if (name == "rtn") return Method::kRtn;
  if (name == "gptq") return Method::kGptq;
  if (name == "awq") return Method::kAwq;
  if (name == "smoothquant") return Method::kSmoothQuant;
  if (name == "fp8") return Method::kFp8;
  if (name == "qat") return Method::kQat;
  return invalid_argument("[quantize] method '{}' (rtn, gptq, awq, smoothquant or fp8)", name);
}

std::string_view method_name(Method m) {
  switch (m) {
    case Method::kRtn: return "rtn";
    case Method::kGptq: return "gptq";
    case Method::kAwq: return "awq";
    case Method::kSmoothQuant: return "smoothquant";
    case Method::kFp8: return "fp8";
    case Method::kQat: return "qat";
  }
  return "?";
}

Expected<QuantizedState> shard_quantized_state(const QuantizedState& full, std::span<const ParamEntry> shard) {
  QuantizedState out = full;
  out.weights.clear();
  for (const ParamEntry& e : shard) {
    auto it = full.weights.find(e.name);
    if (it == full.weights.end()) continue;
    const QTensor& q = it->second;
    const ParamSplit& split = e.split;
    QTensor t;
    t.scheme = q.scheme;
    t.rows = e.shape[0];
    t.cols = e.shape[1];
    const bool per_tensor = q.scheme.group == QuantScheme::kPerTensor;
    const bool cut = split.kind == ParamSplit::Kind::kColumns && split.count < q.cols;  // (tp 1 keeps them all)
    // Per-block int8 activations slice exactly: the group check below keeps whole blocks.
    if (cut && (full.act == ActQuant::kInt8 || full.act == ActQuant::kFp8))
      return invalid_argument("{}: int8 activations ({}) do not split over tensor-parallel ranks: the per-token scale "
                              "spans the whole input row, which the split cuts", e.name, method_name(full.method));
    if (cut && q.scheme.group > 0 && (split.begin % q.scheme.group != 0 || split.count % q.scheme.group != 0))
      return invalid_argument("{}: its {} groups do not split into {} of its {} input columns per tensor-parallel rank",
                              e.name, q.scheme.describe(), split.count, q.cols);
    // Rows of the whole tensor this shard holds, in its order (kRows: each block's range).
    std::vector<int64_t> rows;
    if (split.kind == ParamSplit::Kind::kRows) {
      const int64_t block = q.rows / split.parts;
      for (int64_t p = 0; p < split.parts; ++p)
        for (int64_t r = 0; r < split.count; ++r) rows.push_back(p * block + split.begin + r);
    } else {
      for (int64_t r = 0; r < q.rows; ++r) rows.push_back(r);
    }
    const int64_t c0 = split.kind == ParamSplit::Kind::kColumns ? split.begin : 0;
    const int64_t g0 = q.scheme.group > 0 ? c0 / q.scheme.group : 0;
    for (int64_t r : rows) {
      t.codes.insert(t.codes.end(), q.codes.begin() + r * q.cols + c0, q.codes.begin() + r * q.cols + c0 + t.cols);
      if (per_tensor) continue;
      const int64_t g = t.groups_per_row(), from = r * q.groups_per_row() + g0;
      t.scales.insert(t.scales.end(), q.scales.begin() + from, q.scales.begin() + from + g);
      if (!q.zeros.empty()) t.zeros.insert(t.zeros.end(), q.zeros.begin() + from, q.zeros.begin() + from + g);
    }
    if (per_tensor) {
      t.scales = q.scales;
      t.zeros = q.zeros;
    }
    out.weights.emplace(e.name, std::move(t));
  }
  return out;
}

void install_backends(Transformer& model, const QuantizedState& state) {
  const bool tied = model.config().tied_embeddings;
  for (Linear* l : model.linears()) {
    auto it = state.weights.find(l->name);
    if (it == state.weights.end()) continue;
    const bool is_tied_head = tied && l == model.linears().back();
    if (!is_tied_head) it->second.dequantize(model.param(l->name));
    l->backend = std::make_shared<QuantizedLinear>(it->second, state.act);
  }
}

Expected<QuantizedState> quantize_model(Transformer& model, const TokenShard* calib, const QuantizeOptions& o,
                                        std::string* log) {
  QuantizedState st;
  st.method = o.method;
  st.scheme = o.scheme;
  if (o.method == Method::kSmoothQuant) {
    st.scheme = QuantScheme{};
    st.scheme.bits = 8;
    st.scheme.symmetric = true;
    st.scheme.group = QuantScheme::kPerChannel;
    st.act = ActQuant::kInt8;
  } else if (o.method == Method::kFp8) {
    st.scheme.format = QFormat::kFp8E4M3;
    st.scheme.bits = 8;
    st.scheme.symmetric = true;
    if (st.scheme.group > 0) st.scheme.group = QuantScheme::kPerChannel;
    st.act = ActQuant::kFp8;
  }
  std::vector<Linear*> todo = targets(model, o.quantize_head);
  for (Linear* l : todo) KILN_RETURN_IF_ERROR(check_scheme(st.scheme, l->in));
  const bool needs_calib = o.method == Method::kGptq || o.method == Method::kAwq ||
                           o.method == Method::kSmoothQuant || o.report;
  if (needs_calib && calib == nullptr)
    return invalid_argument("[quantize] {} needs calibration data (--data)", method_name(o.method));
  std::vector<int32_t> tokens;
  if (needs_calib) tokens = calibration_tokens(*calib, o.calib);
  auto say = [&](const std::string& s) {
    if (log) *log += s;
  };
  std::map<std::string, LinearStats> stats;
  if (o.method == Method::kAwq || o.method == Method::kSmoothQuant || o.report) {
    KILN_ASSIGN_OR_RETURN(stats, capture_stats(model, tokens, o.calib, false));
    say(fmt::format("calibration: {} sequences × {} tokens from the corpus\n", o.calib.samples, o.calib.seq_len));
  }
  if (o.report) say(range_report(model, stats, st.scheme));

  if (o.method == Method::kAwq || o.method == Method::kSmoothQuant) {
    KILN_ASSIGN_OR_RETURN(auto groups, smooth_groups(model));
    std::vector<std::vector<float>> scales;
    double total_awq = 0, total_rtn = 0;
    for (const SmoothGroup& g : groups) {
      const LinearStats& x = stats.at(g.consumers[0]);
      if (o.method == Method::kAwq) {
        AwqChoice c = awq_search(model, g, x, st.scheme, o.alpha);
        say(fmt::format("awq {:<40} alpha {:.2f}  output error {:.4e} (RTN {:.4e}, {:+.1f}%)\n", g.consumers[0],
                        c.alpha, c.error, c.error_rtn,
                        c.error_rtn > 0 ? 100.0 * (c.error - c.error_rtn) / c.error_rtn : 0.0));
        total_awq += c.error;
        total_rtn += c.error_rtn;
        scales.push_back(std::move(c.s));
      } else {
        scales.push_back(smoothquant_scales(model, g, x, o.alpha >= 0 ? o.alpha : 0.5));
      }
    }
    if (o.method == Method::kAwq)
      say(fmt::format("awq: summed output error on the calibration sample {:.4e}, RTN {:.4e} ({:+.1f}%)\n", total_awq,
                      total_rtn, total_rtn > 0 ? 100.0 * (total_awq - total_rtn) / total_rtn : 0.0));
    for (size_t i = 0; i < groups.size(); ++i) KILN_RETURN_IF_ERROR(apply_smoothing(model, groups[i], scales[i]));
  }

  if (o.method == Method::kGptq) {
    // Sequential: block b's inputs are captured through blocks < b already quantized (their
    // QuantizedLinear backends installed), all Linears of block b from one pass.
    std::map<int64_t, std::vector<Linear*>> blocks;
    for (Linear* l : todo) blocks[layer_index(l->name)].push_back(l);
    // The head (index -1) goes last.
    std::vector<int64_t> order;
    for (auto& [b, ls] : blocks)
      if (b >= 0) order.push_back(b);
    if (blocks.count(-1)) order.push_back(-1);
    double total_gptq = 0, total_rtn = 0;
    for (int64_t b : order) {
      std::vector<std::string> names;
      for (Linear* l : blocks[b]) names.push_back(l->name);
      KILN_ASSIGN_OR_RETURN(auto bstats, capture_stats(model, tokens, o.calib, true, names));
      for (Linear* l : blocks[b]) {
        const std::vector<float> h = bstats.at(l->name).hessian();
        KILN_ASSIGN_OR_RETURN(GptqResult r, gptq_quantize(l->w, l->out, l->in, h.data(), st.scheme, o.gptq));
        // The layer's output error against RTN's under the same H (what GPTQ minimizes).
        const std::vector<float> wg = r.q.dequantize();
        const std::vector<float> wr = quantize_rtn(l->w, l->out, l->in, st.scheme).dequantize();
        const double eg = layer_output_error(l->w, wg.data(), l->out, l->in, h.data());
        const double er = layer_output_error(l->w, wr.data(), l->out, l->in, h.data());
        say(fmt::format("gptq {:<40} output MSE/token {:.4e} (RTN {:.4e}, {:+.1f}%), damping λ {:.3e}\n", l->name, eg,
                        er, er > 0 ? 100.0 * (eg - er) / er : 0.0, r.damp_used));
        total_gptq += eg;
        total_rtn += er;
        l->backend = std::make_shared<QuantizedLinear>(r.q, st.act);
        st.weights.emplace(l->name, std::move(r.q));
      }
    }
    say(fmt::format("gptq: summed layer output MSE/token {:.4e}, RTN {:.4e} ({:+.1f}%)\n", total_gptq, total_rtn,
                    total_rtn > 0 ? 100.0 * (total_gptq - total_rtn) / total_rtn : 0.0));
  } else {
    for (Linear* l : todo) st.weights.emplace(l->name, quantize_rtn(l->w, l->out, l->in, st.scheme));
  }
  install_backends(model, st);
  say(fmt::format("quantized {} Linears: {} weights, activations {}\n", st.weights.size(), st.scheme.describe(),
                  act_quant_name(st.act)));
  return st;
}

// ---- format --------------------------------------------------------------------------------
Status save_quantized_model(const std::string& dir, Transformer& model, const QuantizedState& st) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return not_found("cannot create {}: {}", dir, ec.message());
  const ModelConfig& c = model.config();
  KILN_RETURN_IF_ERROR(write_file_atomic((fs::path(dir) / "config.json").string(), {config_to_hf_json(c)}));
  nlohmann::ordered_json header;
  const QuantScheme& s = st.scheme;
  header["__metadata__"] = {{"format", "pt"},
                            {"writer", "kiln"},
                            {kMetaMethod, std::string(method_name(st.method))},
                            {"kiln.quant.format", s.format == QFormat::kFp8E4M3 ? "fp8e4m3" : "int"},
                            {"kiln.quant.bits", std::to_string(s.bits)},
                            {"kiln.quant.group", std::to_string(s.group)},
                            {"kiln.quant.symmetric", s.symmetric ? "true" : "false"},
                            {"kiln.quant.act", std::string(act_quant_name(st.act))},
                            {"kiln.quant.scheme", s.describe()}};
  std::string data;
  auto add = [&](const std::string& name, const char* dtype, std::vector<int64_t> shape, std::string_view bytes) {
    const uint64_t begin = data.size();
    data.append(bytes);  // no padding: the tensors must tile the data exactly (safetensors.h)
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, begin + bytes.size()}}};
  };
  for (const ParamEntry& e : model.param_entries()) {
    auto it = st.weights.find(e.name);
    if (it != st.weights.end() && !(c.tied_embeddings && e.name == model.param_entries()[0].name)) {
      const QTensor& q = it->second;
      const std::string b = base_name(e.name);
      if (q.scheme.format == QFormat::kFp8E4M3) {
        add(b + ".qweight", "F8_E4M3", {q.rows, q.cols}, as_bytes(q.codes.data(), q.codes.size()));
      } else {
        const std::vector<uint8_t> packed = pack_codes(q.codes.data(), q.rows, q.cols, q.scheme.bits);
        add(b + ".qweight", "U8", {q.rows, packed_row_bytes(q.cols, q.scheme.bits)},
            as_bytes(packed.data(), packed.size()));
      }
      const std::vector<int64_t> pshape = q.scheme.group == QuantScheme::kPerTensor
                                              ? std::vector<int64_t>{1}
                                              : std::vector<int64_t>{q.rows, q.groups_per_row()};
      add(b + ".scales", "F32", pshape, as_bytes(q.scales.data(), q.scales.size()));
      if (q.scheme.format == QFormat::kInt && !q.scheme.symmetric)
        add(b + ".zeros", "F32", pshape, as_bytes(q.zeros.data(), q.zeros.size()));
      continue;
    }
    const float* w = model.params().data() + e.offset;
    std::vector<int64_t> shape(e.shape.begin(), e.shape.end());
    if (hf_transposed(c, e.name)) {
      const int64_t rows = e.shape[0], cols = e.shape[1];
      std::vector<float> t(static_cast<size_t>(rows * cols));
      for (int64_t j = 0; j < cols; ++j)
        for (int64_t i = 0; i < rows; ++i) t[j * rows + i] = w[i * cols + j];
      std::swap(shape[0], shape[1]);
      add(e.name, "F32", shape, as_bytes(t.data(), t.size()));
    } else {
      add(e.name, "F32", shape, as_bytes(w, static_cast<size_t>(e.shape.numel())));
    }
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h += ' ';
  std::string prefix(8, '\0');
  const uint64_t hlen = h.size();
  std::memcpy(prefix.data(), &hlen, 8);
  return write_file_atomic((fs::path(dir) / "model.safetensors").string(), {prefix, h, data});
}

namespace {
// The file's entry `name`, checked to be of `dtype` and `shape` (before anything is allocated).
Expected<const SafetensorsTensor*> expect_tensor(const SafetensorsFile& f, const std::string& name,
                                                 std::string_view dtype, const std::vector<int64_t>& shape) {
  KILN_ASSIGN_OR_RETURN(const SafetensorsTensor* t, f.tensor(name));
  if (t->dtype != dtype)
    return invalid_argument("{}: tensor {} has dtype '{}', expected {}", f.path(), name, t->dtype, dtype);
  if (!t->shape_is(shape))
    return invalid_argument("{}: tensor {} has shape [{}], the config and scheme need [{}]", f.path(), name,
                            fmt::join(t->shape, ", "), fmt::join(shape, ", "));
  return t;
}

// Where one parameter comes from: a plain F32 tensor, or a quantized Linear's three tensors.
struct ParamSource {
  const SafetensorsTensor* plain = nullptr;
  const SafetensorsTensor *qweight = nullptr, *scales = nullptr, *zeros = nullptr;
};
}  // namespace

Expected<std::unique_ptr<Transformer>> load_any_model(const std::string& dir, QuantizedState* state) {
  if (dir.ends_with(".gguf")) {
    KILN_ASSIGN_OR_RETURN(gguf::LoadedModel g, load_gguf_model(dir, state));
    return std::move(g.model);
  }
  const fs::path st_path = fs::path(dir) / "model.safetensors";
  // Plain (or unreadable) files go to load_model, whose errors name the file and the tensor.
  auto opened = SafetensorsFile::open(st_path.string());
  if (!opened.ok() || opened->header().metadata_value(kMetaMethod).empty()) {
    if (state) *state = QuantizedState{};
    return load_model(dir);
  }
  SafetensorsFile f = std::move(*opened);
  const SafetensorsHeader& h = f.header();
  const fs::path cfg_path = fs::path(dir) / "config.json";
  KILN_ASSIGN_OR_RETURN(std::string cfg_text, read_file(cfg_path.string(), int64_t{1} << 20));
  auto cfg = config_from_hf_json(cfg_text);
  if (cfg.ok()) {
    if (Status s = check_config(*cfg); !s.ok()) cfg = s;
  }
  if (!cfg.ok()) return Status(cfg.status().code(), fmt::format("{}: {}", cfg_path.string(), cfg.status().message()));
  const ModelConfig& c = *cfg;

  QuantizedState st;
  KILN_ASSIGN_OR_RETURN(st.method, parse_method(h.metadata_value(kMetaMethod)));
  const std::string fmt_name = h.metadata_value("kiln.quant.format"), act = h.metadata_value("kiln.quant.act");
  try {
    st.scheme.bits = std::stoi(h.metadata_value("kiln.quant.bits"));
    st.scheme.group = std::stoll(h.metadata_value("kiln.quant.group"));
  } catch (const std::exception&) {
    return data_loss("{}: kiln.quant.bits / kiln.quant.group metadata are not integers", st_path.string());
  }
  st.scheme.symmetric = h.metadata_value("kiln.quant.symmetric") == "true";
  if (fmt_name == "fp8e4m3") st.scheme.format = QFormat::kFp8E4M3;
  else if (fmt_name != "int") return unimplemented("{}: quantized format '{}' (int, fp8e4m3)", st_path.string(), fmt_name);
  if (act == "none") st.act = ActQuant::kNone;
  else if (act == act_quant_name(ActQuant::kInt8)) st.act = ActQuant::kInt8;
  else if (act == act_quant_name(ActQuant::kFp8)) st.act = ActQuant::kFp8;
  else if (act == act_quant_name(ActQuant::kInt8Block)) st.act = ActQuant::kInt8Block;
  else return unimplemented("{}: activation quantization '{}'", st_path.string(), act);
  if (st.act == ActQuant::kInt8Block &&
      !(st.scheme.format == QFormat::kInt && st.scheme.symmetric && st.scheme.group == kQuantBlock &&
        (st.scheme.bits <= 4 || st.scheme.bits == 8)))
    return data_loss("{}: activation quantization '{}' needs symmetric int8 or int4 weights with groups of {}, the "
                     "metadata says {}-bit {} group {}", st_path.string(), act, kQuantBlock, st.scheme.bits,
                     st.scheme.symmetric ? "symmetric" : "asymmetric", st.scheme.group);

  // Every tensor's name, dtype and shape against the header before the model is allocated.
  const std::vector<ParamEntry> entries = Transformer::param_entries_for(c);
  std::vector<ParamSource> sources(entries.size());
  std::set<std::string_view> used;
  for (size_t k = 0; k < entries.size(); ++k) {
    const ParamEntry& e = entries[k];
    const std::string b = base_name(e.name);
    ParamSource& src = sources[k];
    if (!h.find(e.name) && h.find(b + ".qweight") && e.shape.rank() == 2) {
      const int64_t rows = e.shape[0], cols = e.shape[1];
      KILN_RETURN_IF_ERROR(check_scheme(st.scheme, cols));
      QTensor shape_of;
      shape_of.scheme = st.scheme;
      shape_of.rows = rows;
      shape_of.cols = cols;
      if (st.scheme.format == QFormat::kFp8E4M3) {
        KILN_ASSIGN_OR_RETURN(src.qweight, expect_tensor(f, b + ".qweight", "F8_E4M3", {rows, cols}));
      } else {
        KILN_ASSIGN_OR_RETURN(src.qweight,
                              expect_tensor(f, b + ".qweight", "U8", {rows, packed_row_bytes(cols, st.scheme.bits)}));
      }
      const std::vector<int64_t> pshape = st.scheme.group == QuantScheme::kPerTensor
                                              ? std::vector<int64_t>{1}
                                              : std::vector<int64_t>{rows, shape_of.groups_per_row()};
      KILN_ASSIGN_OR_RETURN(src.scales, expect_tensor(f, b + ".scales", "F32", pshape));
      if (st.scheme.format == QFormat::kInt && !st.scheme.symmetric) {
        KILN_ASSIGN_OR_RETURN(src.zeros, expect_tensor(f, b + ".zeros", "F32", pshape));
      }
    } else {
      std::vector<int64_t> want(e.shape.begin(), e.shape.end());
      if (hf_transposed(c, e.name)) std::swap(want[0], want[1]);
      KILN_ASSIGN_OR_RETURN(src.plain, expect_tensor(f, e.name, "F32", want));
    }
    for (const SafetensorsTensor* t : {src.plain, src.qweight, src.scales, src.zeros})
      if (t) used.insert(t->name);
  }
  std::vector<std::string_view> extra;
  for (const SafetensorsTensor& t : h.tensors)
    if (!used.count(t.name)) extra.push_back(t.name);
  if (!extra.empty())
    return invalid_argument("{}: {} tensor(s) the config and scheme do not use: {} (config.json: {})", st_path.string(),
                            extra.size(), fmt::join(extra, ", "), c.describe());

  KILN_ASSIGN_OR_RETURN(auto model, Transformer::create(c, 0));
  KILN_CHECK(model->param_entries().size() == entries.size());
  std::string raw;
  for (size_t k = 0; k < entries.size(); ++k) {
    const ParamEntry& e = model->param_entries()[k];
    const ParamSource& src = sources[k];
    float* w = model->params().data() + e.offset;
    const std::string b = base_name(e.name);
    if (src.qweight) {
      const int64_t rows = e.shape[0], cols = e.shape[1];
      QTensor q;
      q.scheme = st.scheme;
      q.rows = rows;
      q.cols = cols;
      KILN_ASSIGN_OR_RETURN(raw, f.read(*src.qweight));
      if (st.scheme.format == QFormat::kFp8E4M3) q.codes.assign(raw.begin(), raw.end());
      else q.codes = unpack_codes(reinterpret_cast<const uint8_t*>(raw.data()), rows, cols, st.scheme.bits);
      KILN_ASSIGN_OR_RETURN(raw, f.read(*src.scales));
      q.scales.resize(raw.size() / 4);
      std::memcpy(q.scales.data(), raw.data(), raw.size());
      if (src.zeros) {
        KILN_ASSIGN_OR_RETURN(raw, f.read(*src.zeros));
        q.zeros.resize(raw.size() / 4);
        std::memcpy(q.zeros.data(), raw.data(), raw.size());
      } else {
        const float z = st.scheme.format == QFormat::kInt ? static_cast<float>(1 << (st.scheme.bits - 1)) : 0.0f;
        q.zeros.assign(q.scales.size(), z);
      }
      for (float v : q.scales)
        if (!std::isfinite(v)) return data_loss("{}: {}.scales holds a non-finite value", st_path.string(), b);
      for (float v : q.zeros)
        if (!(v >= 0 && v <= static_cast<float>(st.scheme.qmax())) && st.scheme.format == QFormat::kInt)
          return data_loss("{}: {}.zeros holds {} outside [0, {}]", st_path.string(), b, v, st.scheme.qmax());
      st.weights.emplace(e.name, std::move(q));
      continue;
    }
    KILN_ASSIGN_OR_RETURN(raw, f.read(*src.plain));
    if (hf_transposed(c, e.name)) {
      const int64_t rows = e.shape[0], cols = e.shape[1];
      const float* from = reinterpret_cast<const float*>(raw.data());
      for (int64_t j = 0; j < cols; ++j)
        for (int64_t i = 0; i < rows; ++i) std::memcpy(&w[i * cols + j], &from[j * rows + i], 4);
    } else {
      std::memcpy(w, raw.data(), raw.size());
    }
  }
  // Every quantized tensor must be a Linear's weight (an embedding is read as a table).
  for (const auto& [name, q] : st.weights)
    if (find_linear(*model, name) == nullptr || (c.tied_embeddings && name == model->param_entries()[0].name))
      return unimplemented("{}: {} is stored quantized; kiln quantizes only Linear weights", st_path.string(), name);
  install_backends(*model, st);
  if (state) *state = std::move(st);
  return model;
}

int64_t weight_bytes_per_token(Transformer& model) {
  int64_t bytes = model.config().d_model * 4;  // the embedding row
  for (Linear* l : model.linears()) {
    if (auto* q = dynamic_cast<QuantizedLinear*>(l->backend.get())) bytes += q->weight_bytes();
    else if (const auto* pk = dynamic_cast<const PackedLinear*>(l->backend.get()))
      bytes += pk->packed().elem_bytes() * l->in * l->out;  // f32 4, f16 halves 2
    else if (dynamic_cast<Bf16Linear*>(l->backend.get())) bytes += 2 * l->in * l->out;
    else bytes += 4 * l->in * l->out;
  }
  return bytes;
}

}  // namespace kiln::quant
