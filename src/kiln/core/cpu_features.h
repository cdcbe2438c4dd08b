// What this CPU can do (CPUID + XGETBV) and the SIMD target each kernel family runs on.
// Kernels are compiled once per target (file suffix _avx2.cpp / _avx512.cpp) and picked here
// at run time; KILN_SIMD=scalar|avx2|avx512 forces a lower target (tests use it to cover all).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "kiln/core/status.h"

namespace kiln {

struct CpuFeatures {
  std::string vendor, brand;
  bool sse42 = false, avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_vnni = false, avx512_fp16 = false, avx_vnni = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  int l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;  // per core (L1, L2) and shared (L3)
  int l1d_ways = 8, l2_ways = 8;                   // associativity (CPUID; 8 where it is not reported)
  int num_logical_cpus = 1;
};

const CpuFeatures& cpu_features();

// One row per SIMD target, ordered weakest to strongest.
enum class SimdTarget { kScalar, kAvx2, kAvx512, kCount };

struct SimdTargetInfo {
  SimdTarget target;
  std::string_view name;
  int f32_lanes;
};
inline constexpr SimdTargetInfo kSimdTargets[] = {
    {SimdTarget::kScalar, "scalar", 1},
    {SimdTarget::kAvx2, "avx2", 8},
    {SimdTarget::kAvx512, "avx512", 16},
};
static_assert(std::size(kSimdTargets) == static_cast<size_t>(SimdTarget::kCount));

std::string_view simd_target_name(SimdTarget t);
// The strongest target this CPU supports (AVX-512 requires F+BW+VL+DQ; AVX2 requires FMA+F16C).
SimdTarget best_simd_target();
// KILN_SIMD: nullopt when unset; InvalidArgument when it names no target or one this CPU cannot
// run (validate_environment() in env.h reports it; the library then warns and uses the best).
Expected<std::optional<SimdTarget>> simd_target_from_env();
// The target kernels use now: best_simd_target(), or KILN_SIMD, or set_simd_target().
SimdTarget active_simd_target();
// Returns false (and changes nothing) when the CPU cannot run `t`.
bool set_simd_target(SimdTarget t);
bool simd_target_supported(SimdTarget t);

// AVX512_BF16 dot products (vdpbf16ps) available and allowed by the active target.
bool bf16_dot_available();

}  // namespace kiln
