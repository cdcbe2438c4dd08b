// OpenBLAS and oneDNN behind the PeerGemm interface; thread control and the OpenBLAS
// environment re-exec. The only file that includes the peers' headers.
#include "bench/peers.h"

#include <cblas.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <dnnl.hpp>
#include <fstream>
#include <iterator>
#include <vector>

#include <fmt/format.h>

#include "kiln/core/cpu_features.h"
#include "kiln/core/status.h"

namespace kiln::bench {
namespace {

// cblas_sbgemm is declared by the header but not exported by every build (Debian 0.3.21 lacks
// it): look it up at run time, and offer no OpenBLAS bf16 peer without it.
using SbgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint,
                          float, const bfloat16*, blasint, const bfloat16*, blasint, float, float*,
                          blasint);
SbgemmFn find_sbgemm() {
  return reinterpret_cast<SbgemmFn>(dlsym(RTLD_DEFAULT, "cblas_sbgemm"));
}

class OpenblasGemm : public PeerGemm {
 public:
  explicit OpenblasGemm(const GemmShape& s) : s_(s), sbgemm_(find_sbgemm()) {}
  const char* name() const override { return "openblas"; }
  void run(const void* a, const void* b, float* c) override {
    const CBLAS_TRANSPOSE tb = s_.trans_b ? CblasTrans : CblasNoTrans;
    const blasint m = static_cast<blasint>(s_.m), n = static_cast<blasint>(s_.n),
                  k = static_cast<blasint>(s_.k);
    const blasint ldb = static_cast<blasint>(s_.trans_b ? s_.k : s_.n);
    if (s_.dtype == DType::kBF16) {
      sbgemm_(CblasRowMajor, CblasNoTrans, tb, m, n, k, 1.0f, static_cast<const bfloat16*>(a), k,
              static_cast<const bfloat16*>(b), ldb, 0.0f, c, n);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, m, n, k, 1.0f, static_cast<const float*>(a), k,
                  static_cast<const float*>(b), ldb, 0.0f, c, n);
    }
  }

 private:
  GemmShape s_;
  SbgemmFn sbgemm_;
};

class OnednnSgemm : public PeerGemm {
 public:
  explicit OnednnSgemm(const GemmShape& s) : s_(s) {}
  const char* name() const override { return "onednn"; }
  void run(const void* a, const void* b, float* c) override {
    const dnnl_dim_t ldb = s_.trans_b ? s_.k : s_.n;
    const dnnl_status_t st =
        dnnl_sgemm('N', s_.trans_b ? 'T' : 'N', s_.m, s_.n, s_.k, 1.0f, static_cast<const float*>(a),
                   s_.k, static_cast<const float*>(b), ldb, 0.0f, c, s_.n);
    KILN_CHECK(st == dnnl_success);
  }

 private:
  GemmShape s_;
};

class OnednnMatmul : public PeerGemm {
 public:
  explicit OnednnMatmul(const GemmShape& s) : eng_(dnnl::engine::kind::cpu, 0), strm_(eng_) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dt in = s.dtype == DType::kBF16 ? dt::bf16 : s.dtype == DType::kF16 ? dt::f16 : dt::f32;
    const dnnl::memory::desc a_md({s.m, s.k}, in, tag::ab);
    const dnnl::memory::desc b_md({s.k, s.n}, in, s.trans_b ? tag::ba : tag::ab);
    const dnnl::memory::desc c_md({s.m, s.n}, dt::f32, tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), eng_);
    prim_ = dnnl::matmul(pd);
    a_ = dnnl::memory(a_md, eng_, DNNL_MEMORY_NONE);
    b_ = dnnl::memory(b_md, eng_, DNNL_MEMORY_NONE);
    c_ = dnnl::memory(c_md, eng_, DNNL_MEMORY_NONE);
  }
  const char* name() const override { return "onednn"; }
  void run(const void* a, const void* b, float* c) override {
    a_.set_data_handle(const_cast<void*>(a));
    b_.set_data_handle(const_cast<void*>(b));
    c_.set_data_handle(c);
    prim_.execute(strm_, {{DNNL_ARG_SRC, a_}, {DNNL_ARG_WEIGHTS, b_}, {DNNL_ARG_DST, c_}});
    strm_.wait();
  }

 private:
  dnnl::engine eng_;
  dnnl::stream strm_;
  dnnl::matmul prim_;
  dnnl::memory a_, b_, c_;
};

}  // namespace

std::unique_ptr<PeerGemm> make_openblas_gemm(const GemmShape& s) {
  if (s.dtype == DType::kBF16 && find_sbgemm() == nullptr) return nullptr;
  return std::make_unique<OpenblasGemm>(s);
}

std::unique_ptr<PeerGemm> make_onednn_gemm(const GemmShape& s) {
  if (s.dtype == DType::kF32) return std::make_unique<OnednnSgemm>(s);
  if (s.dtype != DType::kF16) return std::make_unique<OnednnMatmul>(s);
  try {  // f16 inputs: oneDNN has a matmul for them on some CPUs and versions only
    return std::make_unique<OnednnMatmul>(s);
  } catch (const dnnl::error&) {
    return nullptr;
  }
}

void set_peer_threads(int n) {
  openblas_set_num_threads(n);
  // libgomp is loaded with oneDNN; look the setter up rather than linking OpenMP into kiln.
  using SetThreads = void (*)(int);
  if (auto* fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) fn(n);
}

std::string openblas_core_name() {
  const char* name = openblas_get_corename();
  return name ? name : "?";
}

namespace {

// The strongest OpenBLAS core this CPU can run, for when OpenBLAS does not recognise the CPU
// and falls back to a generic one (Debian's 0.3.21 takes Emerald Rapids for "Prescott", 5x
// slower than its Cooperlake kernels there). Null when the pick needs no correction.
const char* better_openblas_core(const std::string& picked) {
  static const char* const kGeneric[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai",
                                         "Coppermine", "Northwood", "Banias", "Sandybridge"};
  if (std::find(std::begin(kGeneric), std::end(kGeneric), picked) == std::end(kGeneric)) return nullptr;
  const CpuFeatures& f = cpu_features();
  if (f.avx512_bf16 && f.avx512bw && f.avx512vl) return "Cooperlake";
  if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) return "SkylakeX";
  if (f.avx2 && f.fma) return f.vendor == "AuthenticAMD" ? "Zen" : "Haswell";
  return nullptr;
}

std::string g_core_note = "OPENBLAS_CORETYPE/L2_SIZE unset: OpenBLAS's own pick";

void reexec() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t pos = 0; pos < raw.size();) {
    const size_t end = raw.find('\0', pos);
    args.push_back(raw.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  if (!args.empty()) execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "kiln bench: warning: re-exec for OPENBLAS_CORETYPE failed; OpenBLAS "
                       "keeps the core it picked at load time\n");
}

}  // namespace

std::string openblas_core_note() { return g_core_note; }

void reexec_without_openblas_env() {
  // Second pass, after kiln picked a core: keep it (the variable is kiln's, not the user's).
  if (const char* picked = std::getenv("KILN_OPENBLAS_PICKED"); picked != nullptr) {
    g_core_note = fmt::format("picked by kiln: OpenBLAS took this CPU for {}", picked);
    unsetenv("KILN_OPENBLAS_PICKED");
    return;
  }
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("OPENBLAS_L2_SIZE")) {
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("OPENBLAS_L2_SIZE");
    return reexec();
  }
  const std::string own = openblas_core_name();
  if (const char* better = better_openblas_core(own)) {
    setenv("OPENBLAS_CORETYPE", better, 1);
    setenv("KILN_OPENBLAS_PICKED", own.c_str(), 1);
    reexec();
  }
}

}  // namespace kiln::bench
