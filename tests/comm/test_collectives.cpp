// Every collective algorithm against a direct computation: op x dtype x size class (0, 1,
// p-1, p+1, odd, a few thousand, one larger than a pipeline chunk), in place and out of
// place. Values are small integers, so every dtype and every summation order is exact.
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/core/cpu_features.h"
#include "kiln/comm/collectives.h"
#include "kiln/comm/reduce.h"
#include "kiln/comm/reduce_kernels.h"

namespace kiln::comm {
namespace {

Communicator& world() { return Communicator::world(); }

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};

// Element i of the contribution of `who`: an integer in [-4, 4].
float value_of(int who, int64_t i) { return static_cast<float>((i * 7 + who * 3 + i / 5) % 9 - 4); }

// Elements stored as their dtype's bits in uint32 (f32 bits, or 16-bit patterns).
uint32_t to_bits(DType t, float v) {
  if (t == DType::kF32) return f32_bits(v);
  return t == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
}
float from_bits(DType t, uint32_t b) {
  if (t == DType::kF32) return f32_from_bits(b);
  return t == DType::kBF16 ? bf16_to_f32(static_cast<uint16_t>(b)) : f16_to_f32(static_cast<uint16_t>(b));
}

// A buffer of n elements of dtype t.
struct Buf {
  DType t;
  std::vector<std::byte> bytes;
  Buf(DType dt, int64_t n) : t(dt), bytes(dtype_nbytes(dt, n) + 1) {}  // +1: never empty
  size_t es() const { return dtype_bits(t) / 8; }
  std::byte* data() { return bytes.data(); }
  void set(int64_t i, float v) {
    const uint32_t b = to_bits(t, v);
    std::memcpy(bytes.data() + i * es(), &b, es());
  }
  uint32_t bits(int64_t i) const {
    uint32_t b = 0;
    std::memcpy(&b, bytes.data() + i * es(), es());
    return b;
  }
  float get(int64_t i) const { return from_bits(t, bits(i)); }
  void fill_nan(int64_t n) {
    for (int64_t i = 0; i < n; ++i) set(i, NAN);
  }
};

float reduce_ref(ReduceOp op, int p, int64_t i, int offset_who = 0, int stride_who = 1) {
  float acc = op == ReduceOp::kMax ? -INFINITY : 0.0f;
  for (int r = 0; r < p; ++r) {
    const float v = value_of(offset_who + r * stride_who, i);
    acc = op == ReduceOp::kMax ? std::max(acc, v) : acc + v;
  }
  return op == ReduceOp::kAvg ? acc / static_cast<float>(p) : acc;
}

std::vector<int64_t> size_classes(int p) {
  return {0, 1, p - 1 > 0 ? p - 1 : 2, p + 1, 7, 13, 3001, 600011};
}

// Counts around the eager-piece boundaries of the broadcasts and the all-to-alls (detail.h:
// 4032 B pieces up to 32 KiB, one message above): one f32 piece exactly and one element more,
// 32 KiB of f32 exactly (9 pieces, the last partial) and one element more; bf16/f16 at 4099
// and 16383 elements cut pieces at odd element counts.
std::vector<int64_t> piece_classes() { return {1008, 1009, 4099, 8192, 8193, 16383}; }

// Same verdict everywhere: counts mismatches of `got` against `want` bits.
template <class Want>
int64_t count_wrong(const Buf& got, int64_t n, DType t, Want want) {
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i)
    if (got.bits(i) != to_bits(t, want(i))) ++wrong;
  return wrong;
}

std::vector<Algo> algos_for(CollOp op) {
  std::vector<Algo> out;
  for (const AlgoInfo& a : kAlgoInfos)
    if (algo_implements(a.algo, op)) out.push_back(a.algo);
  return out;
}

TEST(DistCollectives, AllReduceEveryAlgorithm) {
  Communicator& c = world();
  const int p = c.size(), r = c.rank();
  for (int rpn : {0, 2}) {
    c.set_ranks_per_node(rpn);
    for (Algo algo : algos_for(CollOp::kAllReduce)) {
      if (rpn != 0 && algo != Algo::kHierarchical) continue;
      for (DType t : kDTypes)
        for (ReduceOp op : kOps)
          for (int64_t n : size_classes(p)) {
            if (n > 5000 && !((t == DType::kF32 && op != ReduceOp::kAvg) ||
                               (t == DType::kBF16 && op == ReduceOp::kAvg)))
              continue;
            for (bool in_place : {false, true}) {
              Buf send(t, n), recv(t, n);
              for (int64_t i = 0; i < n; ++i) send.set(i, value_of(r, i));
              recv.fill_nan(n);
              Buf& out = in_place ? send : recv;
              ASSERT_TRUE(all_reduce(c, send.data(), out.data(), n, t, op, algo).ok());
              const int64_t wrong =
                  count_wrong(out, n, t, [&](int64_t i) { return reduce_ref(op, p, i); });
              EXPECT_EQ(wrong, 0) << "all_reduce " << algo_name(algo) << " " << dtype_name(t)
                                  << " " << reduce_op_name(op) << " n=" << n
                                  << (in_place ? " in place" : "") << " rpn=" << rpn;
              if (!in_place) {
                int64_t changed = 0;
                for (int64_t i = 0; i < n; ++i) changed += send.bits(i) != to_bits(t, value_of(r, i));
                EXPECT_EQ(changed, 0) << "send buffer modified by " << algo_name(algo);
              }
            }
          }
    }
  }
  c.set_ranks_per_node(0);
}

// Non-integer data: results are within rounding of the direct sum, and bitwise the same on
// every rank (what data-parallel training needs).
TEST(DistCollectives, AllReduceRandomF32SameOnEveryRank) {
  Communicator& c = world();
  const int p = c.size(), r = c.rank();
  const int64_t n = 100003;
  for (Algo algo : algos_for(CollOp::kAllReduce)) {
    std::vector<float> send(n), recv(n);
    for (int64_t i = 0; i < n; ++i) send[i] = std::sin(0.001f * i * (r + 1)) * 3.0f;
    ASSERT_TRUE(all_reduce(c, send.data(), recv.data(), n, DType::kF32, ReduceOp::kSum, algo).ok());
    double max_err = 0;
    for (int64_t i = 0; i < n; ++i) {
      double want = 0;
      for (int q = 0; q < p; ++q) want += std::sin(0.001f * i * (q + 1)) * 3.0f;
      max_err = std::max(max_err, std::abs(want - recv[i]));
    }
    EXPECT_LT(max_err, 1e-5 * p) << algo_name(algo);
    // Bitwise identical across ranks: compare against rank 0's copy.
    std::vector<float> root_copy = recv;
    MPI_Bcast(root_copy.data(), static_cast<int>(n), MPI_FLOAT, 0, c.handle());
    EXPECT_EQ(std::memcmp(root_copy.data(), recv.data(), n * 4), 0) << algo_name(algo);
  }
}

TEST(DistCollectives, AllGatherEveryAlgorithm) {
  Communicator& c = world();
  const int p = c.size(), r = c.rank();
  for (Algo algo : algos_for(CollOp::kAllGather))
    for (DType t : kDTypes)
      for (int64_t n : size_classes(p)) {
        if (n > 5000 && t != DType::kF32) continue;
        if (n > 100000) n = 200003;  // p * n elements on every rank
        for (bool in_place : {false, true}) {
          Buf send(t, n), recv(t, n * p);
          recv.fill_nan(n * p);
          Buf& src = in_place ? recv : send;
          const int64_t base = in_place ? r * n : 0;
          for (int64_t i = 0; i < n; ++i) src.set(base + i, value_of(r, i));
          ASSERT_TRUE(all_gather(c, src.data() + base * src.es(), recv.data(), n, t, algo).ok());
          const int64_t wrong = count_wrong(recv, n * p, t, [&](int64_t i) {
            return value_of(static_cast<int>(i / n), i % n);
          });
          EXPECT_EQ(wrong, 0) << "all_gather " << algo_name(algo) << " " << dtype_name(t)
                              << " n=" << n << (in_place ? " in place" : "");
        }
      }
}

TEST(DistCollectives, ReduceScatterEveryAlgorithm) {
  Communicator& c = world();
  const int p = c.size(), r = c.rank();
  for (Algo algo : algos_for(CollOp::kReduceScatter))
    for (DType t : kDTypes)
      for (ReduceOp op : kOps)
        for (int64_t n : size_classes(p)) {
          if (n > 5000 && (t != DType::kF32 || op != ReduceOp::kSum)) continue;
          if (n > 100000) n = 200003;
          for (bool in_place : {false, true}) {
            Buf send(t, n * p), recv(t, n);
            // Rank r's input element j = value_of(r, j) over the whole p*n vector.
            for (int64_t j = 0; j < n * p; ++j) send.set(j, value_of(r, j));
            recv.fill_nan(n);
            std::byte* out = in_place ? send.data() + r * n * send.es() : recv.data();
            ASSERT_TRUE(reduce_scatter(c, send.data(), out, n, t, op, algo).ok());
            Buf got(t, n);
            std::memcpy(got.data(), out, n * send.es());
            const int64_t wrong =
                count_wrong(got, n, t, [&](int64_t i) { return reduce_ref(op, p, r * n + i); });
            EXPECT_EQ(wrong, 0) << "reduce_scatter " << algo_name(algo) << " " << dtype_name(t)
                                << " " << reduce_op_name(op) << " n=" << n
                                << (in_place ? " in place" : "");
          }
        }
}

TEST(DistCollectives, AllToAllEveryAlgorithm) {
  Communicator& c = world();
  const int p = c.size(), r = c.rank();
  std::vector<int64_t> sizes = size_classes(p);
  for (int64_t n : piece_classes()) sizes.push_back(n);
  for (Algo algo : algos_for(CollOp::kAllToAll))
    for (DType t : kDTypes)
      for (int64_t n : sizes) {
        if (n > 5000 && n != 16383 && t != DType::kF32) continue;
        if (n > 100000) n = 200003;
        for (bool in_place : {false, true}) {
          Buf send(t, n * p), recv(t, n * p);
          // Block j of rank r's send is for rank j: values of "who" = r * p + j.
          for (int j = 0; j < p; ++j)
            for (int64_t i = 0; i < n; ++i) send.set(j * n + i, value_of(r * p + j, i));
          recv.fill_nan(n * p);
          Buf& out = in_place ? send : recv;
          ASSERT_TRUE(all_to_all(c, send.data(), out.data(), n, t, algo).ok());
          const int64_t wrong = count_wrong(out, n * p, t, [&](int64_t i) {
            return value_of(static_cast<int>(i / n) * p + r, i % n);
          });
          EXPECT_EQ(wrong, 0) << "all_to_all " << algo_name(algo) << " " << dtype_name(t)
                              << " n=" << n << (in_place ? " in place" : "");
        }
      }
}

TEST(DistCollectives, BroadcastEveryAlgorithmAndRoot) {
  Communicator& c = world();
  const int p = c.size(), r = c.rank();
  std::vector<int64_t> sizes = size_classes(p);
  for (int64_t n : piece_classes()) sizes.push_back(n);
  for (Algo algo : algos_for(CollOp::kBroadcast))
    for (DType t : kDTypes)
      for (int root : {0, p - 1, p / 2})
        for (int64_t n : sizes) {
          if (n > 5000 && n != 16383 && t != DType::kF32) continue;
          Buf buf(t, n);
          if (r == root) for (int64_t i = 0; i < n; ++i) buf.set(i, value_of(root, i));
          else buf.fill_nan(n);
          ASSERT_TRUE(broadcast(c, buf.data(), n, t, root, algo).ok());
          const int64_t wrong = count_wrong(buf, n, t, [&](int64_t i) { return value_of(root, i); });
          EXPECT_EQ(wrong, 0) << "broadcast " << algo_name(algo) << " " << dtype_name(t)
                              << " root=" << root << " n=" << n;
        }
}

// max propagates a NaN from any rank (either operand of every combine), and the result is the
// same bits on every rank; max(+0, -0) is +0 whatever the order. MPI's own MPI_MAX is the
// peer's semantics and is not checked.
TEST(DistCollectives, MaxPropagatesNaN) {
  Communicator& c = world();
  const int p = c.size(), r = c.rank();
  const int64_t n = 41, kZeros = 33;  // [kZeros, n): signed zeros, no NaN
  for (CollOp cop : {CollOp::kAllReduce, CollOp::kReduceScatter})
    for (Algo algo : algos_for(cop)) {
      if (algo == Algo::kMpi) continue;
      for (DType t : kDTypes) {
        // All-reduce: element i; reduce-scatter: element i of every rank's block (so each
        // rank's own block has the same pattern).
        const int64_t total = cop == CollOp::kAllReduce ? n : n * p;
        Buf send(t, total), recv(t, n);
        for (int64_t j = 0; j < total; ++j) {
          const int64_t i = j % n;
          float v = value_of(r, i);
          if (i >= kZeros) v = r % 2 ? 0.0f : -0.0f;
          else if (i % (p + 1) == r) v = NAN;  // no NaN where i % (p + 1) == p
          send.set(j, v);
        }
        recv.fill_nan(n);
        const Status st = cop == CollOp::kAllReduce
                              ? all_reduce(c, send.data(), recv.data(), n, t, ReduceOp::kMax, algo)
                              : reduce_scatter(c, send.data(), recv.data(), n, t, ReduceOp::kMax, algo);
        ASSERT_TRUE(st.ok());
        int64_t wrong = 0;
        for (int64_t i = 0; i < n; ++i) {
          if (i >= kZeros) {
            wrong += recv.bits(i) != to_bits(t, p >= 2 ? 0.0f : -0.0f);
          } else if (i % (p + 1) < p) {
            wrong += !std::isnan(recv.get(i));
          } else {
            wrong += recv.bits(i) != to_bits(t, reduce_ref(ReduceOp::kMax, p, i));
          }
        }
        EXPECT_EQ(wrong, 0) << coll_op_name(cop) << " " << algo_name(algo) << " " << dtype_name(t);
        if (cop == CollOp::kAllReduce) {
          std::vector<std::byte> root = recv.bytes;
          MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_BYTE, 0, c.handle());
          EXPECT_EQ(std::memcmp(root.data(), recv.data(), root.size()), 0)
              << "max with NaN differs across ranks: " << algo_name(algo) << " " << dtype_name(t);
        }
      }
    }
}

// Bit-for-bit equality of two float vectors (NaN payloads and signed zeros included); empty
// vectors are equal (memcmp must not see their null data pointers).
bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * 4) == 0);
}

// The f32 SIMD reduction kernels give the scalar kernel's bits, NaN and signed zeros included.
TEST(DistReduce, SimdKernelsMatchScalar) {
  if (!simd_target_supported(SimdTarget::kAvx2)) GTEST_SKIP() << "no AVX2";
  const float specials[] = {NAN, 7.0f, 0.0f, -0.0f, INFINITY, -INFINITY, 1.5f, -2.25f, 3e38f};
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{15}, size_t{16}, size_t{37}, size_t{100}}) {
    std::vector<float> a(n), b(n), d1(n), d2(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = specials[i % 9];
      b[i] = specials[(i * 5 + 3) % 9];
    }
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      detail::combine_f32_scalar(op, d1.data(), a.data(), b.data(), n);
      detail::combine_f32_avx2(op, d2.data(), a.data(), b.data(), n);
      EXPECT_TRUE(same_bits(d1, d2)) << "n=" << n;
      if (op == ReduceOp::kMax) {  // symmetric bit for bit
        detail::combine_f32_avx2(op, d2.data(), b.data(), a.data(), n);
        EXPECT_TRUE(same_bits(d1, d2)) << "n=" << n << " swapped";
        for (size_t i = 0; i < n; ++i)
          if (std::isnan(a[i]) || std::isnan(b[i])) {
            EXPECT_TRUE(std::isnan(d1[i]));
          }
      }
    }
    d1 = a;
    d2 = a;
    detail::divide_f32_scalar(d1.data(), n, 3.0f);
    detail::divide_f32_avx2(d2.data(), n, 3.0f);
    EXPECT_TRUE(same_bits(d1, d2)) << "divide n=" << n;
  }
}

// Process groups: collectives on split communicators (even and odd ranks).
TEST(DistCollectives, SplitCommunicators) {
  Communicator& c = world();
  auto sub = c.split(c.rank() % 2, c.rank());
  ASSERT_TRUE(sub.ok());
  Communicator& g = **sub;
  EXPECT_EQ(g.size(), (c.size() + 1 - c.rank() % 2) / 2);
  EXPECT_EQ(g.rank(), c.rank() / 2);
  const int64_t n = 1001;
  std::vector<float> v(n, static_cast<float>(c.rank())), out(n);
  ASSERT_TRUE(all_reduce(g, v.data(), out.data(), n, DType::kF32, ReduceOp::kSum, Algo::kRing).ok());
  float want = 0;
  for (int q = c.rank() % 2; q < c.size(); q += 2) want += q;
  EXPECT_EQ(out[0], want);
  EXPECT_EQ(out[n - 1], want);
}

TEST(DistCollectives, ErrorsAreReturnedOnEveryRank) {
  Communicator& c = world();
  std::vector<float> v(4);
  Status s = all_reduce(c, v.data(), v.data(), 4, DType::kI8, ReduceOp::kSum, Algo::kRing);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("all_reduce"), std::string::npos) << s.message();
  s = all_reduce(c, v.data(), v.data(), 4, DType::kF32, ReduceOp::kSum, Algo::kPairwise);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = all_gather(c, v.data(), v.data(), 1, DType::kF32, Algo::kRabenseifner);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = broadcast(c, v.data(), 4, DType::kF32, c.size(), Algo::kBinomialTree);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = all_reduce(c, v.data(), v.data(), -1, DType::kF32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(DistCollectives, NamesParse) {
  for (const AlgoInfo& a : kAlgoInfos) EXPECT_EQ(parse_algo(a.name), a.algo);
  for (int i = 0; i < kNumCollOps; ++i) EXPECT_EQ(parse_coll_op(kCollOpNames[i]), static_cast<CollOp>(i));
  EXPECT_EQ(parse_reduce_op("avg"), ReduceOp::kAvg);
  EXPECT_FALSE(parse_algo("nope").has_value());
}

}  // namespace
}  // namespace kiln::comm
