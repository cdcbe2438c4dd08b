// Elementwise fusion (fusion.h): the IR checks, the C++ generator, the reference that runs the
// chain op by op, and the cache that compiles generated code with the system compiler.
#include "kiln/perf/fusion.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "kiln/core/cpu_features.h"
#include "kiln/core/env.h"
#include "kiln/core/file_io.h"
#include "kiln/core/thread_pool.h"

extern char** environ;  // posix_spawn passes it on to the compiler

namespace kiln::perf::fusion {

// The scalar formulas, written once: compiled here for run_unfused, and pasted as text into
// every generated kernel, so fused and unfused compute the same bits (tests compare bitwise).
// Math::kExact: kiln::ref's formulas (reference/activation.cpp, elementwise.cpp, norm.cpp's
// rmsnorm apply): transcendental ops in double through std::exp / std::tanh, rounded once.
// Math::kPolynomial (the *_poly functions): kiln::cpu's, as cpu/vec.h's scalar target computes
// them (its fmadd is a rounded multiply then add): bitwise equal to kiln::cpu under
// KILN_SIMD=scalar, within a few ulp of its FMA targets and of kExact.
// Both sides must be compiled without FMA contraction (-ffp-contract=off in the JIT; kiln's
// baseline x86-64 build has no FMA), or a·b+c would round differently.
// clang-format off
#define KILN_FUSION_SCALAR_OPS                                                                  \
  static inline float kf_add(float a, float b) { return a + b; }                                \
  static inline float kf_sub(float a, float b) { return a - b; }                                \
  static inline float kf_mul(float a, float b) { return a * b; }                                \
  static inline float kf_scale(float a, float s) { return a * s; }                              \
  static inline float kf_add_scalar(float a, float s) { return a + s; }                         \
  static inline float kf_neg(float a) { return -a; }                                            \
  static inline float kf_relu(float a) { return a > 0.0f ? a : 0.0f; }                          \
  static inline double kf_sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }           \
  static inline float kf_sigmoid(float a) { return static_cast<float>(kf_sigmoid_d(a)); }       \
  static inline float kf_exp(float a) {                                                         \
    return static_cast<float>(std::exp(static_cast<double>(a)));                                \
  }                                                                                             \
  static inline float kf_silu(float a) {                                                        \
    const double x = a;                                                                         \
    return static_cast<float>(x * kf_sigmoid_d(x));                                             \
  }                                                                                             \
  static inline float kf_gelu_tanh(float a) {                                                   \
    const double x = a;                                                                         \
    return static_cast<float>(                                                                  \
        0.5 * x * (1.0 + std::tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x))));      \
  }                                                                                             \
  static inline float kf_swiglu(float a, float b) {                                             \
    const double g = a;                                                                         \
    return static_cast<float>(g * kf_sigmoid_d(g) * b);                                         \
  }                                                                                             \
  static inline float kf_row_scale(float a, float b, float c) {                                 \
    return static_cast<float>(static_cast<double>(a) * static_cast<double>(b) * c);             \
  }                                                                                             \
  static inline float kf_exp_poly(float x) {                                                    \
    const float hi = 88.3762626647949f, lo = -87.3365447504f;                                   \
    float xc = x > lo ? x : lo;                                                                 \
    xc = xc < hi ? xc : hi;                                                                     \
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;                    \
    float r = xc - n * 0.693359375f;                                                            \
    r = r - n * -2.12194440e-4f;                                                                \
    float p = 1.9875691500e-4f;                                                                 \
    p = p * r + 1.3981999507e-3f;                                                               \
    p = p * r + 8.3334519073e-3f;                                                               \
    p = p * r + 4.1665795894e-2f;                                                               \
    p = p * r + 1.6666665459e-1f;                                                               \
    p = p * r + 5.0000001201e-1f;                                                               \
    p = p * (r * r) + (r + 1.0f);                                                               \
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;                                 \
    float pow2n;                                                                                \
    std::memcpy(&pow2n, &bits, sizeof pow2n);                                                   \
    float y = p * pow2n;                                                                        \
    y = x < lo ? 0.0f : y;                                                                      \
    y = hi < x ? INFINITY : y;                                                                  \
    return x != x ? x : y;                                                                      \
  }                                                                                             \
  static inline float kf_sigmoid_poly(float a) { return 1.0f / (1.0f + kf_exp_poly(-a)); }      \
  static inline float kf_silu_poly(float a) { return a * kf_sigmoid_poly(a); }                  \
  static inline float kf_gelu_tanh_poly(float a) {                                              \
    const float u2 = (2.0f * 0.7978845608028654f) * ((0.044715f * a) * (a * a) + a);           \
    return a * kf_sigmoid_poly(u2);                                                             \
  }                                                                                             \
  static inline float kf_swiglu_poly(float a, float b) { return a * kf_sigmoid_poly(a) * b; }
// clang-format on

#define KILN_FUSION_STRINGIFY(...) #__VA_ARGS__
#define KILN_FUSION_EXPAND_STRINGIFY(...) KILN_FUSION_STRINGIFY(__VA_ARGS__)

namespace {

KILN_FUSION_SCALAR_OPS

constexpr std::string_view kScalarOpsSource = KILN_FUSION_EXPAND_STRINGIFY(KILN_FUSION_SCALAR_OPS);

std::string_view layout_name(Layout l) {
  switch (l) {
    case Layout::kFull:
      return "full";
    case Layout::kPerCol:
      return "per_col";
    case Layout::kPerRow:
      return "per_row";
  }
  return "?";
}

std::string ref_name(Ref r) {
  return fmt::format("{}{}", r.source == Ref::Source::kInput ? "in" : "v", r.index);
}

// An immediate as an exact C++ float literal (hex float), e.g. 0x1.8p+0f.
std::string float_literal(float f) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%af", static_cast<double>(f));
  return buf;
}

}  // namespace

const OpInfo& op_info(OpKind k) {
  const auto i = static_cast<size_t>(k);
  KILN_CHECK(i < std::size(kOps));
  return kOps[i];
}

Ref Chain::input(Layout layout) {
  inputs.push_back(layout);
  return {Ref::Source::kInput, num_inputs() - 1};
}

Ref Chain::op(OpKind kind, Ref a, Ref b, Ref c, float imm) {
  ops.push_back({kind, {a, b, c}, imm});
  return {Ref::Source::kOp, static_cast<int>(ops.size()) - 1};
}

void Chain::output(Ref value, int aliases_input) {
  outputs.push_back({value, aliases_input});
}

Status validate(const Chain& chain) {
  // `before`: the number of ops a reference may name (the ones defined earlier).
  auto check_ref = [&](Ref r, int before, std::string_view where) -> Status {
    const bool input = r.source == Ref::Source::kInput;
    const int limit = input ? chain.num_inputs() : before;
    if (r.index < 0 || r.index >= limit)
      return invalid_argument(
          "[fusion] {} reads {}, but the chain has {} inputs and {} ops before it", where,
          ref_name(r), chain.num_inputs(), before);
    return {};
  };
  if (chain.num_inputs() > kMaxInputs || chain.num_outputs() > kMaxOutputs)
    return invalid_argument("[fusion] the chain has {} inputs and {} outputs; at most {} and {}",
                            chain.num_inputs(), chain.num_outputs(), kMaxInputs, kMaxOutputs);
  for (size_t j = 0; j < chain.ops.size(); ++j) {
    const Op& op = chain.ops[j];
    if (static_cast<size_t>(op.kind) >= std::size(kOps))
      return invalid_argument("[fusion] op v{} has kind {}, not an OpKind", j,
                              static_cast<int>(op.kind));
    const OpInfo& info = op_info(op.kind);
    const std::string where = fmt::format("op v{} ({})", j, info.name);
    for (int k = 0; k < info.arity; ++k)
      KILN_RETURN_IF_ERROR(check_ref(op.operands[k], static_cast<int>(j), where));
    if (info.has_imm && !std::isfinite(op.imm))
      return invalid_argument("[fusion] {} has a non-finite immediate {}", where, op.imm);
    if (op.kind == OpKind::kRowScale) {
      const auto layout_of = [&](Ref r) {
        return r.source == Ref::Source::kInput ? chain.inputs[r.index] : Layout::kFull;
      };
      if (layout_of(op.operands[1]) != Layout::kPerRow ||
          layout_of(op.operands[2]) != Layout::kPerCol)
        return invalid_argument("[fusion] {} needs rstd a per_row input and weight a per_col input",
                                where);
    }
  }
  if (chain.outputs.empty()) return invalid_argument("[fusion] the chain has no outputs");
  for (size_t o = 0; o < chain.outputs.size(); ++o) {
    const Output& out = chain.outputs[o];
    const std::string where = fmt::format("output out{}", o);
    KILN_RETURN_IF_ERROR(check_ref(out.value, static_cast<int>(chain.ops.size()), where));
    if (out.value.source == Ref::Source::kInput && chain.inputs[out.value.index] != Layout::kFull)
      return invalid_argument("[fusion] {} is the broadcast input {}; outputs are full", where,
                              ref_name(out.value));
    if (out.aliases_input != -1 &&
        (out.aliases_input < 0 || out.aliases_input >= chain.num_inputs() ||
         chain.inputs[out.aliases_input] != Layout::kFull))
      return invalid_argument("[fusion] {} aliases input {}, which is not a full input of the {}",
                              where, out.aliases_input, chain.num_inputs());
  }
  return {};
}

namespace {
// For callers whose chain must already be valid (the graph pass built it): a bad one is a bug.
void check_valid(const Chain& chain) {
  const Status valid = validate(chain);
  KILN_CHECK_MSG(valid.ok(), "{}", valid.message());
}
}  // namespace

std::string canonical_text(const Chain& chain) {
  std::string s = fmt::format("kiln fusion abi {}\nmath {}\n", kAbiVersion,
                              chain.math == Math::kExact ? "exact" : "polynomial");
  for (int i = 0; i < chain.num_inputs(); ++i)
    s += fmt::format("in{} {}\n", i, layout_name(chain.inputs[i]));
  for (size_t j = 0; j < chain.ops.size(); ++j) {
    const Op& op = chain.ops[j];
    const OpInfo& info = op_info(op.kind);
    s += fmt::format("v{} = {}", j, info.name);
    for (int k = 0; k < info.arity; ++k) s += " " + ref_name(op.operands[k]);
    if (info.has_imm) s += " " + float_literal(op.imm);
    s += "\n";
  }
  for (size_t o = 0; o < chain.outputs.size(); ++o) {
    s += fmt::format("out{} = {}", o, ref_name(chain.outputs[o].value));
    if (chain.outputs[o].aliases_input >= 0)
      s += fmt::format(" alias in{}", chain.outputs[o].aliases_input);
    s += "\n";
  }
  return s;
}

// ---- code generation ------------------------------------------------------------------------

std::string generate_source(const Chain& chain) {
  check_valid(chain);

  std::vector<bool> aliased(chain.inputs.size(), false), used(chain.inputs.size(), false);
  for (const Output& o : chain.outputs)
    if (o.aliases_input >= 0) aliased[o.aliases_input] = true;
  for (const Op& op : chain.ops)
    for (int k = 0; k < op_info(op.kind).arity; ++k)
      if (op.operands[k].source == Ref::Source::kInput) used[op.operands[k].index] = true;
  for (const Output& o : chain.outputs)
    if (o.value.source == Ref::Source::kInput) used[o.value.index] = true;
  bool broadcast = false;
  for (Layout l : chain.inputs) broadcast |= l != Layout::kFull;

  std::string s = "// Generated by kiln::perf::fusion (fusion.cpp); one elementwise chain:\n";
  std::istringstream lines(canonical_text(chain));
  for (std::string line; std::getline(lines, line);) s += "//   " + line + "\n";
  s += "#include <cmath>\n#include <cstdint>\n#include <cstring>\n\nnamespace {\n";
  // The stringified macro is one line; break it after each function for a readable file.
  std::string ops(kScalarOpsSource);
  for (size_t p = 0; (p = ops.find("} static", p)) != std::string::npos; p += 2) ops[p + 1] = '\n';
  s += ops + "\n}  // namespace\n\n";

  s += fmt::format(
      "extern \"C\" void {}(const float* const* in, float* const* out, int64_t rows, "
      "int64_t cols) {{\n",
      kKernelSymbol);
  // An array an output may alias is not __restrict: the compiler then checks for overlap.
  for (int i = 0; i < chain.num_inputs(); ++i)
    if (used[i])
      s += fmt::format("  const float* {}in{} = in[{}];\n", aliased[i] ? "" : "__restrict ", i, i);
  for (int o = 0; o < chain.num_outputs(); ++o)
    s += fmt::format("  float* {}out{} = out[{}];\n",
                     chain.outputs[o].aliases_input >= 0 ? "" : "__restrict ", o, o);
  std::string indent = "    ";
  if (broadcast) {
    s += "  for (int64_t r = 0; r < rows; ++r) {\n";
    s += "    for (int64_t c = 0; c < cols; ++c) {\n";
    s += "      const int64_t i = r * cols + c;\n";
    indent = "      ";
  } else {
    s += "  const int64_t n = rows * cols;\n";
    s += "  for (int64_t i = 0; i < n; ++i) {\n";
  }
  // Every input is loaded before any output is stored, so an in-place output is safe.
  for (int i = 0; i < chain.num_inputs(); ++i) {
    if (!used[i]) continue;
    const char* index = chain.inputs[i] == Layout::kPerCol   ? "c"
                        : chain.inputs[i] == Layout::kPerRow ? "r"
                                                             : "i";
    s += fmt::format("{}const float in{}_v = in{}[{}];\n", indent, i, i, index);
  }
  const auto value = [](Ref r) {
    return r.source == Ref::Source::kInput ? ref_name(r) + "_v" : ref_name(r);
  };
  for (size_t j = 0; j < chain.ops.size(); ++j) {
    const Op& op = chain.ops[j];
    const OpInfo& info = op_info(op.kind);
    std::string args;
    for (int k = 0; k < info.arity; ++k) args += (k ? ", " : "") + value(op.operands[k]);
    if (info.has_imm) args += ", " + float_literal(op.imm);
    const char* suffix = info.transcendental && chain.math == Math::kPolynomial ? "_poly" : "";
    s += fmt::format("{}const float v{} = kf_{}{}({});\n", indent, j, info.name, suffix, args);
  }
  for (int o = 0; o < chain.num_outputs(); ++o)
    s += fmt::format("{}out{}[i] = {};\n", indent, o, value(chain.outputs[o].value));
  if (broadcast) s += "    }\n";
  s += "  }\n}\n";
  return s;
}

// ---- the reference ----------------------------------------------------------------------

namespace {
// One op on one element: the kf_* function the generated code calls for it. b and c are the
// second and third operands (0 where the op has none).
float apply(const Op& op, bool exact, float a, float b, float c) {
  // clang-format off
  switch (op.kind) {
    case OpKind::kAdd: return kf_add(a, b);
    case OpKind::kSub: return kf_sub(a, b);
    case OpKind::kMul: return kf_mul(a, b);
    case OpKind::kScale: return kf_scale(a, op.imm);
    case OpKind::kAddScalar: return kf_add_scalar(a, op.imm);
    case OpKind::kNeg: return kf_neg(a);
    case OpKind::kRelu: return kf_relu(a);
    case OpKind::kSigmoid: return exact ? kf_sigmoid(a) : kf_sigmoid_poly(a);
    case OpKind::kExp: return exact ? kf_exp(a) : kf_exp_poly(a);
    case OpKind::kSilu: return exact ? kf_silu(a) : kf_silu_poly(a);
    case OpKind::kGeluTanh: return exact ? kf_gelu_tanh(a) : kf_gelu_tanh_poly(a);
    case OpKind::kSwiglu: return exact ? kf_swiglu(a, b) : kf_swiglu_poly(a, b);
    case OpKind::kRowScale: return kf_row_scale(a, b, c);
    case OpKind::kCount: break;
  }
  // clang-format on
  KILN_CHECK_MSG(false, "op kind {}", static_cast<int>(op.kind));
  return 0;
}
}  // namespace

void run_unfused(const Chain& chain, const float* const* in, float* const* out, int64_t rows,
                 int64_t cols) {
  check_valid(chain);
  KILN_CHECK(rows >= 0 && cols >= 0);
  const int64_t n = rows * cols;
  const bool exact = chain.math == Math::kExact;
  // Each op's (rows, cols) result; a kernel per op would write it to memory just so.
  std::vector<std::vector<float>> values(chain.ops.size(), std::vector<float>(n));
  const auto load = [&](Ref ref, int64_t r, int64_t c) -> float {
    if (ref.source == Ref::Source::kOp) return values[ref.index][r * cols + c];
    switch (chain.inputs[ref.index]) {
      case Layout::kFull:
        return in[ref.index][r * cols + c];
      case Layout::kPerCol:
        return in[ref.index][c];
      case Layout::kPerRow:
        return in[ref.index][r];
    }
    return 0;
  };
  for (size_t j = 0; j < chain.ops.size(); ++j) {
    const Op& op = chain.ops[j];
    const OpInfo& info = op_info(op.kind);
    float* y = values[j].data();  // (rows, cols)
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float a = load(op.operands[0], r, c);
        const float b = info.arity > 1 ? load(op.operands[1], r, c) : 0.0f;
        const float w = info.arity > 2 ? load(op.operands[2], r, c) : 0.0f;
        y[r * cols + c] = apply(op, exact, a, b, w);
      }
    }
  }
  // Outputs last, each from a temporary: an output may alias an input that a later op or
  // another output still reads (outputs that are inputs are copied out before any is written).
  std::vector<std::vector<float>> staged(chain.outputs.size());
  for (int o = 0; o < chain.num_outputs(); ++o) {
    const Ref v = chain.outputs[o].value;
    if (v.source == Ref::Source::kInput) staged[o].assign(in[v.index], in[v.index] + n);
  }
  for (int o = 0; o < chain.num_outputs(); ++o) {
    const Ref v = chain.outputs[o].value;
    const std::vector<float>& src = v.source == Ref::Source::kInput ? staged[o] : values[v.index];
    std::copy(src.begin(), src.end(), out[o]);
  }
}

ChainCost chain_cost(const Chain& chain, int64_t rows, int64_t cols) {
  const double n = static_cast<double>(rows) * static_cast<double>(cols);
  const auto elements = [&](Ref r) -> double {
    if (r.source == Ref::Source::kOp) return n;
    switch (chain.inputs[r.index]) {
      case Layout::kFull:
        return n;
      case Layout::kPerCol:
        return static_cast<double>(cols);
      case Layout::kPerRow:
        return static_cast<double>(rows);
    }
    return 0;
  };
  constexpr double kF32Bytes = 4;
  ChainCost cost;
  std::vector<bool> read(chain.inputs.size(), false);
  const auto read_input_once = [&](Ref r) {
    if (r.source != Ref::Source::kInput || read[r.index]) return;
    read[r.index] = true;
    cost.fused.bytes += kF32Bytes * elements(r);
  };
  for (const Op& op : chain.ops) {
    const OpInfo& info = op_info(op.kind);
    cost.fused.flops += info.flops * n;
    for (int k = 0; k < info.arity; ++k) {
      cost.unfused.bytes += kF32Bytes * elements(op.operands[k]);
      read_input_once(op.operands[k]);
    }
    cost.unfused.bytes += kF32Bytes * n;  // its result
  }
  for (const Output& o : chain.outputs) {
    read_input_once(o.value);
    cost.fused.bytes += kF32Bytes * n;
  }
  cost.unfused.flops = cost.fused.flops;
  return cost;
}

// ---- compiler configuration and hash ------------------------------------------------------

Expected<std::string> resolve_compiler(const std::string& name) {
  if (name.empty()) return not_found("[fusion] no compiler: KILN_CXX is empty");
  if (name.find('/') != std::string::npos) {
    if (access(name.c_str(), X_OK) == 0) return name;
    return not_found("[fusion] compiler '{}' is not an executable file (KILN_CXX)", name);
  }
  const std::string path(env_value("PATH").value_or("/usr/bin:/bin"));
  std::istringstream dirs(path);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return not_found("[fusion] compiler '{}' not found on PATH (set KILN_CXX)", name);
}

CompilerConfig default_compiler() {
  CompilerConfig c;
  if (auto cxx = env_value("KILN_CXX")) {
    c.cxx = std::string(*cxx);
  } else {
    c.cxx = "c++";
    for (const char* name : {"c++", "g++", "clang++"}) {
      if (resolve_compiler(name).ok()) {
        c.cxx = name;
        break;
      }
    }
  }
  // -O3, not -O2: GCC 12's -O2 vectorizes only loops whose trip count is a known multiple of
  // the vector width (its "very cheap" cost model), which a chain over n never is.
  c.flags = {"-O3", "-shared", "-fPIC", "-std=c++17", "-ffp-contract=off", "-fno-math-errno"};
  // CMakeLists.txt's KILN_FLAGS_AVX2 / KILN_FLAGS_AVX512 for the target kernels run on now;
  // bf16 and VNNI only where the CPU has them (the AVX-512 target does not require them).
  const SimdTarget t = active_simd_target();
  if (t == SimdTarget::kAvx2 || t == SimdTarget::kAvx512)
    c.flags.insert(c.flags.end(), {"-mavx2", "-mfma", "-mf16c"});
  if (t == SimdTarget::kAvx512) {
    c.flags.insert(c.flags.end(), {"-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"});
    if (cpu_features().avx512_bf16) c.flags.push_back("-mavx512bf16");
    if (cpu_features().avx512_vnni) c.flags.push_back("-mavx512vnni");
  }
  return c;
}

namespace {

uint64_t fnv1a64(std::string_view s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

uint64_t chain_hash(const Chain& chain, const CompilerConfig& compiler) {
  uint64_t h = fnv1a64(generate_source(chain));
  h = fnv1a64("\ncxx " + compiler.cxx, h);
  for (const std::string& f : compiler.flags) h = fnv1a64(" " + f, h);
  return h;
}

// ---- JIT and cache ------------------------------------------------------------------------

class LoadedLibrary {
 public:
  explicit LoadedLibrary(void* handle) : handle_(handle) {}
  LoadedLibrary(const LoadedLibrary&) = delete;
  LoadedLibrary& operator=(const LoadedLibrary&) = delete;
  ~LoadedLibrary() { dlclose(handle_); }
  void* handle() const { return handle_; }

 private:
  void* handle_;
};

std::string default_cache_dir() {
  if (auto dir = env_value("KILN_FUSION_CACHE")) return std::string(*dir);
  if (auto xdg = env_value("XDG_CACHE_HOME")) return std::string(*xdg) + "/kiln/fusion";
  if (auto home = env_value("HOME")) return std::string(*home) + "/.cache/kiln/fusion";
  return "/tmp/kiln-fusion";
}

namespace {

namespace fs = std::filesystem;

std::string first_lines(const std::string& text, int max_lines) {
  std::string out;
  std::istringstream in(text);
  int count = 0;
  for (std::string line; count < max_lines && std::getline(in, line); ++count) out += "\n  " + line;
  return out;
}

// A name no other process or thread writes: <dir>/<hash>.<pid>.<k>.tmp<suffix>.
std::string temp_path(const std::string& dir, const std::string& stem, const char* suffix) {
  static std::atomic<int> counter{0};
  return fmt::format("{}/{}.{}.{}.tmp{}", dir, stem, getpid(), counter++, suffix);
}

// Runs argv[0] with stdout and stderr into `log_path`; its exit status, or -1 when it did not
// start (errno in *spawn_error).
int run_logged(const std::vector<std::string>& argv, const std::string& log_path,
               int* spawn_error) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    *spawn_error = rc;
    return -1;
  }
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0) {
    if (errno != EINTR) {
      *spawn_error = errno;
      return -1;
    }
  }
  return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
}

std::string hash_stem(uint64_t hash) {
  return fmt::format("{:016x}", hash);
}

}  // namespace

KernelCache::KernelCache(std::string dir, CompilerConfig compiler)
    : dir_(std::move(dir)), compiler_(std::move(compiler)) {}

CacheStats KernelCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Status KernelCache::prepare_dir() {
  if (dir_ready_) return {};
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_, ec))
    return failed_precondition(
        "[fusion] cache directory '{}' cannot be created: {} (set KILN_FUSION_CACHE)", dir_,
        ec ? ec.message() : "not a directory");
  if (access(dir_.c_str(), W_OK | X_OK) != 0)
    return failed_precondition(
        "[fusion] cache directory '{}' is not writable: {} (set KILN_FUSION_CACHE)", dir_,
        std::strerror(errno));
  dir_ready_ = true;
  return {};
}

Expected<FusedKernel> KernelCache::load(uint64_t hash, const std::string& so_path) {
  void* handle = dlopen(so_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) return internal_error("[fusion] dlopen '{}' failed: {}", so_path, dlerror());
  auto library = std::make_shared<const LoadedLibrary>(handle);
  void* sym = dlsym(handle, kKernelSymbol);
  if (!sym) return internal_error("[fusion] '{}' has no symbol {}", so_path, kKernelSymbol);
  FusedKernel k;
  k.fn = reinterpret_cast<KernelFn>(sym);
  k.hash = hash;
  k.library_path = so_path;
  k.library = std::move(library);
  return k;
}

void FusedKernel::operator()(const float* const* in, float* const* out, int64_t rows,
                             int64_t cols) const {
  bool broadcast = false;
  for (Layout l : inputs) broadcast |= l != Layout::kFull;
  // A flat chain splits the n elements, as a (n, 1) grid; a broadcast one splits rows.
  const int64_t split_rows = broadcast ? rows : rows * cols, split_cols = broadcast ? cols : 1;
  const int64_t grain =
      std::max<int64_t>(1, kParallelGrainElements / std::max<int64_t>(1, split_cols));
  parallel_for(split_rows, grain, [&](int64_t begin, int64_t end) {
    std::array<const float*, kMaxInputs> in_chunk{};
    std::array<float*, kMaxOutputs> out_chunk{};
    for (size_t i = 0; i < inputs.size(); ++i) {
      const int64_t offset = inputs[i] == Layout::kFull     ? begin * split_cols
                             : inputs[i] == Layout::kPerRow ? begin
                                                            : 0;
      in_chunk[i] = in[i] + offset;
    }
    for (int o = 0; o < num_outputs; ++o) out_chunk[o] = out[o] + begin * split_cols;
    fn(in_chunk.data(), out_chunk.data(), end - begin, split_cols);
  });
}

Expected<FusedKernel> KernelCache::compile(const Chain& chain, uint64_t hash,
                                           const std::string& so_path) {
  KILN_ASSIGN_OR_RETURN(const std::string cxx, resolve_compiler(compiler_.cxx));
  const std::string stem = hash_stem(hash);
  const std::string src_tmp = temp_path(dir_, stem, ".cpp");
  const std::string so_tmp = temp_path(dir_, stem, ".so");
  const std::string log_tmp = temp_path(dir_, stem, ".log");
  {
    std::ofstream f(src_tmp, std::ios::binary);
    f << generate_source(chain);
    if (!f.flush())
      return failed_precondition("[fusion] cannot write '{}' in the cache directory", src_tmp);
  }
  std::vector<std::string> argv = {cxx};
  argv.insert(argv.end(), compiler_.flags.begin(), compiler_.flags.end());
  argv.insert(argv.end(), {"-o", so_tmp, src_tmp});
  int spawn_error = 0;
  const int rc = run_logged(argv, log_tmp, &spawn_error);
  Expected<std::string> read = read_file(log_tmp, int64_t{1} << 20);
  const std::string log = read.ok() ? std::move(*read) : std::string();
  std::error_code ec;
  fs::remove(log_tmp, ec);
  if (rc != 0) {
    fs::remove(src_tmp, ec);
    fs::remove(so_tmp, ec);
    std::string command;
    for (const std::string& a : argv) command += (command.empty() ? "" : " ") + a;
    if (rc < 0)
      return internal_error("[fusion] could not run '{}': {}", cxx, std::strerror(spawn_error));
    return internal_error("[fusion] the compiler failed (exit {}): {}{}", rc, command,
                          first_lines(log, 10));
  }
  // rename(2) is atomic: another process sees no <hash>.so or a whole one.
  fs::rename(so_tmp, so_path, ec);
  if (ec)
    return failed_precondition("[fusion] cannot rename '{}' to '{}': {}", so_tmp, so_path,
                               ec.message());
  fs::rename(src_tmp, dir_ + "/" + stem + ".cpp", ec);  // kept beside it for reading; optional
  if (ec) fs::remove(src_tmp, ec);
  ++stats_.compiles;
  return load(hash, so_path);
}

Expected<FusedKernel> KernelCache::get(const Chain& chain) {
  KILN_RETURN_IF_ERROR(validate(chain));
  const uint64_t hash = chain_hash(chain, compiler_);  // the hash covers the layouts
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = kernels_.find(hash); it != kernels_.end()) {
    ++stats_.memory_hits;
    return it->second;
  }
  KILN_RETURN_IF_ERROR(prepare_dir());
  const std::string so_path = dir_ + "/" + hash_stem(hash) + ".so";
  Expected<FusedKernel> kernel = Status(StatusCode::kNotFound, "");
  if (access(so_path.c_str(), R_OK) == 0) {
    kernel = load(hash, so_path);
    if (kernel.ok()) ++stats_.disk_hits;
  }
  // A file that does not load (truncated by a crash, another ABI) is compiled again over.
  if (!kernel.ok()) kernel = compile(chain, hash, so_path);
  if (!kernel.ok()) return kernel.status();
  kernel->inputs = chain.inputs;
  kernel->num_outputs = chain.num_outputs();
  kernels_.emplace(hash, *kernel);
  return kernel;
}

namespace {
std::atomic<bool> g_fallback_warned{false};
}  // namespace

bool warn_once_fallback(const Status& why) {
  if (g_fallback_warned.exchange(true)) return false;
  fmt::print(stderr, "kiln: warning: fusion unavailable ({}); running elementwise chains unfused\n",
             why.message());
  return true;
}

void reset_fallback_warning_for_testing() {
  g_fallback_warned.store(false);
}

ChainFn fuse_or_fallback(KernelCache& cache, const Chain& chain) {
  check_valid(chain);
  Expected<FusedKernel> kernel = cache.get(chain);
  if (kernel.ok()) return *kernel;
  warn_once_fallback(kernel.status());
  return [chain](const float* const* in, float* const* out, int64_t rows, int64_t cols) {
    run_unfused(chain, in, out, rows, cols);
  };
}

}  // namespace kiln::perf::fusion
