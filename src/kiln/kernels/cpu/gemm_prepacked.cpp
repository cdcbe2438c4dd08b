// gemm_prepacked: the packed GEMM with the weight B packed once (pack_weight_as, f32 or bf16)
// instead of per call. It reuses the per-target packing routines and micro-kernels of cpu::gemm
// (gemm_kernels.h): A is packed per call into one buffer shared by the threads, then (M block,
// N chunk) tasks run the micro-tiles straight off the pre-packed W strips. m <= kGemmSmallM
// (decode) runs the small-M kernels over the strips instead: passes of up to 8 rows, each reading
// W once.
#include "kiln/kernels/gemm_prepacked.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kiln/core/dtype.h"
#include "kiln/core/huge_pages.h"
#include "kiln/core/thread_pool.h"
#include "kiln/core/graph.h"
#include "kiln/core/trace.h"
#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/cpu/gemm_driver.h"
#include "kiln/kernels/cpu/gemm_kernels.h"
#include "kiln/kernels/cpu/parallel.h"

namespace kiln {
namespace {

using cpu::GemmTargetKernels;
using cpu::TileEpilogue;
using cpu::ceil_div;
using cpu::run_tasks;

const GemmTargetKernels& kernels_for(SimdTarget t) {
  switch (t) {
    case SimdTarget::kAvx512: return cpu::gemm_kernels_avx512();
    case SimdTarget::kAvx2: return cpu::gemm_kernels_avx2();
    default: return cpu::gemm_kernels_scalar();
  }
}

// The target whose kernels cpu::gemm would pick now (every target has GEMM kernels).
SimdTarget gemm_target() { return active_simd_target(); }

// The packed path a weight of this dtype goes through: cpu::gemm's bf16 path for bf16 (pairs of
// k with AVX512_BF16, else widened to f32), the half-weight path for f16, the f32 path otherwise.
const cpu::PackedPath& path_for(const GemmTargetKernels& kr, DType weight_dtype) {
  if (weight_dtype == DType::kF16) return kr.f16;
  return weight_dtype == DType::kBF16 ? kr.bf16 : kr.f32;
}

// The calling thread's packed-A buffer of 4-byte elements (f32, or bf16 pairs): grows, is reused,
// never freed per call (fresh pages cost ~16 us each to first-touch in these VMs). Read by the
// pool's threads during one call.
uint32_t* a_pack_buffer(int64_t elems) {
  struct Free {
    void operator()(uint32_t* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<uint32_t, Free> mem;
  thread_local int64_t capacity = 0;
  if (elems > capacity) {
    const size_t bytes = (static_cast<size_t>(elems) * 4 + 4095) & ~size_t{4095};
    mem.reset(static_cast<uint32_t*>(std::aligned_alloc(64, bytes)));
    KILN_CHECK_MSG(mem != nullptr, "gemm_prepacked A buffer of {} bytes", bytes);
    capacity = static_cast<int64_t>(bytes / 4);
  }
  return mem.get();
}

// Small-M passes of <= kGemmSmallM rows over W, or MR-row strips of the packed micro-kernel
// (which computes whole strips)? Measured with `kiln bench prepacked` (Zen 4 VM, 2 cores,
// K = N = 1024/2048, 1 and 2 threads) when the passes streamed the unpacked source weight: one
// 8-row pass cost ~0.85 of one 14-row strip, so passes win for m <= 8 and m = 15, 16 (two
// passes vs a 14 + 2 strip pair). Still so over the packed strips: m = 15, K = N = 1024, 1
// thread, 287 us in two passes vs 524 us in strips. Only measured for that 14-row kernel:
// other targets use the passes for m <= 8 only, as cpu::gemm does.
bool prefer_streaming(int64_t m, int64_t mr) {
  if (m <= cpu::kGemmSmallM) return true;
  if (mr != 14) return false;
  const int64_t passes = (m + cpu::kGemmSmallM - 1) / cpu::kGemmSmallM, strips = (m + mr - 1) / mr;
  return passes * 6 < strips * 7;
}

// Rows [i0, i0 + m) of op(A) interleaved (steps, m) for the small-M kernels, for the k steps
// [l0, l1): a[l * m + i] = op(A)[i0 + i][l] as f32, or with pairs the bf16 bits of k = 2l (low
// half) and 2l + 1 (high; +0 past an odd k), rounded to nearest even from an f32 A.
void pack_a_interleaved(const GemmParams& p, int64_t i0, int m, bool pairs, int64_t l0, int64_t l1,
                        uint32_t* a) {
  const int64_t si = p.trans_a ? 1 : p.lda, sk = p.trans_a ? p.lda : 1;  // strides of i and k
  const bool bf = p.a_dtype == DType::kBF16;
  for (int i = 0; i < m; ++i) {
    const auto* a32 = static_cast<const float*>(p.a) + (i0 + i) * si;
    const auto* a16 = static_cast<const uint16_t*>(p.a) + (i0 + i) * si;
    uint32_t* out = a + i;
    if (!pairs) {
      if (bf) {
        for (int64_t l = l0; l < l1; ++l) out[l * m] = static_cast<uint32_t>(a16[l * sk]) << 16;
      } else {
        for (int64_t l = l0; l < l1; ++l) std::memcpy(&out[l * m], &a32[l * sk], 4);
      }
      continue;
    }
    const int64_t whole = std::min(l1, p.k / 2);  // pairs with both k inside
    int64_t l = l0;
    if (bf) {
      for (; l < whole; ++l) out[l * m] = a16[2 * l * sk] | static_cast<uint32_t>(a16[(2 * l + 1) * sk]) << 16;
    } else {
      for (; l < whole; ++l)
        out[l * m] = f32_to_bf16(a32[2 * l * sk]) | static_cast<uint32_t>(f32_to_bf16(a32[(2 * l + 1) * sk])) << 16;
    }
    for (; l < l1; ++l) out[l * m] = bf ? a16[2 * l * sk] : f32_to_bf16(a32[2 * l * sk]);  // odd k's last pair
  }
}

// Decode-like over the packed strips: passes of <= kGemmSmallM rows, each reading the weight once
// in memory order (strip after strip, prefetched ahead), A interleaved (steps, m) per pass (f32,
// or bf16 pairs of k for a weight in pairs); column chunks of whole strips over the threads.
// Measured on the Zen 4 VM (1 thread, K = N = 4096, cold): f32 m = 8 reaches 85-93% of the DRAM
// read rate here against 60-69% streaming the unpacked (n, k) weight, whose 8 A rows (128 KiB)
// miss L1 on every k step (`kiln bench gemm`, the /pk rows).
void gemm_prepacked_small_m(const GemmParams& p, const PackedMatrix& b,
                            const GemmTargetKernels& kr) {
  const bool pairs = b.k_per_step() == 2;
  const GemmTargetKernels::SmallMPackedFn kernel =
      pairs ? kr.small_m_packed_pairs
            : b.weight_dtype() == DType::kF16 ? kr.small_m_packed_half : kr.small_m_packed;
  KILN_CHECK_MSG(kernel != nullptr, "gemm_prepacked: no small-M kernel for this packing");
  const int64_t steps = b.steps(), nstrips = b.num_strips();
  const int threads = num_threads();
  const int64_t chunks = threads == 1 ? 1 : std::min<int64_t>(nstrips, int64_t{4} * threads);
  for (int64_t i0 = 0; i0 < p.m; i0 += cpu::kGemmSmallM) {
    const int m = static_cast<int>(std::min<int64_t>(cpu::kGemmSmallM, p.m - i0));
    uint32_t* a = a_pack_buffer(m * std::max<int64_t>(steps, 1) + 16);
    // Packing A is the call's only serial part otherwise: at m = 8, K = 4096 bf16 pairs from
    // f32 A it took ~8% of a 2-thread call's time while the other thread waited (EPYC VM).
    const int64_t pack_tasks = threads > 1 && m * steps >= 8192 ? threads : 1;
    run_tasks(pack_tasks, [&](int64_t t) {
      pack_a_interleaved(p, i0, m, pairs, steps * t / pack_tasks, steps * (t + 1) / pack_tasks, a);
    });
    TileEpilogue ep;
    ep.alpha = p.alpha;
    ep.beta = p.beta;
    ep.set_last(p, i0, 0);
    run_tasks(chunks, [&](int64_t t) {
      kernel(m, steps, a, b.data(), nstrips * t / chunks, nstrips * (t + 1) / chunks,
             p.c + i0 * p.ldc, p.ldc, p.n, ep);
    });
  }
}

}  // namespace

void PackedMatrix::Free::operator()(uint32_t* p) const {
  std::free(p);
}

PackedMatrix pack_weight_as(const void* w, DType dtype, int64_t out, int64_t in, int64_t ldw) {
  KILN_CHECK_MSG(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16,
                 "pack_weight: weights of dtype {} (f32, bf16 or f16)", dtype_name(dtype));
  KILN_CHECK(out >= 0 && in >= 0);
  if (ldw == 0) ldw = in;
  KILN_CHECK(ldw >= in && (w != nullptr || out * in == 0));
  PackedMatrix pm;
  pm.target_ = gemm_target();
  const cpu::PackedPath& path = path_for(kernels_for(pm.target_), dtype);
  pm.n_ = out;
  pm.k_ = in;
  pm.nr_ = path.nr;
  pm.k_per_step_ = path.k_per_step;
  pm.elem_bytes_ = path.b_elem_bytes;
  pm.weight_dtype_ = dtype;
  const int64_t strips = pm.num_strips(), steps = pm.steps();
  // Weights of 2 MiB or more on transparent huge pages (THP is "madvise" on the dev VMs): the
  // small-M kernels prefetch the strips 64 KiB ahead, and on 4 KiB pages those prefetches cross
  // into pages not yet in the TLB (m = 8, K = N = 4096, cold, 1 thread: 17 -> 26 GB/s).
  const int64_t bytes = std::max<int64_t>(4, strips * pm.nr_ * steps * pm.elem_bytes_);
  const LargeBuffer buf = allocate_large(static_cast<size_t>((bytes + 3) & ~int64_t{3}));
  pm.data_.reset(static_cast<uint32_t*>(buf.ptr));
  KILN_CHECK_MSG(pm.data_ != nullptr, "pack_weight: {} bytes for ({}, {})", buf.bytes, out, in);
  if (strips == 0 || in == 0) return pm;
  GemmParams p;  // B = w stored (n, k): op(B) = wᵀ
  p.n = out;
  p.k = in;
  p.b = w;
  p.ldb = ldw;
  p.b_dtype = dtype;
  p.trans_b = true;
  // Strip groups over the pool: each strip is (steps, nr), whole k (kc = k), so block q of a
  // strip is simply the q-th (kc / k_per_step) x nr slice of it (K blocks have even sizes).
  const int64_t groups = std::min<int64_t>(strips, 4 * num_threads());
  char* dst = reinterpret_cast<char*>(pm.data_.get());
  run_tasks(groups, [&](int64_t g) {
    const int64_t s0 = strips * g / groups, s1 = strips * (g + 1) / groups;
    if (s0 == s1) return;
    const int64_t j0 = s0 * pm.nr_, cols = std::min(out, s1 * pm.nr_) - j0;
    path.pack_b(p, j0, cols, 0, in, dst + s0 * pm.nr_ * steps * pm.elem_bytes_);
  });
  return pm;
}

Status check_gemm_prepacked(const GemmParams& p, const PackedMatrix& b) {
  if (p.n != b.n() || p.k != b.k())
    return invalid_argument(
        "[gemm_prepacked] params want B (n={}, k={}) but the packed matrix is ({}, {})", p.n, p.k,
        b.n(), b.k());
  if (b.n() > 0 && b.nr() == 0)
    return invalid_argument(
        "[gemm_prepacked] the packed matrix ({}, {}) is empty (default-constructed)", b.n(), b.k());
  GemmParams q = p;
  q.b = b.data();
  q.ldb = std::max<int64_t>(1, p.k);
  q.b_dtype = b.weight_dtype() == DType::kF16 ? DType::kF32 : b.weight_dtype();  // shapes only
  q.trans_b = true;
  return check_gemm(q);
}

double gemm_prepacked_bytes(const GemmParams& p, const PackedMatrix& b) {
  GemmParams q = p;
  q.b_dtype = b.weight_dtype();
  return gemm_bytes(q) - static_cast<double>(dtype_nbytes(b.weight_dtype(), p.k * p.n)) +
         static_cast<double>(b.packed_bytes());
}

namespace {
// gemm_io() with the packed weight as B (p.b is null).
std::array<graph::Access, kGemmIoCount> packed_gemm_io(const GemmParams& p, const PackedMatrix& b) {
  std::array<graph::Access, kGemmIoCount> io = gemm_io(p);
  io[2] = graph::reads_bytes(b.data(), b.packed_bytes());
  return io;
}

// The product and its epilogue (bias_grad aside), p.m > 0 and p.n > 0.
void run_prepacked(const GemmParams& p, const PackedMatrix& b) {
  const GemmTargetKernels& kr = kernels_for(b.target());
  const cpu::PackedPath& path = path_for(kr, b.weight_dtype());
  const int64_t mr = path.mr, nr = path.nr, ks = path.k_per_step;
  if (prefer_streaming(p.m, mr)) return gemm_prepacked_small_m(p, b, kr);
  KILN_CHECK(nr == b.nr() && ks == b.k_per_step() && path.b_elem_bytes == b.elem_bytes());
  const cpu::GemmBlocking blk =
      cpu::gemm_blocking(ks == 2 ? cpu::GemmPath::kBF16 : cpu::GemmPath::kF32);
  const int threads = num_threads();
  // K blocks exactly as cpu::gemm cuts them (equal, even sizes), so results are bitwise those of
  // cpu::gemm: an MC x KC block of A in L2, a KC x NR slice of a W strip in L1 while the MR-row
  // strips of the block pass over it. Sizes in 4-byte elements (k_per_step k each).
  const int64_t num_kb = std::max<int64_t>(1, ceil_div(p.k, blk.kc));
  const int64_t kc_block = std::max<int64_t>(2, (ceil_div(p.k, num_kb) + 1) & ~int64_t{1});
  const int64_t num_pc = p.k == 0 ? 1 : ceil_div(p.k, kc_block);
  const int64_t mstrips = ceil_div(p.m, mr), nstrips = b.num_strips(), strip_elems = nr * b.steps();
  auto block_kc = [&](int64_t q) {
    return std::max<int64_t>(0, std::min(kc_block, p.k - q * kc_block));
  };
  auto block_steps = [&](int64_t q) { return ceil_div(block_kc(q), ks); };

  // A, packed once for all tasks: K block after K block, each mstrips strips of (steps, MR).
  uint32_t* apack = a_pack_buffer(mstrips * mr * std::max<int64_t>(b.steps(), 1) + 16);
  auto a_block = [&](int64_t q) { return apack + mstrips * mr * (kc_block / ks) * q; };
  if (p.k > 0) {
    // Parallel only when there is enough to pack: a pool region costs a few us.
    const int64_t groups =
        p.m * p.k >= (int64_t{1} << 16) ? std::min<int64_t>(mstrips, 2 * threads) : 1;
    run_tasks(groups * num_pc, [&](int64_t t) {
      const int64_t q = t / groups, g = t % groups;
      const int64_t s0 = mstrips * g / groups, s1 = mstrips * (g + 1) / groups;
      if (s0 == s1) return;
      path.pack_a(p, s0 * mr, std::min(p.m, s1 * mr) - s0 * mr, q * kc_block, block_kc(q),
                  a_block(q) + s0 * mr * block_steps(q));
    });
  }

  // Tasks: M blocks of MC rows (a multiple of the thread count when there are several), and N
  // chunks so that there are at least ~2 tasks per thread (decode: one M block, N chunks only).
  const int64_t mc_strips = std::max<int64_t>(1, blk.mc / mr);
  int64_t num_ic = ceil_div(mstrips, mc_strips);
  int64_t num_jn = 1;
  if (threads > 1) {
    num_ic = std::min(mstrips, ceil_div(num_ic, threads) * threads);
    if (num_ic < 2 * threads) num_jn = std::min(nstrips, ceil_div(2 * threads, num_ic));
  }
  run_tasks(num_ic * num_jn, [&](int64_t task) {
    const int64_t ic = task / num_jn, jn = task % num_jn;
    const int64_t ms0 = mstrips * ic / num_ic, ms1 = mstrips * (ic + 1) / num_ic;
    const int64_t ns0 = nstrips * jn / num_jn, ns1 = nstrips * (jn + 1) / num_jn;
    if (ms0 == ms1 || ns0 == ns1) return;
    for (int64_t q = 0; q < num_pc; ++q) {
      const int64_t steps = block_steps(q);
      const bool first = q == 0, last = q + 1 == num_pc;
      TileEpilogue ep;
      ep.alpha = p.alpha;
      ep.beta = first ? p.beta : 1.0f;
      const uint32_t* aq = a_block(q);
      for (int64_t ns = ns0; ns < ns1; ++ns) {
        const int64_t col = ns * nr;
        const int nv = static_cast<int>(std::min(nr, p.n - col));
        const char* bq = static_cast<const char*>(b.data()) +
                         (ns * strip_elems + q * (kc_block / ks) * nr) * b.elem_bytes();
        for (int64_t ms = ms0; ms < ms1; ++ms) {
          const int64_t row = ms * mr;
          const int mv = static_cast<int>(std::min(mr, p.m - row));
          if (last) ep.set_last(p, row, col);
          path.kernel(steps, aq + ms * mr * steps, bq, p.c + row * p.ldc + col, p.ldc, mv, nv, ep);
        }
      }
    }
  });
}
}  // namespace

void gemm_prepacked(const GemmParams& p, const PackedMatrix& b) {
  KILN_GRAPH_NODE_IO("gemm", ([p, &b](const graph::Access* io) {
    GemmParams q = p;
    q.c = io[0].mut<float>(); q.a = io[1].ptr; q.bias = io[3].as<float>(); q.residual = io[4].as<float>();
    q.save_pre = io[6].mut<float>();
    q.pre = io[7].as<float>();
    q.bias_grad = io[8].mut<float>();
    gemm_prepacked(q, b);
  }), packed_gemm_io(p, b));
  trace::Scope kiln_trace_(trace::Category::kKernel, "gemm", [&](trace::Event& e) { describe_gemm(e, p); e.algo = "prepacked"; });
  KILN_CHECK_MSG(check_gemm_prepacked(p, b).ok(), "{}", check_gemm_prepacked(p, b).message());
  if (p.m > 0 && p.n > 0) run_prepacked(p, b);
  if (p.bias_grad != nullptr) cpu::gemm_bias_grad(p, 0, p.m, 0, p.k);  // one pass: A is packed for all tasks
}

}  // namespace kiln
