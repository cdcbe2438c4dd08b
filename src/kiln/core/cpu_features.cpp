// CPUID / XGETBV probing and the run-time SIMD target choice.
#include "kiln/core/cpu_features.h"

#include <cpuid.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace kiln {
namespace {

void cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
  __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
}

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

int sysconf_or(int name, int fallback) {
  long v = sysconf(name);
  return v > 0 ? static_cast<int>(v) : fallback;
}

CpuFeatures probe() {
  CpuFeatures f;
  unsigned r[4];
  cpuid(0, 0, r);
  const unsigned max_leaf = r[0];
  char vendor[13] = {};
  std::memcpy(vendor, &r[1], 4);
  std::memcpy(vendor + 4, &r[3], 4);
  std::memcpy(vendor + 8, &r[2], 4);
  f.vendor = vendor;

  cpuid(0x80000000u, 0, r);
  if (r[0] >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      cpuid(0x80000002u + i, 0, r);
      std::memcpy(brand + 16 * i, r, 16);
    }
    f.brand = brand;
    while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
  }

  cpuid(1, 0, r);
  const bool osxsave = (r[2] >> 27) & 1;
  f.sse42 = (r[2] >> 20) & 1;
  f.fma = (r[2] >> 12) & 1;
  f.f16c = (r[2] >> 29) & 1;
  const bool avx_hw = (r[2] >> 28) & 1;
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool os_ymm = (xcr0 & 0x6) == 0x6;
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;
  f.avx = avx_hw && os_ymm;
  if (!f.avx) f.fma = f.f16c = false;

  if (max_leaf >= 7) {
    cpuid(7, 0, r);
    f.avx2 = f.avx && ((r[1] >> 5) & 1);
    f.avx512f = os_zmm && ((r[1] >> 16) & 1);
    f.avx512dq = f.avx512f && ((r[1] >> 17) & 1);
    f.avx512bw = f.avx512f && ((r[1] >> 30) & 1);
    f.avx512vl = f.avx512f && ((r[1] >> 31) & 1);
    f.avx512_vnni = f.avx512f && ((r[2] >> 11) & 1);
    f.avx512_fp16 = f.avx512f && ((r[3] >> 23) & 1);
    f.amx_bf16 = os_amx && ((r[3] >> 22) & 1);
    f.amx_tile = os_amx && ((r[3] >> 24) & 1);
    f.amx_int8 = os_amx && ((r[3] >> 25) & 1);
    cpuid(7, 1, r);
    f.avx_vnni = f.avx && ((r[0] >> 4) & 1);
    f.avx512_bf16 = f.avx512f && ((r[0] >> 5) & 1);
  }

  f.num_logical_cpus = sysconf_or(_SC_NPROCESSORS_ONLN, 1);
  f.l1d_bytes = sysconf_or(_SC_LEVEL1_DCACHE_SIZE, 32 << 10);
  f.l2_bytes = sysconf_or(_SC_LEVEL2_CACHE_SIZE, 1 << 20);
  f.l3_bytes = sysconf_or(_SC_LEVEL3_CACHE_SIZE, 8 << 20);
  // Deterministic cache parameters (leaf 4 on Intel, 0x8000001D on AMD) are more reliable
  // than sysconf in VMs: size = ways * partitions * line * sets.
  const bool amd = f.vendor == "AuthenticAMD";
  cpuid(amd ? 0x80000000u : 0u, 0, r);
  const unsigned leaf = amd ? 0x8000001Du : 4u;
  if (r[0] >= leaf) {
    for (unsigned sub = 0; sub < 8; ++sub) {
      cpuid(leaf, sub, r);
      const unsigned type = r[0] & 0x1f, level = (r[0] >> 5) & 0x7;
      if (type == 0) break;
      if (type == 2) continue;  // instruction cache
      const int bytes = static_cast<int>(((r[1] >> 22) + 1) * (((r[1] >> 12) & 0x3ff) + 1) *
                                         ((r[1] & 0xfff) + 1) * (r[2] + 1));
      const int ways = static_cast<int>((r[1] >> 22) + 1);
      if (level == 1) f.l1d_bytes = bytes, f.l1d_ways = ways;
      if (level == 2) f.l2_bytes = bytes, f.l2_ways = ways;
      if (level == 3) f.l3_bytes = bytes;
    }
  }
  return f;
}

std::atomic<int> g_target{-1};

SimdTarget initial_target() {
  auto env = simd_target_from_env();
  if (!env.ok()) {  // `kiln` refuses this before any kernel runs; other programs get a warning
    std::fprintf(stderr, "kiln: warning: %s; using %s\n", env.status().message().c_str(),
                 std::string(simd_target_name(best_simd_target())).c_str());
    return best_simd_target();
  }
  return env->value_or(best_simd_target());
}

}  // namespace

Expected<std::optional<SimdTarget>> simd_target_from_env() {
  const char* env = std::getenv("KILN_SIMD");
  if (env == nullptr || *env == '\0') return std::optional<SimdTarget>{};
  for (const auto& info : kSimdTargets) {
    if (info.name != env) continue;
    if (!simd_target_supported(info.target))
      return invalid_argument("KILN_SIMD={}: this CPU does not support it (best: {})", env,
                              simd_target_name(best_simd_target()));
    return std::optional<SimdTarget>{info.target};
  }
  return invalid_argument("KILN_SIMD='{}': expected scalar, avx2 or avx512", env);
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = probe();
  return f;
}

std::string_view simd_target_name(SimdTarget t) {
  return kSimdTargets[static_cast<int>(t)].name;
}

bool simd_target_supported(SimdTarget t) {
  const CpuFeatures& f = cpu_features();
  switch (t) {
    case SimdTarget::kScalar: return true;
    case SimdTarget::kAvx2: return f.avx2 && f.fma && f.f16c;
    case SimdTarget::kAvx512:
      return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma && f.f16c;
    case SimdTarget::kCount: break;
  }
  return false;
}

SimdTarget best_simd_target() {
  if (simd_target_supported(SimdTarget::kAvx512)) return SimdTarget::kAvx512;
  if (simd_target_supported(SimdTarget::kAvx2)) return SimdTarget::kAvx2;
  return SimdTarget::kScalar;
}

SimdTarget active_simd_target() {
  int t = g_target.load(std::memory_order_relaxed);
  if (t < 0) {
    t = static_cast<int>(initial_target());
    g_target.store(t, std::memory_order_relaxed);
  }
  return static_cast<SimdTarget>(t);
}

bool set_simd_target(SimdTarget t) {
  if (!simd_target_supported(t)) return false;
  g_target.store(static_cast<int>(t), std::memory_order_relaxed);
  return true;
}

bool bf16_dot_available() {
  return active_simd_target() == SimdTarget::kAvx512 && cpu_features().avx512_bf16;
}

}  // namespace kiln
