// Knobs of the fast CPU GEMM that tools see: cache blocking (MC, KC, NC) per path, derived from
// the cache sizes (blocking_from_caches) and refined by a short timed search at first use
// (autotune_gemm), cached per CPU in the tune file; which products the bf16 path uses; the
// micro-kernel rate behind the FMA-peak self-check; and path names for `kiln info`. The kernels
// themselves are behind cpu::gemm (kiln/kernels/gemm.h). Implemented in gemm_tuning.cpp.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/core/status.h"

namespace kiln::cpu {

// Cache blocking in elements of op(A)/op(B): an MC x KC block of A lives in L2, a KC x NC
// panel of B in L3 (shared by the threads), a KC x NR micro-panel of B in L1.
struct GemmBlocking {
  int mc = 0, kc = 0, nc = 0;
};

enum class GemmPath { kF32, kBF16 };

// The caches a blocking is derived from (CpuFeatures: CPUID leaf 4 / 0x8000001D).
struct CacheGeometry {
  int64_t l1d_bytes = 32 << 10, l2_bytes = 1 << 20, l3_bytes = 32 << 20;
  int l1d_ways = 8, l2_ways = 8;
};
CacheGeometry this_cpu_caches();

// The analytical model (after BLIS's "analytical modeling is enough"), for kiln's loop order:
// per K block, a group of kStripGroup B micro-panels (NR x KC) sits in L2 while every MR x KC
// A strip of the M block runs against all of them from L1. With e = 4 bytes per k step (an f32,
// or a bf16 pair when k_per_step = 2):
//  * KC: the A strip keeps all but one way of L1 (the streamed B lines and the C rows written
//    by the epilogue take the last way): MR * steps * e <= (W1 - 1) / W1 * L1. Multiple of 16
//    steps. Zen 4 (32 KiB, 8-way): 512 steps, the value measured best there for f32 and bf16.
//  * MC: the M block's A strips and the group's B micro-panels share L2, one way left for C
//    and the streams: (MC + G * NR) * steps * e <= (W2 - 1) / W2 * L2. Multiple of MR, at least
//    2 MR. On Zen 4 this gives 182 where 336 (f32) and 84 (bf16) were measured best, 2-4% apart:
//    the L2 term is where the model is weakest, which is what the first-use autotune refines.
//  * NC: the K x NC panel of B takes an eighth of L3 (shared by the cores and, in a VM, with
//    other tenants): KC * NC * e <= L3 / 8, in [1024, 4096], a multiple of 256.
inline constexpr int kStripGroup = 8;
GemmBlocking blocking_from_caches(const CacheGeometry& caches, int mr, int nr, int k_per_step);
// The AMX path (32 x 32 tiles of C, gemm_amx.h) breaks that model's first rule. Its cost per K
// block is the reload of C's accumulator tiles (TILELOADD from beyond L2, on the critical path
// of the TDPBF16PS chain), while A's tile rows stream from L2 at the rate the tiles consume them.
// So K blocks are as long as they go: KC = kAmxKc bf16 values, one block for every hidden size of
// the presets. MC: the M block's A in twice L2, a multiple of 32. NC as above.
// Measured on a Sapphire-Rapids-class Xeon VM (48 KiB L1d, 2 MiB L2), 1 thread, against oneDNN
// in the same runs: the L1 rule's KC = 704-864 gave 0.85-1.5x, KC = 384 0.87-1.2x, KC = 2048 with
// MC = 1120 1.0-1.7x (shapes 2048x1152x384, 2048x384x1536, 384x384x2048, 2048^3, 4096^3).
inline constexpr int kAmxKc = 2048;
GemmBlocking amx_blocking_from_caches(const CacheGeometry& caches);

// The blocking the packed path uses now: set_gemm_blocking(), else this CPU's entry in the tune
// file (read once), else default_gemm_blocking().
GemmBlocking gemm_blocking(GemmPath path);
// blocking_from_caches() for this CPU and the active target's micro-kernel of `path`.
GemmBlocking default_gemm_blocking(GemmPath path);
void set_gemm_blocking(GemmPath path, GemmBlocking b);  // mc, kc, nc are clamped to sane ranges

// $KILN_TUNE_FILE, else $XDG_CACHE_HOME/kiln/gemm_tune.json, else ~/.cache/kiln/gemm_tune.json.
// One entry per CPU (tune_cpu_key()): other CPUs' entries in a shared home are kept.
std::string gemm_tune_file();
// Brand string and cache sizes: VMs of different hosts often report the same brand.
std::string tune_cpu_key();
// Where this process's blocking came from: "tune file (autotune)", "tune file (bench --tune)",
// "autotune (this run)" or "cache model" (set_gemm_blocking does not change it).
std::string gemm_blocking_source();
// Writes the current blocking of both paths and the bf16 kernel choice into this CPU's entry of
// gemm_tune_file(), keeping the other entries; `source` is recorded beside them.
Status save_gemm_tuning(const std::string& source = "bench --tune");
// This CPU's entry of gemm_tune_file() (a version-1 file counts when it names this CPU's brand):
// a JSON object, null when the file or the entry is absent, an error when the file is not JSON.
// Other kernels' tunings (the FlashAttention tiles, attention_tiles.h) live in the same entry.
Expected<nlohmann::json> read_tune_entry();
// Sets each member of `fields` in this CPU's entry, keeping its other members and the other CPUs'
// entries (a version-1 or unreadable file is replaced); creates the directories.
Status merge_tune_entry(const nlohmann::json& fields);

// ---- bf16 products: AMX tiles, vdpbf16ps or widened to f32 ----------------------------------
// Where VDPBF16PS issues on one port (Xeon Sapphire/Emerald Rapids: half the f32 FMA rate in
// FLOPs), bf16 inputs widened to f32 while packing and run through the f32 micro-kernel are
// about twice as fast as the dot products; those Xeons also have AMX, whose TDPBF16PS does a
// 16 x 32 x 16 product per instruction (gemm_amx.h) — when Linux grants the process the tile
// state. cpu::gemm's packed path uses the fastest: KILN_BF16_GEMM (dot | widen | amx), else AMX
// where usable, else this CPU's tune-file entry, else a ~20 ms timing of the dot and f32
// micro-kernels in L1 at first use (dot is kept when it is >= 1.15x the f32 kernel's FLOP
// rate: widening costs twice the packed bytes). Pre-packed weights (gemm_prepacked) keep their
// pairs either way: their decode is bandwidth-bound.
enum class Bf16Kernel { kDot, kWiden, kAmx };
Bf16Kernel bf16_gemm_kernel();
void set_bf16_gemm_kernel(Bf16Kernel k);  // tests and benchmarks: both paths in one process
std::string bf16_gemm_choice();           // "widen: vdpbf16ps 86 GFLOP/s vs f32 FMA 160 (timed)"
bool bf16_amx_available();                // this process may run the AMX kernel (CPU, OS, target)
// The bf16 GEMM multiplies in bf16 (vdpbf16ps or AMX tiles), not widened to f32: its rates are
// quoted against the bf16 products' peak (perf/peak.h) and its blocking is tuned of its own.
bool bf16_gemm_on_bf16_products();
// FLOPs done by `reps` rounds of four TDPBF16PS on tiles in registers (the AMX bf16 peak loop of
// perf/peak.h); 0 where !bf16_amx_available().
double run_bf16_amx_peak_loop(int64_t reps);

// FLOPs done by `reps` runs of the active target's micro-kernel of `path` (kBF16: the vdpbf16ps
// kernel where the CPU has it, else the f32 one) on one MR x NR tile whose A strip and B
// micro-panel fit in 3/4 of L1: the compute-bound rate a GEMM's inner loop reaches. The
// calling thread's own buffers. For the FMA-peak self-check (perf/peak.h).
double run_micro_kernel_in_l1(GemmPath path, int64_t reps);

// The f32 micro-kernel's rate in L1, as run_micro_kernel_in_l1 times it, for the active target's
// tiling (used: true) and each of its other register tilings (GemmTargetKernels::f32_other_tiles):
// `rounds` rounds of ~`seconds` per tiling, the tilings alternated within a round, best kept.
struct TileRate {
  std::string name;
  int mr = 0, nr = 0;
  double gflops = 0;
  bool used = false;
};
std::vector<TileRate> f32_tile_rates(double seconds, int rounds);

// ---- first-use autotune ------------------------------------------------------------------------
struct AutotuneOptions {
  int64_t size = 1536;  // square problem timed per candidate
  int reps = 3;         // best of
  std::function<void(const std::string&)> log;  // one line per candidate, when set
  int64_t quant_size = 2048;  // first use: K = N of the quantized tiles' search (quant_tiles.h)
  int64_t flash_seq = 1024;   // first use: T of the flash forward's V-packing timing (attention_tiles.h)
};
struct AutotuneResult {
  GemmBlocking f32, bf16;
  double f32_gflops = 0, bf16_gflops = 0;
  double seconds = 0;
};
// Coordinate search (KC, then MC, then NC) around default_gemm_blocking() on the current
// thread count, bf16 too when its kernel is the dot product; sets the winners (a candidate must
// beat the best by 4%, above the VMs' run-to-run noise) and leaves saving to the caller. About
// 1-3 s on 2-core VMs. Disarms the first-use trigger.
AutotuneResult autotune_gemm(const AutotuneOptions& opt = {});
// Off by default in the library; `kiln` turns it on unless --no-autotune or KILN_AUTOTUNE=0.
// When on, the first packed GEMM of >= 2 * 512^3 FLOPs or the first quantized GEMM (block or
// weight-only) of a >= 512 x 512 weight, called outside the pool, runs the parts this CPU's
// tune-file entry lacks: autotune_gemm() (no GEMM blocking yet), autotune_quant_tiles()
// (no quant_tiles yet; quant_tiles.h) and autotune_flash_v_packing() (no V packing choice and the
// flash tiles on their cache model; attention_tiles.h), and saves them (a line on stderr each);
// the first flash forward of >= 512 x 512 x 4 (queries x keys x heads) is a trigger too. Together 1.5-4 s
// on the 2-core Zen 4 VM. Not under mpirun with several ranks (they would time each other):
// there the model's blocking and the default tiles. `search` is what the searches time (tests
// pass small problems; the triggers stay as above).
void set_first_use_autotune(bool on, const AutotuneOptions& search = {});
void maybe_autotune_first_use(int64_t m, int64_t n, int64_t k);
void maybe_autotune_first_use_quant(int64_t out, int64_t in);
void maybe_autotune_first_use_flash(int64_t q_len, int64_t kv_len, int64_t heads);
// The searches call it: their own GEMMs must not start another search.
void disarm_first_use_autotune();

// "avx512 14x32 micro-kernel", "avx512_bf16 dpbf16ps 14x32", ... for the active SIMD target.
std::string gemm_path_name(GemmPath path);
std::string gemm_small_m_name();

// Problems with m <= this take the GEMV-like path that streams B once without packing it.
inline constexpr int kGemmSmallM = 8;

}  // namespace kiln::cpu
