// The fp16-arithmetic GEMM's checks, its reference and the choice between the AVX512-FP16 kernel
// (cpu/gemm_f16_avx512fp16.cpp) and the widened f32 GEMM (gemm_f16.h).
#include "kiln/kernels/gemm_f16.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kiln/core/cpu_features.h"
#include "kiln/core/dtype.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/cpu/gemm_f16_kernel.h"
#include "kiln/kernels/cpu/parallel.h"
#include "kiln/kernels/gemm.h"

namespace kiln {

Status check_gemm_f16(const GemmF16Params& p) {
  if (p.m < 0 || p.n < 0 || p.k < 0)
    return invalid_argument("[gemm_f16] negative size m={} n={} k={}", p.m, p.n, p.k);
  if (p.lda < p.k || p.ldb < p.k || p.ldc < p.n)
    return invalid_argument("[gemm_f16] leading dims lda={} ldb={} (>= k={}), ldc={} (>= n={})",
                            p.lda, p.ldb, p.k, p.ldc, p.n);
  if (p.chunk < 1 || p.chunk > 4096)
    return invalid_argument("[gemm_f16] chunk {}: 1..4096 k steps summed in fp16", p.chunk);
  if (p.m > 0 && p.n > 0 && (p.c == nullptr || (p.k > 0 && (p.a == nullptr || p.b == nullptr))))
    return invalid_argument("[gemm_f16] null operand (a={}, b={}, c={})",
                            static_cast<const void*>(p.a), static_cast<const void*>(p.b),
                            static_cast<const void*>(p.c));
  return {};
}

namespace ref {
void gemm_f16(const GemmF16Params& p) {
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      float acc = 0.0f;
      for (int64_t l = 0; l < p.k; ++l)
        acc += f16_to_f32(p.a[i * p.lda + l]) * f16_to_f32(p.b[j * p.ldb + l]);
      p.c[i * p.ldc + j] = acc;
    }
}
}  // namespace ref

namespace cpu {

bool gemm_f16_native() {
  return cpu_features().avx512_fp16 && active_simd_target() >= SimdTarget::kAvx512;
}

const char* gemm_f16_path_name() {
  return gemm_f16_native() ? "avx512fp16 vfmadd231ph 12x64 micro-kernel, fp16 sums over chunks of "
                             "k steps added into f32"
                           : "halves widened to f32, the f32 GEMM (no AVX512-FP16 here)";
}

namespace {
// K block: a multiple of the chunk near 512 k steps (the A strip, 12 x 512 words = 24 KiB, stays
// in L1 while a group of B micro-panels of 64 KiB each streams from L2).
constexpr int64_t kKcTarget = 512;
// M block: 20 strips, 240 rows (A block of 480 KiB in L2 at KC = 512).
constexpr int64_t kMcStrips = 20;
// B micro-panels run as a group against each A strip (kiln's GEMM order, gemm_cpu.h).
constexpr int64_t kGroup = 8;

int64_t block_k(int chunk) {
  return chunk >= kKcTarget ? chunk : kKcTarget / chunk * chunk;
}

// `count` stored rows of halves (rows ld apart, from column k0 on) into ceil(count / W) strips of
// (kc, W) elements, element (k, i) = f(row i's k); rows past the end are zero. The A strips
// (W = 12, each half twice in a 32-bit word) and the B micro-panels (W = 64 rows of the stored
// (n, k) B, i.e. columns of op(B)) are both this transposing copy.
template <int W, class T, class F>
void pack_strips(const uint16_t* src, int64_t ld, int64_t count, int64_t k0, int64_t kc, T* dst,
                 F f) {
  for (int64_t s = 0; s * W < count; ++s) {
    T* strip = dst + s * kc * W;
    for (int i = 0; i < W; ++i) {
      const int64_t r = s * W + i;
      if (r >= count) {
        for (int64_t k = 0; k < kc; ++k) strip[k * W + i] = T{0};
        continue;
      }
      const uint16_t* row = src + r * ld + k0;
      for (int64_t k = 0; k < kc; ++k) strip[k * W + i] = f(row[k]);
    }
  }
}

void pack_a(const GemmF16Params& p, int64_t i0, int64_t rows, int64_t k0, int64_t kc,
            uint32_t* dst) {
  pack_strips<kF16Mr>(p.a + i0 * p.lda, p.lda, rows, k0, kc, dst,
                      [](uint16_t h) { return h * 0x10001u; });
}

void pack_b(const GemmF16Params& p, int64_t j0, int64_t cols, int64_t k0, int64_t kc,
            uint16_t* dst) {
  pack_strips<kF16Nr>(p.b + j0 * p.ldb, p.ldb, cols, k0, kc, dst, [](uint16_t h) { return h; });
}

template <class T>
struct Aligned {
  explicit Aligned(size_t n)
      : p(static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64))) {
    KILN_CHECK_MSG(p != nullptr, "gemm_f16: {} bytes of packing", n * sizeof(T));
  }
  ~Aligned() { std::free(p); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  T* p;
};

// The packed path around the AVX512-FP16 micro-kernel: K blocks -> B packed for all columns
// -> M blocks of packed A per task -> 12 x 64 tiles, each tile's f32 sum stored (first K block)
// or added into C.
void gemm_f16_packed(const GemmF16Params& p) {
  const int64_t kc_block = block_k(p.chunk);
  const int64_t num_kb = p.k == 0 ? 1 : ceil_div(p.k, kc_block);
  const int64_t nstrips = ceil_div(p.n, kF16Nr), mstrips = ceil_div(p.m, kF16Mr);
  const int threads = num_threads();
  // B for every K block and column, packed once, over the pool: K block q at q * kc_block * n_pad.
  const int64_t n_pad = nstrips * kF16Nr;
  Aligned<uint16_t> bpack(static_cast<size_t>(std::max<int64_t>(1, num_kb * kc_block * n_pad)));
  const int64_t b_groups = std::min<int64_t>(nstrips, 4 * threads);
  run_tasks(num_kb * b_groups, [&](int64_t t) {
    const int64_t q = t / b_groups, g = t % b_groups;
    const int64_t s0 = nstrips * g / b_groups, s1 = nstrips * (g + 1) / b_groups;
    const int64_t k0 = q * kc_block, kc = std::max<int64_t>(0, std::min(kc_block, p.k - k0));
    if (s0 < s1)
      pack_b(p, s0 * kF16Nr, std::min(p.n, s1 * kF16Nr) - s0 * kF16Nr, k0, kc,
             bpack.p + q * kc_block * n_pad + s0 * kc * kF16Nr);
  });
  // Tasks: M blocks, and N chunks when there are fewer blocks than 2 per thread.
  const int64_t num_ic = ceil_div(mstrips, kMcStrips);
  const int64_t num_jn =
      num_ic >= 2 * threads ? 1 : std::min(nstrips, ceil_div(2 * threads, num_ic));
  run_tasks(num_ic * num_jn, [&](int64_t task) {
    const int64_t ic = task / num_jn, jn = task % num_jn;
    const int64_t ms0 = ic * kMcStrips, ms1 = std::min(mstrips, ms0 + kMcStrips);
    const int64_t ns0 = nstrips * jn / num_jn, ns1 = nstrips * (jn + 1) / num_jn;
    if (ns0 == ns1) return;
    Aligned<uint32_t> apack(static_cast<size_t>((ms1 - ms0) * kF16Mr * kc_block));
    alignas(64) float tile[kF16Mr * kF16Nr];
    for (int64_t q = 0; q < num_kb; ++q) {
      const int64_t k0 = q * kc_block, kc = std::max<int64_t>(0, std::min(kc_block, p.k - k0));
      const int64_t row0 = ms0 * kF16Mr;
      pack_a(p, row0, std::min(p.m, ms1 * kF16Mr) - row0, k0, kc, apack.p);
      const uint16_t* bq = bpack.p + q * kc_block * n_pad;
      for (int64_t nb = ns0; nb < ns1; nb += kGroup)
        for (int64_t ms = ms0; ms < ms1; ++ms)
          for (int64_t ns = nb; ns < std::min(ns1, nb + kGroup); ++ns) {
            gemm_f16_micro_kernel_avx512fp16(kc, p.chunk, apack.p + (ms - ms0) * kc * kF16Mr,
                                             bq + ns * kc * kF16Nr, tile);
            const int64_t row = ms * kF16Mr, col = ns * kF16Nr;
            const int64_t mv = std::min<int64_t>(kF16Mr, p.m - row),
                          nv = std::min<int64_t>(kF16Nr, p.n - col);
            for (int64_t i = 0; i < mv; ++i) {
              float* c = p.c + (row + i) * p.ldc + col;
              const float* t = tile + i * kF16Nr;
              if (q == 0) {
                std::memcpy(c, t, sizeof(float) * static_cast<size_t>(nv));
              } else {
                for (int64_t j = 0; j < nv; ++j) c[j] += t[j];
              }
            }
          }
    }
  });
}

// Widens rows x cols halves (rows ld apart) into a dense f32 matrix, over the pool.
std::vector<float> widen(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < cols; ++c)
        out[static_cast<size_t>(r * cols + c)] = f16_to_f32(src[r * ld + c]);
  });
  return out;
}
}  // namespace

void gemm_f16(const GemmF16Params& p) {
  KILN_CHECK_MSG(check_gemm_f16(p).ok(), "{}", check_gemm_f16(p).message());
  if (p.m == 0 || p.n == 0) return;
  if (gemm_f16_native()) return gemm_f16_packed(p);
  if (p.k == 0) {  // an empty sum: zeros (the f32 GEMM takes no empty operands)
    for (int64_t i = 0; i < p.m; ++i) std::fill_n(p.c + i * p.ldc, p.n, 0.0f);
    return;
  }
  const std::vector<float> a = widen(p.a, p.m, p.k, p.lda), b = widen(p.b, p.n, p.k, p.ldb);
  GemmParams g;
  g.m = p.m, g.n = p.n, g.k = p.k;
  g.a = a.data(), g.lda = p.k;
  g.b = b.data(), g.ldb = p.k, g.trans_b = true;
  g.c = p.c, g.ldc = p.ldc;
  cpu::gemm(g);
}

}  // namespace cpu
}  // namespace kiln
