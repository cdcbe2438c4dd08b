// The variable-size all-to-all (all_to_all_v, its counts exchange all_to_all_counts and
// all_to_all_v_async) against MPI's own MPI_Alltoallv / MPI_Alltoall, bitwise over the whole
// receive buffer (gaps included): random count matrices with zeros, a rank that sends nothing
// and one that receives nothing, blocks in shuffled order with gaps, every dtype; the async
// call in flight while the caller computes; argument errors and count mismatches between peers.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kiln/comm/collectives.h"
#include "kiln/comm/work.h"
#include "kiln/core/rng.h"

namespace kiln::comm {
namespace {

Communicator& world() {
  return Communicator::world();
}

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
constexpr std::byte kPoison{0xa5};

size_t elem_bytes(DType t) {
  return static_cast<size_t>(dtype_bits(t) / 8);
}

// What every rank sends every other: counts[from * p + to], the same on every rank (drawn from
// `seed`). About a third of the pairs are 0, a few are large enough to leave OpenMPI's eager
// protocol (up to 24000 elements); for even seeds one rank sends nothing and, for p > 1,
// another receives nothing (odd seeds keep every pair random, the own blocks too).
struct CountMatrix {
  int p = 1;
  std::vector<int64_t> counts;
  int64_t at(int from, int to) const { return counts[static_cast<size_t>(from * p + to)]; }
  std::vector<int64_t> row(int from) const {
    return {counts.begin() + from * p, counts.begin() + (from + 1) * p};
  }
  std::vector<int64_t> column(int to) const {
    std::vector<int64_t> c(static_cast<size_t>(p));
    for (int from = 0; from < p; ++from) c[static_cast<size_t>(from)] = at(from, to);
    return c;
  }
};

CountMatrix random_counts(int p, uint64_t seed) {
  Rng rng(seed);
  CountMatrix m{p, std::vector<int64_t>(static_cast<size_t>(p * p))};
  const int silent = static_cast<int>(seed / 2 % p), deaf = (silent + 1) % p;
  for (int from = 0; from < p; ++from)
    for (int to = 0; to < p; ++to) {
      const uint64_t kind = rng.below(20);
      int64_t n = kind < 7    ? 0
                  : kind < 19 ? 1 + static_cast<int64_t>(rng.below(300))
                              : 9000 + static_cast<int64_t>(rng.below(15000));
      if (seed % 2 == 0 && (from == silent || (p > 1 && to == deaf))) n = 0;
      m.counts[static_cast<size_t>(from * p + to)] = n;
    }
  return m;
}

// Displacements for blocks of `counts`: the blocks in a shuffled order, each after a gap of
// 0..5 elements. Returns the buffer length in elements (a trailing gap included).
int64_t layout_with_gaps(const std::vector<int64_t>& counts, Rng& rng,
                         std::vector<int64_t>& displs) {
  const int p = static_cast<int>(counts.size());
  std::vector<int> order(static_cast<size_t>(p));
  std::iota(order.begin(), order.end(), 0);
  for (int i = p - 1; i > 0; --i)
    std::swap(order[i], order[rng.below(static_cast<uint64_t>(i + 1))]);
  displs.assign(static_cast<size_t>(p), 0);
  int64_t at = 0;
  for (int j : order) {
    at += static_cast<int64_t>(rng.below(6));
    displs[static_cast<size_t>(j)] = at;
    at += counts[static_cast<size_t>(j)];
  }
  return at + static_cast<int64_t>(rng.below(6));
}

// One rank's arguments of a call: buffers, counts and displacements (in elements).
struct Call {
  DType t = DType::kF32;
  std::vector<int64_t> send_counts, send_displs, recv_counts, recv_displs;
  std::vector<std::byte> send, recv;
};

// This rank's call for matrix `m`: send filled with random bits (gaps too), recv poisoned.
Call make_call(const Communicator& c, const CountMatrix& m, DType t, uint64_t seed) {
  Rng rng(seed * 7919 + static_cast<uint64_t>(c.rank()) + 1);
  Call k;
  k.t = t;
  k.send_counts = m.row(c.rank());
  k.recv_counts = m.column(c.rank());
  const size_t es = elem_bytes(t);
  k.send.resize(static_cast<size_t>(layout_with_gaps(k.send_counts, rng, k.send_displs)) * es + 1);
  k.recv.assign(static_cast<size_t>(layout_with_gaps(k.recv_counts, rng, k.recv_displs)) * es + 1,
                kPoison);
  for (std::byte& b : k.send) b = static_cast<std::byte>(rng.next_u64());
  return k;
}

Status run(Communicator& c, Call& k) {
  return all_to_all_v(c, k.send.data(), k.send_counts, k.send_displs, k.recv.data(), k.recv_counts,
                      k.recv_displs, k.t);
}
Work run_async(Communicator& c, Call& k) {
  return all_to_all_v_async(c, k.send.data(), k.send_counts, k.send_displs, k.recv.data(),
                            k.recv_counts, k.recv_displs, k.t);
}

// The reference: MPI_Alltoallv in bytes into a copy of k.recv as it was before the call
// (poisoned), so the two buffers compare whole.
std::vector<std::byte> mpi_reference(Communicator& c, const Call& k) {
  const int p = c.size();
  const int es = static_cast<int>(elem_bytes(k.t));
  std::vector<int> sc(static_cast<size_t>(p)), sd(sc.size()), rc(sc.size()), rd(sc.size());
  for (size_t j = 0; j < sc.size(); ++j) {
    sc[j] = static_cast<int>(k.send_counts[j]) * es;
    sd[j] = static_cast<int>(k.send_displs[j]) * es;
    rc[j] = static_cast<int>(k.recv_counts[j]) * es;
    rd[j] = static_cast<int>(k.recv_displs[j]) * es;
  }
  std::vector<std::byte> ref(k.recv.size(), kPoison);
  EXPECT_EQ(MPI_Alltoallv(k.send.data(), sc.data(), sd.data(), MPI_BYTE, ref.data(), rc.data(),
                          rd.data(), MPI_BYTE, c.handle()),
            MPI_SUCCESS);
  return ref;
}

// The first byte where got and want differ, -1 when none.
int64_t first_difference(const std::vector<std::byte>& got, const std::vector<std::byte>& want) {
  if (got.size() != want.size()) return 0;
  const auto [g, w] = std::mismatch(got.begin(), got.end(), want.begin());
  return g == got.end() ? -1 : g - got.begin();
}

constexpr uint64_t kSeeds[] = {1, 2, 3, 4, 5, 6, 7, 8};

void expect_matches_mpi(Communicator& c, const char* what) {
  for (DType t : kDTypes)
    for (uint64_t seed : kSeeds) {
      const CountMatrix m = random_counts(c.size(), seed);
      Call k = make_call(c, m, t, seed);
      const std::vector<std::byte> ref = mpi_reference(c, k);
      const std::vector<std::byte> sent = k.send;
      ASSERT_TRUE(run(c, k).ok()) << what;
      EXPECT_EQ(first_difference(k.recv, ref), -1)
          << what << " " << dtype_name(t) << " seed " << seed << " rank " << c.rank();
      EXPECT_EQ(first_difference(k.send, sent), -1) << what << ": send modified";
    }
}

TEST(AllToAllV, RandomCountsEveryDtypeMatchMpiAlltoallv) {
  expect_matches_mpi(world(), "world");
}

TEST(AllToAllV, SplitCommunicatorsMatchMpiAlltoallv) {
  Communicator& w = world();
  auto sub = w.split(w.rank() % 2, w.size() - w.rank());  // reversed rank order inside
  ASSERT_TRUE(sub.ok());
  expect_matches_mpi(**sub, "split");
}

TEST(AllToAllV, NothingToMoveAcceptsNullBuffers) {
  Communicator& c = world();
  const std::vector<int64_t> zeros(static_cast<size_t>(c.size()), 0);
  EXPECT_TRUE(all_to_all_v(c, nullptr, zeros, zeros, nullptr, zeros, zeros, DType::kBF16).ok());
  // Rank 0 sends nothing and receives nothing (null buffers); the others exchange 3 elements.
  const int p = c.size(), r = c.rank();
  std::vector<int64_t> counts(static_cast<size_t>(p), r == 0 ? 0 : 3), displs(counts.size());
  counts[0] = 0;
  for (int j = 0; j < p; ++j) displs[static_cast<size_t>(j)] = 3 * j;
  std::vector<float> send(static_cast<size_t>(3 * p)), recv(send.size(), -1.0f);
  for (size_t i = 0; i < send.size(); ++i)
    send[i] = static_cast<float>(r * 1000 + static_cast<int>(i));
  const bool none = r == 0;
  ASSERT_TRUE(all_to_all_v(c, none ? nullptr : send.data(), counts, displs,
                           none ? nullptr : recv.data(), counts, displs, DType::kF32)
                  .ok());
  for (int j = 1; j < p && !none; ++j)
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(recv[static_cast<size_t>(3 * j + i)], static_cast<float>(j * 1000 + 3 * r + i));
  EXPECT_EQ(recv[0], -1.0f);
}

TEST(AllToAllCounts, MatchesMpiAlltoallInAndOutOfPlace) {
  Communicator& c = world();
  const int p = c.size();
  for (uint64_t seed : kSeeds) {
    const CountMatrix m = random_counts(p, seed);
    std::vector<int64_t> send = m.row(c.rank()), recv(static_cast<size_t>(p), -1),
                         ref(recv.size(), -1);
    ASSERT_EQ(MPI_Alltoall(send.data(), 1, MPI_INT64_T, ref.data(), 1, MPI_INT64_T, c.handle()),
              MPI_SUCCESS);
    ASSERT_TRUE(all_to_all_counts(c, send, recv).ok());
    EXPECT_EQ(recv, ref) << "seed " << seed;
    EXPECT_EQ(recv, m.column(c.rank())) << "seed " << seed;
    ASSERT_TRUE(all_to_all_counts(c, send, send).ok());  // in place
    EXPECT_EQ(send, ref) << "in place, seed " << seed;
  }
}

// Work the caller does while calls are in flight: a reduction of `x` it can check.
double compute(const std::vector<float>& x, int passes) {
  double acc = 0;
  for (int k = 0; k < passes; ++k)
    for (float v : x) acc += static_cast<double>(v) * (k + 1);
  return acc;
}

TEST(AllToAllVAsync, InFlightWhileTheCallerComputesMatchesMpiAlltoallv) {
  Communicator& c = world();
  std::vector<float> x(1 << 18);
  Rng(3).fill_uniform(x);
  const double want = compute(x, 4);
  for (DType t : kDTypes) {
    // Three calls in flight at once while the caller computes, then a blocking one queued
    // behind them (it runs on the communication thread, in order); waited in reverse order.
    std::vector<Call> calls;
    std::vector<std::vector<std::byte>> refs;
    for (uint64_t seed : {11, 12, 13, 14}) {
      calls.push_back(make_call(c, random_counts(c.size(), seed), t, seed));
      refs.push_back(mpi_reference(c, calls.back()));
    }
    std::vector<Work> works;
    for (size_t i = 0; i < 3; ++i) works.push_back(run_async(c, calls[i]));
    EXPECT_EQ(compute(x, 4), want);
    ASSERT_TRUE(run(c, calls[3]).ok());
    for (size_t i = works.size(); i-- > 0;) ASSERT_TRUE(works[i].wait().ok());
    for (size_t i = 0; i < calls.size(); ++i)
      EXPECT_EQ(first_difference(calls[i].recv, refs[i]), -1) << dtype_name(t) << " call " << i;
    for (const Work& w : works) EXPECT_LE(w.start_seconds(), w.end_seconds());
  }
  // The blocking calls again, now routed through the communication thread that exists.
  expect_matches_mpi(c, "with a communication thread");
}

TEST(AllToAllVAsync, ErrorsComeBackThroughTheWork) {
  Communicator& c = world();
  const std::vector<int64_t> zeros(static_cast<size_t>(c.size()), 0), short_counts(1, 0);
  float x = 0;
  const Status bad_dtype =
      all_to_all_v_async(c, &x, zeros, zeros, &x + 1, zeros, zeros, DType::kI8).wait();
  EXPECT_EQ(bad_dtype.code(), StatusCode::kUnimplemented) << bad_dtype.message();
  if (c.size() > 1) {
    const Status bad_size =
        all_to_all_v_async(c, &x, short_counts, zeros, &x + 1, zeros, zeros, DType::kF32).wait();
    EXPECT_EQ(bad_size.code(), StatusCode::kInvalidArgument) << bad_size.message();
  }
}

// Each case breaks one argument of an otherwise valid call the same way on every rank, so
// every rank must return the same code with a message naming the problem, before any message.
TEST(AllToAllVErrors, ArgumentErrorsOnEveryRank) {
  Communicator& c = world();
  const int p = c.size(), r = c.rank();
  struct Args {
    std::vector<int64_t> sc, sd, rc, rd;
    std::vector<float> send, recv;
    const void* send_ptr;
    void* recv_ptr;
    DType t = DType::kF32;
  };
  // Valid: 2 elements to and from every rank, blocks back to back.
  auto valid = [&] {
    Args a;
    a.sc.assign(static_cast<size_t>(p), 2);
    a.rc = a.sc;
    for (int j = 0; j < p; ++j) a.sd.push_back(2 * j);
    a.rd = a.sd;
    a.send.assign(static_cast<size_t>(2 * p), 1.0f);
    a.recv.assign(a.send.size(), 0.0f);
    a.send_ptr = a.send.data();
    a.recv_ptr = a.recv.data();
    return a;
  };
  auto call = [&](const Args& a) {
    return all_to_all_v(c, a.send_ptr, a.sc, a.sd, a.recv_ptr, a.rc, a.rd, a.t);
  };
  ASSERT_TRUE(call(valid()).ok());
  struct Case {
    const char* name;
    StatusCode code;
    const char* says;  // a part of the message
    void (*breaks)(Args&, int p, int r);
  };
  const Case cases[] = {
      {"dtype", StatusCode::kUnimplemented, "dtype i8",
       [](Args& a, int, int) { a.t = DType::kI8; }},
      {"send_counts size", StatusCode::kInvalidArgument, "send_counts has",
       [](Args& a, int, int) { a.sc.push_back(0); }},
      {"recv_displs size", StatusCode::kInvalidArgument, "recv_displs has",
       [](Args& a, int, int) { a.rd.pop_back(); }},
      {"negative count", StatusCode::kInvalidArgument, "recv_counts[0] = -2 is negative",
       [](Args& a, int, int) { a.rc[0] = -2; }},
      {"negative displacement", StatusCode::kInvalidArgument, "send_displs[0] = -1 is negative",
       [](Args& a, int, int) { a.sd[0] = -1; }},
      {"in place", StatusCode::kInvalidArgument, "in place is not supported",
       [](Args& a, int, int) { a.recv_ptr = const_cast<void*>(a.send_ptr); }},
      {"null send", StatusCode::kInvalidArgument, "send is null",
       [](Args& a, int, int) { a.send_ptr = nullptr; }},
      {"own block", StatusCode::kInvalidArgument, "must match what it receives from itself",
       [](Args& a, int, int r) { a.rc[static_cast<size_t>(r)] = 1; }},
      {"recv blocks overlap", StatusCode::kInvalidArgument, "overlap (elements",
       [](Args& a, int p, int) {
         a.rd[static_cast<size_t>(p - 1)] = 2 * p - 3;
         a.rd[0] = 2 * p - 4;
       }},
      {"recv over send", StatusCode::kInvalidArgument, "overwrite data still to be sent",
       [](Args& a, int p, int) {  // recv inside send's buffer, one element past its start
         a.send.resize(static_cast<size_t>(2 * p + 1));
         a.send_ptr = a.send.data();
         a.recv_ptr = a.send.data() + 1;
       }},
      {"block past 2 GiB", StatusCode::kOutOfRange, "limit 2 GiB",
       [](Args& a, int p, int r) { a.sc[static_cast<size_t>((r + 1) % p)] = int64_t{1} << 29; }},
      {"end past a pointer", StatusCode::kOutOfRange, "past what a pointer can address",
       [](Args& a, int, int) { a.rd[0] = INT64_MAX - 1; }},
  };
  for (const Case& k : cases) {
    if (std::string(k.name) == "block past 2 GiB" && p == 1) continue;  // the own block is copied
    if (std::string(k.name) == "recv blocks overlap" && p == 1) continue;
    Args a = valid();
    k.breaks(a, p, r);
    const Status s = call(a);
    EXPECT_EQ(s.code(), k.code) << k.name << ": " << s.message();
    EXPECT_NE(s.message().find(k.says), std::string::npos) << k.name << ": " << s.message();
    EXPECT_NE(s.message().find("[all_to_all_v]"), std::string::npos) << s.message();
  }
  // Send blocks may overlap (the same data to several ranks), and recv may lie inside send's
  // buffer where no send block is.
  Args a = valid();
  for (int64_t& d : a.sd) d = 0;
  std::vector<float> arena(static_cast<size_t>(4 * p), 0.0f);
  arena[0] = static_cast<float>(10 * r + 1);
  arena[1] = static_cast<float>(10 * r + 2);
  a.send_ptr = arena.data();
  a.recv_ptr = arena.data() + 2 * p;
  EXPECT_TRUE(call(a).ok());
  for (int j = 0; j < p; ++j) {
    EXPECT_EQ(arena[static_cast<size_t>(2 * p + 2 * j)], static_cast<float>(10 * j + 1));
    EXPECT_EQ(arena[static_cast<size_t>(2 * p + 2 * j + 1)], static_cast<float>(10 * j + 2));
  }

  std::vector<int64_t> counts(static_cast<size_t>(p), 1), short_counts(1, 1);
  EXPECT_EQ(all_to_all_counts(c, short_counts, counts).code(),
            p == 1 ? StatusCode::kOk : StatusCode::kInvalidArgument);
  counts[0] = -1;
  const Status neg = all_to_all_counts(c, counts, counts);
  EXPECT_EQ(neg.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(neg.message().find("[all_to_all_counts] send_counts[0] = -1"), std::string::npos)
      << neg.message();
  std::vector<int64_t> both(static_cast<size_t>(p + 1), 0);
  if (p > 1) {
    EXPECT_EQ(all_to_all_counts(c, std::span(both).first(static_cast<size_t>(p)),
                                std::span(both).last(static_cast<size_t>(p)))
                  .code(),
              StatusCode::kInvalidArgument);
  }
}

// Every rank sends 10 elements to the next; the receiver expects `expect` from the previous.
// A receive that is too small must not write past its block, one that is too large must say
// how many bytes came; either way the error names the sending rank, and the communicator works
// afterwards.
TEST(AllToAllVErrors, CountMismatchWithAPeerNamesIt) {
  Communicator& c = world();
  const int p = c.size(), r = c.rank();
  if (p == 1) GTEST_SKIP() << "needs a peer (the own block is checked as an argument)";
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  for (int64_t expect : {9, 11}) {
    for (bool async : {false, true}) {
      std::vector<int64_t> sc(static_cast<size_t>(p), 0), rc(sc.size(), 0), zeros(sc.size(), 0);
      sc[static_cast<size_t>(next)] = 10;
      rc[static_cast<size_t>(prev)] = expect;
      std::vector<float> send(10, 7.0f), recv(16, -1.0f);
      const Status s =
          async ? all_to_all_v_async(c, send.data(), sc, zeros, recv.data(), rc, zeros, DType::kF32)
                      .wait()
                : all_to_all_v(c, send.data(), sc, zeros, recv.data(), rc, zeros, DType::kF32);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
      EXPECT_NE(s.message().find("rank " + std::to_string(prev) + " sent"), std::string::npos)
          << s.message();
      if (expect == 11) {
        EXPECT_NE(s.message().find("sent 40 bytes"), std::string::npos) << s.message();
      }
      for (size_t i = static_cast<size_t>(expect); i < recv.size(); ++i)
        EXPECT_EQ(recv[i], -1.0f) << "written past the block at " << i << ", expected " << expect;
    }
  }
  // Nothing was left behind: a correct call goes through.
  expect_matches_mpi(c, "after mismatches");
}

}  // namespace
}  // namespace kiln::comm
