// perf/fusion.h: every generated kernel against run_unfused (bitwise: both run the same scalar
// formulas, one source text), run_unfused against kiln::ref's kernels, and the cache: memory
// and disk hits, hashes, a missing or failing compiler (fallback with one warning), bad
// directories. All compiled objects go to a mkdtemp directory removed at the end; the suite
// compiles about ten chains (~0.5 s each), so keep new cases to chains already here.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/cpu_features.h"
#include "kiln/core/rng.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/activation.h"
#include "kiln/kernels/elementwise.h"
#include "kiln/perf/fusion.h"

namespace kiln::perf::fusion {
namespace {

namespace fs = std::filesystem;

// A mkdtemp directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kiln-fusion-test-XXXXXX";
    KILN_CHECK(mkdtemp(tmpl) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Sets an environment variable for one scope, restoring the old value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    had_ = getenv(name) != nullptr;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// The tests that compile need a C++ compiler; a machine without one skips them.
bool have_compiler() {
  return resolve_compiler(default_compiler().cxx).ok();
}
#define KILN_SKIP_WITHOUT_COMPILER() \
  if (!have_compiler()) GTEST_SKIP() << "no C++ compiler (KILN_CXX, c++, g++, clang++)"

// kiln's pool at n threads for one scope.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : old_(num_threads()) { set_num_threads(n); }
  ~ScopedThreads() { set_num_threads(old_); }

 private:
  int old_;
};

// One cache directory for the whole suite, so each chain compiles once.
class Fusion : public ::testing::Test {
 protected:
  void SetUp() override { KILN_SKIP_WITHOUT_COMPILER(); }
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    cache_ = new KernelCache(dir_->path() + "/cache");
  }
  static void TearDownTestSuite() {
    delete cache_;
    delete dir_;
  }
  static TempDir* dir_;
  static KernelCache* cache_;
};
TempDir* Fusion::dir_ = nullptr;
KernelCache* Fusion::cache_ = nullptr;

int64_t length(Layout l, int64_t rows, int64_t cols) {
  return l == Layout::kFull ? rows * cols : l == Layout::kPerCol ? cols : rows;
}

// Random inputs in [-4, 4) (gelu and silu's interesting range), rstd-like inputs in (0, 2].
std::vector<std::vector<float>> random_inputs(const Chain& chain, int64_t rows, int64_t cols,
                                              uint64_t seed) {
  Rng rng(seed);
  std::vector<std::vector<float>> in;
  for (Layout l : chain.inputs) {
    std::vector<float> v(length(l, rows, cols));
    for (float& x : v)
      x = l == Layout::kPerRow ? 2.0f - rng.uniform() * 1.99f : rng.uniform() * 8 - 4;
    in.push_back(std::move(v));
  }
  return in;
}

std::vector<const float*> pointers(const std::vector<std::vector<float>>& v) {
  std::vector<const float*> p;
  for (const auto& x : v) p.push_back(x.data());
  return p;
}
std::vector<float*> pointers(std::vector<std::vector<float>>& v) {
  std::vector<float*> p;
  for (auto& x : v) p.push_back(x.data());
  return p;
}

// "" when a and b hold the same bits, else where they first differ.
std::string first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return "sizes differ";
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return "index " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " +
             std::to_string(b[i]);
  return "";
}

// sum((got - want)²) / sum(want²)
double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    ref += double(want[i]) * want[i];
  }
  return err / ref;
}

// <dir>/<hash>.so or .cpp, the cache's names.
std::string cached_file(const std::string& dir, uint64_t hash, const char* ext) {
  return fmt::format("{}/{:016x}{}", dir, hash, ext);
}

// A compile leaves nothing temporary behind, whether it worked or not.
void expect_no_temporaries(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
}

// Runs `kernel` and run_unfused on the same random inputs; outputs that alias an input are
// computed in place on a copy of that input. Expects identical bits.
void expect_fused_matches_unfused(const ChainFn& kernel, const Chain& chain, int64_t rows,
                                  int64_t cols) {
  SCOPED_TRACE("rows=" + std::to_string(rows) + " cols=" + std::to_string(cols));
  const auto inputs = random_inputs(chain, rows, cols, 1234 + rows * 31 + cols);
  std::vector<std::vector<float>> results[2];
  for (int fused = 0; fused < 2; ++fused) {
    auto in = inputs;
    std::vector<std::vector<float>> out(chain.num_outputs(),
                                        std::vector<float>(rows * cols, -7.0f));
    std::vector<float*> out_ptr = pointers(out);
    for (int o = 0; o < chain.num_outputs(); ++o)
      if (chain.outputs[o].aliases_input >= 0)
        out_ptr[o] = in[chain.outputs[o].aliases_input].data();
    const auto in_ptr = pointers(std::as_const(in));
    if (fused)
      kernel(in_ptr.data(), out_ptr.data(), rows, cols);
    else
      run_unfused(chain, in_ptr.data(), out_ptr.data(), rows, cols);
    for (int o = 0; o < chain.num_outputs(); ++o)
      if (chain.outputs[o].aliases_input >= 0) out[o] = in[chain.outputs[o].aliases_input];
    results[fused] = std::move(out);
  }
  for (int o = 0; o < chain.num_outputs(); ++o)
    EXPECT_EQ(first_difference(results[1][o], results[0][o]), "") << "output " << o;
}

// Compiles `chain` in the suite's cache and checks it on every flat size.
void check_flat_chain(KernelCache& cache, const Chain& chain) {
  auto kernel = cache.get(chain);
  ASSERT_TRUE(kernel.ok()) << kernel.status().message();
  for (int64_t n : {1, 7, 33, 1000, 4097}) expect_fused_matches_unfused(*kernel, chain, n, 1);
  expect_fused_matches_unfused(*kernel, chain, 33, 64);
  // Large enough to be split over two threads (kParallelGrainElements), with a ragged end.
  ScopedThreads two(2);
  expect_fused_matches_unfused(*kernel, chain, 4 * kParallelGrainElements + 3, 1);
  expect_fused_matches_unfused(*kernel, chain, 1, 4 * kParallelGrainElements + 3);
}

// Broadcast chains on rows x cols grids.
void check_grid_chain(KernelCache& cache, const Chain& chain) {
  auto kernel = cache.get(chain);
  ASSERT_TRUE(kernel.ok()) << kernel.status().message();
  for (int64_t cols : {1, 3, 64})
    for (int64_t rows : {1, 7, 33}) expect_fused_matches_unfused(*kernel, chain, rows, cols);
  ScopedThreads two(2);  // rows split over two threads
  expect_fused_matches_unfused(*kernel, chain, 4 * kParallelGrainElements / 64 + 1, 64);
  expect_fused_matches_unfused(*kernel, chain, 4 * kParallelGrainElements + 1, 3);
}

Chain bias_gelu_chain() {  // (rows, cols) + bias (cols,), then GELU: GPT-2's MLP epilogue
  Chain c;
  const Ref x = c.input(), bias = c.input(Layout::kPerCol);
  c.output(c.gelu_tanh(c.add(x, bias)));
  return c;
}

Chain residual_scale_chain() {  // out = x + 0.5·r
  Chain c;
  const Ref x = c.input(), r = c.input();
  c.output(c.add(x, c.scale(r, 0.5f)));
  return c;
}

Chain swiglu_chain() {
  Chain c;
  const Ref gate = c.input(), up = c.input();
  c.output(c.swiglu(gate, up));
  return c;
}

Chain silu_mul_residual_chain() {  // residual += silu(a)·b, in place in the residual
  Chain c;
  const Ref a = c.input(), b = c.input(), residual = c.input();
  c.output(c.add(residual, c.mul(c.silu(a), b)), /*aliases_input=*/2);
  return c;
}

Chain six_op_chain() {  // every remaining op; two outputs, one in place
  Chain c;
  const Ref a = c.input(), b = c.input();
  const Ref d = c.sub(b, a);       // order matters: b - a
  const Ref e = c.relu(c.neg(d));  // max(a - b, 0)
  const Ref s = c.sigmoid(c.add_scalar(e, -0.25f));
  const Ref x = c.exp(c.scale(s, -1.5f));
  c.output(x, /*aliases_input=*/0);
  c.output(c.mul(x, d));
  return c;
}

Chain rmsnorm_apply_residual_chain() {  // y = x·rstd[row]·w[col]; out = y + residual
  Chain c;
  const Ref x = c.input(), rstd = c.input(Layout::kPerRow), w = c.input(Layout::kPerCol);
  const Ref residual = c.input();
  const Ref y = c.row_scale(x, rstd, w);
  c.output(y);
  c.output(c.add(y, residual));
  return c;
}

TEST_F(Fusion, BiasGeluWithBroadcastBias) {
  check_grid_chain(*cache_, bias_gelu_chain());
}
TEST_F(Fusion, ResidualPlusScale) {
  check_flat_chain(*cache_, residual_scale_chain());
}
TEST_F(Fusion, Swiglu) {
  check_flat_chain(*cache_, swiglu_chain());
}
TEST_F(Fusion, SiluTimesBPlusResidualInPlace) {
  check_flat_chain(*cache_, silu_mul_residual_chain());
}
TEST_F(Fusion, SixOpChainWithTwoOutputs) {
  check_flat_chain(*cache_, six_op_chain());
}
// Outputs that are inputs, written over each other: a swap of two arrays in place.
TEST_F(Fusion, InPlaceSwapOfTwoInputs) {
  Chain c;
  const Ref a = c.input(), b = c.input();
  c.output(b, /*aliases_input=*/0);
  c.output(a, /*aliases_input=*/1);
  auto kernel = cache_->get(c);
  ASSERT_TRUE(kernel.ok()) << kernel.status().message();
  std::vector<float> x = {1, 2, 3}, y = {4, 5, 6};
  const float* in[2] = {x.data(), y.data()};
  float* out[2] = {x.data(), y.data()};
  run_unfused(c, in, out, 3, 1);
  EXPECT_EQ(x, (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(y, (std::vector<float>{1, 2, 3}));
  (*kernel)(in, out, 3, 1);  // and back
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(y, (std::vector<float>{4, 5, 6}));
}

TEST_F(Fusion, RmsNormApplyEpilogue) {
  check_grid_chain(*cache_, rmsnorm_apply_residual_chain());
}

// run_unfused uses kiln::ref's formulas: the same bits as ref::gelu_forward after a bias add,
// and as ref::swiglu_forward.
TEST(FusionReference, UnfusedMatchesKilnReferenceKernels) {
  const int64_t rows = 7, cols = 33, n = rows * cols;
  {
    const Chain c = bias_gelu_chain();
    const auto in = random_inputs(c, rows, cols, 5);
    std::vector<float> got(n), want(n);
    float* out = got.data();
    run_unfused(c, pointers(in).data(), &out, rows, cols);
    for (int64_t i = 0; i < n; ++i) want[i] = in[0][i] + in[1][i % cols];
    ref::gelu_forward(want.data(), want.data(), n);
    EXPECT_EQ(first_difference(got, want), "");
  }
  {
    const Chain c = swiglu_chain();
    const auto in = random_inputs(c, rows, cols, 6);
    std::vector<float> got(n), want(n);
    float* out = got.data();
    run_unfused(c, pointers(in).data(), &out, rows, cols);
    ref::swiglu_forward(want.data(), in[0].data(), in[1].data(), n);
    EXPECT_EQ(first_difference(got, want), "");
  }
}

// Against kiln::cpu's SIMD GELU (polynomial exp / tanh within 2 ulp, cpu/vec.h), the fused
// kernel differs by a few ulp per element: nmse <= (8u)² with u = 2^-24 leaves room for the
// bias add's rounding and gelu's amplification of its input error (|x·gelu'(x)/gelu(x)| <~ 3).
TEST_F(Fusion, FusedGeluIsCloseToKilnCpuKernel) {
  const Chain c = bias_gelu_chain();
  auto kernel = cache_->get(c);
  ASSERT_TRUE(kernel.ok()) << kernel.status().message();
  const int64_t rows = 33, cols = 64, n = rows * cols;
  const auto in = random_inputs(c, rows, cols, 8);
  std::vector<float> got(n), want(n);
  float* out = got.data();
  (*kernel)(pointers(in).data(), &out, rows, cols);
  for (int64_t i = 0; i < n; ++i) want[i] = in[0][i] + in[1][i % cols];
  cpu::gelu_forward(want.data(), want.data(), n);
  const double u = 0x1p-24;
  EXPECT_LE(nmse(got, want), 64 * u * u);
}

// ---- Math::kPolynomial: kiln::cpu's formulas, vectorizable ----------------------------------

Chain polynomial(Chain c) {
  c.math = Math::kPolynomial;
  return c;
}

Chain every_transcendental_chain() {  // silu, swiglu, sigmoid, exp; two outputs
  Chain c;
  const Ref a = c.input(), b = c.input();
  const Ref s = c.add(c.silu(a), c.swiglu(a, b));
  c.output(c.mul(c.sigmoid(s), c.exp(b)));
  c.output(s, /*aliases_input=*/1);
  return c;
}

TEST_F(Fusion, PolynomialBiasGelu) {
  check_grid_chain(*cache_, polynomial(bias_gelu_chain()));
}
TEST_F(Fusion, PolynomialSiluSwigluSigmoidExp) {
  check_flat_chain(*cache_, polynomial(every_transcendental_chain()));
}

// The polynomial formulas are kiln::cpu's: the same bits as its scalar target's kernels.
TEST(FusionReference, PolynomialUnfusedMatchesKilnCpuScalarTarget) {
  const SimdTarget before = active_simd_target();
  ASSERT_TRUE(set_simd_target(SimdTarget::kScalar));
  const int64_t n = 1000;
  std::vector<float> x(n), y(n), got(n), want(n);
  Rng rng(9);
  rng.fill_uniform(x, -10, 10);
  rng.fill_uniform(y, -4, 4);
  const float* in[2] = {x.data(), y.data()};
  float* out = got.data();
  const auto unary = [&](Ref (Chain::*op)(Ref), void (*kernel)(float*, const float*, int64_t)) {
    Chain c;
    c.math = Math::kPolynomial;
    c.output((c.*op)(c.input()));
    run_unfused(c, in, &out, n, 1);
    kernel(want.data(), x.data(), n);
    return first_difference(got, want);
  };
  EXPECT_EQ(unary(&Chain::gelu_tanh, cpu::gelu_forward), "") << "gelu";
  EXPECT_EQ(unary(&Chain::silu, cpu::silu_forward), "") << "silu";
  EXPECT_EQ(unary(&Chain::exp, cpu::exp_array), "") << "exp";
  Chain c = polynomial(swiglu_chain());
  run_unfused(c, in, &out, n, 1);
  cpu::swiglu_forward(want.data(), x.data(), y.data(), n);
  EXPECT_EQ(first_difference(got, want), "") << "swiglu";
  ASSERT_TRUE(set_simd_target(before));
}

// kPolynomial against kExact: exp within 1.3 ulp, sigmoid 3 (vec.h); each op adds its own
// rounding and passes its input's error on amplified by at most ~3 (|x·f'(x)/f(x)| on [-4, 4]):
// over these short chains, per-element relative error < 16u, so nmse <= (16u)².
TEST(FusionReference, PolynomialIsCloseToExact) {
  for (const Chain& exact : {bias_gelu_chain(), every_transcendental_chain()}) {
    const int64_t rows = 33, cols = 64, n = rows * cols;
    const auto in = random_inputs(exact, rows, cols, 10);
    std::vector<std::vector<float>> got(exact.num_outputs(), std::vector<float>(n)), want = got;
    run_unfused(exact, pointers(in).data(), pointers(want).data(), rows, cols);
    run_unfused(polynomial(exact), pointers(in).data(), pointers(got).data(), rows, cols);
    for (int o = 0; o < exact.num_outputs(); ++o) {
      const double u = 0x1p-24, e = nmse(got[o], want[o]);
      EXPECT_LE(e, 256 * u * u) << canonical_text(exact) << "output " << o;
      EXPECT_GT(e, 0) << "the two maths should differ somewhere";
    }
  }
}

// ---- cache behaviour ----------------------------------------------------------------------

Chain small_cache_chain() {
  Chain c;
  const Ref x = c.input();
  c.output(c.relu(c.add_scalar(x, 1.0f)));
  return c;
}

TEST(FusionCache, SecondGetCompilesNothingAndAFreshCacheLoadsFromDisk) {
  KILN_SKIP_WITHOUT_COMPILER();
  TempDir dir;
  const Chain chain = small_cache_chain();
  uint64_t hash = 0;
  {
    KernelCache cache(dir.path());
    auto a = cache.get(chain);
    ASSERT_TRUE(a.ok()) << a.status().message();
    EXPECT_EQ(cache.stats().compiles, 1);
    auto b = cache.get(chain);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(cache.stats().compiles, 1);
    EXPECT_EQ(cache.stats().memory_hits, 1);
    EXPECT_EQ(a->fn, b->fn);
    hash = a->hash;
    EXPECT_EQ(hash, chain_hash(chain));
    EXPECT_TRUE(fs::exists(cached_file(dir.path(), hash, ".so")));
    EXPECT_TRUE(fs::exists(cached_file(dir.path(), hash, ".cpp")));
  }
  // A new process, simulated by a new cache: the object is on disk.
  KernelCache again(dir.path());
  auto c = again.get(chain);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(again.stats().compiles, 0);
  EXPECT_EQ(again.stats().disk_hits, 1);
  expect_fused_matches_unfused(*c, chain, 1000, 1);
  expect_no_temporaries(dir.path());
}

TEST(FusionCache, AKernelOutlivesItsCache) {
  KILN_SKIP_WITHOUT_COMPILER();
  TempDir dir;
  FusedKernel kernel;
  {
    KernelCache cache(dir.path());
    auto k = cache.get(small_cache_chain());
    ASSERT_TRUE(k.ok()) << k.status().message();
    kernel = *k;
  }
  expect_fused_matches_unfused(kernel, small_cache_chain(), 33, 1);
}

TEST(FusionCache, ACorruptObjectOnDiskIsCompiledAgain) {
  KILN_SKIP_WITHOUT_COMPILER();
  TempDir dir;
  const Chain chain = small_cache_chain();
  const std::string so = cached_file(dir.path(), chain_hash(chain), ".so");
  std::ofstream(so) << "not an ELF file";
  KernelCache cache(dir.path());
  auto k = cache.get(chain);
  ASSERT_TRUE(k.ok()) << k.status().message();
  EXPECT_EQ(cache.stats().compiles, 1);
  expect_fused_matches_unfused(*k, chain, 7, 1);
}

// Two processes compiling the same chain into one directory (two caches on two threads here):
// each renames a whole object into place, and both load a working kernel.
TEST(FusionCache, TwoCachesCompilingTheSameChainAtOnce) {
  KILN_SKIP_WITHOUT_COMPILER();
  TempDir dir;
  const Chain chain = residual_scale_chain();
  Expected<FusedKernel> results[2] = {Status(StatusCode::kInternal, "not run"),
                                      Status(StatusCode::kInternal, "not run")};
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t)
      threads.emplace_back([&, t] {
        KernelCache cache(dir.path());
        results[t] = cache.get(chain);
      });
    for (auto& th : threads) th.join();
  }
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().message();
    expect_fused_matches_unfused(*r, chain, 4097, 1);
  }
}

TEST(FusionCache, DifferentChainsGetDifferentHashes) {
  const CompilerConfig cc{"c++", {"-O2"}};
  std::vector<Chain> chains = {bias_gelu_chain(),  residual_scale_chain(),
                               swiglu_chain(),     silu_mul_residual_chain(),
                               six_op_chain(),     rmsnorm_apply_residual_chain(),
                               small_cache_chain()};
  {  // the same chain but for an immediate, the operand order, a layout, an alias
    Chain c = residual_scale_chain();
    c.ops[0].imm = 0.25f;
    chains.push_back(c);
    c = residual_scale_chain();
    std::swap(c.ops[1].operands[0], c.ops[1].operands[1]);
    chains.push_back(c);
    c = bias_gelu_chain();
    c.inputs[1] = Layout::kFull;
    chains.push_back(c);
    c = residual_scale_chain();
    c.outputs[0].aliases_input = 0;
    chains.push_back(c);
  }
  std::vector<uint64_t> hashes;
  for (const Chain& c : chains) {
    ASSERT_TRUE(validate(c).ok()) << validate(c).message();
    hashes.push_back(chain_hash(c, cc));
  }
  for (size_t i = 0; i < hashes.size(); ++i)
    for (size_t j = i + 1; j < hashes.size(); ++j)
      EXPECT_NE(hashes[i], hashes[j]) << canonical_text(chains[i]) << "vs\n"
                                      << canonical_text(chains[j]);
  // Stable: rebuilding a chain gives the same hash; the compiler and its flags are part of it.
  EXPECT_EQ(chain_hash(six_op_chain(), cc), chain_hash(six_op_chain(), cc));
  EXPECT_NE(chain_hash(six_op_chain(), cc), chain_hash(six_op_chain(), {"c++", {"-O3"}}));
  EXPECT_NE(chain_hash(six_op_chain(), cc), chain_hash(six_op_chain(), {"clang++", {"-O2"}}));
}

TEST(FusionCache, CanonicalTextAndSourceSayWhatTheChainDoes) {
  const Chain c = silu_mul_residual_chain();
  EXPECT_EQ(canonical_text(c),
            "kiln fusion abi 1\nmath exact\nin0 full\nin1 full\nin2 full\n"
            "v0 = silu in0\nv1 = mul v0 in1\nv2 = add in2 v1\nout0 = v2 alias in2\n");
  const std::string src = generate_source(c);
  EXPECT_NE(src.find("extern \"C\" void kiln_fused("), std::string::npos) << src;
  // The aliased pair is not __restrict; the other inputs are.
  EXPECT_NE(src.find("const float* in2 = in[2];"), std::string::npos) << src;
  EXPECT_NE(src.find("float* out0 = out[0];"), std::string::npos) << src;
  EXPECT_NE(src.find("const float* __restrict in0 = in[0];"), std::string::npos) << src;
  EXPECT_NE(generate_source(residual_scale_chain()).find("//   v0 = scale in1 0x1p-1f\n"),
            std::string::npos);
}

TEST(FusionCache, InvalidChainsAreNamedErrors) {
  TempDir dir;
  KernelCache cache(dir.path());
  Chain forward_ref;
  const Ref x = forward_ref.input();
  forward_ref.op(OpKind::kAdd, x, Ref{Ref::Source::kOp, 0});  // reads itself
  forward_ref.output(Ref{Ref::Source::kOp, 0});
  auto k = cache.get(forward_ref);
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(k.status().message().find("op v0 (add) reads v0"), std::string::npos)
      << k.status().message();

  Chain no_outputs;
  no_outputs.relu(no_outputs.input());
  EXPECT_NE(validate(no_outputs).message().find("no outputs"), std::string::npos);

  Chain bad_row_scale;
  const Ref a = bad_row_scale.input(), b = bad_row_scale.input();
  bad_row_scale.output(bad_row_scale.row_scale(a, b, b));
  EXPECT_NE(validate(bad_row_scale).message().find("per_row"), std::string::npos);

  Chain bad_alias = bias_gelu_chain();
  bad_alias.outputs[0].aliases_input = 1;  // the (cols,) bias
  EXPECT_NE(validate(bad_alias).message().find("aliases input 1"), std::string::npos);

  Chain nan_imm;
  nan_imm.output(nan_imm.scale(nan_imm.input(), std::nanf("")));
  EXPECT_NE(validate(nan_imm).message().find("non-finite"), std::string::npos);
  EXPECT_EQ(cache.stats().compiles, 0);
}

TEST(FusionCache, CostCountsIntermediatesOnlyUnfused) {
  // x + 0.5·r over n: unfused, scale reads r and writes t, add reads x and t and writes out:
  // 5n floats; fused, reads x and r and writes out: 3n. 2 FLOPs per element either way.
  const int64_t rows = 10, cols = 100, n = rows * cols;
  const ChainCost cost = chain_cost(residual_scale_chain(), rows, cols);
  EXPECT_DOUBLE_EQ(cost.unfused.bytes, 4.0 * 5 * n);
  EXPECT_DOUBLE_EQ(cost.fused.bytes, 4.0 * 3 * n);
  EXPECT_DOUBLE_EQ(cost.fused.flops, 2.0 * n);
  EXPECT_DOUBLE_EQ(cost.unfused.flops, 2.0 * n);
  // A broadcast bias is cols floats; gelu counts 9 FLOPs (activation.h's gelu_forward_cost).
  const ChainCost bg = chain_cost(bias_gelu_chain(), rows, cols);
  EXPECT_DOUBLE_EQ(bg.fused.bytes, 4.0 * (n + cols + n));
  EXPECT_DOUBLE_EQ(bg.unfused.bytes, 4.0 * (n + cols + n) + 4.0 * (n + n));
  EXPECT_DOUBLE_EQ(bg.fused.flops, (1.0 + 9.0) * n);
}

// ---- no compiler: errors and the fallback ----------------------------------------------------

TEST(FusionCache, MissingOrFailingCompilerIsAnErrorAndFallsBackWithOneWarning) {
  TempDir dir;
  const Chain chain = six_op_chain();
  {
    KernelCache cache(dir.path(), {"/bin/false", default_compiler().flags});
    auto k = cache.get(chain);
    ASSERT_FALSE(k.ok());
    EXPECT_EQ(k.status().code(), StatusCode::kInternal);
    EXPECT_NE(k.status().message().find("compiler failed (exit 1)"), std::string::npos)
        << k.status().message();
  }
  {
    ScopedEnv env("KILN_CXX", "/nonexistent/kiln-cxx");
    EXPECT_EQ(default_compiler().cxx, "/nonexistent/kiln-cxx");
    KernelCache cache(dir.path());
    auto k = cache.get(chain);
    ASSERT_FALSE(k.ok());
    EXPECT_EQ(k.status().code(), StatusCode::kNotFound);
    EXPECT_NE(k.status().message().find("/nonexistent/kiln-cxx"), std::string::npos);
  }
  {
    ScopedEnv env("KILN_CXX", "kiln-no-such-compiler");
    KernelCache cache(dir.path());
    auto k = cache.get(chain);
    ASSERT_FALSE(k.ok());
    EXPECT_NE(k.status().message().find("'kiln-no-such-compiler' not found on PATH"),
              std::string::npos)
        << k.status().message();
  }
  if (have_compiler()) {  // a compiler that rejects a flag: its stderr is in the error
    KernelCache cache(dir.path(),
                      {default_compiler().cxx, {"-shared", "-fPIC", "--kiln-no-such-flag"}});
    auto k = cache.get(chain);
    ASSERT_FALSE(k.ok());
    EXPECT_NE(k.status().message().find("kiln-no-such-flag"), std::string::npos)
        << k.status().message();
    EXPECT_NE(k.status().message().find("\n  "), std::string::npos) << k.status().message();
  }
  // The graph's path: two chains that cannot compile, one warning, unfused results.
  KernelCache broken(dir.path(), {"/bin/false", {}});
  reset_fallback_warning_for_testing();
  ::testing::internal::CaptureStderr();
  const ChainFn f1 = fuse_or_fallback(broken, chain);
  const ChainFn f2 = fuse_or_fallback(broken, swiglu_chain());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("kiln: warning: fusion unavailable"), std::string::npos) << err;
  EXPECT_EQ(err.find("warning", err.find("warning") + 1), std::string::npos) << err;
  expect_fused_matches_unfused(f1, chain, 33, 1);
  expect_fused_matches_unfused(f2, swiglu_chain(), 33, 1);
  expect_no_temporaries(dir.path());
}

TEST(FusionCache, UnusableCacheDirectoryIsAClearError) {
  TempDir dir;
  const std::string file = dir.path() + "/a-file";
  std::ofstream(file) << "x";
  const std::string bad = file + "/fusion";  // under a regular file: cannot exist (even as root)
  ScopedEnv env("KILN_FUSION_CACHE", bad.c_str());
  EXPECT_EQ(default_cache_dir(), bad);
  KernelCache cache;
  auto k = cache.get(small_cache_chain());
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(k.status().message().find("cache directory '" + bad + "'"), std::string::npos)
      << k.status().message();
}

TEST(FusionCache, DefaultDirectoryFollowsXdgThenHome) {
  ScopedEnv none("KILN_FUSION_CACHE", "");
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/x/cache");
    EXPECT_EQ(default_cache_dir(), "/x/cache/kiln/fusion");
  }
  ScopedEnv xdg("XDG_CACHE_HOME", "");
  ScopedEnv home("HOME", "/h");
  EXPECT_EQ(default_cache_dir(), "/h/.cache/kiln/fusion");
}

// Where KILN_SIMD picks a lower target, the JIT compiles for it (different flags and hash).
TEST(FusionCache, FlagsFollowTheActiveSimdTarget) {
  const SimdTarget before = active_simd_target();
  ASSERT_TRUE(set_simd_target(SimdTarget::kScalar));
  const CompilerConfig scalar = default_compiler();
  ASSERT_TRUE(set_simd_target(before));
  for (const std::string& f : scalar.flags) EXPECT_EQ(f.rfind("-mavx", 0), std::string::npos) << f;
  if (before != SimdTarget::kScalar) {
    EXPECT_NE(chain_hash(swiglu_chain(), scalar), chain_hash(swiglu_chain()));
    bool has_avx2 = false;
    for (const std::string& f : default_compiler().flags) has_avx2 |= f == "-mavx2";
    EXPECT_TRUE(has_avx2);
  }
}

}  // namespace
}  // namespace kiln::perf::fusion
