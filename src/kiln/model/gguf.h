// GGUF (llama.cpp's single-file model format, version 3): the container — header, typed
// metadata, tensor infos, aligned tensor data — with F32, F16, Q8_0 and Q4_0 tensors laid out
// exactly as ggml defines them, and the mapping of kiln's Llama models (tensor names, metadata,
// the byte-level BPE tokenizer, the q/k RoPE row order) to llama.cpp's. Every size read from a
// file is bounded: a truncated or corrupted file is a DataLoss/Unimplemented Status, never a crash.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/model/transformer.h"

namespace kiln::gguf {

// Metadata value types, numbered as in the GGUF spec.
enum class ValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// One metadata value. Scalars: integers and bool in `i` (u64 as its bit pattern), floats in
// `f`, strings in `s`. Arrays (one level; nested arrays are not supported): `elem` is the element
// type and the elements are in `ints`, `floats` or `strings` by kind.
struct Value {
  ValueType type = ValueType::kU32;
  ValueType elem = ValueType::kU32;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;

  static Value u32(uint32_t v);
  static Value i32(int32_t v);
  static Value f32(float v);
  static Value boolean(bool v);
  static Value str(std::string v);
  static Value str_array(std::vector<std::string> v);
  static Value i32_array(std::vector<int64_t> v);
  static Value f32_array(std::vector<double> v);
  bool is_integer() const;  // any integer scalar type
};

// ggml tensor types kiln reads and writes (the numbers are ggml's type ids).
enum class TensorType : uint32_t { kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ8_0 = 8 };
std::string_view tensor_type_name(TensorType t);
// Elements per block (1 for F32/F16, 32 for Q8_0/Q4_0) and bytes per block.
int64_t block_elems(TensorType t);
int64_t block_bytes(TensorType t);

// Block layouts (ggml's, little-endian):
//  Q8_0, 34 bytes per 32 values: f16 scale d, then 32 int8 q;          x = d·q.
//  Q4_0, 18 bytes per 32 values: f16 scale d, then 16 bytes; byte j holds element j in its low
//        nibble and element j + 16 in its high nibble, unsigned;         x = d·(q − 8).
// Quantizers follow ggml's reference ones (Q8_0: d = amax/127, q = round-half-away(x/d);
// Q4_0: d = (the value of largest magnitude)/−8, q = min(15, trunc(x/d + 8.5))). n % 32 == 0.
void quantize_q8_0(const float* x, int64_t n, uint8_t* out);
void dequantize_q8_0(const uint8_t* in, int64_t n, float* y);
// The unsigned code (0..15) of element j of a Q4_0 block's 16 quant bytes q.
inline uint8_t q4_0_code(const uint8_t* q, int64_t j) { return j < 16 ? (q[j] & 0x0F) : (q[j - 16] >> 4); }
void quantize_q4_0(const float* x, int64_t n, uint8_t* out);
void dequantize_q4_0(const uint8_t* in, int64_t n, float* y);
// x (n,) -> the bytes of one tensor of type t (n a multiple of block_elems(t)).
std::string encode_tensor(const float* x, int64_t n, TensorType t);
// The reverse; bytes.size() must be exactly the tensor's size (checked by the caller).
void decode_tensor(std::string_view bytes, int64_t n, TensorType t, float* y);

struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ne[], fastest-varying first: a (out, in) matrix is {in, out}
  TensorType type = TensorType::kF32;
  uint64_t offset = 0;        // into the data section (reader: as found; writer: computed)
  std::string data;           // the tensor's bytes
  int64_t numel() const;
};

struct File {
  uint32_t version = 3;
  std::vector<std::pair<std::string, Value>> metadata;  // in file order
  std::vector<TensorInfo> tensors;
  uint64_t alignment = 32;  // general.alignment when present

  const Value* find(std::string_view key) const;
  const TensorInfo* tensor(std::string_view name) const;
};

// Fuzzer entry point. Parses a whole GGUF image (version 2 or 3, little-endian) from memory;
// `what` names it in errors. Refuses what llama.cpp refuses: a repeated metadata key or tensor
// name, a tensor name over 63 bytes, tensors not laid out in order at aligned offsets (so none
// overlaps), data past the end; and any count or size that does not fit the bytes left (metadata
// arrays at most 2^24 elements). Never throws.
Expected<File> parse(std::string_view bytes, std::string_view what = "gguf");
Expected<File> read(const std::string& path);
// Serializes (offsets and padding computed here; general.alignment written when it is not 32).
std::string serialize(const File& f);
Status write(const std::string& path, const File& f);  // temporary file + rename

// ---- kiln Llama models <-> llama.cpp GGUF ---------------------------------------------------
// kiln (Hugging Face) tensor name -> llama.cpp name ("model.layers.3.mlp.up_proj.weight" ->
// "blk.3.ffn_up.weight"); empty when the name has no llama.cpp counterpart.
std::string llama_tensor_name(std::string_view hf_name);
// A MoE expert's weight (model.layers.L.block_sparse_moe.experts.J.wK.weight): (J, K). In GGUF
// the layer's experts are one stacked tensor per projection (llama.cpp's ffn_{gate,down,up}_exps,
// dims {cols, rows, num_experts}), which llama_tensor_name names for every J.
Expected<std::pair<int64_t, int64_t>> moe_expert_slice(std::string_view hf_name);

// Row order of q_proj / k_proj: kiln (and HF) rotate pairs (i, i + D/2) of each head; llama.cpp
// rotates adjacent pairs (2i, 2i+1), so its convert script permutes the rows of each head:
// gguf row 2i + a = hf row a·D/2 + i (a ∈ {0, 1}). w: (heads·D, cols), row-major.
void permute_rope_rows_to_gguf(const float* hf, float* out, int64_t heads, int64_t head_dim, int64_t cols);
// The GGUF row that holds HF row r of such a matrix (the map both permutations apply).
inline int64_t gguf_rope_row(int64_t r, int64_t head_dim) {
  const int64_t half = head_dim / 2, within = r % head_dim;
  return r - within + 2 * (within % half) + within / half;
}
void permute_rope_rows_from_gguf(const float* gg, float* out, int64_t heads, int64_t head_dim, int64_t cols);

// Builds the GGUF of a Llama-family model: 2-D weights as `type` (quantized types fall back to
// F16 when a row is not a multiple of 32), 1-D norms as F32, llama.* metadata, and the
// tokenizer (tokenizer.json text in kiln's / Hugging Face's format; empty for none).
Expected<File> llama_to_gguf(Transformer& model, std::string_view tokenizer_json, TensorType type,
                             std::string_view name);

struct LoadedModel {
  std::unique_ptr<Transformer> model;
  std::string tokenizer_json;  // "" when the file has no byte-level BPE (gpt2) tokenizer
  std::string tokenizer_note;  // why there is none, for the user
};
// A llama.cpp Llama GGUF as a kiln model in fp32 (Q8_0/Q4_0 dequantized, q/k rows un-permuted).
Expected<LoadedModel> llama_from_gguf(const File& f);
Expected<LoadedModel> load_llama(const std::string& path);

}  // namespace kiln::gguf
