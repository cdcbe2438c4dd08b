// FlashAttention on the CPU: threading, SIMD dispatch and scratch around the per-target tile
// kernels (attention_flash_impl.inc). Forward: one task per (sequence, head, query tile), the
// heaviest causal tiles first. Few queries (decode): split-KV, one task per (sequence, key
// chunk) over all heads, partials merged through their logsumexps. Backward: one task per (sequence, KV
// head[, key chunk]) owning its dK, dV rows; dQ goes straight to the output when a task owns
// all keys, else to per-chunk buffers summed in a fixed order (no races, no atomics).
// Regular batches, packed variable-length batches and the paged KV cache share these drivers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "kiln/core/thread_pool.h"
#include "kiln/core/trace.h"
#include "kiln/kernels/attention.h"
#include "kiln/kernels/cpu/attention_flash.h"
#include "kiln/kernels/cpu/attention_io.h"
#include "kiln/kernels/cpu/attention_scratch.h"
#include "kiln/kernels/cpu/parallel.h"

namespace kiln::cpu {

namespace {
int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }
}  // namespace

int64_t flash_forward_scratch_floats(int64_t head_dim, FlashTiles t) {
  return pad16(head_dim * t.q) + pad16(t.k * t.q) + pad16(t.q * head_dim) + pad16(3 * t.q) +
         (t.pack_v ? pad16(t.k * head_dim) : 0);
}
int64_t flash_backward_scratch_floats(int64_t head_dim, FlashTiles t) {
  return 2 * pad16(head_dim * t.q) + 2 * pad16(t.k * t.q) + 2 * t.q * head_dim;
}

namespace {

// Split-KV chunks never shorter than this many keys: a chunk's merge costs about as much as
// scanning a few dozen keys, so shorter chunks would not pay for themselves.
constexpr int64_t kMinSplitKeys = 256;

// The forward's and the backward's tiles of a batched call (flash_tiles() fitted to its length).
FlashTileChoice call_tiles(const AttentionParams& p) {
  return flash_tiles_for_length(flash_tiles(), p.q_len, p.causal || p.window > 0);
}

// tiles: the forward's or the backward's (flash_tiles(), or call_tiles() for a batched call).
FlashShape shape_of(const AttentionParams& p, int64_t lse_hs, FlashTiles tiles) {
  FlashShape sh;
  sh.n_heads = p.n_heads;
  sh.n_kv_heads = p.n_kv_heads;
  sh.head_dim = p.head_dim;
  sh.causal = p.causal;
  sh.window = p.window;
  sh.scale = p.softmax_scale();
  sh.q_rs = p.q_row_stride;
  sh.k_rs = p.k_row_stride;
  sh.v_rs = p.v_row_stride;
  sh.o_rs = p.o_row_stride;
  sh.k_hs = sh.v_hs = p.head_dim;
  sh.lse_hs = lse_hs;
  sh.tiles = tiles;
  return sh;
}

// The sequences of a regular (B, T, ·) batch; lse (B, Hq, T).
std::vector<FlashSeq> batch_seqs(const AttentionParams& p, const float* out, const float* lse, const float* q,
                                 const float* k, const float* v) {
  std::vector<FlashSeq> seqs(static_cast<size_t>(p.batch));
  for (int64_t b = 0; b < p.batch; ++b) {
    FlashSeq& s = seqs[static_cast<size_t>(b)];
    s = FlashSeq{};
    s.q = q + b * p.q_len * p.q_row_stride;
    s.k = k + b * p.kv_len * p.k_row_stride;
    s.v = v + b * p.kv_len * p.v_row_stride;
    s.o = const_cast<float*>(out) + b * p.q_len * p.o_row_stride;
    s.lse = const_cast<float*>(lse) + b * p.n_heads * p.q_len;
    s.q_len = p.q_len;
    s.kv_len = p.kv_len;
  }
  return seqs;
}

// Packed sequences; lse (Hq, total_q).
std::vector<FlashSeq> varlen_seqs(const AttentionParams& p, const AttentionVarlen& vl, const float* out,
                                  const float* lse, const float* q, const float* k, const float* v) {
  std::vector<FlashSeq> seqs(static_cast<size_t>(vl.num_seqs));
  for (int64_t i = 0; i < vl.num_seqs; ++i) {
    const int64_t q0 = vl.cu_seqlens_q[i], k0 = vl.cu_seqlens_k[i];
    FlashSeq& s = seqs[static_cast<size_t>(i)];
    s = FlashSeq{};
    s.q = q + q0 * p.q_row_stride;
    s.k = k + k0 * p.k_row_stride;
    s.v = v + k0 * p.v_row_stride;
    s.o = const_cast<float*>(out) + q0 * p.o_row_stride;
    s.lse = const_cast<float*>(lse) + q0;
    s.q_len = vl.cu_seqlens_q[i + 1] - q0;
    s.kv_len = vl.cu_seqlens_k[i + 1] - k0;
  }
  return seqs;
}

int64_t varlen_total_q(const AttentionVarlen& vl) { return vl.num_seqs > 0 ? vl.cu_seqlens_q[vl.num_seqs] : 0; }

// Task t of a region laid out as consecutive per-sequence ranges: (sequence, local index).
struct TaskMap {
  std::vector<int64_t> begin;  // (num_seqs + 1,) prefix sums of per-sequence task counts
  int64_t total() const { return begin.back(); }
  std::pair<size_t, int64_t> locate(int64_t task) const {
    const auto it = std::upper_bound(begin.begin(), begin.end(), task);
    const size_t s = static_cast<size_t>(it - begin.begin()) - 1;
    return {s, task - begin[s]};
  }
};

template <class CountFn>
TaskMap make_task_map(size_t num_seqs, CountFn&& count) {
  TaskMap m;
  m.begin.assign(num_seqs + 1, 0);
  for (size_t i = 0; i < num_seqs; ++i) m.begin[i + 1] = m.begin[i] + count(i);
  return m;
}

// ---- one KV head's rows, staged --------------------------------------------------------------
// K and V rows of one head sit H·D apart in the (B, S, H, D) layout (3 KiB at 12 × 64, 4.5 KiB
// out of GPT-2's fused QKV projection): a key tile's rows fall into a few of L1's sets, every row
// is a short stream of its own for the prefetchers, and once a head's K/V outgrow L2 (T = 4096 at
// 64 dims on a 2 MiB L2) each query tile refetches them that way from L3. So the tile drivers copy
// one KV head's K and V into rows D apart in a per-thread buffer, once per (sequence, KV head) a
// thread works on, and run the tiles on the copy; the backward also accumulates that head's dK,
// dV and its group's dQ there and writes them out once. Measured on a Xeon (causal, head_dim 64):
// the kernels on inputs already laid out head after head ran 17-25% faster than on interleaved
// rows, at W5's T = 4096 (12 heads, 2 threads) and at W1a's shape (B 8, 6 heads, T 256, fused QKV
// rows, 1 thread); docs/results/attention-staging-2026-12-07.md has the figures with the staging.
// Not for sliding windows (a window reads a band of keys, not the whole head), not for a
// sequence of fewer than two query tiles (each key row is read once anyway: a prefill chunk
// against a long cache would pay the copy for nothing), and not past kMaxStageFloats per thread.
constexpr int64_t kMaxStageFloats = int64_t{16} << 20;  // 64 MiB per thread

bool stages(const FlashShape& sh, int64_t q_len) {
  return q_len >= 2 * sh.tiles.q;
}

// Floats of one thread's staging buffer (0: the tiles read K/V in place): `arrays` arrays of
// kv_len rows of D (2 forward: K, V; 4 backward: K, V, dK, dV), then q_rows rows of D (the
// backward's dQ of one KV head's query heads).
int64_t stage_floats(const FlashShape& sh, int64_t max_q_len, int64_t max_kv_len, int arrays,
                     int64_t q_rows = 0) {
  const int64_t D = sh.head_dim;
  if (sh.window > 0 || (sh.k_rs == D && sh.v_rs == D) || !stages(sh, max_q_len)) return 0;
  const int64_t floats = arrays * pad16(max_kv_len * D) + pad16(q_rows * D);
  return floats <= kMaxStageFloats ? floats : 0;
}

// Rows [r0, r1) of one head, rows rs apart, to dst with rows d apart (row r at dst + r·d);
// copy_rows_out: the other way. The strided side is prefetched kCopyAhead rows ahead: its rows
// are a few cache lines each, one per page or so, which the hardware prefetchers do not follow
// (without it the copies ran at ~4 GB/s from DRAM and were a fifth of the backward at W1a's
// shape).
// Two loops, not one taking the strided side as a parameter (runtime or template): that version
// ran W1a's backward 9% slower (gcc 12, four paired rounds).
constexpr int64_t kCopyAhead = 8;
inline void prefetch_row(const float* row, int64_t d, bool write) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < d * 4; b += 64) {
    if (write) {
      __builtin_prefetch(p + b, 1, 3);
    } else {
      __builtin_prefetch(p + b, 0, 3);
    }
  }
}
void copy_head_rows(float* dst, const float* src, int64_t rs, int64_t r0, int64_t r1, int64_t d) {
  for (int64_t r = r0; r < std::min(r1, r0 + kCopyAhead); ++r) prefetch_row(src + r * rs, d, false);
  for (int64_t r = r0; r < r1; ++r) {
    if (r + kCopyAhead < r1) prefetch_row(src + (r + kCopyAhead) * rs, d, false);
    std::memcpy(dst + r * d, src + r * rs, sizeof(float) * static_cast<size_t>(d));
  }
}
void copy_rows_out(float* dst, int64_t rs, const float* src, int64_t r0, int64_t r1, int64_t d) {
  for (int64_t r = r0; r < std::min(r1, r0 + kCopyAhead); ++r) prefetch_row(dst + r * rs, d, true);
  for (int64_t r = r0; r < r1; ++r) {
    if (r + kCopyAhead < r1) prefetch_row(dst + (r + kCopyAhead) * rs, d, true);
    std::memcpy(dst + r * rs, src + r * d, sizeof(float) * static_cast<size_t>(d));
  }
}

// sh for tiles that read one KV head's K/V (and write its dK/dV) from a staging buffer.
FlashShape staged_shape(FlashShape sh) {
  sh.k_rs = sh.v_rs = sh.head_dim;
  sh.k_hs = sh.v_hs = 0;
  sh.tiles.pack_v = false;  // V's rows are D apart already
  return sh;
}

// ---- forward: query tiles ---------------------------------------------------------------------

// prof: nullptr, or one FlashProfile per pool thread (profiled runs).
void forward_tiles(const FlashShape& sh, const std::vector<const FlashSeq*>& seqs, FlashProfile* prof = nullptr) {
  if (seqs.empty()) return;
  const auto tile = KILN_FLASH_DISPATCH(flash_forward_tile).pick();
  const int64_t Br = sh.tiles.q;
  // Tasks per head: as few as give every thread eight, so that a thread stages a head's K/V once
  // for several query tiles (one tile per task made each of two threads stage every head: W1a's
  // forward scaled 1.75x from 1 to 2 threads). Task c of a head runs its tiles c, c + tasks, …,
  // so the tasks of a head carry about equal causal work.
  const int64_t per_head =
      ceil_div(8 * num_threads(), static_cast<int64_t>(seqs.size()) * sh.n_heads);
  const auto tasks_of = [&](const FlashSeq& s) {
    return std::min(ceil_div(s.q_len, Br), per_head);
  };
  const TaskMap map =
      make_task_map(seqs.size(), [&](size_t i) { return sh.n_heads * tasks_of(*seqs[i]); });
  const int64_t slices = map.total() > 1 ? num_threads() : 1, D = sh.head_dim;
  int64_t max_kv = 0, max_q = 0;
  for (const FlashSeq* s : seqs)
    max_kv = std::max(max_kv, s->kv_len), max_q = std::max(max_q, s->q_len);
  const int64_t stage = stage_floats(sh, max_q, max_kv, 2);
  const ScratchBuffer scratch(slices, flash_forward_scratch_floats(D, sh.tiles) + stage);
  // Per thread: the (sequence, KV head) its staging buffer holds.
  std::vector<std::pair<size_t, int64_t>> staged(static_cast<size_t>(slices), {seqs.size(), -1});
  const FlashShape staged_sh = staged_shape(sh);
  thread_pool().run(map.total(), [&](int64_t task, int thread) {
    const auto [si, local] = map.locate(task);
    const FlashSeq& sq = *seqs[si];
    const int64_t nqt = ceil_div(sq.q_len, Br), tasks = tasks_of(sq);
    // Head-major, so the tasks running together (and back to back) reread one head's K/V from
    // L2/L3 instead of DRAM (at T = 8192 a head-interleaved order was 1.8× slower); within a
    // head the later query tiles, which see more keys when causal, go first.
    const int64_t h = local / tasks, c = local % tasks;
    float* tile_scratch = scratch.slice(thread);
    const FlashShape* use_sh = &sh;
    FlashSeq use_sq = sq;
    if (stage > 0 && stages(sh, sq.q_len)) {
      const int64_t g = h / (sh.n_heads / sh.n_kv_heads);
      float* ks = tile_scratch + pad16(flash_forward_scratch_floats(D, sh.tiles));
      float* vs = ks + pad16(max_kv * D);
      auto& held = staged[static_cast<size_t>(thread)];
      if (held != std::make_pair(si, g)) {
        copy_head_rows(ks, sq.k + g * sh.k_hs, sh.k_rs, 0, sq.kv_len, D);
        copy_head_rows(vs, sq.v + g * sh.v_hs, sh.v_rs, 0, sq.kv_len, D);
        held = {si, g};
      }
      use_sq.k = ks;
      use_sq.v = vs;
      use_sh = &staged_sh;
    }
    for (int64_t j = c; j < nqt; j += tasks) {
      const int64_t t0 = (nqt - 1 - j) * Br, br = std::min(Br, sq.q_len - t0);
      tile(*use_sh, use_sq, h, t0, br, 0, sq.kv_len, sq.o + t0 * sh.o_rs + h * D, sh.o_rs,
           sq.lse + h * sh.lse_hs + t0, tile_scratch, prof ? prof + thread : nullptr);
    }
  });
}

// ---- forward: split-KV rows ---------------------------------------------------------------------

int64_t auto_chunks(int64_t kv_len, int64_t num_seqs) {
  const int64_t threads = num_threads();
  if (threads == 1 || num_seqs <= 0) return 1;
  const int64_t want = ceil_div(2 * threads, num_seqs);  // >= 2 tasks per thread
  return std::clamp<int64_t>(want, 1, std::max<int64_t>(1, kv_len / kMinSplitKeys));
}

// Keys [c0, c1) of one sequence through the row kernel, every KV head per block of keys: the
// cache streams through once in address order (a (block, Hkv, D) slab stays in L2 while each
// head reads its columns). Paged runs end where the next block is not the next in the pool.
// State rows are h·nq + t. Each head's call prefetches its columns of the next run, spread over
// its own work.
void scan_keys(const FlashShape& sh, const FlashSeq& sq, const PagedKv* paged, size_t seq_index, int64_t c0,
               int64_t c1, float* m, float* l, float* o) {
  const auto update = KILN_FLASH_DISPATCH(attention_rows_update).pick();
  const int64_t D = sh.head_dim, rep = sh.n_heads / sh.n_kv_heads, nq = sq.q_len, q_pos0 = sq.kv_len - sq.q_len;
  const int32_t* table = paged ? paged->block_table + static_cast<int64_t>(seq_index) * paged->max_blocks_per_seq : nullptr;
  // The run of keys starting at j (at most kRowsBlock, never across a gap between paged blocks):
  // rows, count.
  struct Run {
    const float* k;
    const float* v;
    int64_t n;
  };
  const auto run_at = [&](int64_t j) {
    Run r{nullptr, nullptr, 0};
    if (j >= c1) return r;
    r.n = std::min(c1 - j, kRowsBlock);
    if (paged) {
      // To the end of this block, and on through the blocks that follow it in the pool (a
      // prompt's blocks are handed out together, so most of a context is such runs).
      const int64_t bs = paged->block_size, row = j % bs;
      int64_t b = j / bs, n = bs - row;
      while (n < r.n && table[b + 1] == table[b] + 1) n += bs, ++b;
      r.n = std::min(r.n, n);
      const int64_t r0 = table[j / bs] * bs + row;
      r.k = paged->k_pool + r0 * sh.k_rs;
      r.v = paged->v_pool + r0 * sh.v_rs;
    } else {
      r.k = sq.k + j * sh.k_rs;
      r.v = sq.v + j * sh.v_rs;
    }
    return r;
  };
  Run cur = run_at(c0);
  for (int64_t j = c0; j < c1;) {
    const Run next = run_at(j + cur.n);
    for (int64_t g = 0; g < sh.n_kv_heads; ++g) {
      const int64_t r = g * rep * nq;
      update(sh, sq.q + g * rep * D, nq, q_pos0, cur.k + g * D, cur.v + g * D, cur.n, j, m + r, l + r, o + r * D,
             next.k ? next.k + g * D : nullptr, next.v ? next.v + g * D : nullptr, next.n);
    }
    j += cur.n;
    cur = next;
  }
}

// o / l and m + log l for `rows` rows of an online-softmax state; zeros and -inf when empty.
void finish_rows(float* out_rows, float* lse_rows, const float* m, const float* l, const float* o, int64_t rows,
                 int64_t D) {
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = out_rows + r * D;
    if (l[r] == 0.0f) {
      std::fill(dst, dst + D, 0.0f);
      lse_rows[r] = -std::numeric_limits<float>::infinity();
      continue;
    }
    const float inv = 1.0f / l[r];
    for (int64_t d = 0; d < D; ++d) dst[d] = o[r * D + d] * inv;
    lse_rows[r] = m[r] + std::log(l[r]);
  }
}

// Split-KV: one task per (sequence, key chunk) covering all heads; each chunk's normalized
// rows and logsumexps go to a partial buffer (or straight to the output when unsplit), then
// one task per sequence merges them.
void forward_split_kv(const FlashShape& sh, const std::vector<const FlashSeq*>& seqs, int64_t num_splits,
                      const PagedKv* paged = nullptr) {
  if (seqs.empty()) return;
  const int64_t H = sh.n_heads, D = sh.head_dim;
  const int64_t num_seqs = static_cast<int64_t>(seqs.size());
  std::vector<int64_t> chunks(seqs.size());
  int64_t max_rows = 0;
  std::vector<int64_t> part_begin(seqs.size() + 1, 0);  // floats of partials before sequence i
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t c = num_splits > 0 ? num_splits : auto_chunks(seqs[i]->kv_len, num_seqs);
    chunks[i] = std::clamp<int64_t>(c, 1, std::max<int64_t>(1, ceil_div(seqs[i]->kv_len, kRowsBlock)));
    const int64_t rows = H * seqs[i]->q_len;
    max_rows = std::max(max_rows, rows);
    part_begin[i + 1] = part_begin[i] + (chunks[i] > 1 ? chunks[i] * rows * (D + 1) : 0);
  }
  const TaskMap map = make_task_map(seqs.size(), [&](size_t i) { return chunks[i]; });
  const ScratchBuffer parts(1, part_begin.back());
  const ScratchBuffer state(map.total() > 1 ? num_threads() : 1, max_rows * (D + 2));
  thread_pool().run(map.total(), [&](int64_t task, int thread) {
    const auto [si, c] = map.locate(task);
    const FlashSeq& sq = *seqs[si];
    const int64_t nc = chunks[si], nq = sq.q_len, rows = H * nq;
    // Chunks of whole kRowsBlock key blocks.
    const int64_t per = ceil_div(ceil_div(sq.kv_len, nc), kRowsBlock) * kRowsBlock;
    const int64_t c0 = std::min(sq.kv_len, c * per), c1 = std::min(sq.kv_len, c0 + per);
    float* m = state.slice(thread);
    float* l = m + rows;
    float* o = l + rows;  // (rows, D), row h·nq + t
    std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
    std::fill(l, l + rows + rows * D, 0.0f);
    scan_keys(sh, sq, paged, si, c0, c1, m, l, o);
    if (nc == 1) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t t = 0; t < nq; ++t) {
          const int64_t r = h * nq + t;
          finish_rows(sq.o + t * sh.o_rs + h * D, sq.lse + h * sh.lse_hs + t, m + r, l + r, o + r * D, 1, D);
        }
      }
      return;
    }
    float* part = parts.data() + part_begin[si] + c * rows * (D + 1);  // (rows, D) then lse (rows,)
    finish_rows(part, part + rows * D, m, l, o, rows, D);
  });
  if (part_begin.back() == 0) return;
  const auto wsum = KILN_FLASH_DISPATCH(weighted_sum_rows).pick();
  thread_pool().run(num_seqs, [&](int64_t si, int) {
    const FlashSeq& sq = *seqs[static_cast<size_t>(si)];
    const int64_t nc = chunks[static_cast<size_t>(si)], nq = sq.q_len, rows = H * nq;
    if (nc == 1) return;
    const float* base = parts.data() + part_begin[static_cast<size_t>(si)];
    const int64_t part_stride = rows * (D + 1);
    std::vector<float> w(static_cast<size_t>(nc));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t h = r / nq, t = r % nq;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t cc = 0; cc < nc; ++cc) mx = std::max(mx, base[cc * part_stride + rows * D + r]);
      float* dst = sq.o + t * sh.o_rs + h * D;
      if (mx == -std::numeric_limits<float>::infinity()) {
        std::fill(dst, dst + D, 0.0f);
        sq.lse[h * sh.lse_hs + t] = mx;
        continue;
      }
      double sum = 0;
      for (int64_t cc = 0; cc < nc; ++cc) {
        w[static_cast<size_t>(cc)] = std::exp(base[cc * part_stride + rows * D + r] - mx);
        sum += w[static_cast<size_t>(cc)];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (float& x : w) x *= inv;
      wsum(dst, base + r * D, part_stride, w.data(), nc, D);
      sq.lse[h * sh.lse_hs + t] = mx + static_cast<float>(std::log(sum));
    }
  });
}

void forward_seqs(const FlashShape& sh, const std::vector<FlashSeq>& seqs, int64_t num_splits) {
  std::vector<const FlashSeq*> tiles, rows;
  for (const FlashSeq& s : seqs) {
    if (s.q_len == 0) continue;
    (s.q_len <= kSplitKvMaxQueries ? rows : tiles).push_back(&s);
  }
  forward_tiles(sh, tiles);
  forward_split_kv(sh, rows, num_splits);
}

// ---- backward -------------------------------------------------------------------------------

int64_t backward_chunks(int64_t kv_len, int64_t num_groups, int64_t Bc) {
  const int64_t threads = num_threads();
  if (threads == 1 || num_groups >= 2 * threads) return 1;
  // Causal key chunks differ in work; 4 per thread let the pool even them out.
  return std::clamp<int64_t>(ceil_div(4 * threads, num_groups), 1, std::max<int64_t>(1, ceil_div(kv_len, Bc)));
}

void backward_seqs(const FlashShape& sh, const std::vector<FlashSeq>& seqs) {
  const int64_t Hkv = sh.n_kv_heads, rep = sh.n_heads / Hkv, D = sh.head_dim, Bc = sh.tiles.k;
  const int64_t groups = static_cast<int64_t>(seqs.size()) * Hkv;
  std::vector<int64_t> chunks(seqs.size());
  int64_t max_t = 0;
  std::vector<int64_t> part_begin(seqs.size() + 1, 0);  // dQ partials of chunks 1.. (floats)
  for (size_t i = 0; i < seqs.size(); ++i) {
    chunks[i] = backward_chunks(seqs[i].kv_len, groups, Bc);
    max_t = std::max(max_t, seqs[i].q_len);
    part_begin[i + 1] = part_begin[i] + Hkv * (chunks[i] - 1) * seqs[i].q_len * rep * D;
  }
  const TaskMap map = make_task_map(seqs.size(), [&](size_t i) { return Hkv * chunks[i]; });
  const auto keys = KILN_FLASH_DISPATCH(flash_backward_keys).pick();
  const auto row_dots = KILN_FLASH_DISPATCH(row_dots).pick();
  const ScratchBuffer parts(1, part_begin.back());
  int64_t max_kv = 0;
  for (const FlashSeq& s : seqs) max_kv = std::max(max_kv, s.kv_len);
  const int64_t stage = stage_floats(sh, max_t, max_kv, 4,
                                     rep * max_t);  // K, V, dK, dV of one KV head, dQ of its group
  const ScratchBuffer scratch(
      map.total() > 1 ? num_threads() : 1,
      pad16(flash_backward_scratch_floats(D, sh.tiles)) + pad16(rep * max_t) + stage);
  const FlashShape staged_sh = staged_shape(sh);
  thread_pool().run(map.total(), [&](int64_t task, int thread) {
    const auto [si, local] = map.locate(task);
    const FlashSeq& sq = seqs[si];
    const int64_t nc = chunks[si], g = local / nc, c = local % nc, T = sq.q_len;
    float* tile_scratch = scratch.slice(thread);
    float* dvec = tile_scratch + pad16(flash_backward_scratch_floats(D, sh.tiles));  // (rep, T)
    for (int64_t hh = 0; hh < rep; ++hh) {
      const int64_t h = g * rep + hh;
      row_dots(dvec + hh * T, sq.o + h * D, sq.dout + h * D, sh.o_rs, T, D);
    }
    // With staging, chunk 0's dQ rows of the group also accumulate in rows rep·D apart (the
    // buffer's tail) and go out once at the end.
    const int64_t span = pad16(max_kv * D);
    float* dq_stage = stage > 0 && stages(sh, T) ? dvec + pad16(rep * max_t) + 4 * span : nullptr;
    float* dq;
    int64_t ldq;
    if (c == 0 && dq_stage) {
      dq = dq_stage;
      ldq = rep * D;
      std::memset(dq, 0, sizeof(float) * static_cast<size_t>(T * rep * D));
    } else if (c == 0) {
      dq = sq.dq + g * rep * D;
      ldq = sh.q_rs;
      for (int64_t t = 0; t < T; ++t) std::memset(dq + t * ldq, 0, sizeof(float) * static_cast<size_t>(rep * D));
    } else {
      dq = parts.data() + part_begin[si] + (g * (nc - 1) + c - 1) * T * rep * D;
      ldq = rep * D;
      std::memset(dq, 0, sizeof(float) * static_cast<size_t>(T * rep * D));
    }
    const int64_t nkt = ceil_div(sq.kv_len, Bc);
    const int64_t kb = std::min(sq.kv_len, (c * nkt / nc) * Bc);
    const int64_t ke = std::min(sq.kv_len, ((c + 1) * nkt / nc) * Bc);
    if (!dq_stage) {
      keys(sh, sq, g, kb, ke, dq, ldq, dvec, tile_scratch);
      return;
    }
    // K, V in, dK, dV out through this thread's staging buffer (rows D apart; only rows
    // [kb, ke) are touched).
    float* ks = dvec + pad16(rep * max_t);
    float *vs = ks + span, *dks = vs + span, *dvs = dks + span;
    copy_head_rows(ks, sq.k + g * sh.k_hs, sh.k_rs, kb, ke, D);
    copy_head_rows(vs, sq.v + g * sh.v_hs, sh.v_rs, kb, ke, D);
    FlashSeq staged_sq = sq;
    staged_sq.k = ks;
    staged_sq.v = vs;
    staged_sq.dk = dks;
    staged_sq.dv = dvs;
    keys(staged_sh, staged_sq, g, kb, ke, dq, ldq, dvec, tile_scratch);
    copy_rows_out(sq.dk + g * sh.k_hs, sh.k_rs, dks, kb, ke, D);
    copy_rows_out(sq.dv + g * sh.v_hs, sh.v_rs, dvs, kb, ke, D);
    if (c == 0) copy_rows_out(sq.dq + g * rep * D, sh.q_rs, dq_stage, 0, T, rep * D);
  });
  if (part_begin.back() == 0) return;
  // dQ += the partials of chunks 1.., in chunk order, one task per (sequence, KV head).
  thread_pool().run(map.total(), [&](int64_t task, int) {
    const auto [si, local] = map.locate(task);
    const FlashSeq& sq = seqs[si];
    const int64_t nc = chunks[si], T = sq.q_len;
    if (nc == 1 || local % nc != 0) return;
    const int64_t g = local / nc;
    for (int64_t c = 1; c < nc; ++c) {
      const float* part = parts.data() + part_begin[si] + (g * (nc - 1) + c - 1) * T * rep * D;
      for (int64_t t = 0; t < T; ++t) {
        float* dst = sq.dq + t * sh.q_rs + g * rep * D;
        const float* src = part + t * rep * D;
        for (int64_t i = 0; i < rep * D; ++i) dst[i] += src[i];
      }
    }
  });
}

}  // namespace

// ---- entry points -------------------------------------------------------------------------------

void attention_forward_flash(float* out, float* lse, const float* q, const float* k, const float* v,
                             const AttentionParams& p) {
  maybe_autotune_first_use_flash(p.q_len, p.kv_len, p.n_heads);  // before the tiles are read
  trace::Scope kiln_trace_(trace::Category::kKernel, "attention_forward", [&](trace::Event& e) { describe_attention(e, p, attention_forward_cost(p), "flash"); });
  forward_seqs(shape_of(p, p.q_len, call_tiles(p).fwd), batch_seqs(p, out, lse, q, k, v),
               p.num_splits);
}

FlashProfile attention_forward_flash_profiled(float* out, float* lse, const float* q, const float* k, const float* v,
                                              const AttentionParams& p) {
  KILN_CHECK(p.q_len > kSplitKvMaxQueries);  // the query-tile path only
  const std::vector<FlashSeq> seqs = batch_seqs(p, out, lse, q, k, v);
  std::vector<const FlashSeq*> ptrs;
  for (const FlashSeq& s : seqs) ptrs.push_back(&s);
  std::vector<FlashProfile> per_thread(static_cast<size_t>(num_threads()));
  forward_tiles(shape_of(p, p.q_len, call_tiles(p).fwd), ptrs, per_thread.data());
  FlashProfile sum;
  for (const FlashProfile& t : per_thread) sum += t;
  return sum;
}

void attention_backward_flash(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                              const float* v, const float* out, const float* lse, const AttentionParams& p) {
  trace::Scope kiln_trace_(trace::Category::kKernel, "attention_backward", [&](trace::Event& e) { describe_attention(e, p, attention_backward_cost(p), "flash"); });
  std::vector<FlashSeq> seqs = batch_seqs(p, out, lse, q, k, v);
  for (int64_t b = 0; b < p.batch; ++b) {
    FlashSeq& s = seqs[static_cast<size_t>(b)];
    s.dout = dout + b * p.q_len * p.o_row_stride;
    s.dq = dq + b * p.q_len * p.q_row_stride;
    s.dk = dk + b * p.kv_len * p.k_row_stride;
    s.dv = dv + b * p.kv_len * p.v_row_stride;
  }
  backward_seqs(shape_of(p, p.q_len, call_tiles(p).bwd), seqs);
}

void attention_forward_split_kv(float* out, float* lse, const float* q, const float* k, const float* v,
                                const AttentionParams& p, int64_t num_splits) {
  trace::Scope kiln_trace_(trace::Category::kKernel, "attention_forward", [&](trace::Event& e) { describe_attention(e, p, attention_forward_cost(p), "split-kv"); });
  const std::vector<FlashSeq> seqs = batch_seqs(p, out, lse, q, k, v);
  std::vector<const FlashSeq*> ptrs;
  for (const FlashSeq& s : seqs) ptrs.push_back(&s);
  forward_split_kv(shape_of(p, p.q_len, flash_tiles().fwd), ptrs, num_splits);
}

int64_t split_kv_chunks(const AttentionParams& p) {
  return std::clamp<int64_t>(auto_chunks(p.kv_len, p.batch), 1, std::max<int64_t>(1, ceil_div(p.kv_len, kRowsBlock)));
}

void attention_merge(float* out, float* lse, const float* parts, const float* part_lse, int64_t num_parts,
                     int64_t rows, int64_t head_dim) {
  const auto wsum = KILN_FLASH_DISPATCH(weighted_sum_rows).pick();
  parallel_for(rows, 64, [&](int64_t r0, int64_t r1) {
    std::vector<float> w(static_cast<size_t>(num_parts));
    for (int64_t r = r0; r < r1; ++r) {
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < num_parts; ++c) mx = std::max(mx, part_lse[c * rows + r]);
      float* dst = out + r * head_dim;
      if (mx == -std::numeric_limits<float>::infinity()) {
        std::fill(dst, dst + head_dim, 0.0f);
        lse[r] = mx;
        continue;
      }
      double sum = 0;
      for (int64_t c = 0; c < num_parts; ++c) {
        w[static_cast<size_t>(c)] = std::exp(part_lse[c * rows + r] - mx);
        sum += w[static_cast<size_t>(c)];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (float& x : w) x *= inv;
      wsum(dst, parts + r * head_dim, rows * head_dim, w.data(), num_parts, head_dim);
      lse[r] = mx + static_cast<float>(std::log(sum));
    }
  });
}

void attention_forward_varlen(float* out, float* lse, const float* q, const float* k, const float* v,
                              const AttentionParams& p, const AttentionVarlen& varlen) {
  trace::Scope kiln_trace_(trace::Category::kKernel, "attention_forward", [&](trace::Event& e) { describe_attention(e, p, attention_forward_cost(p, varlen), "flash varlen"); });
  forward_seqs(shape_of(p, varlen_total_q(varlen), flash_tiles().fwd), varlen_seqs(p, varlen, out, lse, q, k, v),
               p.num_splits);
}

void attention_backward_varlen(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                               const float* v, const float* out, const float* lse, const AttentionParams& p,
                               const AttentionVarlen& varlen) {
  trace::Scope kiln_trace_(trace::Category::kKernel, "attention_backward", [&](trace::Event& e) { describe_attention(e, p, attention_backward_cost(p, varlen), "flash varlen"); });
  std::vector<FlashSeq> seqs = varlen_seqs(p, varlen, out, lse, q, k, v);
  for (int64_t i = 0; i < varlen.num_seqs; ++i) {
    FlashSeq& s = seqs[static_cast<size_t>(i)];
    const int64_t q0 = varlen.cu_seqlens_q[i], k0 = varlen.cu_seqlens_k[i];
    s.dout = dout + q0 * p.o_row_stride;
    s.dq = dq + q0 * p.q_row_stride;
    s.dk = dk + k0 * p.k_row_stride;
    s.dv = dv + k0 * p.v_row_stride;
  }
  backward_seqs(shape_of(p, varlen_total_q(varlen), flash_tiles().bwd), seqs);
}

void attention_decode_paged(float* out, float* lse, const float* q, const PagedKv& kv, const AttentionParams& p) {
  // The pools' extent is the cache's, not this call's: a byte of each marks them (the step that
  // writes the pools declares all of them).
  KILN_GRAPH_NODE("attention_decode", [=](const graph::Access* io) {
    PagedKv r = kv;
    r.k_pool = io[3].as<float>(); r.v_pool = io[4].as<float>();
    r.block_table = io[5].as<int32_t>(); r.seq_lens = io[6].as<int32_t>();
    attention_decode_paged(io[0].mut<float>(), io[1].mut<float>(), io[2].as<float>(), r, p);
  }, attention_rows(out, kv.num_seqs * p.q_len, p.n_heads * p.head_dim, p.o_row_stride, true),
     graph::writes(lse, kv.num_seqs * p.n_heads * p.q_len),
     attention_rows(q, kv.num_seqs * p.q_len, p.n_heads * p.head_dim, p.q_row_stride, false),
     graph::reads(kv.k_pool, 1), graph::reads(kv.v_pool, 1), graph::reads(kv.block_table, kv.num_seqs * kv.max_blocks_per_seq),
     graph::reads(kv.seq_lens, kv.num_seqs));
  trace::Scope kiln_trace_(trace::Category::kKernel, "attention_decode", [&](trace::Event& e) { describe_attention(e, p, attention_decode_paged_cost(p, kv), "split-kv paged"); });
  std::vector<FlashSeq> seqs(static_cast<size_t>(kv.num_seqs));
  std::vector<const FlashSeq*> ptrs;
  for (int64_t i = 0; i < kv.num_seqs; ++i) {
    FlashSeq& s = seqs[static_cast<size_t>(i)];
    s = FlashSeq{};
    s.q = q + i * p.q_len * p.q_row_stride;
    s.o = out + i * p.q_len * p.o_row_stride;
    s.lse = lse + i * p.n_heads * p.q_len;
    s.q_len = p.q_len;
    s.kv_len = kv.seq_lens[i];
    KILN_CHECK(s.kv_len >= s.q_len || !p.causal);
    ptrs.push_back(&s);
  }
  forward_split_kv(shape_of(p, p.q_len, flash_tiles().fwd), ptrs, p.num_splits, &kv);  // runs end at gaps between blocks
}

int64_t attention_forward_scratch_bytes(const AttentionParams& p, AttentionImpl impl) {
  if (impl == AttentionImpl::kDefault) impl = attention_impl();
  const int64_t threads = num_threads();
  if (impl == AttentionImpl::kNaive)
    return (p.batch * p.n_kv_heads > 1 ? threads : 1) * pad16(p.q_len * p.kv_len) * 4;
  if (p.q_len <= kSplitKvMaxQueries) {
    const int64_t rows = p.n_heads * p.q_len;
    const int64_t nc = p.num_splits > 0 ? p.num_splits : split_kv_chunks(p);
    const int64_t part = nc > 1 ? p.batch * nc * rows * (p.head_dim + 1) : 0;
    return 4 * (pad16(part) + threads * pad16(rows * (p.head_dim + 2)));
  }
  const FlashShape sh = shape_of(p, p.q_len, call_tiles(p).fwd);
  return 4 * threads *
         pad16(flash_forward_scratch_floats(p.head_dim, sh.tiles) +
               stage_floats(sh, p.q_len, p.kv_len, 2));
}

int64_t attention_backward_scratch_bytes(const AttentionParams& p, AttentionImpl impl) {
  if (impl == AttentionImpl::kDefault) impl = attention_impl();
  const int64_t threads = num_threads();
  if (impl == AttentionImpl::kNaive)
    return (p.batch * p.n_kv_heads > 1 ? threads : 1) * pad16(2 * p.q_len * p.kv_len) * 4;
  const int64_t rep = p.n_heads / p.n_kv_heads;
  const FlashTiles tiles = call_tiles(p).bwd;
  const int64_t nc = backward_chunks(p.kv_len, p.batch * p.n_kv_heads, tiles.k);
  const int64_t part = p.batch * p.n_kv_heads * (nc - 1) * p.q_len * rep * p.head_dim;
  const int64_t stage =
      stage_floats(shape_of(p, p.q_len, tiles), p.q_len, p.kv_len, 4, rep * p.q_len);
  return 4 *
         (pad16(part) + threads * pad16(pad16(flash_backward_scratch_floats(p.head_dim, tiles)) +
                                        pad16(rep * p.q_len) + stage));
}

}  // namespace kiln::cpu
