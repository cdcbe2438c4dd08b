// Elementwise fusion: a graph pass describes a chain of elementwise ops (bias, activation,
// residual, scale, the RMSNorm apply epilogue) as a `Chain`; `KernelCache` turns it into one
// C++ loop, compiled at run time by the system compiler into a shared object cached on disk
// under a hash of the chain (as TorchInductor does on CPU) and loaded with dlopen.
// `run_unfused` is the reference (one pass per op) and the fallback when no compiler works; it
// runs the very same scalar formulas (kiln::ref's, or kiln::cpu's polynomial ones), so the two
// agree bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/kernels/op_cost.h"

namespace kiln::perf::fusion {

// Bumped whenever the generated code's signature or the meaning of a chain changes; part of
// every hash, so an old cache directory is never read as the new ABI.
inline constexpr int kAbiVersion = 1;

// ---- the IR -------------------------------------------------------------------------------
// Values are float32 over a (rows, cols) grid, n = rows·cols. Every op's result is rounded to
// float, as the unfused chain stores it. Transcendental ops follow the chain's Math.
enum class OpKind {
  kAdd,        // a + b
  kSub,        // a - b
  kMul,        // a · b
  kScale,      // a · imm
  kAddScalar,  // a + imm
  kNeg,        // -a
  kRelu,       // max(a, 0)
  kSigmoid,    // 1 / (1 + e^-a)
  kExp,        // e^a
  kSilu,       // a · sigmoid(a)                     (ref::silu_forward)
  kGeluTanh,   // 0.5·a·(1 + tanh(√(2/π)(a + 0.044715a³)))  (ref::gelu_forward)
  kSwiglu,     // silu(a) · b                        (ref::swiglu_forward)
  kRowScale,   // a · b · c with b = rstd per row, c = weight per column: the RMSNorm apply
  kCount
};

struct OpInfo {
  OpKind kind;
  std::string_view name;  // in the canonical text and the generated source
  int arity;              // operands read (1 to 3)
  bool has_imm;           // reads Op::imm
  bool transcendental;    // computed per Chain::math (exact or polynomial)
  double flops;           // per element (OpCost convention: exp and divide count 1 each)
};
inline constexpr OpInfo kOps[] = {
    {OpKind::kAdd, "add", 2, false, false, 1},
    {OpKind::kSub, "sub", 2, false, false, 1},
    {OpKind::kMul, "mul", 2, false, false, 1},
    {OpKind::kScale, "scale", 1, true, false, 1},
    {OpKind::kAddScalar, "add_scalar", 1, true, false, 1},
    {OpKind::kNeg, "neg", 1, false, false, 1},
    {OpKind::kRelu, "relu", 1, false, false, 1},
    {OpKind::kSigmoid, "sigmoid", 1, false, true, 3},
    {OpKind::kExp, "exp", 1, false, true, 1},
    {OpKind::kSilu, "silu", 1, false, true, 4},
    {OpKind::kGeluTanh, "gelu_tanh", 1, false, true, 9},
    {OpKind::kSwiglu, "swiglu", 2, false, true, 5},
    {OpKind::kRowScale, "row_scale", 3, false, false, 2},
};
static_assert(std::size(kOps) == static_cast<size_t>(OpKind::kCount));
constexpr bool ops_table_in_order() {
  for (size_t i = 0; i < std::size(kOps); ++i)
    if (static_cast<size_t>(kOps[i].kind) != i) return false;
  return true;
}
static_assert(ops_table_in_order(), "kOps rows must follow OpKind order");
const OpInfo& op_info(OpKind k);

// How an input array covers the (rows, cols) grid.
enum class Layout {
  kFull,    // (rows, cols): activations, residuals
  kPerCol,  // (cols,), broadcast over rows: bias, norm weight
  kPerRow,  // (rows,), broadcast over columns: rstd of a norm
};

// A value: input array `index`, or the result of op `index` (SSA: each op defines one value).
struct Ref {
  enum class Source : uint8_t { kInput, kOp };
  Source source = Source::kInput;
  int index = 0;
  bool operator==(const Ref&) const = default;
};

struct Op {
  OpKind kind = OpKind::kAdd;
  Ref operands[3] = {};  // the first op_info(kind).arity are read
  float imm = 0;         // kScale, kAddScalar
};

struct Output {
  Ref value;
  int aliases_input = -1;  // the kFull input this output array may be (in-place), or -1
};

// How transcendental ops are computed; fused and unfused run the same formulas either way.
enum class Math {
  kExact,       // kiln::ref's: in double through std::exp / std::tanh, rounded once. glibc's
                // double exp and tanh are scalar calls: the fused loop does not vectorize.
  kPolynomial,  // kiln::cpu's: vec.h's float exp polynomial (1.3 ulp) as its scalar target
                // writes it, gelu as x·sigmoid(2u); plain float code, so the loop vectorizes.
};

// At most this many inputs and outputs (validate() says so), so that a call's per-chunk pointer
// arrays live on the stack.
inline constexpr int kMaxInputs = 16, kMaxOutputs = 8;

// A chain built in order: each op may read inputs and earlier ops. Outputs are written to their
// own arrays; they must not overlap each other or any input they do not declare as aliased.
struct Chain {
  Math math = Math::kExact;
  std::vector<Layout> inputs;
  std::vector<Op> ops;
  std::vector<Output> outputs;

  Ref input(Layout layout = Layout::kFull);
  Ref op(OpKind kind, Ref a, Ref b = {}, Ref c = {}, float imm = 0);
  void output(Ref value, int aliases_input = -1);

  // Shorthands for op().
  Ref add(Ref a, Ref b) { return op(OpKind::kAdd, a, b); }
  Ref sub(Ref a, Ref b) { return op(OpKind::kSub, a, b); }
  Ref mul(Ref a, Ref b) { return op(OpKind::kMul, a, b); }
  Ref scale(Ref a, float s) { return op(OpKind::kScale, a, {}, {}, s); }
  Ref add_scalar(Ref a, float s) { return op(OpKind::kAddScalar, a, {}, {}, s); }
  Ref neg(Ref a) { return op(OpKind::kNeg, a); }
  Ref relu(Ref a) { return op(OpKind::kRelu, a); }
  Ref sigmoid(Ref a) { return op(OpKind::kSigmoid, a); }
  Ref exp(Ref a) { return op(OpKind::kExp, a); }
  Ref silu(Ref a) { return op(OpKind::kSilu, a); }
  Ref gelu_tanh(Ref a) { return op(OpKind::kGeluTanh, a); }
  Ref swiglu(Ref gate, Ref up) { return op(OpKind::kSwiglu, gate, up); }
  Ref row_scale(Ref x, Ref rstd, Ref weight) { return op(OpKind::kRowScale, x, rstd, weight); }

  int num_inputs() const { return static_cast<int>(inputs.size()); }
  int num_outputs() const { return static_cast<int>(outputs.size()); }
};

// InvalidArgument naming the op and operand for: more than kMaxInputs inputs or kMaxOutputs
// outputs, an operand that is not an input or an earlier
// op, a non-finite immediate, row_scale whose rstd is not kPerRow or weight not kPerCol, no
// outputs, an alias that is not a kFull input.
Status validate(const Chain& chain);

// One line per input, op and output ("in0 full", "v0 = add in0 in1", "out0 = v2 alias in0"):
// what the hash covers and the generated source's header comment.
std::string canonical_text(const Chain& chain);

// ---- code generation ------------------------------------------------------------------------
// The generated kernel: in[i] for each input (its layout's length), out[j] for each output
// (rows·cols). The chain must be valid (aborts otherwise).
inline constexpr const char* kKernelSymbol = "kiln_fused";
using KernelFn = void (*)(const float* const* in, float* const* out, int64_t rows, int64_t cols);
std::string generate_source(const Chain& chain);

// The compiler command: $KILN_CXX (a path, or a name looked up on PATH), else the first of c++,
// g++, clang++ on PATH (c++ when none is); flags: -O3 -shared -fPIC -std=c++17
// -ffp-contract=off -fno-math-errno plus the SIMD flags of active_simd_target() (those of
// CMakeLists.txt's KILN_FLAGS_*, less what this CPU lacks), so the JIT emits nothing it can't run.
struct CompilerConfig {
  std::string cxx;  // as given; resolved on PATH when compiling
  std::vector<std::string> flags;
};
CompilerConfig default_compiler();
// `cxx` itself when it holds a slash and is executable, else the first executable of that name
// on PATH; NotFound naming it otherwise.
Expected<std::string> resolve_compiler(const std::string& cxx);

// FNV-1a 64 of the generated source (which holds the canonical text and kAbiVersion), the
// compiler and its flags: stable across runs, different for chains that compute differently.
uint64_t chain_hash(const Chain& chain, const CompilerConfig& compiler);
inline uint64_t chain_hash(const Chain& chain) {
  return chain_hash(chain, default_compiler());
}

// ---- the reference ----------------------------------------------------------------------
// One pass per op over (rows, cols) temporaries with the same scalar formulas as the generated
// code: the ground truth the fused kernel is tested against, and the graph's fallback.
void run_unfused(const Chain& chain, const float* const* in, float* const* out, int64_t rows,
                 int64_t cols);

// Compulsory traffic both ways: unfused, every op reads its operands and writes its result;
// fused, each input is read once and each output written once. FLOPs are the same.
struct ChainCost {
  OpCost fused, unfused;
};
ChainCost chain_cost(const Chain& chain, int64_t rows, int64_t cols);

// ---- JIT and cache ------------------------------------------------------------------------
class LoadedLibrary;  // a dlopen handle, dlclosed when the last FusedKernel using it goes

// A compiled chain; valid as long as it (or a copy) lives, even after its cache is gone.
struct FusedKernel {
  KernelFn fn = nullptr;  // one thread over the whole (rows, cols) grid
  uint64_t hash = 0;
  std::string library_path;
  std::shared_ptr<const LoadedLibrary> library;
  std::vector<Layout> inputs;  // the chain's, to offset each input's pointer per chunk
  int num_outputs = 0;

  // fn over kiln's thread pool: the grid split into row ranges (a chain without broadcast
  // inputs: element ranges) of at least kParallelGrainElements elements each.
  void operator()(const float* const* in, float* const* out, int64_t rows, int64_t cols) const;
};
// 64 KiB per array per chunk: ~3 µs of streaming on one core of the 2-core dev VM, against
// ~1 µs for the pool to hand a chunk out; smaller grids run on the calling thread.
inline constexpr int64_t kParallelGrainElements = int64_t{1} << 14;

// The cache directory: $KILN_FUSION_CACHE, else $XDG_CACHE_HOME/kiln/fusion, else
// $HOME/.cache/kiln/fusion, else /tmp/kiln-fusion.
std::string default_cache_dir();

struct CacheStats {
  int memory_hits = 0;  // found in this cache's map
  int disk_hits = 0;    // <hash>.so already in the directory, loaded
  int compiles = 0;     // compiler runs that succeeded
};

// Memory map, then <dir>/<hash>.so, else writes <hash>.cpp and compiles it (to a temporary
// file renamed into place, so another process never loads a half-written object). Thread-safe.
class KernelCache {
 public:
  explicit KernelCache(std::string dir = default_cache_dir(),
                       CompilerConfig compiler = default_compiler());

  // InvalidArgument (invalid chain), FailedPrecondition (the directory cannot be created or
  // written; names it), NotFound (no compiler), Internal (the compiler failed: its command and
  // the first lines of its stderr, or dlopen/dlsym failed).
  Expected<FusedKernel> get(const Chain& chain);

  const std::string& dir() const { return dir_; }
  const CompilerConfig& compiler() const { return compiler_; }
  CacheStats stats() const;

 private:
  Status prepare_dir();
  Expected<FusedKernel> load(uint64_t hash, const std::string& so_path);
  Expected<FusedKernel> compile(const Chain& chain, uint64_t hash, const std::string& so_path);

  std::string dir_;
  CompilerConfig compiler_;
  mutable std::mutex mu_;
  bool dir_ready_ = false;
  std::map<uint64_t, FusedKernel> kernels_;
  CacheStats stats_;
};

// Prints "kiln: warning: fusion unavailable (<status>); running elementwise chains unfused"
// to stderr the first time it is called in the process; returns whether it printed.
bool warn_once_fallback(const Status& why);
void reset_fallback_warning_for_testing();

// What a graph pass calls: the fused kernel, or, when compiling fails, the unfused chain (after
// warn_once_fallback). The chain must be valid.
using ChainFn =
    std::function<void(const float* const* in, float* const* out, int64_t rows, int64_t cols)>;
ChainFn fuse_or_fallback(KernelCache& cache, const Chain& chain);

}  // namespace kiln::perf::fusion
