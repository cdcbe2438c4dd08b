// GGUF Q8_0 / Q4_0 blocks as kiln QTensors, value for value (gguf_weights.h).
#include "kiln/quant/gguf_weights.h"

#include "kiln/model/packed_linear.h"

#include <cstring>

#include <fmt/format.h>

#include "kiln/core/dtype.h"

namespace kiln::quant {
namespace {

constexpr int64_t kBlock = 32;

// The (rows, cols) matrix of one GGUF tensor of type Q8_0 or Q4_0, row r of the result taken
// from GGUF row row_of(r).
template <class RowOf>
QTensor from_blocks(const gguf::TensorInfo& t, int64_t rows, int64_t cols, RowOf row_of) {
  const bool q8 = t.type == gguf::TensorType::kQ8_0;
  QTensor q;
  q.scheme.format = QFormat::kInt;
  q.scheme.bits = q8 ? 8 : 4;
  q.scheme.symmetric = true;
  q.scheme.group = kBlock;
  q.rows = rows;
  q.cols = cols;
  const int64_t groups = cols / kBlock, block_bytes = q8 ? 34 : 18;
  q.codes.resize(static_cast<size_t>(rows * cols));
  q.scales.resize(static_cast<size_t>(rows * groups));
  q.zeros.assign(q.scales.size(), q8 ? 128.0f : 8.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const auto* src = reinterpret_cast<const uint8_t*>(t.data.data()) + row_of(r) * groups * block_bytes;
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* b = src + g * block_bytes;
      uint16_t d = 0;
      std::memcpy(&d, b, sizeof(d));
      q.scales[static_cast<size_t>(r * groups + g)] = f16_to_f32(d);
      uint8_t* out = q.codes.data() + r * cols + g * kBlock;
      for (int64_t j = 0; j < kBlock; ++j) {
        out[j] = q8 ? static_cast<uint8_t>(static_cast<int>(static_cast<int8_t>(b[2 + j])) + 128)
                    : gguf::q4_0_code(b + 2, j);
      }
    }
  }
  return q;
}

}  // namespace

QuantizedState gguf_quantized_state(const gguf::File& f, Transformer& model) {
  QuantizedState st;
  st.method = Method::kRtn;  // the grid is llama.cpp's round-to-nearest one
  const int64_t D = model.config().head_dim();
  for (Linear* l : model.linears()) {
    const std::string gname = gguf::llama_tensor_name(l->name);
    const gguf::TensorInfo* t = gname.empty() || gguf::moe_expert_slice(l->name).ok() ? nullptr : f.tensor(gname);
    if (t == nullptr || (t->type != gguf::TensorType::kQ8_0 && t->type != gguf::TensorType::kQ4_0)) continue;
    if (l->in % kBlock != 0 || t->numel() != l->in * l->out) continue;  // the loader checked; be safe
    const bool rope_rows = l->name.ends_with("q_proj.weight") || l->name.ends_with("k_proj.weight");
    QTensor& q = st.weights[l->name] =
        from_blocks(*t, l->out, l->in, [&](int64_t r) { return rope_rows ? gguf::gguf_rope_row(r, D) : r; });
    if (st.weights.size() == 1) st.scheme = q.scheme;  // a file may mix Q8_0 and Q4_0: each tensor has its own
  }
  return st;
}

Expected<gguf::LoadedModel> load_gguf_model(const std::string& path, QuantizedState* state, ActQuant act) {
  KILN_ASSIGN_OR_RETURN(const gguf::File f, gguf::read(path));
  auto loaded = gguf::llama_from_gguf(f);
  if (!loaded.ok()) return Status(loaded.status().code(), fmt::format("{}: {}", path, loaded.status().message()));
  QuantizedState st = gguf_quantized_state(f, *loaded->model);
  st.act = act;
  install_backends(*loaded->model, st);
  // F16 matrices stay halves (2 bytes per weight streamed, not 4); the fp32 master holds the
  // same values, so the half copy is exact. A tied head reads the embedding: left fp32.
  const bool tied = loaded->model->config().tied_embeddings;
  for (Linear* l : loaded->model->linears()) {
    if (l->backend || (tied && l == loaded->model->linears().back())) continue;
    const std::string gname = gguf::llama_tensor_name(l->name);
    const gguf::TensorInfo* t = gname.empty() || gguf::moe_expert_slice(l->name).ok() ? nullptr : f.tensor(gname);
    if (t && t->type == gguf::TensorType::kF16 && t->numel() == l->in * l->out)
      l->backend = std::make_shared<PackedLinear>(*l, DType::kF16);
  }
  if (state) *state = std::move(st);
  return loaded;
}

}  // namespace kiln::quant
