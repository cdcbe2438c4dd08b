// Double binary tree all-reduce (NCCL's tree): two binary trees in which no rank is an inner
// node in both; each tree reduces one half of the vector up to its root and broadcasts it
// back down, in chunks, so that every level of both trees works at once.
#include <cstring>

#include "kiln/comm/detail.h"

namespace kiln::comm::detail {
namespace {

// In-order binary tree on positions 1..p: node x with lowest set bit b has children
// x - b/2 and x + c (c the largest power of two <= b/2 with x + c <= p); the root is the
// largest power of two <= p. Leaves are exactly the odd positions.
void position_children(int p, int x, int out[2]) {
  const int b = x & -x;
  out[0] = out[1] = -1;
  if (b < 2) return;
  out[0] = x - b / 2;
  int c = b / 2;
  while (c >= 1 && x + c > p) c /= 2;
  if (c >= 1) out[1] = x + c;
}

int position_parent(int p, int x) {
  const int root = floor_pow2(p);
  if (x == root) return -1;
  // Walk down from the root: the parent is the last node before x on the path.
  int cur = root;
  for (;;) {
    int ch[2];
    position_children(p, cur, ch);
    const int next = x < cur ? ch[0] : ch[1];
    if (next == x) return cur;
    KILN_CHECK(next >= 1);
    cur = next;
  }
}

int rank_to_position(int p, int rank, int which) {
  if (which == 0) return rank + 1;
  return p % 2 == 0 ? p - rank : (rank + 1) % p + 1;
}
int position_to_rank(int p, int pos, int which) {
  if (which == 0) return pos - 1;
  return p % 2 == 0 ? p - pos : mod(pos - 2, p);
}

}  // namespace

TreeLinks tree_links(int p, int rank, int which) {
  TreeLinks t;
  const int x = rank_to_position(p, rank, which);
  const int par = position_parent(p, x);
  if (par >= 1) t.parent = position_to_rank(p, par, which);
  int ch[2];
  position_children(p, x, ch);
  for (int i = 0; i < 2; ++i)
    if (ch[i] >= 1) t.children[i] = position_to_rank(p, ch[i], which);
  return t;
}

int tree_height(int p) {
  int h = 0;
  while ((2 << h) <= p) ++h;  // floor(log2 p): the root's level above the odd leaves
  return h;
}

void allreduce_double_binary_tree(Communicator& c, const std::byte* send, std::byte* recv,
                                  int64_t n, const RedSpec& s, int avg_divisor) {
  const int p = c.size(), r = c.rank();
  const size_t es = s.esize;
  if (p == 1) {
    if (recv != send && n > 0) std::memcpy(recv, send, n * es);
    if (avg_divisor > 0) divide(s.dtype, recv, n, avg_divisor);
    return;
  }
  const TreeLinks tree[2] = {tree_links(p, r, 0), tree_links(p, r, 1)};
  const int64_t half = n / 2;
  const int64_t lo[2] = {0, half}, len[2] = {half, n - half};
  const size_t chunk_bytes = tree_chunk_bytes(n * es);
  const int64_t chunk = static_cast<int64_t>(chunk_bytes / es);
  const int64_t nchunks[2] = {(len[0] + chunk - 1) / chunk, (len[1] + chunk - 1) / chunk};
  const int64_t K = std::max(nchunks[0], nchunks[1]);
  // The down phase of chunk k runs `lag` iterations after its up phase, so chunk k+1..k+lag
  // climb the tree while chunk k comes down.
  const int64_t lag = tree_height(p) + 1;
  std::byte* tmp[2] = {c.scratch(0, chunk_bytes), c.scratch(1, chunk_bytes)};
  std::vector<MPI_Request> up_sends[2] = {std::vector<MPI_Request>(nchunks[0], MPI_REQUEST_NULL),
                                          std::vector<MPI_Request>(nchunks[1], MPI_REQUEST_NULL)};
  std::vector<MPI_Request> down_sends, kid_recvs;

  auto range = [&](int w, int64_t k, int64_t* a, int64_t* cnt) {
    *a = lo[w] + k * chunk;
    *cnt = std::min(chunk, lo[w] + len[w] - *a);
  };
  auto up = [&](int w, int64_t k) {
    const TreeLinks& t = tree[w];
    int64_t a, cnt;
    range(w, k, &a, &cnt);
    const std::byte* mine = send + a * es;
    std::byte* dst = recv + a * es;
    const int nk = t.num_children();
    if (nk > 0) {
      kid_recvs.clear();
      for (int j = 0; j < 2; ++j)
        if (t.children[j] >= 0)
          kid_recvs.push_back(c.irecv(tmp[j], cnt * es, t.children[j], kTagTree + 2 * w));
      Communicator::wait_all(kid_recvs);
      const std::byte* acc = mine;
      for (int j = 0; j < 2; ++j) {
        if (t.children[j] < 0) continue;
        combine(s.dtype, s.op, dst, acc, tmp[j], cnt);
        acc = dst;
      }
      mine = dst;
    }
    if (t.parent >= 0) {
      up_sends[w][k] = c.isend(mine, cnt * es, t.parent, kTagTree + 2 * w);
    } else if (avg_divisor > 0) {
      divide(s.dtype, dst, cnt, avg_divisor);  // the root owns the final value of this chunk
    }
  };
  auto down = [&](int w, int64_t k) {
    const TreeLinks& t = tree[w];
    int64_t a, cnt;
    range(w, k, &a, &cnt);
    std::byte* dst = recv + a * es;
    if (t.parent >= 0) {
      Communicator::wait(up_sends[w][k]);  // the same bytes go up before the result comes down
      c.recv(dst, cnt * es, t.parent, kTagTree + 2 * w + 1);
    }
    for (int j = 0; j < 2; ++j)
      if (t.children[j] >= 0)
        down_sends.push_back(c.isend(dst, cnt * es, t.children[j], kTagTree + 2 * w + 1));
  };
  for (int64_t it = 0; it < K + lag; ++it) {
    for (int w = 0; w < 2; ++w)
      if (it < nchunks[w]) up(w, it);
    for (int w = 0; w < 2; ++w) {
      const int64_t k = it - lag;
      if (k >= 0 && k < nchunks[w]) down(w, k);
    }
  }
  Communicator::wait_all(down_sends);
}

}  // namespace kiln::comm::detail
