// The launch configuration (grid, threads per block, dynamic shared memory) of every CUDA kernel,
// as plain host C++: the .cu launchers launch exactly what these functions return, and the
// catalog (cuda_catalog.cpp) reports the same numbers on any machine, CUDA built or not.
// Tile sizes are the kernels' template arguments; each constant says why it was chosen (all
// picked on paper for sm_80/sm_90 — 48 KiB of static shared memory per block, 64K registers
// per SM — not yet tuned on a GPU).
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>

namespace kiln::cuda {

struct LaunchConfig {
  int64_t grid_x = 1, grid_y = 1, grid_z = 1;
  int threads = 0;               // per block (1-D blocks, or 2-D tiled ones flattened)
  int block_x = 0, block_y = 1;  // the block's shape (block_x · block_y = threads)
  int64_t smem_bytes = 0;        // dynamic shared memory per block
  int64_t blocks() const { return grid_x * grid_y * grid_z; }
};

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// ---- GEMM: the ladder, each rung a kernel one can select (bench/, tests) ---------------------
enum class GemmKernel {
  kNaive,          // one thread per C element, threadIdx.x along m: uncoalesced
  kCoalesced,      // threadIdx.x along n: a warp reads one B row segment and writes one C run
  kSmemTiled,      // 32x32 tiles of A and B staged in shared memory
  kRegisterTiled,  // 128x128 block tile, 8x8 micro-tile of C per thread in registers
  kPadded,         // the same with padded shared-memory rows (no bank conflicts on the stores)
  kMma,            // tensor cores: mma.sync m16n8k16 bf16 -> f32, 128x128x32 block tile
  kMmaCpAsync,     // the same, tiles fetched with cp.async into two buffers (sm_80+)
  kMmaTma,         // the same, tiles fetched by the Tensor Memory Accelerator into 4 stages (sm_90)
  kAuto,           // the fastest measured that supports the params (kMmaCpAsync > kMma > kPadded)
};
inline constexpr GemmKernel kGemmLadder[] = {
    GemmKernel::kNaive,  GemmKernel::kCoalesced, GemmKernel::kSmemTiled,  GemmKernel::kRegisterTiled,
    GemmKernel::kPadded, GemmKernel::kMma,       GemmKernel::kMmaCpAsync, GemmKernel::kMmaTma};

// Tile of the shared-memory rung: 32x32 threads (1024, the block maximum), one C element each.
inline constexpr int kGemmSmemTile = 32;
// Register-tiled rungs: 256 threads each own an 8x8 C micro-tile of a 128x128 block tile; BK = 8
// keeps the two staged tiles at 8 KiB so several blocks fit an SM.
inline constexpr int kGemmRegBm = 128, kGemmRegBn = 128, kGemmRegBk = 8, kGemmRegTm = 8,
                     kGemmRegTn = 8;
inline constexpr int kGemmRegThreads = (kGemmRegBm / kGemmRegTm) * (kGemmRegBn / kGemmRegTn);
// The padded rung's extra floats per shared row: a warp's staging stores walk 8 k values of 4
// rows (k-contiguous operand) at word k·(BM + 4) + r, i.e. bank 4k + r: all 32 distinct.
inline constexpr int kGemmRegPad = 4;
// Tensor-core rungs: 8 warps as 2 (m) x 4 (n), each warp a 64x32 tile = 4x4 mma tiles of 16x8;
// BK = 32 is two k16 steps per stage. Shared rows are padded by 8 bf16 (16 bytes): row stride
// 40 bf16 = 20 words puts the 8 rows a fragment load touches in 8 distinct 4-bank groups.
inline constexpr int kGemmMmaBm = 128, kGemmMmaBn = 128, kGemmMmaBk = 32, kGemmMmaPad = 8;
inline constexpr int kGemmMmaWarpsM = 2, kGemmMmaWarpsN = 4;
inline constexpr int kGemmMmaThreads = 32 * kGemmMmaWarpsM * kGemmMmaWarpsN;
inline constexpr int64_t kGemmMmaStageBytes =
    int64_t{2} * (kGemmMmaBm + kGemmMmaBn) * (kGemmMmaBk + kGemmMmaPad);  // bf16: 2 bytes

// The TMA rung (sm_90): the same 128x128x32 block tile and warps as the mma rungs, its tiles
// copied by the Tensor Memory Accelerator: one thread starts a 2-D tile copy per operand and stage
// (a CUtensorMap describes the matrix: dims, row stride, box, swizzle), an mbarrier in shared
// memory counts the bytes as they land, and the warps wait on it. Four stages keep three tiles in
// flight while the tensor cores work on the fourth. TMA writes a box densely (no padded rows), so
// the 64-byte swizzle (each 64-byte row of BK = 32 bf16 as four 16-byte chunks, chunk c of row r
// stored at c ^ ((r >> 1) & 3)) keeps the fragment loads conflict-free instead: the 8 rows a load
// touches land in 8 distinct 4-bank groups. Stages start 1024-byte aligned (the swizzle repeats
// every 512 bytes); the +1024 in the dynamic shared memory is the slack to align the base.
inline constexpr int kGemmTmaStages = 4;
inline constexpr int64_t kGemmTmaStageBytes = int64_t{2} * (kGemmMmaBm + kGemmMmaBn) * kGemmMmaBk;
inline constexpr int64_t kGemmTmaSmemBytes = kGemmTmaStages * kGemmTmaStageBytes + 1024;
// Element (r, k) of a TMA-staged (rows, 32) bf16 tile: dense 64-byte rows, chunk k / 8 swizzled.
// constexpr, so the kernel (nvcc --expt-relaxed-constexpr) and the CPU tests share it.
constexpr int gemm_tma_smem_index(int r, int k) {
  return r * kGemmMmaBk + ((((k >> 3) ^ (r >> 1)) & 3) << 3) + (k & 7);
}

// One row per GemmKernel, in enum order (checked below): the name bench/ and errors print and
// the variant the catalog (cuda_catalog.h) describes.
struct GemmKernelInfo {
  GemmKernel kernel;
  std::string_view name;
  std::string_view variant;
};
inline constexpr GemmKernelInfo kGemmKernelInfo[] = {
    {GemmKernel::kNaive, "naive", "naive, 16x16 threads, x along m (uncoalesced)"},
    {GemmKernel::kCoalesced, "coalesced", "coalesced, 32x8 threads, x along n"},
    {GemmKernel::kSmemTiled, "smem-tiled", "shared-memory tiles 32x32"},
    {GemmKernel::kRegisterTiled, "register-tiled", "register-tiled 128x128x8, 8x8 per thread"},
    {GemmKernel::kPadded, "padded", "register-tiled 128x128x8, 8x8 per thread, padded shared rows"},
    {GemmKernel::kMma, "mma", "tiled 128x128x32, mma.sync bf16"},
    {GemmKernel::kMmaCpAsync, "mma-cp-async",
     "tiled 128x128x32, mma.sync bf16, cp.async double buffer"},
    {GemmKernel::kMmaTma, "mma-tma",
     "tiled 128x128x32, mma.sync bf16, TMA loads into 4 stages, 64-byte swizzle (sm_90)"},
    {GemmKernel::kAuto, "auto", "the fastest rung that takes the params"},
};
static_assert([] {
  for (int i = 0; i < static_cast<int>(std::size(kGemmKernelInfo)); ++i)
    if (static_cast<int>(kGemmKernelInfo[i].kernel) != i) return false;
  return std::size(kGemmKernelInfo) == static_cast<size_t>(GemmKernel::kAuto) + 1;
}());
inline const GemmKernelInfo& gemm_kernel_info(GemmKernel k) {
  return kGemmKernelInfo[static_cast<int>(k)];
}
inline std::string_view gemm_kernel_name(GemmKernel k) {
  return gemm_kernel_info(k).name;
}

// The __global__ function behind each rung, named as cuda_catalog.h's KernelLaunch::kernel.
inline std::string gemm_kernel_symbol(GemmKernel k) {
  const auto reg = [](int pad) {
    return "kiln::cuda::gemm_register_tiled<" + std::to_string(kGemmRegBm) + ", " +
           std::to_string(kGemmRegBn) + ", " + std::to_string(kGemmRegBk) + ", " +
           std::to_string(kGemmRegTm) + ", " + std::to_string(kGemmRegTn) + ", " +
           std::to_string(pad) + ">";
  };
  const auto mma = [](const char* kernel, int stages) {
    return std::string("kiln::cuda::") + kernel + "<" + std::to_string(kGemmMmaBm) + ", " +
           std::to_string(kGemmMmaBn) + ", " + std::to_string(kGemmMmaBk) + ", " +
           std::to_string(stages) + ">";
  };
  switch (k) {
    case GemmKernel::kNaive:
      return "kiln::cuda::gemm_naive";
    case GemmKernel::kCoalesced:
      return "kiln::cuda::gemm_coalesced";
    case GemmKernel::kSmemTiled:
      return "kiln::cuda::gemm_smem_tiled<" + std::to_string(kGemmSmemTile) + ">";
    case GemmKernel::kRegisterTiled:
      return reg(0);
    case GemmKernel::kPadded:
      return reg(kGemmRegPad);
    case GemmKernel::kMma:
      return mma("gemm_mma_bf16", 1);
    case GemmKernel::kMmaCpAsync:
      return mma("gemm_mma_bf16", 2);
    case GemmKernel::kMmaTma:
      return mma("gemm_mma_bf16_tma", kGemmTmaStages);
    case GemmKernel::kAuto:
      break;
  }
  return {};
}

// C is (m, n); every rung covers it with whole tiles (edge tiles are bounds-checked).
inline LaunchConfig gemm_launch(GemmKernel k, int64_t m, int64_t n) {
  LaunchConfig c;
  switch (k) {
    case GemmKernel::kNaive:  // 16x16 threads, x along m
      c.block_x = 16, c.block_y = 16;
      c.grid_x = ceil_div(m, 16), c.grid_y = ceil_div(n, 16);
      break;
    case GemmKernel::kCoalesced:  // 32x8 threads, x along n (one warp = 32 consecutive columns)
      c.block_x = 32, c.block_y = 8;
      c.grid_x = ceil_div(n, 32), c.grid_y = ceil_div(m, 8);
      break;
    case GemmKernel::kSmemTiled:
      c.block_x = kGemmSmemTile, c.block_y = kGemmSmemTile;
      c.grid_x = ceil_div(n, kGemmSmemTile), c.grid_y = ceil_div(m, kGemmSmemTile);
      break;
    case GemmKernel::kRegisterTiled:
    case GemmKernel::kPadded:
      c.block_x = kGemmRegThreads;
      c.grid_x = ceil_div(n, kGemmRegBn), c.grid_y = ceil_div(m, kGemmRegBm);
      break;
    case GemmKernel::kMma:
    case GemmKernel::kMmaCpAsync:
    case GemmKernel::kMmaTma:
      c.block_x = kGemmMmaThreads;
      c.grid_x = ceil_div(n, kGemmMmaBn), c.grid_y = ceil_div(m, kGemmMmaBm);
      c.smem_bytes = k == GemmKernel::kMmaTma ? kGemmTmaSmemBytes
                                               : kGemmMmaStageBytes * (k == GemmKernel::kMmaCpAsync ? 2 : 1);
      break;
    case GemmKernel::kAuto:
      break;
  }
  c.threads = c.block_x * c.block_y;
  return c;
}

// ---- row-wise kernels (norms, softmax, cross-entropy, embedding): one block per row ---------
// Up to 256 threads stride over a row's columns and reduce with warp shuffles, then across the
// block's warps through 32 floats of static shared memory; short rows get fewer threads.
inline constexpr int kRowMaxThreads = 256;
inline LaunchConfig row_launch(int64_t rows, int64_t cols) {
  LaunchConfig c;
  c.grid_x = std::max<int64_t>(rows, 1);
  c.block_x = static_cast<int>(std::clamp<int64_t>(ceil_div(cols, 32) * 32, 32, kRowMaxThreads));
  c.threads = c.block_x;
  return c;
}

// ---- elementwise kernels (activations, AdamW, RoPE pairs): a grid-stride loop -------------
// 256 threads; at most 65536 blocks (beyond that each thread takes several elements).
inline constexpr int kElementwiseThreads = 256;
inline constexpr int64_t kElementwiseMaxBlocks = 65536;
inline LaunchConfig elementwise_launch(int64_t n) {
  LaunchConfig c;
  c.grid_x = std::clamp<int64_t>(ceil_div(n, kElementwiseThreads), 1, kElementwiseMaxBlocks);
  c.block_x = c.threads = kElementwiseThreads;
  return c;
}

// ---- the empty kernel: what a launch costs with no work in it (kiln bench launch) -----------
inline LaunchConfig empty_kernel_launch() {
  LaunchConfig c;
  c.block_x = c.threads = 32;  // one warp, one block
  return c;
}

// ---- FlashAttention forward ---------------------------------------------------------------
// A block = 8 warps = 8 query rows of one (batch, query head); K/V tiles of 32 keys (one per
// lane for the scores) are staged in shared memory with rows padded to head_dim + 1 floats, so
// lane j reading key j's element d hits bank (j·(D+1) + d) mod 32 = distinct banks. Each lane
// keeps head_dim/32 output elements, so head_dim <= kAttnMaxHeadDim.
inline constexpr int kAttnWarps = 8;
inline constexpr int kAttnKeyTile = 32;
inline constexpr int kAttnMaxHeadDim = 256;
inline int64_t attention_smem_bytes(int64_t head_dim) {
  return 4 * (2 * kAttnKeyTile * (head_dim + 1) + kAttnWarps * head_dim);
}
inline LaunchConfig attention_launch(int64_t batch, int64_t n_heads, int64_t q_len,
                                     int64_t head_dim) {
  LaunchConfig c;
  c.grid_x = ceil_div(std::max<int64_t>(q_len, 1), kAttnWarps);
  c.grid_y = n_heads;
  c.grid_z = batch;
  c.block_x = c.threads = 32 * kAttnWarps;
  c.smem_bytes = attention_smem_bytes(head_dim);
  return c;
}

// ---- norm parameter gradients: a column reduction ------------------------------------------
// dweight (and dbias) sum one term per row over every row. A block owns kColTile columns with
// kColTile x kColRows threads: threadIdx.x runs along the columns (a warp reads one 128-byte run
// of a row: coalesced), threadIdx.y over the rows with stride kColRows; the kColRows partial
// sums of a column then meet in shared memory in a fixed order, so the result is the same bits
// on every run (no atomics), like the CPU's. Few columns give few blocks (cols / 32): splitting
// the rows over more blocks would need a scratch buffer or atomics.
inline constexpr int kColTile = 32, kColRows = 8;
inline LaunchConfig column_launch(int64_t cols) {
  LaunchConfig c;
  c.grid_x = std::max<int64_t>(ceil_div(cols, kColTile), 1);
  c.block_x = kColTile, c.block_y = kColRows;
  c.threads = c.block_x * c.block_y;
  return c;
}

// ---- FlashAttention backward: two kernels, no atomics ---------------------------------------
// dK/dV: a block owns kAttnKeyTile keys of one (batch, KV head), staged once in shared memory
// (rows of head_dim + 1 floats, as the forward), and walks the query rows of every query head
// that reads this KV head (GQA) in tiles of kAttnWarps rows: so each key's gradient is summed
// by one block and written once. Per query tile it stages q and dO (kAttnWarps, D) and the
// probabilities P and dS (kAttnWarps, kAttnKeyTile); each row's lse and delta = rowsum(dO ∘ O)
// stay in its warp's registers (delta is recomputed per key tile rather than kept in a scratch
// buffer: one extra read of O per tile, beside the q and dO reads the tile needs anyway).
inline int64_t attention_backward_dkdv_smem_bytes(int64_t head_dim) {
  return 4 * (2 * kAttnKeyTile * (head_dim + 1) + 2 * kAttnWarps * head_dim +
              2 * kAttnWarps * kAttnKeyTile);
}
inline LaunchConfig attention_backward_dkdv_launch(int64_t batch, int64_t n_kv_heads,
                                                   int64_t kv_len, int64_t head_dim) {
  LaunchConfig c;
  c.grid_x = ceil_div(std::max<int64_t>(kv_len, 1), kAttnKeyTile);
  c.grid_y = n_kv_heads;
  c.grid_z = batch;
  c.block_x = c.threads = 32 * kAttnWarps;
  c.smem_bytes = attention_backward_dkdv_smem_bytes(head_dim);
  return c;
}
// dQ: the forward's layout (a warp per query row, kAttnWarps rows per block, 32-key K/V tiles
// padded in shared memory) with q and dO of the block's rows beside them; P is recomputed from
// the forward's logsumexp, so the two kernels share nothing but their inputs.
inline int64_t attention_backward_dq_smem_bytes(int64_t head_dim) {
  return 4 * (2 * kAttnKeyTile * (head_dim + 1) + 2 * kAttnWarps * head_dim);
}
inline LaunchConfig attention_backward_dq_launch(int64_t batch, int64_t n_heads, int64_t q_len,
                                                 int64_t head_dim) {
  LaunchConfig c = attention_launch(batch, n_heads, q_len, head_dim);
  c.smem_bytes = attention_backward_dq_smem_bytes(head_dim);
  return c;
}

// ---- split-KV decode over the paged KV cache (attention.h's PagedKv) ------------------------
// A block is one (sequence, KV head, group of kAttnWarps query rows, key chunk): its warps are
// the query rows (query heads of the GQA group x q_len) that read this KV head, so every K/V
// tile it stages serves all of them. The sequences' lengths live on the device, so the chunks
// are cut from the longest a sequence can be (max_blocks_per_seq · block_size), in whole cache
// blocks (as the CPU's chunks follow block boundaries); a chunk past a sequence's end is empty.
// Each chunk writes its unnormalised output, running max and sum to a workspace, and a combine
// kernel (a warp per query row) merges the chunks exactly. One chunk skips the workspace.
//
// With num_splits 0, the chunk count makes the grid about kDecodeTargetBlocks blocks: two per
// SM of a 132-SM H100, enough that every SM streams the cache at once (decode reads each K/V
// byte once, so it is bandwidth-bound), while more chunks only add combine work. On paper.
inline constexpr int64_t kDecodeTargetBlocks = 256;
struct DecodeSplit {
  int64_t num_splits = 1;
  int64_t chunk_keys = 0;  // keys per chunk, a multiple of block_size
};
inline int64_t decode_row_groups(int64_t n_heads, int64_t n_kv_heads, int64_t q_len) {
  return std::max<int64_t>(ceil_div((n_heads / n_kv_heads) * q_len, kAttnWarps), 1);
}
inline DecodeSplit decode_split(int64_t requested, int64_t num_seqs, int64_t n_heads,
                                int64_t n_kv_heads, int64_t q_len, int64_t block_size,
                                int64_t max_blocks_per_seq) {
  DecodeSplit d;
  if (max_blocks_per_seq <= 0 || block_size <= 0) return d;
  int64_t want = requested;
  if (want <= 0) {
    const int64_t base =
        std::max<int64_t>(num_seqs * n_kv_heads * decode_row_groups(n_heads, n_kv_heads, q_len), 1);
    want = ceil_div(kDecodeTargetBlocks, base);
  }
  want = std::clamp<int64_t>(want, 1, max_blocks_per_seq);
  const int64_t blocks_per_chunk = ceil_div(max_blocks_per_seq, want);
  d.num_splits = ceil_div(max_blocks_per_seq, blocks_per_chunk);  // no chunk entirely past the end
  d.chunk_keys = blocks_per_chunk * block_size;
  return d;
}
// Floats of workspace a decode needs: per chunk and query row (num_seqs · n_heads · q_len), the
// unnormalised output (head_dim), running max and sum; none for one chunk.
inline int64_t decode_workspace_floats(int64_t num_splits, int64_t rows, int64_t head_dim) {
  return num_splits > 1 ? num_splits * rows * (head_dim + 2) : 0;
}
inline LaunchConfig attention_decode_launch(int64_t num_seqs, int64_t n_heads, int64_t n_kv_heads,
                                            int64_t q_len, int64_t head_dim, int64_t num_splits) {
  LaunchConfig c;
  c.grid_x = std::max<int64_t>(num_splits, 1);
  c.grid_y = n_kv_heads * decode_row_groups(n_heads, n_kv_heads, q_len);
  c.grid_z = std::max<int64_t>(num_seqs, 1);
  c.block_x = c.threads = 32 * kAttnWarps;
  c.smem_bytes = attention_smem_bytes(head_dim);
  return c;
}
// The combine: a warp per query row, kAttnWarps rows per block.
inline LaunchConfig attention_decode_combine_launch(int64_t rows) {
  LaunchConfig c;
  c.grid_x = ceil_div(std::max<int64_t>(rows, 1), kAttnWarps);
  c.block_x = c.threads = 32 * kAttnWarps;
  return c;
}

}  // namespace kiln::cuda
