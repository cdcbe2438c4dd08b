// The GPU execution model on paper: a specs table of the data-centre GPUs kiln targets, the
// occupancy calculator (with the hardware's allocation granularities), waves and the tail effect
// of a grid, Little's law for HBM, warp coalescing and shared-memory bank conflicts, and the
// parser of ptxas / cuobjdump resource usage that `kiln info --cuda` joins with the CUDA
// backend's launches. Arithmetic only: no GPU and no CUDA runtime needed.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/kernels/cuda_catalog.h"

namespace kiln::perf {

constexpr int kWarpSize = 32;

// Dense peaks in operations per second (a FMA counts 2); 0 where the GPU has no such path.
struct GpuPeaks {
  double fp32 = 0;  // CUDA cores, no tensor cores
  double tf32 = 0;  // tensor cores
  double bf16 = 0;  // tensor cores, bf16 and fp16 alike, fp32 accumulate
  double fp8 = 0;   // tensor cores (e4m3 / e5m2)
  double int8 = 0;  // tensor cores, int32 accumulate
};

// One GPU. Per-SM limits are the CUDA programming guide's "technical specifications per compute
// capability" table; bandwidth, L2, clock and peaks the vendor's datasheet or whitepaper.
struct GpuSpec {
  std::string_view name;           // "a100" | "h100" | "h200" | "b200" (the --gpu flag)
  std::string_view full_name;      // "A100 SXM4 80GB", ...
  int cc_major = 0, cc_minor = 0;  // compute capability, e.g. 9.0
  int num_sms = 0;
  int fp32_lanes_per_sm = 0;    // FP32 FMA units per SM (peaks.fp32 = SMs × lanes × 2 × clock)
  int registers_per_sm = 0;     // 32-bit registers
  int registers_per_block = 0;  // the most one block may hold
  int max_registers_per_thread = 0;
  int64_t smem_per_sm_bytes = 0;              // the largest carveout
  int64_t smem_per_block_bytes = 0;           // the most one block may use (opt-in past 48 KiB)
  int64_t smem_reserved_per_block_bytes = 0;  // the runtime's own, added to every block (cc >= 8.0)
  std::span<const int> smem_carveouts_kib;    // shared-memory sizes the L1 / shared split allows
  int max_threads_per_sm = 0, max_threads_per_block = 0, max_blocks_per_sm = 0;
  double hbm_bytes_per_s = 0;
  int64_t hbm_capacity_bytes = 0;
  int64_t l2_bytes = 0;
  double boost_clock_hz = 0;
  GpuPeaks peaks;
  std::string_view source;  // where the figures come from

  int max_warps_per_sm() const { return max_threads_per_sm / kWarpSize; }
  int arch_number() const { return cc_major * 10 + cc_minor; }  // 90 for sm_90
  std::string arch() const;                                     // "sm_90"
};

// The table: A100 SXM4 80GB, H100 SXM5, H200 SXM, B200.
std::span<const GpuSpec> gpu_specs();
// The row named `name` (a100 | h100 | h200 | b200), or InvalidArgument naming the known ones.
Expected<const GpuSpec*> find_gpu(std::string_view name);

// ---- Occupancy -----------------------------------------------------------------------------

// What one block of a kernel holds. registers_per_thread 0: unknown (no register limit applied).
struct BlockResources {
  int threads_per_block = 0;
  int registers_per_thread = 0;
  int64_t smem_per_block_bytes = 0;  // static + dynamic, as the kernel asks for it
};

// What bounds the blocks resident on one SM. Ties name the first of this order.
enum class OccupancyLimiter { kWarps, kRegisters, kSharedMemory, kBlocks };
// "warps" | "registers" | "smem" | "blocks"
std::string_view occupancy_limiter_name(OccupancyLimiter l);

struct Occupancy {
  int blocks_per_sm = 0;
  int warps_per_sm = 0;
  double fraction = 0;  // warps_per_sm / the SM's max warps
  OccupancyLimiter limiter = OccupancyLimiter::kWarps;
  // Each limit in blocks per SM (INT_MAX: no limit, e.g. registers unknown or no shared memory).
  int blocks_by_warps = 0, blocks_by_registers = 0, blocks_by_smem = 0, blocks_by_cap = 0;
  bool registers_known = true;
  int warps_per_block = 0;
  int registers_per_warp = 0;            // allocated: regs × 32 rounded up to 256
  int64_t smem_allocated_per_block = 0;  // (asked + reserved) rounded up to 128 bytes
  int smem_carveout_kib = 0;             // the smallest carveout holding blocks_per_sm blocks
};

// Resident blocks and warps per SM, the way cudaOccupancyMaxActiveBlocksPerMultiprocessor counts
// them on compute capability 8.0 - 10.0:
//  * warps: ceil(threads / 32) per block against the SM's max warps;
//  * registers: allocated per warp, regs × 32 rounded up to 256; the register file is split over
//    4 sub-partitions (SM quarters) and a warp lives in one, so warps per SM =
//    4 × floor((regs per SM / 4) / regs per warp);
//  * shared memory: (asked + the 1 KiB the runtime reserves per block) rounded up to 128 bytes,
//    against the SM's largest carveout (what the occupancy API assumes with no carveout
//    preference); smem_carveout_kib then says which carveout the driver can pick: the smallest
//    that still holds that many blocks (the rest of the unified L1 / shared array stays L1);
//  * the cap on blocks per SM.
// InvalidArgument when no block can launch at all: threads outside 1..1024, registers past 255,
// a block's registers past the per-block file (rounded to 4 warps, as the hardware checks), or
// shared memory past the per-block maximum.
Expected<Occupancy> occupancy(const GpuSpec& gpu, const BlockResources& block);

// ---- Waves and the tail effect -------------------------------------------------------------

struct Waves {
  int64_t blocks = 0;
  int64_t blocks_per_wave = 0;  // SMs × blocks per SM
  int64_t num_waves = 0;        // ceil(blocks / blocks_per_wave)
  int64_t last_wave_blocks = 0;
  double last_wave_efficiency = 0;  // last_wave_blocks / blocks_per_wave
  double efficiency = 0;            // blocks / (num_waves × blocks_per_wave): SM time doing work
};
// Every block is assumed to take the same time. blocks_per_sm 0 (cannot launch): all zero.
Waves waves(int64_t grid_blocks, int num_sms, int blocks_per_sm);

// ---- Little's law --------------------------------------------------------------------------

// bytes in flight = bandwidth × latency, to keep HBM busy.
struct LittlesLaw {
  double latency_s = 0;
  double bytes_in_flight = 0;  // whole GPU
  double bytes_in_flight_per_sm = 0;
  double bytes_per_warp = 0;         // what one warp keeps in flight (given)
  double warps_per_sm = 0;           // bytes_in_flight_per_sm / bytes_per_warp
  double fraction_of_max_warps = 0;  // warps_per_sm / the SM's max warps (> 1: cannot be reached)
};
LittlesLaw littles_law(const GpuSpec& gpu, double latency_s, double bytes_per_warp);

// The load latency `kiln info --cuda` assumes: 600 ns. Pointer-chasing microbenchmarks of A100 and
// H100 (e.g. Chips and Cheese, Jia et al.'s "Dissecting" papers) put an idle HBM load near
// 450-550 ns; under load queueing adds to it, so 600 ns is a round figure on the high side, not
// something kiln measured.
constexpr double kAssumedHbmLatencyS = 600e-9;

// ---- Coalescing ----------------------------------------------------------------------------

constexpr int kSectorBytes = 32;

struct Coalescing {
  int sectors = 0;           // distinct 32-byte sectors the warp touches
  int64_t useful_bytes = 0;  // distinct bytes the threads ask for
  int64_t sector_bytes = 0;  // sectors × 32: what the memory system moves
  double efficiency = 0;     // useful / sector bytes
};
// One warp-wide global access: the active lanes' byte addresses (at most 32) and each lane's
// access size in bytes (1, 2, 4, 8 or 16). An access straddling a sector boundary touches both.
Coalescing coalescing(std::span<const uint64_t> addresses, int access_bytes);

// ---- Shared-memory bank conflicts ----------------------------------------------------------

constexpr int kNumBanks = 32;
constexpr int kBankWordBytes = 4;

struct BankConflicts {
  int degree = 0;  // max over phases of the distinct 4-byte words in one bank (1: conflict-free)
  int wavefronts = 0;  // shared-memory cycles the warp's access takes (sum over phases)
};
// One warp-wide shared-memory access: the active lanes' byte addresses and the access width
// (1, 2, 4, 8 or 16 bytes). Bank = (address / 4) mod 32; lanes reading the same word are served by
// one broadcast. 8-byte accesses run as 2 phases of 16 lanes and 16-byte ones as 4 phases of 8
// (each phase moves at most 128 bytes), so a float4 stride-1 read is conflict-free in 4 wavefronts.
BankConflicts bank_conflicts(std::span<const uint64_t> addresses, int access_bytes);

// ---- ptxas / cuobjdump resource usage ------------------------------------------------------

// One kernel on one arch, as the CUDA toolchain reported it.
struct KernelResourceUsage {
  std::string mangled;  // the symbol, e.g. "_Z10gemm_naivePKfS0_Pfiii"
  std::string name;     // ptxas_kernel_name(mangled)
  std::string arch;     // "sm_90"
  int registers = 0;
  int64_t smem_bytes = 0;                    // static shared memory
  int64_t stack_bytes = 0;                   // ptxas: stack frame; cuobjdump: STACK
  std::optional<int64_t> local_bytes;        // cuobjdump LOCAL
  std::optional<int64_t> spill_store_bytes;  // ptxas only
  std::optional<int64_t> spill_load_bytes;   // ptxas only
  std::optional<int64_t> cmem0_bytes;        // constant bank 0 (kernel parameters), where printed
  std::optional<int> barriers;               // named barriers (ptxas, recent versions)
};

// `nvcc -Xptxas -v` / `nvcc --resource-usage` stderr: per entry function a "Compiling entry
// function 'SYM' for 'sm_XX'" line, "Function properties for SYM" with the stack frame and spills,
// and "Used N registers, ..." with smem / cmem / stack. Lines it does not know are skipped; an
// entry without a "Used" line is dropped.
std::vector<KernelResourceUsage> parse_ptxas_output(std::string_view text);
// `cuobjdump --dump-resource-usage FILE`: per "Fatbin elf code" section an "arch = sm_XX" line
// and per kernel "Function SYM:" followed by "REG:N STACK:N SHARED:N LOCAL:N CONSTANT[0]:N ...".
// Note: for sm_90 and later its SHARED of a kernel that uses shared memory includes 1 KiB more
// than ptxas's smem figure (seen with CUDA 13: 8192 in ptxas, 9216 in cuobjdump).
std::vector<KernelResourceUsage> parse_cuobjdump_resource_usage(std::string_view text);
// Either format (cuobjdump's when the text has "Resource usage:" or "Fatbin elf code").
std::vector<KernelResourceUsage> parse_resource_usage(std::string_view text);

// A kernel symbol as the launch catalog names it: demangled, without return type and parameter
// list. "_Z10gemm_naivePKfS0_Pfiii" -> "gemm_naive"; a symbol that does not demangle (extern "C")
// is returned as it is.
std::string ptxas_kernel_name(std::string_view mangled);

// ---- Launches explained --------------------------------------------------------------------

// One launch with what the toolchain said about its kernel and what the model makes of it.
struct LaunchRow {
  cuda::KernelLaunch launch;
  std::optional<KernelResourceUsage> usage;  // the entry for the launch's kernel and the arch used
  std::string arch_used;                     // "" when no entry matched
  int64_t smem_per_block_bytes = 0;          // static (when known) + dynamic
  std::optional<Occupancy> occupancy;        // none when the launch cannot fit (see error)
  std::string error;
  Waves waves;
};

struct LaunchReport {
  std::string target_arch;  // the GPU's own, e.g. "sm_90"
  std::vector<LaunchRow> rows;
  std::vector<std::string> notes;  // arch fallbacks, kernels with no entry
};

// Join every launch with the usage entry of the same kernel name on the GPU's arch (or the
// nearest lower arch present for that kernel, noted), and run occupancy and waves. Without an
// entry the registers are unknown: occupancy without the register limit.
LaunchReport explain_launches(const GpuSpec& gpu, std::span<const cuda::KernelLaunch> launches,
                              std::span<const KernelResourceUsage> usage);

// The report as `kiln info --cuda` prints it: a header line, one row per launch (family, variant,
// grid, threads, registers, static+dynamic shared memory, spills, blocks and warps per SM,
// occupancy, limiter, waves, last-wave efficiency; "?" for unknown registers and "*" after an
// occupancy computed without them), then the notes.
std::string format_launch_report(const LaunchReport& r);

}  // namespace kiln::perf
