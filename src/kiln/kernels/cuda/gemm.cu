// The CUDA GEMM ladder (launch.h's GemmKernel), each rung behind gemm.h's GemmParams contract (as
// GemmArgs): naive -> coalesced -> shared-memory tiles -> register micro-tiles -> padded
// (conflict-free) shared rows -> tensor cores (mma.sync bf16, f32 accumulate) -> cp.async double
// buffering -> TMA loads into four stages (sm_90). Every rung bounds-checks its edge tiles
// (zero-filled loads, guarded stores), so any m, n, k and leading dims work; the fused epilogue is
// gemm_store() (common.cuh).
#include <cuda.h>  // CUtensorMap and its enums; the encoder comes through the runtime (no -lcuda)

#include "kiln/kernels/cuda/common.cuh"

namespace kiln::cuda {
namespace {
// A(i, l) of op(A) (m, k) and B(l, j) of op(B) (k, n), as f32.
__device__ __forceinline__ float a_at(const GemmArgs& p, int64_t i, int64_t l) {
  return load_operand(p.a, p.a_bf16, p.trans_a ? l * p.lda + i : i * p.lda + l);
}
__device__ __forceinline__ float b_at(const GemmArgs& p, int64_t l, int64_t j) {
  return load_operand(p.b, p.b_bf16, p.trans_b ? j * p.ldb + l : l * p.ldb + j);
}
// The raw bf16 bits of A(i, l) / B(l, j), 0 outside the matrix (the tensor-core rungs).
__device__ __forceinline__ uint16_t a_bits(const GemmArgs& p, int64_t i, int64_t l) {
  if (i >= p.m || l >= p.k) return 0;
  return static_cast<const uint16_t*>(p.a)[p.trans_a ? l * p.lda + i : i * p.lda + l];
}
__device__ __forceinline__ uint16_t b_bits(const GemmArgs& p, int64_t l, int64_t j) {
  if (l >= p.k || j >= p.n) return 0;
  return static_cast<const uint16_t*>(p.b)[p.trans_b ? j * p.ldb + l : l * p.ldb + j];
}
}  // namespace

// ---- rung 1: one thread per C element, threadIdx.x along m ---------------------------------
// Neighbouring threads read different rows of A and write C a row apart: no coalescing.
namespace {
// C[i, j] from a dot product over k straight out of global memory (rungs 1 and 2).
__device__ __forceinline__ void gemm_element(const GemmArgs& p, int64_t i, int64_t j) {
  if (i >= p.m || j >= p.n) return;
  float acc = 0.0f;
  for (int64_t l = 0; l < p.k; ++l) acc += a_at(p, i, l) * b_at(p, l, j);
  gemm_store(p, i, j, acc);
}
}  // namespace

__global__ void gemm_naive(GemmArgs p) {
  gemm_element(p, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
               static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y);
}

// ---- rung 2: threadIdx.x along n -------------------------------------------------------------
// A warp shares one A element (a broadcast) and reads 32 consecutive B elements (row-major B).
__global__ void gemm_coalesced(GemmArgs p) {
  gemm_element(p, static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y,
               static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
}

// ---- rung 3: T x T tiles of A and B in shared memory, one C element per thread ---------------
// Each element loaded from global memory is reused T times from shared memory.
template <int T>
__global__ void gemm_smem_tiled(GemmArgs p) {
  __shared__ float as[T][T];  // (m, k) tile
  __shared__ float bs[T][T];  // (k, n) tile
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * T + ty;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * T + tx;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < p.k; k0 += T) {
    as[ty][tx] = (i < p.m && k0 + tx < p.k) ? a_at(p, i, k0 + tx) : 0.0f;
    bs[ty][tx] = (k0 + ty < p.k && j < p.n) ? b_at(p, k0 + ty, j) : 0.0f;
    __syncthreads();
    for (int l = 0; l < T; ++l) acc += as[ty][l] * bs[l][tx];
    __syncthreads();
  }
  if (i < p.m && j < p.n) gemm_store(p, i, j, acc);
}

// ---- rungs 4 and 5: register micro-tiles (PAD = 0), then padded shared rows (PAD > 0) -------
// A BM x BN block tile; each of the (BM/TM)(BN/TN) threads owns TM x TN C elements, strided by
// BM/TM rows and BN/TN columns so that a warp's shared reads hit consecutive words and its C
// stores are coalesced. Both staged tiles are k-major (as[k][m], bs[k][n]) so the inner loop
// reads a column of each; the staging loads walk each operand's contiguous dimension, which
// for a k-contiguous operand makes the stores stride BM (or BN) words: bank conflicts that the
// PAD extra words per row remove.
template <int BM, int BN, int BK, int TM, int TN, int PAD>
__global__ void __launch_bounds__((BM / TM) * (BN / TN), 1) gemm_register_tiled(GemmArgs p) {
  constexpr int kThreads = (BM / TM) * (BN / TN);
  constexpr int kRowStep = BM / TM, kColStep = BN / TN;
  __shared__ float as[BK][BM + PAD];
  __shared__ float bs[BK][BN + PAD];
  const int tid = threadIdx.x;
  const int tr = tid / kColStep, tc = tid % kColStep;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * BM;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * BN;
  float acc[TM][TN] = {};
  for (int64_t k0 = 0; k0 < p.k; k0 += BK) {
    for (int e = tid; e < BM * BK; e += kThreads) {
      // k fastest when A is row-major (k-contiguous), m fastest when A is stored transposed.
      const int r = p.trans_a ? e % BM : e / BK, l = p.trans_a ? e / BM : e % BK;
      const int64_t gi = row0 + r, gl = k0 + l;
      as[l][r] = (gi < p.m && gl < p.k) ? a_at(p, gi, gl) : 0.0f;
    }
    for (int e = tid; e < BN * BK; e += kThreads) {
      // n fastest when B is row-major (k, n), k fastest when B is stored (n, k).
      const int c = p.trans_b ? e / BK : e % BN, l = p.trans_b ? e % BK : e / BN;
      const int64_t gj = col0 + c, gl = k0 + l;
      bs[l][c] = (gj < p.n && gl < p.k) ? b_at(p, gl, gj) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int l = 0; l < BK; ++l) {
      float a[TM], b[TN];
#pragma unroll
      for (int x = 0; x < TM; ++x) a[x] = as[l][tr + x * kRowStep];
#pragma unroll
      for (int y = 0; y < TN; ++y) b[y] = bs[l][tc + y * kColStep];
#pragma unroll
      for (int x = 0; x < TM; ++x)
#pragma unroll
        for (int y = 0; y < TN; ++y) acc[x][y] += a[x] * b[y];
    }
    __syncthreads();
  }
#pragma unroll
  for (int x = 0; x < TM; ++x) {
    const int64_t i = row0 + tr + x * kRowStep;
    if (i >= p.m) continue;
#pragma unroll
    for (int y = 0; y < TN; ++y) {
      const int64_t j = col0 + tc + y * kColStep;
      if (j < p.n) gemm_store(p, i, j, acc[x][y]);
    }
  }
}

// ---- rungs 6 and 7: tensor cores --------------------------------------------------------------
namespace {
// D = A·B + D for one 16x8 tile over k16: A (16x16, row) in 4 registers of bf16 pairs, B (16x8,
// col) in 2, D (16x8 f32) in 4. Lane l holds, with g = l / 4 and t = l % 4 (PTX ISA "matrix
// fragments for mma.m16n8k16"): a0 = A[g][2t, 2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..],
// a3 = A[g+8][2t+8..]; b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]; d0, d1 = D[g][2t, 2t+1],
// d2, d3 = D[g+8][2t, 2t+1].
__device__ __forceinline__ void mma_bf16_16x8x16(float d[4], const uint32_t a[4],
                                                 const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// A shared-memory pointer as the 32-bit address PTX's shared-state instructions take.
__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16 bytes global -> shared, asynchronously; bytes past src_bytes (0..16) are zero-filled.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Shared tiles of one stage: as (BM, BK + pad) and bs (BN, BK + pad), both k-contiguous bf16.
constexpr int kMmaRow = kGemmMmaBk + kGemmMmaPad;

// Plain loads of the (BM, BK) tile of A and the (BN, BK) tile of B^T at k0 (any layout).
template <int BM, int BN, int BK>
__device__ __forceinline__ void mma_load_tile(const GemmArgs& p, uint16_t* as, uint16_t* bs,
                                              int64_t row0, int64_t col0, int64_t k0) {
  for (int e = threadIdx.x; e < BM * BK; e += kGemmMmaThreads) {
    const int r = p.trans_a ? e % BM : e / BK, l = p.trans_a ? e / BM : e % BK;
    as[r * kMmaRow + l] = a_bits(p, row0 + r, k0 + l);
  }
  for (int e = threadIdx.x; e < BN * BK; e += kGemmMmaThreads) {
    const int c = p.trans_b ? e / BK : e % BN, l = p.trans_b ? e % BK : e / BN;
    bs[c * kMmaRow + l] = b_bits(p, k0 + l, col0 + c);
  }
}

// cp.async copies of the same tiles for A row-major and B stored (n, k), both with leading dims
// that are multiples of 8 elements and 16-byte aligned bases: 8 bf16 per copy, the k tail of a
// row zero-filled through src_bytes, rows past m (or n) all zeros. load_rows_async stages ROWS
// k-contiguous rows [row0, row0 + ROWS) of a (num_rows, k) matrix, columns [k0, k0 + BK).
template <int ROWS, int BK>
__device__ __forceinline__ void load_rows_async(uint16_t* dst, const uint16_t* src, int64_t ld,
                                                int64_t row0, int64_t num_rows, int64_t k,
                                                int64_t k0) {
  constexpr int kChunksPerRow = BK / 8;
  for (int e = threadIdx.x; e < ROWS * kChunksPerRow; e += kGemmMmaThreads) {
    const int r = e / kChunksPerRow, l = (e % kChunksPerRow) * 8;
    const int64_t gr = row0 + r, gl = k0 + l;
    const int64_t left = gr < num_rows ? k - gl : 0;
    const int bytes = left <= 0 ? 0 : left >= 8 ? 16 : static_cast<int>(2 * left);
    cp_async_16(dst + r * kMmaRow + l, bytes > 0 ? src + gr * ld + gl : src, bytes);
  }
}
template <int BM, int BN, int BK>
__device__ __forceinline__ void mma_load_tile_async(const GemmArgs& p, uint16_t* as, uint16_t* bs,
                                                    int64_t row0, int64_t col0, int64_t k0) {
  load_rows_async<BM, BK>(as, static_cast<const uint16_t*>(p.a), p.lda, row0, p.m, p.k, k0);
  load_rows_async<BN, BK>(bs, static_cast<const uint16_t*>(p.b), p.ldb, col0, p.n, p.k, k0);
}

// Where element (r, k) of a staged k-contiguous tile sits: padded rows (the mma and cp.async
// rungs), or dense 64-byte rows with TMA's 64-byte swizzle (launch.h: kGemmTmaStages).
struct PaddedRows {
  static __device__ __forceinline__ int at(int r, int k) { return r * kMmaRow + k; }
};
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // the TMA rung's only
struct Swizzled64 {
  static_assert(kGemmMmaBk == 32, "64-byte rows: four 16-byte chunks of 8 bf16");
  static __device__ __forceinline__ int at(int r, int k) { return gemm_tma_smem_index(r, k); }
};
#endif
// Two neighbouring bf16 (k even: both in one 16-byte chunk) as one 32-bit fragment register.
template <class Layout>
__device__ __forceinline__ uint32_t pair_at(const uint16_t* tile, int r, int k) {
  return *reinterpret_cast<const uint32_t*>(tile + Layout::at(r, k));
}

// One stage's BK of MMAs for this warp's (WM, WN) = (BM / warps_m, BN / warps_n) tile.
template <int MT, int NT, int BK, class Layout = PaddedRows>
__device__ __forceinline__ void mma_compute_stage(float (&acc)[MT][NT][4], const uint16_t* as,
                                                  const uint16_t* bs, int warp_row, int warp_col) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int ks = 0; ks < BK; ks += 16) {
    uint32_t a[MT][4], b[NT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int r = warp_row + mt * 16 + g, k = ks + 2 * t;
      a[mt][0] = pair_at<Layout>(as, r, k);
      a[mt][1] = pair_at<Layout>(as, r + 8, k);
      a[mt][2] = pair_at<Layout>(as, r, k + 8);
      a[mt][3] = pair_at<Layout>(as, r + 8, k + 8);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int r = warp_col + nt * 8 + g, k = ks + 2 * t;
      b[nt][0] = pair_at<Layout>(bs, r, k);
      b[nt][1] = pair_at<Layout>(bs, r, k + 8);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_bf16_16x8x16(acc[mt][nt], a[mt], b[nt]);
  }
}
// The warp's accumulators through the fused epilogue into C, from (row0, col0) of its tile.
template <int MT, int NT>
__device__ __forceinline__ void mma_store_tile(const GemmArgs& p, const float (&acc)[MT][NT][4],
                                               int64_t row0, int64_t col0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int64_t i = row0 + mt * 16 + g + (r >= 2 ? 8 : 0);
        const int64_t j = col0 + nt * 8 + 2 * t + (r % 2);
        if (i < p.m && j < p.n) gemm_store(p, i, j, acc[mt][nt][r]);
      }
    }
  }
}
}  // namespace

// BM x BN block tile, 8 warps as kGemmMmaWarpsM x kGemmMmaWarpsN, each warp (BM/2) x (BN/4) =
// MT x NT mma tiles. STAGES = 1: plain loads, one buffer; STAGES = 2: cp.async into two
// buffers, the next k tile in flight while the tensor cores work on this one.
template <int BM, int BN, int BK, int STAGES>
__global__ void __launch_bounds__(kGemmMmaThreads, 1) gemm_mma_bf16(GemmArgs p) {
  static_assert(BK % 16 == 0 && BK % 8 == 0 && BK == kGemmMmaBk, "stage layout is kMmaRow wide");
  constexpr int WM = BM / kGemmMmaWarpsM, WN = BN / kGemmMmaWarpsN;
  constexpr int MT = WM / 16, NT = WN / 8;
  constexpr int kStageElems = (BM + BN) * kMmaRow;
  extern __shared__ __align__(16) uint16_t smem[];
  const int warp = threadIdx.x / 32;
  const int warp_row = (warp / kGemmMmaWarpsN) * WM, warp_col = (warp % kGemmMmaWarpsN) * WN;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * BM;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * BN;
  float acc[MT][NT][4] = {};
  const int64_t num_tiles = (p.k + BK - 1) / BK;
  if constexpr (STAGES == 1) {
    uint16_t* as = smem;
    uint16_t* bs = smem + BM * kMmaRow;
    for (int64_t kt = 0; kt < num_tiles; ++kt) {
      mma_load_tile<BM, BN, BK>(p, as, bs, row0, col0, kt * BK);
      __syncthreads();
      mma_compute_stage<MT, NT, BK>(acc, as, bs, warp_row, warp_col);
      __syncthreads();
    }
  } else {
    static_assert(STAGES == 2, "two buffers");
    if (num_tiles > 0) {
      mma_load_tile_async<BM, BN, BK>(p, smem, smem + BM * kMmaRow, row0, col0, 0);
      cp_async_commit();
    }
    for (int64_t kt = 0; kt < num_tiles; ++kt) {
      uint16_t* cur = smem + (kt % 2) * kStageElems;
      if (kt + 1 < num_tiles) {
        uint16_t* next = smem + ((kt + 1) % 2) * kStageElems;
        mma_load_tile_async<BM, BN, BK>(p, next, next + BM * kMmaRow, row0, col0, (kt + 1) * BK);
        cp_async_commit();
        cp_async_wait<1>();  // this tile's group is done; the next one may still be in flight
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
      mma_compute_stage<MT, NT, BK>(acc, cur, cur + BM * kMmaRow, warp_row, warp_col);
      __syncthreads();  // everyone is done reading `cur` before it is refilled
    }
  }
  mma_store_tile(p, acc, row0 + warp_row, col0 + warp_col);
}

// ---- rung 8: TMA loads into four stages (sm_90) -----------------------------------------------
namespace {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// An mbarrier expecting one arrival (the thread that starts the copies) per phase.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(bar)));
}
// The arrival, and the bytes the copies will complete on the barrier before its phase ends.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
// Until the barrier's phase with this parity has completed (every byte landed).
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
// One 2-D box of the tensor map, at (x = k, y = row), into shared memory; its bytes complete on
// `bar`. Out-of-range elements (past m, n or k) arrive as zeros and still count.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int x, int y,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(smem_u32(bar))
      : "memory");
}
#endif
}  // namespace

// BM x BN block tile and warps as gemm_mma_bf16; A (m, k) row-major and B stored (n, k), each
// described by a tensor map with a (rows, BK) box and the 64-byte swizzle. Thread 0 starts the
// copies of STAGES k tiles; every warp waits for stage kt % STAGES's barrier, computes, and after
// the block has finished reading the stage, thread 0 refills it with tile kt + STAGES.
template <int BM, int BN, int BK, int STAGES>
__global__ void __launch_bounds__(kGemmMmaThreads, 1)
    gemm_mma_bf16_tma(GemmArgs p, const __grid_constant__ CUtensorMap a_map,
                      const __grid_constant__ CUtensorMap b_map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int WM = BM / kGemmMmaWarpsM, WN = BN / kGemmMmaWarpsN;
  constexpr int MT = WM / 16, NT = WN / 8;
  constexpr int kAElems = BM * BK, kStageElems = (BM + BN) * BK;
  constexpr uint32_t kStageBytes = 2 * kStageElems;
  static_assert(kStageBytes == kGemmTmaStageBytes && (2 * kAElems) % 1024 == 0,
                "stages and the B tile stay 1024-byte aligned");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[STAGES];
  uint16_t* smem = reinterpret_cast<uint16_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
  const int warp = threadIdx.x / 32;
  const int warp_row = (warp / kGemmMmaWarpsN) * WM, warp_col = (warp % kGemmMmaWarpsN) * WN;
  const int row0 = static_cast<int>(blockIdx.y) * BM, col0 = static_cast<int>(blockIdx.x) * BN;
  const int64_t num_tiles = (p.k + BK - 1) / BK;
  const auto issue = [&](int stage, int64_t kt) {
    uint16_t* as = smem + stage * kStageElems;
    mbarrier_arrive_expect_tx(&full[stage], kStageBytes);
    tma_load_2d(as, &a_map, static_cast<int>(kt * BK), row0, &full[stage]);
    tma_load_2d(as + kAElems, &b_map, static_cast<int>(kt * BK), col0, &full[stage]);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) mbarrier_init(&full[s]);
    // The initialized barriers visible to the async proxy (TMA) before any copy names them.
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int64_t kt = 0; kt < STAGES && kt < num_tiles; ++kt) issue(static_cast<int>(kt), kt);
  float acc[MT][NT][4] = {};
  for (int64_t kt = 0; kt < num_tiles; ++kt) {
    const int stage = static_cast<int>(kt % STAGES);
    mbarrier_wait(&full[stage], static_cast<uint32_t>((kt / STAGES) & 1));
    const uint16_t* as = smem + stage * kStageElems;
    mma_compute_stage<MT, NT, BK, Swizzled64>(acc, as, as + kAElems, warp_row, warp_col);
    __syncthreads();  // the whole block is done reading this stage before TMA overwrites it
    if (threadIdx.x == 0 && kt + STAGES < num_tiles) issue(stage, kt + STAGES);
  }
  mma_store_tile(p, acc, row0 + warp_row, col0 + warp_col);
#else
  __trap();  // sm_90 only: gemm_supports refuses the rung on older devices
#endif
}

namespace {
using TensorMapEncoder = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                      const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                      const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                      CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
// cuTensorMapEncodeTiled from the driver, through the runtime (null where the driver lacks it).
TensorMapEncoder tensor_map_encoder() {
  static const TensorMapEncoder fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return static_cast<TensorMapEncoder>(nullptr);
    return reinterpret_cast<TensorMapEncoder>(f);
  }();
  return fn;
}
// A (rows, cols) bf16 matrix with row stride ld elements, read in (box_rows, BK) boxes.
bool encode_rows(CUtensorMap* map, const void* base, int64_t rows, int64_t cols, int64_t ld,
                 int box_rows) {
  const TensorMapEncoder encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};  // bytes, dim 1
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kGemmMmaBk), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides,
                box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_64B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

cudaError_t launch_gemm_tma(const GemmArgs& p, dim3 grid, dim3 block, size_t smem) {
  CUtensorMap a_map{}, b_map{};
  if (!encode_rows(&a_map, p.a, p.m, p.k, p.lda, kGemmMmaBm) ||
      !encode_rows(&b_map, p.b, p.n, p.k, p.ldb, kGemmMmaBn))
    return cudaErrorNotSupported;
  const auto kernel = gemm_mma_bf16_tma<kGemmMmaBm, kGemmMmaBn, kGemmMmaBk, kGemmTmaStages>;
  if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(smem));
      e != cudaSuccess)
    return e;
  kernel<<<grid, block, smem, launch_stream()>>>(p, a_map, b_map);
  return cudaGetLastError();
}
}  // namespace

// ---- launcher (checked params: kernels_cuda.cpp) ---------------------------------------------
cudaError_t launch_gemm(const GemmArgs& p, GemmKernel kernel) {
  const LaunchConfig c = gemm_launch(kernel, p.m, p.n);
  const dim3 grid = grid_of(c), block = block_of(c);
  const size_t smem = static_cast<size_t>(c.smem_bytes);
  switch (kernel) {
    case GemmKernel::kNaive:
      gemm_naive<<<grid, block, 0, launch_stream()>>>(p);
      break;
    case GemmKernel::kCoalesced:
      gemm_coalesced<<<grid, block, 0, launch_stream()>>>(p);
      break;
    case GemmKernel::kSmemTiled:
      gemm_smem_tiled<kGemmSmemTile><<<grid, block, 0, launch_stream()>>>(p);
      break;
    case GemmKernel::kRegisterTiled:
      gemm_register_tiled<kGemmRegBm, kGemmRegBn, kGemmRegBk, kGemmRegTm, kGemmRegTn, 0>
          <<<grid, block, 0, launch_stream()>>>(p);
      break;
    case GemmKernel::kPadded:
      gemm_register_tiled<kGemmRegBm, kGemmRegBn, kGemmRegBk, kGemmRegTm, kGemmRegTn, kGemmRegPad>
          <<<grid, block, 0, launch_stream()>>>(p);
      break;
    case GemmKernel::kMma:
      gemm_mma_bf16<kGemmMmaBm, kGemmMmaBn, kGemmMmaBk, 1>
          <<<grid, block, smem, launch_stream()>>>(p);
      break;
    case GemmKernel::kMmaCpAsync:
      gemm_mma_bf16<kGemmMmaBm, kGemmMmaBn, kGemmMmaBk, 2>
          <<<grid, block, smem, launch_stream()>>>(p);
      break;
    case GemmKernel::kMmaTma:
      return launch_gemm_tma(p, grid, block, smem);
    case GemmKernel::kAuto:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace kiln::cuda
