// `kiln convert`: a kiln Llama model directory (config.json, model.safetensors, tokenizer.json)
// to a llama.cpp GGUF file (F32, F16, Q8_0 or Q4_0 weights), and a GGUF back to a kiln model
// directory in fp32 (quantized tensors dequantized), so `kiln eval` / `kiln generate` run it.
#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "apps/kiln/commands.h"
#include "kiln/core/file_io.h"
#include "kiln/model/gguf.h"
#include "kiln/model/weights.h"

namespace kiln::app {
namespace {

namespace fs = std::filesystem;

struct ConvertArgs {
  std::string model, gguf, out, type = "f16", name;
};

[[noreturn]] void fail(const Status& s) {
  fmt::print(stderr, "kiln convert: {}\n", s.message());
  throw CLI::RuntimeError(kUserError);
}

void to_gguf(const ConvertArgs& a) {
  static const std::map<std::string, gguf::TensorType> kTypes = {
      {"f32", gguf::TensorType::kF32}, {"f16", gguf::TensorType::kF16},
      {"q8_0", gguf::TensorType::kQ8_0}, {"q4_0", gguf::TensorType::kQ4_0}};
  const gguf::TensorType type = kTypes.at(a.type);
  auto model = load_model(a.model);
  if (!model.ok()) fail(model.status());
  std::string tokenizer;
  const fs::path tk_path = fs::path(a.model) / "tokenizer.json";
  if (fs::exists(tk_path)) {
    auto text = read_file(tk_path.string(), int64_t{1} << 30);
    if (!text.ok()) fail(text.status());
    tokenizer = std::move(*text);
  } else {
    fmt::print("note: {} not found; the GGUF will have no tokenizer\n", tk_path.string());
  }
  const std::string name = a.name.empty() ? fs::path(a.model).filename().string() : a.name;
  auto file = gguf::llama_to_gguf(**model, tokenizer, type, name.empty() ? "kiln" : name);
  if (!file.ok()) fail(file.status());
  if (Status s = gguf::write(a.out, *file); !s.ok()) fail(s);
  std::map<std::string, std::pair<int, int64_t>> by_type;  // type -> (tensors, bytes)
  for (const gguf::TensorInfo& t : file->tensors) {
    auto& e = by_type[std::string(gguf::tensor_type_name(t.type))];
    e.first += 1;
    e.second += static_cast<int64_t>(t.data.size());
  }
  fmt::print("model: {}\n", (*model)->config().describe());
  for (const auto& [t, e] : by_type) fmt::print("  {:5} {:4} tensors {:10.3f} MiB\n", t, e.first, e.second / 1048576.0);
  fmt::print("wrote {} ({} tensors, {} metadata keys, tokenizer: {})\n", a.out, file->tensors.size(),
             file->metadata.size(), tokenizer.empty() ? "none" : "gpt2 byte-level BPE");
}

void from_gguf(const ConvertArgs& a) {
  auto loaded = gguf::load_llama(a.gguf);
  if (!loaded.ok()) fail(loaded.status());
  if (Status s = save_model(a.out, *loaded->model); !s.ok()) fail(s);
  if (!loaded->tokenizer_json.empty()) {
    if (Status s = write_file_atomic((fs::path(a.out) / "tokenizer.json").string(), {loaded->tokenizer_json}); !s.ok())
      fail(s);
  } else {
    fmt::print("note: no tokenizer.json written ({})\n", loaded->tokenizer_note);
  }
  fmt::print("model: {}\nwrote {} (fp32 safetensors{})\n", loaded->model->config().describe(), a.out,
             loaded->tokenizer_json.empty() ? "" : " + tokenizer.json");
}

}  // namespace

void register_convert(CLI::App& app) {
  auto a = std::make_shared<ConvertArgs>();
  CLI::App* c = app.add_subcommand(
      "convert", "kiln Llama model dir -> llama.cpp GGUF (--model), or GGUF -> kiln model dir (--gguf)");
  auto* m = c->add_option("--model", a->model, "kiln model directory (config.json, model.safetensors, tokenizer.json)");
  auto* g = c->add_option("--gguf", a->gguf, "GGUF file to convert into a kiln model directory");
  m->excludes(g);
  c->add_option("--out", a->out, "Output: a .gguf file (with --model) or a directory (with --gguf)")->required();
  c->add_option("--type", a->type, "GGUF weight type for 2-D tensors (norms stay f32)")
      ->check(CLI::IsMember({"f32", "f16", "q8_0", "q4_0"}));
  c->add_option("--name", a->name, "general.name (default: the model directory's name)");
  c->callback([a] {
    if (!a->model.empty()) to_gguf(*a);
    else if (!a->gguf.empty()) from_gguf(*a);
    else fail(invalid_argument("give --model DIR (to GGUF) or --gguf FILE (from GGUF)"));
  });
}

}  // namespace kiln::app
