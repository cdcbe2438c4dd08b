// The GPU execution model (perf/gpu_model.h) against hand-derived figures: the occupancy cases of
// NVIDIA's CUDA Best Practices Guide and calculator rules, waves and the tail effect, Little's law,
// coalescing and bank-conflict patterns, and the resource-usage parsers on real ptxas and cuobjdump
// output (CUDA 13.0 nvcc, cuobjdump 13.1, compiled here for sm_80 / sm_90 without a GPU).
#include <gtest/gtest.h>

#include <climits>
#include <tuple>
#include <vector>

#include "kiln/perf/gpu_model.h"

namespace kiln::perf {
namespace {

const GpuSpec& gpu(std::string_view name) {
  return *find_gpu(name).value();
}

Occupancy occ(std::string_view g, int threads, int regs, int64_t smem) {
  return occupancy(gpu(g), {threads, regs, smem}).value();
}

// Blocks and warps per SM, occupancy (the cases' fractions are exact in binary) and limiter.
using Summary = std::tuple<int, int, double, OccupancyLimiter>;
Summary summary(const Occupancy& o) {
  return {o.blocks_per_sm, o.warps_per_sm, o.fraction, o.limiter};
}
constexpr OccupancyLimiter kByWarps = OccupancyLimiter::kWarps,
                           kByRegs = OccupancyLimiter::kRegisters,
                           kBySmem = OccupancyLimiter::kSharedMemory,
                           kByCap = OccupancyLimiter::kBlocks;

// ---- Specs ---------------------------------------------------------------------------------

TEST(GpuSpecs, TableHasTheFourGpusEachWithASource) {
  std::vector<std::string_view> names;
  for (const GpuSpec& g : gpu_specs()) {
    names.push_back(g.name);
    EXPECT_FALSE(g.source.empty()) << g.name;
    EXPECT_GT(g.hbm_bytes_per_s, 0) << g.name;
    EXPECT_GE(g.peaks.bf16, g.peaks.tf32) << g.name;
  }
  EXPECT_EQ(names, (std::vector<std::string_view>{"a100", "h100", "h200", "b200"}));
  EXPECT_EQ(gpu("a100").arch(), "sm_80");
  EXPECT_EQ(gpu("h200").arch(), "sm_90");
  EXPECT_EQ(gpu("b200").arch(), "sm_100");
  EXPECT_EQ(gpu("a100").peaks.fp8, 0);  // Ampere has no FP8 tensor cores
  const Expected<const GpuSpec*> bad = find_gpu("v100");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("a100, h100, h200, b200"), std::string::npos);
}

TEST(GpuSpecs, TensorPeakFollowsFromSmsAndClock) {
  // A100: 4 tensor cores per SM × 256 dense FP16 FMA per clock = 1024 FMA/clk/SM (whitepaper):
  // 108 × 1024 × 2 × 1.41 GHz = 311.9 TFLOP/s, the datasheet's 312.
  const GpuSpec& a = gpu("a100");
  EXPECT_NEAR(a.num_sms * 1024.0 * 2 * a.boost_clock_hz, a.peaks.bf16, 0.001 * a.peaks.bf16);
  // H100 and H200 are one chip with different memory.
  EXPECT_EQ(gpu("h100").num_sms, gpu("h200").num_sms);
  EXPECT_EQ(gpu("h100").peaks.bf16, gpu("h200").peaks.bf16);
  EXPECT_GT(gpu("h200").hbm_bytes_per_s, gpu("h100").hbm_bytes_per_s);
}

// ---- Occupancy: NVIDIA's documented cases, derived by hand ---------------------------------

TEST(GpuOccupancy, BestPracticesGuide37RegistersAt128And320Threads) {
  // CUDA C++ Best Practices Guide, "Calculating Occupancy" (cc 7.0; 8.0 - 10.0 have the same 64 K
  // registers and 64 warps per SM): 37 registers with 128-thread blocks give 75% with 12 blocks,
  // with 320-thread blocks 63% with 4 blocks. By hand: 37 × 32 = 1184 registers per warp, rounded
  // up to 256 → 1280; a sub-partition's 16384 hold floor(16384 / 1280) = 12 warps, 48 per SM.
  // 128 threads = 4 warps → 12 blocks, 48 / 64 warps = 75%; 320 threads = 10 warps → 4 blocks,
  // 40 / 64 = 62.5%.
  for (const std::string_view g : {"a100", "h100", "b200"}) {
    const Occupancy a = occ(g, 128, 37, 0);
    EXPECT_EQ(a.registers_per_warp, 1280);
    EXPECT_EQ(summary(a), Summary(12, 48, 0.75, kByRegs)) << g;
    EXPECT_EQ(summary(occ(g, 320, 37, 0)), Summary(4, 40, 0.625, kByRegs)) << g;
  }
}

TEST(GpuOccupancy, FullOccupancyNeeds32RegistersOrFewer) {
  // Best Practices Guide: with 65,536 registers and 2048 threads per SM, 100% occupancy allows at
  // most 32 registers per thread. 32: 1024 per warp, 16 warps per sub-partition, 64 per SM — the
  // warp limit too (a tie: warps named first). 33: 1056 → 1280 per warp, 12 per sub-partition,
  // 48 warps = 6 blocks of 256 threads, 75%.
  const Occupancy full = occ("h100", 256, 32, 0);
  EXPECT_EQ(summary(full), Summary(8, 64, 1.0, kByWarps));
  EXPECT_EQ(full.blocks_by_registers, 8);
  const Occupancy one_more = occ("h100", 256, 33, 0);
  EXPECT_EQ(one_more.registers_per_warp, 1280);
  EXPECT_EQ(summary(one_more), Summary(6, 48, 0.75, kByRegs));
}

TEST(GpuOccupancy, RegistersLiveInSubPartitions) {
  // 96 registers: 3072 per warp. A quarter SM's 16384 hold 5 such warps (5.33), so 20 per SM,
  // not floor(65536 / 3072) = 21. 32-thread blocks: 20 blocks (the cap is 32).
  const Occupancy o = occ("a100", 32, 96, 0);
  EXPECT_EQ(o.blocks_by_registers, 20);
  EXPECT_EQ(summary(o), Summary(20, 20, 20.0 / 64, kByRegs));
  // 255 registers (the most): 8160 → 8192 per warp, 2 per sub-partition, 8 warps per SM.
  EXPECT_EQ(occ("h100", 256, 255, 0).blocks_per_sm, 1);
  EXPECT_EQ(occ("h100", 64, 255, 0).warps_per_sm, 8);
  // 1024 threads × 64 registers = 65536: exactly one block, 32 warps.
  EXPECT_EQ(summary(occ("h100", 1024, 64, 0)), Summary(1, 32, 0.5, kByRegs));
}

TEST(GpuOccupancy, LaunchesThatCannotFitAreErrors) {
  // 1024 threads × 255 registers: 32 warps × 8192 = 262144 registers > 65536 per block.
  const auto too_many = occupancy(gpu("h100"), {1024, 255, 0});
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("too many resources"), std::string::npos);
  // 288 threads (9 warps) × 224 registers = 9 × 7168 = 64512 fits 65536, but the hardware check
  // rounds the block to 12 warps (whole rows of the 4 sub-partitions): 86016 > 65536.
  EXPECT_FALSE(occupancy(gpu("h100"), {288, 224, 0}).ok());
  EXPECT_TRUE(occupancy(gpu("h100"), {256, 224, 0}).ok());  // 8 warps × 7168 = 57344
  EXPECT_FALSE(occupancy(gpu("h100"), {1025, 32, 0}).ok());
  EXPECT_FALSE(occupancy(gpu("h100"), {0, 32, 0}).ok());
  EXPECT_FALSE(occupancy(gpu("h100"), {128, 256, 0}).ok());
  // Shared memory per block: 227 KiB on H100 (163 KiB on A100), opt-in.
  EXPECT_TRUE(occupancy(gpu("h100"), {128, 32, 227 * 1024}).ok());
  EXPECT_FALSE(occupancy(gpu("h100"), {128, 32, 227 * 1024 + 1}).ok());
  EXPECT_FALSE(occupancy(gpu("a100"), {128, 32, 164 * 1024}).ok());
}

TEST(GpuOccupancy, SharedMemoryReserveGranularityAndCarveout) {
  // 48 KiB per block, 128 threads, 32 registers on H100: 49152 + 1024 reserved = 50176 (a multiple
  // of 128); 228 KiB = 233472 / 50176 = 4.65 → 4 blocks, 16 warps (25%). Warps and registers allow
  // 16 blocks. Four blocks take 200704 bytes = 196 KiB exactly: the 196 KiB carveout.
  const Occupancy h = occ("h100", 128, 32, 48 * 1024);
  EXPECT_EQ(h.smem_allocated_per_block, 50176);
  EXPECT_EQ(summary(h), Summary(4, 16, 0.25, kBySmem));
  EXPECT_EQ(h.smem_carveout_kib, 196);
  // A100: 164 KiB = 167936 / 50176 = 3.35 → 3 blocks; 150528 bytes = 147 KiB → the 164 carveout.
  const Occupancy a = occ("a100", 128, 32, 48 * 1024);
  EXPECT_EQ(a.blocks_per_sm, 3);
  EXPECT_EQ(a.smem_carveout_kib, 164);
  // 32329 bytes on H100, 64 threads: 32329 + 1024 = 33353 → rounded to 128: 33408; 233472 / 33408
  // = 6.99 → 6 blocks. Without the 128-byte rounding 233472 / 33353 = 7.0001 → 7; without the
  // 1 KiB reserve 32329 → 32384, 7.2 → 7. Six blocks take 200448 bytes → 196 KiB.
  const Occupancy g = occ("h100", 64, 32, 32329);
  EXPECT_EQ(g.smem_allocated_per_block, 33408);
  EXPECT_EQ(g.blocks_per_sm, 6);
  EXPECT_EQ(g.smem_carveout_kib, 196);
  // 100 bytes → 1124 → 1152 allocated.
  EXPECT_EQ(occ("a100", 256, 32, 100).smem_allocated_per_block, 1152);
  // The whole 227 KiB: one block, the largest carveout.
  const Occupancy max = occ("h100", 128, 32, 227 * 1024);
  EXPECT_EQ(max.blocks_per_sm, 1);
  EXPECT_EQ(max.smem_carveout_kib, 228);
}

TEST(GpuOccupancy, TheBlockCapAndTheCalculatorDefault) {
  // Programming guide's occupancy example style: 32-thread blocks, no shared memory. Warps allow
  // 64 blocks, the SM holds at most 32: 32 warps, 50%.
  EXPECT_EQ(summary(occ("a100", 32, 32, 0)), Summary(32, 32, 0.5, kByCap));
  // The occupancy calculator's default input (256 threads, 32 registers, 4096 bytes) on cc 8.0:
  // warps 64 / 8 = 8 blocks, registers 8, shared memory 167936 / 5120 = 32: 8 blocks, 100%.
  // 8 × 5120 = 40 KiB needed → the 64 KiB carveout.
  const Occupancy d = occ("a100", 256, 32, 4096);
  EXPECT_EQ(summary(d), Summary(8, 64, 1.0, kByWarps));
  EXPECT_EQ(d.blocks_by_smem, 32);
  EXPECT_EQ(d.smem_carveout_kib, 64);
  // Partial warps count whole: 33 threads are 2 warps.
  EXPECT_EQ(occ("a100", 33, 32, 0).warps_per_block, 2);
}

TEST(GpuOccupancy, UnknownRegistersLeaveOutTheRegisterLimit) {
  const Occupancy o = occ("h100", 256, 0, 0);
  EXPECT_FALSE(o.registers_known);
  EXPECT_EQ(o.blocks_by_registers, INT_MAX);
  EXPECT_EQ(o.blocks_per_sm, 8);
  EXPECT_EQ(o.limiter, OccupancyLimiter::kWarps);
}

// ---- Waves ---------------------------------------------------------------------------------

TEST(GpuWaves, TailEffectOfAGrid) {
  // 4096² GEMM in 128×128 tiles = 1024 blocks on H100, 1 block per SM: 132 per wave, 8 waves
  // (7.76), the last with 1024 − 7 × 132 = 100 blocks: 100/132 = 75.8% busy; overall
  // 1024 / (8 × 132) = 97.0%.
  const Waves w = waves(1024, 132, 1);
  EXPECT_EQ(w.blocks_per_wave, 132);
  EXPECT_EQ(w.num_waves, 8);
  EXPECT_EQ(w.last_wave_blocks, 100);
  EXPECT_DOUBLE_EQ(w.last_wave_efficiency, 100.0 / 132);
  EXPECT_DOUBLE_EQ(w.efficiency, 1024.0 / 1056);
  // One block past a full wave: the second wave does 1/264 of the work in half the time.
  const Waves tail = waves(265, 132, 2);
  EXPECT_EQ(tail.num_waves, 2);
  EXPECT_EQ(tail.last_wave_blocks, 1);
  EXPECT_DOUBLE_EQ(tail.efficiency, 265.0 / 528);
  // Exactly full waves.
  const Waves full = waves(264, 132, 2);
  EXPECT_EQ(full.num_waves, 1);
  EXPECT_DOUBLE_EQ(full.last_wave_efficiency, 1.0);
  EXPECT_DOUBLE_EQ(full.efficiency, 1.0);
  EXPECT_EQ(waves(10, 132, 0).num_waves, 0);  // cannot launch
  EXPECT_EQ(waves(0, 132, 4).num_waves, 0);
}

// ---- Little's law --------------------------------------------------------------------------

TEST(GpuLittlesLaw, BytesInFlightToSaturateHbm) {
  // H100: 3.35 TB/s × 600 ns = 2.01 MB in flight; / 132 SMs = 15227 bytes per SM. A warp with one
  // 16-byte load per lane in flight holds 512 bytes: 29.7 warps per SM, 46% of 64.
  const LittlesLaw h = littles_law(gpu("h100"), 600e-9, 512);
  EXPECT_NEAR(h.bytes_in_flight, 2.01e6, 1);
  EXPECT_NEAR(h.bytes_in_flight_per_sm, 2.01e6 / 132, 1e-6);
  EXPECT_NEAR(h.warps_per_sm, 2.01e6 / 132 / 512, 1e-9);
  EXPECT_NEAR(h.fraction_of_max_warps, 2.01e6 / 132 / 512 / 64, 1e-9);
  // H200 at 4.8 TB/s needs 4.8 / 3.35 times more with the same SMs; 4-byte loads (128 B per warp)
  // would need 2.88e6 / 132 / 128 = 170 warps per SM: more than an SM holds (64).
  const LittlesLaw h2 = littles_law(gpu("h200"), 600e-9, 128);
  EXPECT_NEAR(h2.bytes_in_flight, 2.88e6, 1);
  EXPECT_GT(h2.fraction_of_max_warps, 1.0);
}

// ---- Coalescing ----------------------------------------------------------------------------

std::vector<uint64_t> lanes(uint64_t base, uint64_t stride_bytes) {
  std::vector<uint64_t> a(32);
  for (uint64_t i = 0; i < 32; ++i) a[i] = base + i * stride_bytes;
  return a;
}

TEST(GpuCoalescing, SectorsOfKnownPatterns) {
  // Stride-1 floats from an aligned base: 128 contiguous bytes = 4 sectors, all used.
  Coalescing c = coalescing(lanes(4096, 4), 4);
  EXPECT_EQ(c.sectors, 4);
  EXPECT_EQ(c.useful_bytes, 128);
  EXPECT_DOUBLE_EQ(c.efficiency, 1.0);
  // Stride 2 floats: 256 bytes spanned, 8 sectors, half of each used.
  c = coalescing(lanes(4096, 8), 4);
  EXPECT_EQ(c.sectors, 8);
  EXPECT_DOUBLE_EQ(c.efficiency, 0.5);
  // Stride 32 floats (128 bytes): every lane its own sector, 4 of 32 bytes used.
  c = coalescing(lanes(4096, 128), 4);
  EXPECT_EQ(c.sectors, 32);
  EXPECT_DOUBLE_EQ(c.efficiency, 0.125);
  // Off by one float: 128 bytes over 5 sectors.
  c = coalescing(lanes(4100, 4), 4);
  EXPECT_EQ(c.sectors, 5);
  EXPECT_DOUBLE_EQ(c.efficiency, 128.0 / 160);
  // Every lane the same float: one sector, 4 useful bytes.
  c = coalescing(lanes(4096, 0), 4);
  EXPECT_EQ(c.sectors, 1);
  EXPECT_EQ(c.useful_bytes, 4);
  // float4 stride 1: 512 bytes, 16 sectors, all used.
  c = coalescing(lanes(0, 16), 16);
  EXPECT_EQ(c.sectors, 16);
  EXPECT_DOUBLE_EQ(c.efficiency, 1.0);
  // An 8-byte access at byte 28 straddles two sectors.
  const uint64_t one[] = {28};
  EXPECT_EQ(coalescing(one, 8).sectors, 2);
}

// ---- Bank conflicts ------------------------------------------------------------------------

TEST(GpuBankConflicts, StridesAndBroadcast) {
  EXPECT_EQ(bank_conflicts(lanes(0, 4), 4).degree, 1);     // stride 1: 32 banks, one word each
  EXPECT_EQ(bank_conflicts(lanes(0, 8), 4).degree, 2);     // stride 2: 16 banks, two words each
  EXPECT_EQ(bank_conflicts(lanes(0, 12), 4).degree, 1);    // odd stride 3: a permutation of banks
  EXPECT_EQ(bank_conflicts(lanes(0, 128), 4).degree, 32);  // stride 32: all in bank 0
  EXPECT_EQ(bank_conflicts(lanes(0, 128), 4).wavefronts, 32);
  EXPECT_EQ(bank_conflicts(lanes(64, 0), 4).degree, 1);  // one word for all: broadcast
  // Lanes pairwise on the same word (i / 2): multicast, no conflict.
  std::vector<uint64_t> pairs(32);
  for (uint64_t i = 0; i < 32; ++i) pairs[i] = (i / 2) * 4;
  EXPECT_EQ(bank_conflicts(pairs, 4).degree, 1);
  // Bytes: 32 lanes read 8 words in 8 banks.
  EXPECT_EQ(bank_conflicts(lanes(0, 1), 1).degree, 1);
  // 8- and 16-byte accesses run in 2 and 4 phases of 128 bytes: stride 1 stays conflict-free.
  EXPECT_EQ(bank_conflicts(lanes(0, 8), 8).degree, 1);
  EXPECT_EQ(bank_conflicts(lanes(0, 8), 8).wavefronts, 2);
  const BankConflicts f4 = bank_conflicts(lanes(0, 16), 16);
  EXPECT_EQ(f4.degree, 1);
  EXPECT_EQ(f4.wavefronts, 4);
}

// A 32 × 32 float tile in shared memory, lane t reading column c of row t (a transpose's read).
std::vector<uint64_t> column_read(int row_floats, bool swizzle, int c) {
  std::vector<uint64_t> a(32);
  for (int t = 0; t < 32; ++t) {
    const int col = swizzle ? (c ^ t) : c;
    a[t] = static_cast<uint64_t>(t * row_floats + col) * 4;
  }
  return a;
}

TEST(GpuBankConflicts, TileColumnReadUnpaddedPaddedSwizzled) {
  for (const int c : {0, 5, 31}) {
    // Unpadded: word t·32 + c is in bank c for every t: 32-way.
    EXPECT_EQ(bank_conflicts(column_read(32, false, c), 4).degree, 32) << c;
    // Padded to 33: bank (33t + c) mod 32 = (t + c) mod 32, all distinct.
    EXPECT_EQ(bank_conflicts(column_read(33, false, c), 4).degree, 1) << c;
    // XOR swizzle: bank c ^ t, all distinct (and rows still read contiguously).
    EXPECT_EQ(bank_conflicts(column_read(32, true, c), 4).degree, 1) << c;
  }
  // The row read of the unpadded tile is conflict-free.
  EXPECT_EQ(bank_conflicts(lanes(7 * 128, 4), 4).degree, 1);
}

// ---- Kernel names --------------------------------------------------------------------------

TEST(GpuPtxas, KernelNameDemangledWithoutSignature) {
  EXPECT_EQ(ptxas_kernel_name("_Z10gemm_naivePKfS0_Pfiii"), "gemm_naive");
  EXPECT_EQ(ptxas_kernel_name("_ZN4kiln4cuda10gemm_tiledILi128ELi128ELi32EEEvPKfS3_Pfiii"),
            "kiln::cuda::gemm_tiled<128, 128, 32>");
  EXPECT_EQ(ptxas_kernel_name("_ZN4kiln4cuda10gemm_tiledILi64ELi64ELi16EEEvPKfS3_Pfiii"),
            "kiln::cuda::gemm_tiled<64, 64, 16>");
  EXPECT_EQ(ptxas_kernel_name("_ZN4kiln4cuda5heavyEPK6float4PS1_i"), "kiln::cuda::heavy");
  EXPECT_EQ(ptxas_kernel_name("_ZN12_GLOBAL__N_16kernelEv"), "(anonymous namespace)::kernel");
  EXPECT_EQ(ptxas_kernel_name("plain_c"), "plain_c");  // extern "C": not mangled
}

// ---- Real toolchain output -----------------------------------------------------------------

// `nvcc -c -arch=sm_80 -Xptxas -v -maxrregcount=40 k.cu` (CUDA 13.0): a spilling kernel, a
// template with static __shared__ (2 × 64×16 floats = 8192 bytes), a plain one; cmem[0] printed.
constexpr std::string_view kPtxasSm80 =
    R"(ptxas info    : Overriding maximum register limit 256 for '_ZN4kiln4cuda5heavyEPK6float4PS1_i' with  40 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN4kiln4cuda5heavyEPK6float4PS1_i' for 'sm_80'
ptxas info    : Function properties for _ZN4kiln4cuda5heavyEPK6float4PS1_i
    584 bytes stack frame, 580 bytes spill stores, 2868 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 584 bytes cumulative stack size, 372 bytes cmem[0]
ptxas info    : Compile time = 54.457 ms
ptxas info    : Compiling entry function '_ZN4kiln4cuda10gemm_tiledILi64ELi64ELi16EEEvPKfS3_Pfiii' for 'sm_80'
ptxas info    : Function properties for _ZN4kiln4cuda10gemm_tiledILi64ELi64ELi16EEEvPKfS3_Pfiii
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 8192 bytes smem, 388 bytes cmem[0]
ptxas info    : Compile time = 8.467 ms
ptxas info    : Compiling entry function '_Z10gemm_naivePKfS0_Pfiii' for 'sm_80'
ptxas info    : Function properties for _Z10gemm_naivePKfS0_Pfiii
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 388 bytes cmem[0]
ptxas info    : Compile time = 5.093 ms
)";

// The same for sm_90 (no cmem printed there), then an extern "C" kernel calling a __noinline__
// device function, whose "Function properties" follow the entry's and belong to no entry.
constexpr std::string_view kPtxasSm90 = R"(ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN4kiln4cuda5heavyEPK6float4PS1_i' for 'sm_90'
ptxas info    : Function properties for _ZN4kiln4cuda5heavyEPK6float4PS1_i
    608 bytes stack frame, 608 bytes spill stores, 2884 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 608 bytes cumulative stack size
ptxas info    : Compile time = 59.817 ms
ptxas info    : Compiling entry function '_ZN4kiln4cuda10gemm_tiledILi64ELi64ELi16EEEvPKfS3_Pfiii' for 'sm_90'
ptxas info    : Function properties for _ZN4kiln4cuda10gemm_tiledILi64ELi64ELi16EEEvPKfS3_Pfiii
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 8192 bytes smem
ptxas info    : Compile time = 9.833 ms
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'plain_c' for 'sm_80'
ptxas info    : Function properties for plain_c
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers, 360 bytes cmem[0]
ptxas info    : Compile time = 9.039 ms
ptxas info    : Function properties for _Z6helperf
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
)";

// `cuobjdump --dump-resource-usage k.o` of the sm_80 and sm_90 objects (cuobjdump 13.1). sm_90's
// SHARED is ptxas's 8192 + 1 KiB.
constexpr std::string_view kCuobjdump = R"(
Fatbin elf code:
================
arch = sm_80
code version = [1,8]
host = linux
compile_size = 64bit

Resource usage:
 Common:
  GLOBAL:0
 Function _ZN4kiln4cuda5heavyEPK6float4PS1_i:
  REG:40 STACK:584 SHARED:0 LOCAL:0 CONSTANT[0]:372 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _ZN4kiln4cuda10gemm_tiledILi64ELi64ELi16EEEvPKfS3_Pfiii:
  REG:40 STACK:0 SHARED:8192 LOCAL:0 CONSTANT[0]:388 TEXTURE:0 SURFACE:0 SAMPLER:0

Fatbin ptx code:
================
arch = sm_80
code version = [9,0]
host = linux
compile_size = 64bit
compressed
ptxasOptions = -v  -maxrregcount=40

Fatbin elf code:
================
arch = sm_90
code version = [1,8]
host = linux
compile_size = 64bit

Resource usage:
 Common:
  GLOBAL:0
 Function _ZN4kiln4cuda10gemm_tiledILi64ELi64ELi16EEEvPKfS3_Pfiii:
  REG:40 STACK:0 SHARED:9216 LOCAL:0 CONSTANT[0]:564 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z10gemm_naivePKfS0_Pfiii:
  REG:40 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:564 TEXTURE:0 SURFACE:0 SAMPLER:0
)";

TEST(GpuPtxas, ParsesPtxasVerboseOutput) {
  const std::vector<KernelResourceUsage> e = parse_ptxas_output(kPtxasSm80);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].name, "kiln::cuda::heavy");
  EXPECT_EQ(e[0].arch, "sm_80");
  EXPECT_EQ(e[0].registers, 40);
  EXPECT_EQ(e[0].stack_bytes, 584);
  EXPECT_EQ(e[0].spill_store_bytes, 580);
  EXPECT_EQ(e[0].spill_load_bytes, 2868);
  EXPECT_EQ(e[0].cmem0_bytes, 372);
  EXPECT_EQ(e[0].smem_bytes, 0);
  EXPECT_EQ(e[1].mangled, "_ZN4kiln4cuda10gemm_tiledILi64ELi64ELi16EEEvPKfS3_Pfiii");
  EXPECT_EQ(e[1].name, "kiln::cuda::gemm_tiled<64, 64, 16>");
  EXPECT_EQ(e[1].smem_bytes, 8192);
  EXPECT_EQ(e[1].barriers, 1);
  EXPECT_EQ(e[1].spill_store_bytes, 0);
  EXPECT_EQ(e[2].name, "gemm_naive");
  EXPECT_EQ(e[2].cmem0_bytes, 388);
  EXPECT_FALSE(e[2].local_bytes.has_value());  // ptxas does not print LOCAL

  const std::vector<KernelResourceUsage> f = parse_ptxas_output(kPtxasSm90);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].arch, "sm_90");
  EXPECT_EQ(f[0].spill_load_bytes, 2884);
  EXPECT_FALSE(f[0].cmem0_bytes.has_value());
  EXPECT_EQ(f[1].smem_bytes, 8192);
  EXPECT_EQ(f[2].name, "plain_c");
  EXPECT_EQ(f[2].arch, "sm_80");
  EXPECT_EQ(f[2].registers, 10);
  EXPECT_EQ(f[2].stack_bytes, 0);  // the device function's 16 bytes are not the entry's
  EXPECT_EQ(parse_resource_usage(kPtxasSm80).size(), 3u);
}

TEST(GpuPtxas, ParsesCuobjdumpResourceUsage) {
  const std::vector<KernelResourceUsage> e = parse_cuobjdump_resource_usage(kCuobjdump);
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[0].name, "kiln::cuda::heavy");
  EXPECT_EQ(e[0].arch, "sm_80");
  EXPECT_EQ(e[0].stack_bytes, 584);
  EXPECT_EQ(e[0].local_bytes, 0);
  EXPECT_EQ(e[0].cmem0_bytes, 372);
  EXPECT_FALSE(e[0].spill_store_bytes.has_value());  // cuobjdump does not say
  EXPECT_EQ(e[1].smem_bytes, 8192);
  EXPECT_EQ(e[2].arch, "sm_90");
  EXPECT_EQ(e[2].name, "kiln::cuda::gemm_tiled<64, 64, 16>");
  EXPECT_EQ(e[2].smem_bytes, 9216);
  EXPECT_EQ(e[2].registers, 40);
  EXPECT_EQ(e[3].name, "gemm_naive");
  EXPECT_EQ(e[3].cmem0_bytes, 564);
  EXPECT_EQ(parse_resource_usage(kCuobjdump).size(), 4u);
}

TEST(GpuPtxas, MalformedTextGivesNoEntries) {
  EXPECT_TRUE(parse_ptxas_output("").empty());
  EXPECT_TRUE(parse_ptxas_output("ptxas info    : Used 32 registers\n").empty());  // no entry line
  EXPECT_TRUE(parse_cuobjdump_resource_usage("REG:40 STACK:0\n").empty());         // no Function
  // A truncated log: the entry without its "Used" line is dropped.
  EXPECT_EQ(
      parse_ptxas_output(kPtxasSm80.substr(0, kPtxasSm80.find("Used 40 registers, used 1"))).size(),
      1u);
  // Synthetic: should another function's properties come between an entry's lines, its stack and
  // spills are not the entry's.
  const std::vector<KernelResourceUsage> e = parse_ptxas_output(
      "ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
      "ptxas info    : Function properties for _Z6helperf\n"
      "    16 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
      "ptxas info    : Used 12 registers, used 0 barriers\n");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].stack_bytes, 0);
  EXPECT_FALSE(e[0].spill_store_bytes.has_value());
}

// ---- Launches explained --------------------------------------------------------------------

cuda::KernelLaunch launch(std::string kernel, int64_t grid, int threads, int64_t dyn_smem) {
  cuda::KernelLaunch l;
  l.kernel = std::move(kernel), l.family = "gemm", l.variant = "test";
  l.grid_blocks = grid, l.threads_per_block = threads, l.dynamic_smem_bytes = dyn_smem;
  return l;
}

// A synthetic log: one template kernel built for sm_80 and sm_90, one for sm_80 only, one for
// sm_100 only.
std::vector<KernelResourceUsage> synthetic_usage() {
  auto entry = [](std::string name, std::string arch, int regs, int64_t smem) {
    KernelResourceUsage e;
    e.name = e.mangled = std::move(name), e.arch = std::move(arch);
    e.registers = regs, e.smem_bytes = smem;
    return e;
  };
  return {entry("kiln::cuda::gemm_tiled<128, 128, 32>", "sm_80", 128, 32768),
          entry("kiln::cuda::gemm_tiled<128, 128, 32>", "sm_90", 168, 32768),
          entry("kiln::cuda::softmax", "sm_80", 37, 0),
          entry("kiln::cuda::tma_gemm", "sm_100", 90, 0)};
}

TEST(GpuExplain, JoinsLaunchesWithTheArchsEntries) {
  const std::vector<cuda::KernelLaunch> launches = {
      launch("kiln::cuda::gemm_tiled<128, 128, 32>", 1024, 256, 16384),
      launch("kiln::cuda::softmax", 4096, 128, 0), launch("kiln::cuda::tma_gemm", 10, 128, 0),
      launch("kiln::cuda::missing", 10, 128, 0)};
  const std::vector<KernelResourceUsage> usage = synthetic_usage();
  const LaunchReport r = explain_launches(gpu("h100"), launches, usage);
  EXPECT_EQ(r.target_arch, "sm_90");
  ASSERT_EQ(r.rows.size(), 4u);
  // gemm_tiled on sm_90: 168 registers → 5376 per warp, 3 per sub-partition, 12 warps: 1 block of
  // 8 warps; shared memory 32768 + 16384 + 1024 = 50176 allows 4. Waves: 1024 / 132 → 8, last 100.
  const LaunchRow& g = r.rows[0];
  EXPECT_EQ(g.arch_used, "sm_90");
  ASSERT_TRUE(g.usage.has_value());
  EXPECT_EQ(g.usage->registers, 168);
  EXPECT_EQ(g.smem_per_block_bytes, 32768 + 16384);
  ASSERT_TRUE(g.occupancy.has_value());
  EXPECT_EQ(g.occupancy->blocks_per_sm, 1);
  EXPECT_EQ(g.occupancy->limiter, OccupancyLimiter::kRegisters);
  EXPECT_EQ(g.waves.num_waves, 8);
  EXPECT_EQ(g.waves.last_wave_blocks, 100);
  // softmax falls back to sm_80 (noted): 37 registers, 128 threads → 12 blocks.
  EXPECT_EQ(r.rows[1].arch_used, "sm_80");
  EXPECT_EQ(r.rows[1].occupancy->blocks_per_sm, 12);
  // tma_gemm exists for sm_100 only and missing not at all: registers unknown.
  EXPECT_FALSE(r.rows[2].usage.has_value());
  EXPECT_FALSE(r.rows[2].occupancy->registers_known);
  EXPECT_FALSE(r.rows[3].usage.has_value());
  EXPECT_EQ(r.rows[3].occupancy->blocks_per_sm, 16);  // 4 warps: warps allow 16
  ASSERT_EQ(r.notes.size(), 3u);
  EXPECT_NE(r.notes[0].find("softmax: no sm_90 build, using the sm_80"), std::string::npos);
  EXPECT_NE(r.notes[0].find("JIT-compiled from PTX"), std::string::npos);
  EXPECT_NE(r.notes[1].find("built only for sm_100"), std::string::npos);
  EXPECT_NE(r.notes[2].find("missing: not in the resource-usage log"), std::string::npos);

  // On A100 the gemm uses its sm_80 entry (128 registers: 4096 per warp, 16 warps → 2 blocks).
  const LaunchReport a = explain_launches(gpu("a100"), launches, usage);
  EXPECT_EQ(a.rows[0].arch_used, "sm_80");
  EXPECT_EQ(a.rows[0].occupancy->blocks_per_sm, 2);
  // On B200 the sm_100 kernel matches exactly and the gemm falls back to sm_90.
  const LaunchReport b = explain_launches(gpu("b200"), launches, usage);
  EXPECT_EQ(b.rows[0].arch_used, "sm_90");
  EXPECT_EQ(b.rows[2].arch_used, "sm_100");
}

TEST(GpuExplain, RealPtxasLogJoinsByKernelNameAndArch) {
  // The sm_80 and sm_90 ptxas logs of the sample file, as a build for both archs prints them.
  const std::string log = std::string(kPtxasSm80) + std::string(kPtxasSm90);
  const std::vector<KernelResourceUsage> usage = parse_resource_usage(log);
  const std::vector<cuda::KernelLaunch> launches = {
      launch("kiln::cuda::gemm_tiled<64, 64, 16>", 4096, 256, 0),
      launch("gemm_naive", 65536, 256, 0), launch("kiln::cuda::heavy", 132, 128, 0)};
  // H100: gemm_tiled and heavy have sm_90 entries; gemm_naive only sm_80 (noted). gemm_tiled:
  // 40 registers → 1280 per warp, 48 warps = 6 blocks of 8 warps; smem 8192 + 1024 allows 25.
  const LaunchReport h = explain_launches(gpu("h100"), launches, usage);
  EXPECT_EQ(h.rows[0].arch_used, "sm_90");
  EXPECT_EQ(summary(*h.rows[0].occupancy), Summary(6, 48, 0.75, kByRegs));
  EXPECT_EQ(h.rows[1].arch_used, "sm_80");
  EXPECT_EQ(h.rows[2].usage->spill_load_bytes, 2884);  // sm_90's figure, not sm_80's 2868
  ASSERT_EQ(h.notes.size(), 1u);
  EXPECT_NE(h.notes[0].find("gemm_naive: no sm_90 build"), std::string::npos);
  // A100: every kernel's sm_80 entry, no notes.
  const LaunchReport a = explain_launches(gpu("a100"), launches, usage);
  EXPECT_EQ(a.rows[2].usage->spill_load_bytes, 2868);
  EXPECT_TRUE(a.notes.empty());
}

TEST(GpuExplain, WithoutALogAndWithALaunchThatCannotFit) {
  const std::vector<cuda::KernelLaunch> launches = {launch("kiln::cuda::a", 100, 256, 0),
                                                    launch("kiln::cuda::b", 100, 256, 300 * 1024)};
  const LaunchReport r = explain_launches(gpu("h200"), launches, {});
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("registers unknown"), std::string::npos);
  EXPECT_FALSE(r.rows[0].occupancy->registers_known);
  EXPECT_EQ(r.rows[0].occupancy->blocks_per_sm, 8);
  EXPECT_FALSE(r.rows[1].occupancy.has_value());  // 300 KiB: more than a block may have
  EXPECT_NE(r.rows[1].error.find("shared memory"), std::string::npos);
  EXPECT_EQ(r.rows[1].waves.num_waves, 0);
  EXPECT_TRUE(explain_launches(gpu("h200"), {}, {}).rows.empty());
}

TEST(GpuExplain, FormattedReportMarksUnknownRegisters) {
  std::vector<cuda::KernelLaunch> launches = {
      launch("kiln::cuda::gemm_tiled<128, 128, 32>", 1024, 256, 16384),
      launch("kiln::cuda::missing", 10, 128, 0), launch("kiln::cuda::b", 100, 256, 300 * 1024)};
  std::vector<KernelResourceUsage> usage = synthetic_usage();
  usage[1].spill_store_bytes = 12, usage[1].spill_load_bytes = 20;
  const std::string text = format_launch_report(explain_launches(gpu("h100"), launches, usage));
  std::vector<std::string> lines;
  for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
    lines.push_back(text.substr(at, nl - at));
  ASSERT_EQ(lines.size(), 6u) << text;  // header, 3 rows, 2 notes
  EXPECT_NE(lines[0].find("limiter"), std::string::npos);
  // gemm_tiled: 168 registers, 32768 + 16384 bytes, spills 12/20, 1 block = 8 warps = 12.5%, 8
  // waves with a last one of 100 / 132 = 75.8%.
  EXPECT_NE(lines[1].find(" 168 "), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("32768+16384"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("12/20"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find(" 12.5  registers "), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("75.8"), std::string::npos) << lines[1];
  // missing: "?" registers and smem, occupancy 16 blocks × 4 warps = 100% marked "*".
  EXPECT_NE(lines[2].find(" ? "), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find("?+0"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find("100.0*"), std::string::npos) << lines[2];
  EXPECT_NE(lines[3].find("cannot launch"), std::string::npos) << lines[3];
  EXPECT_EQ(lines[4].rfind("note: ", 0), 0u);
}

}  // namespace
}  // namespace kiln::perf
