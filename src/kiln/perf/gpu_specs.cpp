// The GPU specs table of gpu_model.h: one row per GPU, each with the documents its figures come
// from, and compile-time checks that the rows agree with themselves (shared memory per block plus
// the runtime's reserve is the SM's largest carveout; the fp32 peak is SMs × lanes × 2 × clock).
#include <fmt/format.h>

#include <array>

#include "kiln/perf/gpu_model.h"

namespace kiln::perf {
namespace {

constexpr int64_t kKiB = 1024, kMiB = 1024 * 1024;
constexpr int64_t kGB = 1000 * 1000 * 1000;

// Shared-memory capacities (KiB) the L1 / shared split allows: CUDA programming guide, "Shared
// Memory" of compute capabilities 8.x, 9.0 and 10.0
// (cudaFuncAttributePreferredSharedMemoryCarveout).
constexpr std::array<int, 8> kCarveoutsSm80 = {0, 8, 16, 32, 64, 100, 132, 164};
constexpr std::array<int, 10> kCarveoutsSm90 = {0, 8, 16, 32, 64, 100, 132, 164, 196, 228};

// The limits per SM every row shares (compute capability 8.0, 9.0 and 10.0 alike): 64 K 32-bit
// registers per SM and per block, 255 per thread, 2048 threads and 32 blocks per SM, 1024 threads
// per block, 1 KiB of shared memory reserved per block.
constexpr GpuSpec with_common_limits(GpuSpec s) {
  s.registers_per_sm = 65536;
  s.registers_per_block = 65536;
  s.max_registers_per_thread = 255;
  s.max_threads_per_sm = 2048;
  s.max_threads_per_block = 1024;
  s.max_blocks_per_sm = 32;
  s.smem_reserved_per_block_bytes = 1 * kKiB;
  return s;
}

constexpr GpuSpec a100() {
  GpuSpec s;
  s.name = "a100", s.full_name = "A100 SXM4 80GB", s.cc_major = 8, s.cc_minor = 0;
  s.num_sms = 108, s.fp32_lanes_per_sm = 64;
  s.smem_per_sm_bytes = 164 * kKiB, s.smem_per_block_bytes = 163 * kKiB;
  s.smem_carveouts_kib = kCarveoutsSm80;
  s.hbm_bytes_per_s = 2039e9, s.hbm_capacity_bytes = 80 * kGB, s.l2_bytes = 40 * kMiB;
  s.boost_clock_hz = 1410e6;
  s.peaks = {19.5e12, 156e12, 312e12, 0, 624e12};
  s.source =
      "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB: 2,039 GB/s; dense TF32 156, "
      "BF16/FP16 312, INT8 624 T; no FP8) and NVIDIA A100 architecture whitepaper (108 SMs, "
      "64 FP32 lanes/SM, 40 MB L2, 1410 MHz boost); CUDA C++ Programming Guide, technical "
      "specifications, cc 8.0";
  return with_common_limits(s);
}

constexpr GpuSpec h100() {
  GpuSpec s;
  s.name = "h100", s.full_name = "H100 SXM5 80GB", s.cc_major = 9, s.cc_minor = 0;
  s.num_sms = 132, s.fp32_lanes_per_sm = 128;
  s.smem_per_sm_bytes = 228 * kKiB, s.smem_per_block_bytes = 227 * kKiB;
  s.smem_carveouts_kib = kCarveoutsSm90;
  s.hbm_bytes_per_s = 3.35e12, s.hbm_capacity_bytes = 80 * kGB, s.l2_bytes = 50 * kMiB;
  s.boost_clock_hz = 1980e6;
  s.peaks = {67e12, 494.7e12, 989.4e12, 1978.9e12, 1978.9e12};
  s.source =
      "NVIDIA H100 Tensor Core GPU datasheet (SXM: 3.35 TB/s; FP32 67 T; tensor figures given "
      "with 2:4 sparsity, halved here: TF32 989, BF16 1979, FP8 3958, INT8 3958) and NVIDIA "
      "H100 (Hopper) architecture whitepaper (132 SMs, 128 FP32 lanes/SM, 50 MB L2); CUDA C++ "
      "Programming Guide, technical specifications, cc 9.0";
  return with_common_limits(s);
}

constexpr GpuSpec h200() {
  GpuSpec s = h100();
  s.name = "h200", s.full_name = "H200 SXM 141GB";
  s.hbm_bytes_per_s = 4.8e12, s.hbm_capacity_bytes = 141 * kGB;
  s.source =
      "NVIDIA H200 Tensor Core GPU datasheet (SXM: 141 GB HBM3e at 4.8 TB/s; the H100 SXM's "
      "compute figures: FP32 67 T, sparse TF32 989, BF16 1979, FP8 3958, INT8 3958, halved "
      "here); the same GH100 chip as H100 (132 SMs, 50 MB L2); CUDA C++ Programming Guide, "
      "technical specifications, cc 9.0";
  return s;
}

constexpr GpuSpec b200() {
  GpuSpec s;
  s.name = "b200", s.full_name = "B200 180GB", s.cc_major = 10, s.cc_minor = 0;
  s.num_sms = 148, s.fp32_lanes_per_sm = 128;
  s.smem_per_sm_bytes = 228 * kKiB, s.smem_per_block_bytes = 227 * kKiB;
  s.smem_carveouts_kib = kCarveoutsSm90;
  s.hbm_bytes_per_s = 8e12, s.hbm_capacity_bytes = 180 * kGB, s.l2_bytes = 126 * kMiB;
  s.boost_clock_hz = 1980e6;
  s.peaks = {75e12, 1125e12, 2250e12, 4500e12, 4500e12};
  s.source =
      "NVIDIA HGX B200 datasheet, one of its 8 GPUs (1.4 TB HBM3e in all, 8 TB/s per GPU; "
      "FP32 600 T, sparse TF32 18, BF16 36, FP8 72 P, INT8 72 POPS per 8 GPUs: divided by 8, "
      "halved for dense); 148 SMs and 1980 MHz boost from NVIDIA's Blackwell material; L2 126 "
      "MB is what CUDA's device properties report (no datasheet figure); CUDA C++ Programming "
      "Guide, technical specifications, cc 10.0";
  return with_common_limits(s);
}

constexpr std::array<GpuSpec, 4> kGpus = {a100(), h100(), h200(), b200()};

constexpr double relative_gap(double a, double b) {
  return (a > b ? a - b : b - a) / b;
}
constexpr bool rows_agree() {
  for (const GpuSpec& g : kGpus) {
    if (g.smem_per_block_bytes + g.smem_reserved_per_block_bytes != g.smem_per_sm_bytes)
      return false;
    if (g.smem_carveouts_kib.back() * kKiB != g.smem_per_sm_bytes) return false;
    const double fp32 = 2.0 * g.num_sms * g.fp32_lanes_per_sm * g.boost_clock_hz;
    if (relative_gap(fp32, g.peaks.fp32) > 0.01) return false;
    if (g.max_threads_per_sm % kWarpSize != 0) return false;
  }
  return true;
}
static_assert(rows_agree(), "a GPU row contradicts itself (see rows_agree)");

}  // namespace

std::string GpuSpec::arch() const {
  return fmt::format("sm_{}", arch_number());
}

std::span<const GpuSpec> gpu_specs() {
  return kGpus;
}

Expected<const GpuSpec*> find_gpu(std::string_view name) {
  std::string known;
  for (const GpuSpec& g : kGpus) {
    if (g.name == name) return &g;
    known += known.empty() ? "" : ", ";
    known += g.name;
  }
  return invalid_argument("unknown GPU '{}' (known: {})", name, known);
}

}  // namespace kiln::perf
