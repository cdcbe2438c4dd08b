// `kiln info`: the build, the CPU features detected, each kernel family's SIMD path, threads.
#include <fmt/format.h>

#include "apps/kiln/commands.h"
#include "kiln/core/allocator.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/registry.h"

namespace kiln::app {
namespace {

const char* yes_no(bool b) { return b ? "yes" : "no"; }

void run_info() {
  const CpuFeatures& f = cpu_features();
  fmt::print("kiln {}\n", "0.1.0");
  fmt::print("build      : {} , {} {}, C++{}\n", KILN_BUILD_TYPE,
#if defined(__clang__)
             "clang", __clang_version__,
#else
             "g++", __VERSION__,
#endif
             __cplusplus / 100 % 100);
  fmt::print("cpu        : {} ({}), {} logical CPUs\n", f.brand, f.vendor, f.num_logical_cpus);
  fmt::print("caches     : L1d {} KiB, L2 {} KiB, L3 {} KiB\n", f.l1d_bytes >> 10, f.l2_bytes >> 10,
             f.l3_bytes >> 10);
  fmt::print("features   : AVX2 {}  FMA {}  F16C {}  AVX-512F {}  AVX-512BW {}  AVX-512VL {}  "
             "AVX-512DQ {}\n",
             yes_no(f.avx2), yes_no(f.fma), yes_no(f.f16c), yes_no(f.avx512f), yes_no(f.avx512bw),
             yes_no(f.avx512vl), yes_no(f.avx512dq));
  fmt::print("             AVX512_BF16 {}  AVX512_VNNI {}  AVX512_FP16 {}  AVX-VNNI {}  AMX {}\n",
             yes_no(f.avx512_bf16), yes_no(f.avx512_vnni), yes_no(f.avx512_fp16), yes_no(f.avx_vnni),
             yes_no(f.amx_tile));
  fmt::print("simd       : best {}, active {}\n", simd_target_name(best_simd_target()),
             simd_target_name(active_simd_target()));
  fmt::print("threads    : {}\n", num_threads());
  fmt::print("kernels    :\n");
  for (const KernelPath& k : kernel_paths()) fmt::print("  {:<22} {}\n", k.family, k.path);
}

}  // namespace

void register_info(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("info", "Print the build, CPU features, SIMD paths and threads");
  cmd->callback([] { run_info(); });
}

}  // namespace kiln::app
