// Fast CPU GEMM driver: BLIS-style loops (NC panels of B -> KC blocks -> pack B -> MC blocks of A
// packed per task -> NR x MR micro-tiles), threads over (M block, N chunk) tiles of the kiln pool
// or, for small problems, one column chunk per thread, the small-M streaming path for decode-like
// shapes and the scalar target (blocking and its tuning: gemm_tuning.cpp). The single-thread
// pieces other drivers reuse (cpu::grouped_gemm) are declared in gemm_driver.h.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "kiln/core/cpu_features.h"
#include "kiln/core/huge_pages.h"
#include "kiln/core/thread_pool.h"
#include "kiln/core/graph.h"
#include "kiln/core/trace.h"
#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/cpu/gemm_driver.h"
#include "kiln/kernels/cpu/gemm_simd.h"
#include "kiln/kernels/cpu/ops_targets.h"
#include "kiln/kernels/dispatch.h"
#include "kiln/kernels/cpu/parallel.h"

namespace kiln::cpu {
namespace {

// ---- scalar target: a one-lane "vector" so the shared templates compile to plain C++ -------
struct V1 {
  using T = float;
  static constexpr int kLanes = 1;
  static T zero() { return 0.0f; }
  static T set1(float x) { return x; }
  static T load(const float* p) { return *p; }
  static T load_half(const uint16_t* p) { return f16_to_f32(*p); }
  static T loadu(const float* p) { return *p; }
  static T loadu(const uint16_t* p) { return gemm_detail::bf16_bits_to_f32(*p); }
  static T load_n(const float* p, int) { return *p; }
  static T load_n(const uint16_t* p, int) { return gemm_detail::bf16_bits_to_f32(*p); }
  static void store_n(float* p, T x, int) { *p = x; }
  static T fmadd(T a, T b, T c) { return a * b + c; }
  static T add(T a, T b) { return a + b; }
  static T sub(T a, T b) { return a - b; }
  static T mul(T a, T b) { return a * b; }
  static T div(T a, T b) { return a / b; }
  static T max(T a, T b) { return a > b ? a : b; }
  static float reduce_add(T a) { return a; }
  using Vec = scalar::Vec;  // vec.h: the epilogue's activations
};

GemmTargetKernels make_scalar_kernels() {
  using namespace gemm_detail;
  GemmTargetKernels k;
  k.f32 = {"scalar 4x8 micro-kernel", 4, 8, 1, &pack_a_f32<4>, &pack_b_f32<8>,
           &micro_kernel_f32<V1, 4, 8>};
  k.bf16 = k.f32;
  k.bf16.name = "scalar 4x8 micro-kernel, bf16 widened to f32 in packing";
  k.bf16_f32 = k.bf16;
  k.small_m_name = "scalar small-M (m<=8) kernel, B unpacked";
  k.small_m = &small_m<V1>;
  k.small_m_packed = &small_m_packed<V1, PackedF32Ops<V1>, 8>;
  k.f16 = {"scalar 4x8 micro-kernel, f16 weights widened", 4, 8, 1, &pack_a_f32<4>, &pack_b_half<8>,
           &micro_kernel_f32<V1, 4, 8, uint16_t>, nullptr, DType::kF32, 2};
  k.small_m_packed_half = &small_m_packed<V1, PackedHalfOps<V1>, 8>;
  k.epilogue_rows = &epilogue_rows<V1>;
  return k;
}

// Scratch that grows and is reused, never freed per call (first touch of a fresh page costs
// ~16 us in these VMs). One per thread: packing buffers are written by the thread that owns them.
// Buffers of 2 MiB and more (the packed B panels) are 2 MiB-aligned and asked to be backed by
// transparent huge pages (the machines default THP to "madvise"): the B stream of a 2048^3 f32
// GEMM crosses a 4 KiB page every 32 k steps of a tile; paired against OpenBLAS on 1 thread
// (EPYC VM) this gained ~3% at 2048^3 (1.025 -> 1.058) and was within noise at 4096^3.
class ScratchBuffer {
 public:
  void* get(size_t bytes) {
    if (bytes > capacity_) {
      const LargeBuffer b = allocate_large(bytes);
      mem_.reset(b.ptr);
      KILN_CHECK_MSG(mem_ != nullptr, "gemm scratch of {} bytes", b.bytes);
      capacity_ = b.bytes;
    }
    return mem_.get();
  }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> mem_;
  size_t capacity_ = 0;
};

ScratchBuffer& a_pack_buffer() { thread_local ScratchBuffer b; return b; }
ScratchBuffer& b_pack_buffer() { thread_local ScratchBuffer b; return b; }
ScratchBuffer& small_a_buffer() { thread_local ScratchBuffer b; return b; }
ScratchBuffer& small_acc_buffer() { thread_local ScratchBuffer b; return b; }
ScratchBuffer& small_a16_buffer() { thread_local ScratchBuffer b; return b; }

// ---- the packed path (PanelLayout: gemm_driver.h) ---------------------------------------------
// The most 64-byte lines that `rows` rows of row_bytes, stride bytes apart, put in one set of a
// 32 KiB 8-way L1 (64 sets). The rows of a strip are read together, k step by k step, and stay
// in L1 while a group of B micro-panels runs against them; back to back (stride = row_bytes)
// they spread as evenly as they can.
int l1_set_load(int64_t rows, int64_t stride, int64_t row_bytes) {
  constexpr int64_t kLine = 64, kSets = 64;
  int load[kSets] = {};
  for (int64_t i = 0; i < rows && row_bytes > 0; ++i)
    for (int64_t l = i * stride / kLine; l <= (i * stride + row_bytes - 1) / kLine; ++l) ++load[l % kSets];
  return *std::max_element(load, load + kSets);
}

// C strips [ms0, ms1) x panel strips [ns0, ns1) over all K blocks: per K block, packs this
// thread's MC x KC block of A (or reads its full strips in place) and runs the micro-tiles, so
// the C block stays in cache across the K blocks. The panel covers columns [jc, jc + nc).
void run_block(const GemmParams& p, const PackedPath& path, const PanelLayout& lay, const uint32_t* bpack,
               int64_t jc, int64_t nc, int64_t ms0, int64_t ms1, int64_t ns0, int64_t ns1) {
  const int64_t mr = path.mr, nr = path.nr;
  // Full strips may read A in place (no packing) when the kernel has such a variant for A's
  // layout and dtype (kernel_direct_a); a partial last strip is always packed (the kernel reads
  // MR whole rows). In place saves packing A, which each thread would otherwise do for all of A
  // in the column split (up to 11% at 256^3 and 512^3, 2 threads, EPYC VM). Not when in place
  // the strip's rows crowd some L1 sets more than a packed strip does: rows 4 KiB apart put all
  // 14 rows in the same sets (f32 1024^3 at 2 threads fell from 206 to 155 GFLOP/s that way).
  // Copying such rows back to back and running the in-place kernel on the copy was tried: the
  // copy is fast, but the GEMM then ran 1-5% slower than with the transposing pack at 2048^3 and
  // 4096^3 (f32 and bf16, 1 thread; the pack costs 3-4% there).
  const int64_t esize = dtype_nbytes(p.a_dtype, 1);
  const bool direct = path.kernel_direct_a != nullptr && !p.trans_a && p.a_dtype == path.direct_a_dtype;
  auto* apack = static_cast<uint32_t*>(a_pack_buffer().get(4 * ((ms1 - ms0) * mr * lay.steps_block() + 16)));
  const int64_t full_end = std::min(ms1, p.m / mr);  // strips [ms0, full_end) are full
  for (int64_t q = 0; q < lay.num_pc; ++q) {
    const int64_t pc = q * lay.kc_block, kc = std::max<int64_t>(0, std::min(lay.kc_block, p.k - pc));
    const int64_t steps = lay.steps(q);
    const int64_t a_strip = mr * steps, b_strip = nr * steps;
    // bf16: whole pairs within the rows (an even K block).
    const int64_t row_bytes = kc * esize;
    const int64_t stride = p.lda * esize;
    const bool direct_q = direct && kc % lay.ks == 0 &&
                          (stride == row_bytes || l1_set_load(mr, stride, row_bytes) <= l1_set_load(mr, row_bytes, row_bytes));
    if (kc > 0) {
      const int64_t fe = direct_q ? std::max(ms0, full_end) : ms0;  // strips from fe on are packed
      if (fe < ms1)
        path.pack_a(p, fe * mr, std::min(p.m, ms1 * mr) - fe * mr, pc, kc, apack + (fe - ms0) * a_strip);
      // BGRADA: one task per row adds it (the one holding column 0), K block after K block.
      if (p.bias_grad != nullptr && jc == 0 && ns0 == 0)
        gemm_bias_grad(p, ms0 * mr, std::min(p.m, ms1 * mr) - ms0 * mr, pc, kc);
    }
    const bool first = q == 0, last = q + 1 == lay.num_pc;
    TileEpilogue ep;
    ep.alpha = p.alpha;
    ep.beta = first ? p.beta : 1.0f;
    const uint32_t* bq = bpack + lay.offset(q);
    auto tile = [&](int64_t ms, int64_t ns) {
      const int64_t col = jc + ns * nr;
      const int nv = static_cast<int>(std::min(nr, jc + nc - col));
      const int64_t row = ms * mr;
      const int mv = static_cast<int>(std::min(mr, p.m - row));
      if (last) ep.set_last(p, row, col);
      float* c = p.c + row * p.ldc + col;
      if (direct_q && ms < full_end) {
        const char* a = static_cast<const char*>(p.a) + (row * p.lda + pc) * esize;
        path.kernel_direct_a(steps, a, p.lda, bq + ns * b_strip, c, p.ldc, nv, ep);
      } else {
        path.kernel(steps, apack + (ms - ms0) * a_strip, bq + ns * b_strip, c, p.ldc, mv, nv, ep);
      }
    };
    // Tile order: groups of kStripGroup B micro-panels (8 x 64 KiB at KC = 512, in L2), and
    // within a group each A strip runs against all of them, so one A strip is reused from L1
    // kStripGroup times while the B panels of the group stay in L2 for every A strip of the
    // block. The plain BLIS order (one B micro-panel against every A strip) was 1.5-2% slower
    // at f32 2048^3 and 4096^3 on 1 thread on the EPYC VM, where neither micro-panel fits L1.
    // kStripGroup: gemm_cpu.h (the cache model sizes MC with it).
    for (int64_t nb = ns0; nb < ns1; nb += kStripGroup)
      for (int64_t ms = ms0; ms < ms1; ++ms)
        for (int64_t ns = nb; ns < std::min(ns1, nb + kStripGroup); ++ns) tile(ms, ns);
  }
}

}  // namespace

void gemm_bias_grad(const GemmParams& p, int64_t r0, int64_t rows, int64_t pc, int64_t kc) {
  if (!p.trans_a || p.a_dtype != DType::kF32) return add_bias_grad_rows(p, r0, rows, pc, kc);
  const auto add = KILN_OPS_DISPATCH(accumulate_n).pick();
  const float* a = static_cast<const float*>(p.a) + r0;
  for (int64_t l = pc; l < pc + kc; ++l) add(p.bias_grad + r0, a + l * p.lda, rows);
}

PanelLayout panel_layout(const GemmParams& p, const PackedPath& path, GemmBlocking blk) {
  const int64_t num_kb = std::max<int64_t>(1, ceil_div(p.k, blk.kc));
  PanelLayout lay;
  lay.nr = path.nr;
  lay.ks = path.k_per_step;
  lay.kc_block = std::max<int64_t>(2, (ceil_div(p.k, num_kb) + 1) & ~int64_t{1});
  lay.num_pc = p.k == 0 ? 1 : ceil_div(p.k, lay.kc_block);
  lay.k = p.k;
  return lay;
}

void pack_b_panel(const GemmParams& p, const PackedPath& path, const PanelLayout& lay, int64_t jc, int64_t nc,
                  uint32_t* dst) {
  for (int64_t q = 0; q < lay.num_pc && p.k > 0; ++q) {
    const int64_t pc = q * lay.kc_block;
    path.pack_b(p, jc, nc, pc, std::min(lay.kc_block, p.k - pc), dst + lay.offset(q));
  }
}

void run_column_chunk(const GemmParams& p, const PackedPath& path, PanelLayout lay, int64_t s0,
                      int64_t s1, int64_t ms0, int64_t ms1, int64_t mc_strips) {
  const int64_t jc = s0 * lay.nr, nc = std::min(p.n, s1 * lay.nr) - jc;
  lay.strips = s1 - s0;
  auto* bpack = static_cast<uint32_t*>(b_pack_buffer().get(4 * lay.elems()));
  pack_b_panel(p, path, lay, jc, nc, bpack);
  for (int64_t b = ms0; b < ms1; b += mc_strips)
    run_block(p, path, lay, bpack, jc, nc, b, std::min(ms1, b + mc_strips), 0, lay.strips);
}

namespace {

// Per NC panel of B: one parallel region packs the whole K x NC panel (all K blocks), a second
// runs the (M block, N chunk) tasks, each looping over the K blocks itself (packing its MC x KC
// block of A per K block). Two pool regions per panel keep barrier costs small on 2 threads,
// and a task's C block stays in cache across its K blocks.
// Small problems on several threads take the column split instead: one region, one column chunk
// per thread, each thread packing its own part of B and all of A (duplicated, cheap at these
// sizes). No packed data written by one core is read by another, and a thread's C columns stay
// in its own L2 from call to call.
// The column split is used while each thread's packed part of B stays within kThreadPanelBytes
// and M <= N (each thread packs all of A, so the duplicated packing stays below the B traffic it
// saves). Measured on the 2-core EPYC VM (alternating blocks, one process): f32 and bf16 squares
// 256-1536 gain 1-10% at 2 threads, bf16 2048 is even; larger panels keep the shared-panel path.
void gemm_packed(const GemmParams& p, const PackedPath& path, GemmBlocking blk) {
  const int64_t mr = path.mr, nr = path.nr, ks = path.k_per_step;
  const int threads = num_threads();
  PanelLayout lay = panel_layout(p, path, blk);
  const int64_t kc_block = lay.kc_block, num_pc = lay.num_pc;
  const int64_t mstrips = ceil_div(p.m, mr);
  const int64_t mc_strips = std::max<int64_t>(1, blk.mc / mr);

  const int64_t all_strips = ceil_div(p.n, nr);
  const int64_t b_bytes = 4 * ceil_div(std::max<int64_t>(p.k, 1), ks) * all_strips * nr;
  if (threads > 1 && p.m <= p.n && all_strips >= 2 * threads &&
      b_bytes <= threads * kThreadPanelBytes) {
    run_tasks(threads, [&](int64_t t) {
      run_column_chunk(p, path, lay, all_strips * t / threads, all_strips * (t + 1) / threads, 0,
                       mstrips, mc_strips);
    });
    return;
  }

  // NC: the tuned width, narrowed so the packed K x NC panel stays within 64 MiB of scratch. Each
  // M block streams the whole panel, but only ~1 byte of B per 170 FLOPs (MC = 336), so a panel
  // beyond the L3 costs nothing there, while every extra panel packs all of A once more. At
  // 4096^3 a 16 MiB cap (4 f32 panels of 1024 columns) was 1-3% slower than 64 MiB (2 panels of
  // the tuned 2048): f32 at 1 and 2 threads, bf16 at 1, EPYC VM.
  constexpr int64_t kPanelBytes = int64_t{64} << 20;
  const int64_t nc_fit = kPanelBytes / (4 * std::max<int64_t>(p.k, 1) / ks + 1);
  const int64_t nc_max = std::max<int64_t>(nr, std::min<int64_t>(blk.nc, nc_fit) / nr * nr);
  for (int64_t jc = 0; jc < p.n; jc += nc_max) {
    const int64_t nc = std::min(nc_max, p.n - jc);
    const int64_t nstrips = ceil_div(nc, nr);
    lay.strips = nstrips;
    auto* bpack = static_cast<uint32_t*>(b_pack_buffer().get(4 * lay.elems()));
    if (p.k > 0) {
      const int64_t groups = std::max<int64_t>(1, std::min<int64_t>(nstrips, 2 * threads));
      run_tasks(groups * num_pc, [&](int64_t t) {
        const int64_t q = t / groups, g = t % groups;
        const int64_t s0 = nstrips * g / groups, s1 = nstrips * (g + 1) / groups;
        if (s0 == s1) return;
        const int64_t pc = q * kc_block, kc = std::min(kc_block, p.k - pc);
        path.pack_b(p, jc + s0 * nr, std::min(nc, s1 * nr) - s0 * nr, pc, kc,
                    bpack + lay.offset(q) + s0 * nr * lay.steps(q));
      });
    }
    // Task grid: M blocks (a multiple of the thread count, so the split is even), and when
    // there are few of them, N is cut into chunks too.
    int64_t num_ic = ceil_div(mstrips, mc_strips);
    int64_t num_jn = 1;
    if (threads > 1) {
      num_ic = std::min(mstrips, ceil_div(num_ic, threads) * threads);
      if (num_ic < threads) num_jn = std::min(nstrips, ceil_div(2 * threads, num_ic));
    }
    run_tasks(num_ic * num_jn, [&](int64_t task) {
      const int64_t ic = task / num_jn, jn = task % num_jn;
      const int64_t ms0 = mstrips * ic / num_ic, ms1 = mstrips * (ic + 1) / num_ic;
      const int64_t ns0 = nstrips * jn / num_jn, ns1 = nstrips * (jn + 1) / num_jn;
      if (ms0 == ms1 || ns0 == ns1) return;
      run_block(p, path, lay, bpack, jc, nc, ms0, ms1, ns0, ns1);
    });
  }
}

}  // namespace

// ---- the small-M (decode-like) path: B streamed once, straight from the caller's memory ------
SmallMArgs small_m_args(const GemmParams& p) {
  // Row stride of the f32 copy of A: rows 64..448 bytes apart modulo 4 KiB, so the M rows (read
  // together in every k step) land in different L1 sets; with K = 4096 unpadded they all alias
  // one set with the B rows and thrash the 8-way L1.
  int64_t lda = (p.k + 15) & ~int64_t{15};
  while ((lda * 4) % 4096 < 64 || (lda * 4) % 4096 > 448) lda += 16;
  auto* a32 = static_cast<float*>(small_a_buffer().get(4 * (p.m * lda + 16)));  // (m, k), ld lda
  // The copies run once, before the column loops (and in cpu::gemm before the threads start):
  // keep the dtype and layout tests out of the loops.
  const int64_t si = p.trans_a ? 1 : p.lda, sk = p.trans_a ? p.lda : 1;  // strides of i and k
  const bool a_bf16 = p.a_dtype == DType::kBF16;
  for (int64_t i = 0; i < p.m; ++i) {
    const auto* src32 = static_cast<const float*>(p.a) + i * si;
    const auto* src16 = static_cast<const uint16_t*>(p.a) + i * si;
    float* dst = a32 + i * lda;
    if (a_bf16) {
      for (int64_t l = 0; l < p.k; ++l) dst[l] = gemm_detail::bf16_bits_to_f32(src16[l * sk]);
    } else if (sk == 1) {
      std::memcpy(dst, src32, static_cast<size_t>(p.k) * 4);
    } else {
      for (int64_t l = 0; l < p.k; ++l) dst[l] = src32[l * sk];
    }
  }
  SmallMArgs s{a32, p.m, p.k, lda};
  s.b = p.b;
  s.ldb = p.ldb;
  s.b_dtype = p.b_dtype;
  s.trans_b = p.trans_b;
  if (p.b_dtype == DType::kBF16) {
    // bf16 copy of A for the vdpbf16ps kernels (same L1-set padding, in 64-byte steps).
    int64_t lda16 = (p.k + 31) & ~int64_t{31};
    while ((lda16 * 2) % 4096 < 64 || (lda16 * 2) % 4096 > 448) lda16 += 32;
    auto* a16 = static_cast<uint16_t*>(small_a16_buffer().get(2 * (p.m * lda16 + 32)));  // (m, k)
    for (int64_t i = 0; i < p.m; ++i) {
      uint16_t* dst = a16 + i * lda16;
      if (a_bf16) {
        const auto* src16 = static_cast<const uint16_t*>(p.a) + i * si;
        for (int64_t l = 0; l < p.k; ++l) dst[l] = src16[l * sk];
      } else {
        for (int64_t l = 0; l < p.k; ++l) dst[l] = gemm_detail::f32_to_bf16_bits(a32[i * lda + l]);
      }
      for (int64_t l = p.k; l < lda16; ++l) dst[l] = 0;
    }
    s.a16 = a16;
    s.lda16 = lda16;
  }
  return s;
}

void small_m_columns(const GemmParams& p, const GemmTargetKernels& kernels, const SmallMArgs& s,
                     int64_t j0, int64_t j1) {
  // (m, j1 - j0)
  auto* acc = static_cast<float*>(small_acc_buffer().get(4 * (p.m * (j1 - j0) + 16)));
  kernels.small_m(s, j0, j1, acc);
  TileEpilogue ep;
  ep.alpha = p.alpha;
  ep.beta = p.beta;
  ep.set_last(p, 0, j0);
  kernels.epilogue_rows(p.c + j0, p.ldc, acc, j1 - j0, p.m, j1 - j0, ep);
}

namespace {

void gemm_small_m(const GemmParams& p, const GemmTargetKernels& kernels) {
  const SmallMArgs s = small_m_args(p);  // read by every thread
  // Column chunks of >= 64 (multiples of 16), about four per thread for balance.
  const int threads = num_threads();
  const int64_t num_chunks = threads == 1 ? 1 : std::max<int64_t>(1, std::min(ceil_div(p.n, 64), int64_t{4} * threads));
  run_tasks(num_chunks, [&](int64_t t) {
    const int64_t j0 = t == 0 ? 0 : (p.n * t / num_chunks) & ~int64_t{15};
    const int64_t j1 = t + 1 == num_chunks ? p.n : (p.n * (t + 1) / num_chunks) & ~int64_t{15};
    if (j1 > j0) small_m_columns(p, kernels, s, j0, j1);
  });
}

}  // namespace

const GemmTargetKernels& gemm_target_kernels() {
  using KernelsFn = const GemmTargetKernels& (*)();
  return Dispatch<KernelsFn>{&gemm_kernels_scalar, &gemm_kernels_avx2, &gemm_kernels_avx512}.pick()();
}

const GemmTargetKernels& gemm_kernels_scalar() {
  static const GemmTargetKernels k = make_scalar_kernels();
  return k;
}

const PackedPath& bf16_packed_path(const GemmTargetKernels& k, Bf16Kernel choice) {
  if (choice == Bf16Kernel::kWiden) return k.bf16_f32;
  if (choice == Bf16Kernel::kAmx && k.bf16_amx.kernel) return k.bf16_amx;
  return k.bf16;
}

std::string gemm_path_name(GemmPath path) {
  const GemmTargetKernels& k = gemm_target_kernels();
  if (path == GemmPath::kF32) return k.f32.name;
  return bf16_packed_path(k, bf16_gemm_kernel()).name;
}
std::string gemm_small_m_name() { return gemm_target_kernels().small_m_name; }

void gemm(const GemmParams& p) {
  KILN_GRAPH_NODE_IO("gemm", [p](const graph::Access* io) {
    GemmParams q = p;
    q.c = io[0].mut<float>(); q.a = io[1].ptr; q.b = io[2].ptr; q.bias = io[3].as<float>(); q.residual = io[4].as<float>();
    q.save_pre = io[6].mut<float>();
    q.pre = io[7].as<float>();
    q.bias_grad = io[8].mut<float>();
    gemm(q);
  }, gemm_io(p));
  trace::Scope kiln_trace_(trace::Category::kKernel, "gemm", [&](trace::Event& e) { describe_gemm(e, p); e.algo = p.m <= kGemmSmallM ? "small-m" : "packed"; });
  KILN_CHECK_MSG(check_gemm(p).ok(), "{}", check_gemm(p).message());
  if (p.m == 0) return;
  const GemmTargetKernels& kernels = gemm_target_kernels();
  if (p.n == 0 || p.m <= kGemmSmallM) {
    if (p.n > 0) gemm_small_m(p, kernels);
    if (p.bias_grad != nullptr) gemm_bias_grad(p, 0, p.m, 0, p.k);  // the small-M path packs no A
    return;
  }
  maybe_autotune_first_use(p.m, p.n, p.k);
  const bool bf16 = p.a_dtype == DType::kBF16 || p.b_dtype == DType::kBF16;
  const PackedPath& path = !bf16 ? kernels.f32 : bf16_packed_path(kernels, bf16_gemm_kernel());
  gemm_packed(p, path, gemm_blocking(path.k_per_step == 2 ? GemmPath::kBF16 : GemmPath::kF32));
}

}  // namespace kiln::cpu
