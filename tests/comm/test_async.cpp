// Nonblocking collectives (work.h) against the blocking ones: bitwise the same results with
// several calls in flight and non-integer values (so a different summation order would
// show), and the DeviceMesh: its checks and its axis groups.
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/comm/mesh.h"
#include "kiln/comm/work.h"
#include "kiln/core/rng.h"

namespace kiln::comm {
namespace {

Communicator& world() { return Communicator::world(); }

std::vector<float> random_values(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  Rng rng(seed);
  rng.fill_normal(v, 0.0f, 1.0f);
  return v;
}

TEST(AsyncCollectives, AllReduceInFlightIsBitwiseTheBlockingResult) {
  Communicator& w = world();
  const std::vector<int64_t> sizes = {1, 7, 1000, 65537, 300001};
  for (Algo algo : {Algo::kAuto, Algo::kRing, Algo::kRabenseifner}) {
    std::vector<std::vector<float>> blocking, async;
    for (int64_t n : sizes) {
      blocking.push_back(random_values(n, 11 + static_cast<uint64_t>(w.rank() * 31 + n)));
      async.push_back(blocking.back());
      ASSERT_TRUE(all_reduce(w, blocking.back().data(), blocking.back().data(), n, DType::kF32, ReduceOp::kAvg, algo).ok());
    }
    std::vector<Work> works;  // all in flight at once, then waited in reverse order
    for (size_t i = 0; i < sizes.size(); ++i)
      works.push_back(all_reduce_async(w, async[i].data(), async[i].data(), sizes[i], DType::kF32, ReduceOp::kAvg, algo));
    for (size_t i = works.size(); i-- > 0;) ASSERT_TRUE(works[i].wait().ok());
    for (size_t i = 0; i < sizes.size(); ++i) {
      ASSERT_TRUE(works[i].test());
      EXPECT_LE(works[i].start_seconds(), works[i].end_seconds());
      EXPECT_EQ(std::memcmp(async[i].data(), blocking[i].data(), async[i].size() * sizeof(float)), 0)
          << "size " << sizes[i] << " algo " << algo_name(algo);
    }
  }
}

TEST(AsyncCollectives, GatherScatterBroadcastMatchBlocking) {
  Communicator& w = world();
  const int p = w.size();
  const int64_t n = 4099;
  std::vector<float> mine = random_values(n, 5 + static_cast<uint64_t>(w.rank()));
  std::vector<float> g_block(static_cast<size_t>(n * p)), g_async(g_block.size());
  ASSERT_TRUE(all_gather(w, mine.data(), g_block.data(), n, DType::kF32).ok());
  Work wg = all_gather_async(w, mine.data(), g_async.data(), n, DType::kF32);
  std::vector<float> full = random_values(n * p, 9 + static_cast<uint64_t>(w.rank()));
  std::vector<float> rs_block(static_cast<size_t>(n)), rs_async(static_cast<size_t>(n));
  ASSERT_TRUE(reduce_scatter(w, full.data(), rs_block.data(), n, DType::kF32, ReduceOp::kSum).ok());
  Work wr = reduce_scatter_async(w, full.data(), rs_async.data(), n, DType::kF32, ReduceOp::kSum);
  std::vector<float> b_block = random_values(n, 77 + static_cast<uint64_t>(w.rank())), b_async = b_block;
  ASSERT_TRUE(broadcast(w, b_block.data(), n, DType::kF32, p - 1).ok());
  Work wb = broadcast_async(w, b_async.data(), n, DType::kF32, p - 1);
  ASSERT_TRUE(wb.wait().ok());
  ASSERT_TRUE(wr.wait().ok());
  ASSERT_TRUE(wg.wait().ok());
  EXPECT_EQ(std::memcmp(g_block.data(), g_async.data(), g_block.size() * 4), 0);
  EXPECT_EQ(std::memcmp(rs_block.data(), rs_async.data(), rs_block.size() * 4), 0);
  EXPECT_EQ(std::memcmp(b_block.data(), b_async.data(), b_block.size() * 4), 0);
}

TEST(AsyncCollectives, ErrorsComeBackThroughTheWork) {
  std::vector<float> x(4);
  Work bad = all_reduce_async(world(), x.data(), x.data(), 4, DType::kI8, ReduceOp::kSum);
  EXPECT_FALSE(bad.wait().ok());
  EXPECT_TRUE(Work().test());  // a default Work is complete
}

TEST(DeviceMesh, SizesMustMultiplyToTheWorld) {
  Communicator& w = world();
  auto bad = DeviceMesh::create(w, {{"dp", w.size() + 1}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("dp " + std::to_string(w.size() + 1)), std::string::npos)
      << bad.status().message();
  EXPECT_FALSE(DeviceMesh::create(w, {{"dp", w.size()}, {"dp", 1}}).ok());
  EXPECT_FALSE(DeviceMesh::create(w, {{"dp", 0}}).ok());
}

TEST(DeviceMesh, AxisGroupsAreTheRanksThatAgreeOnTheOtherAxes) {
  Communicator& w = world();
  const int p = w.size();
  const int inner = p % 2 == 0 ? 2 : 1;
  auto mesh = DeviceMesh::create(w, {{"dp", p / inner}, {"tp", inner}});
  ASSERT_TRUE(mesh.ok()) << mesh.status().message();
  DeviceMesh& m = **mesh;
  EXPECT_EQ(m.coord("dp") * inner + m.coord("tp"), w.rank());
  EXPECT_EQ(m.comm("tp").size(), inner);
  EXPECT_EQ(m.comm("dp").size(), p / inner);
  EXPECT_EQ(m.comm("tp").rank(), m.coord("tp"));
  // The sum of world ranks over the tp group: the consecutive ranks of this dp coordinate.
  float r = static_cast<float>(w.rank()), sum = 0;
  ASSERT_TRUE(all_reduce(m.comm("tp"), &r, &sum, 1, DType::kF32, ReduceOp::kSum).ok());
  const int first = m.coord("dp") * inner;
  EXPECT_EQ(sum, static_cast<float>(inner * first + inner * (inner - 1) / 2));
  // Over dp: ranks with the same tp coordinate, strided by `inner`.
  ASSERT_TRUE(all_reduce(m.comm("dp"), &r, &sum, 1, DType::kF32, ReduceOp::kSum).ok());
  float want = 0;
  for (int d = 0; d < p / inner; ++d) want += static_cast<float>(d * inner + m.coord("tp"));
  EXPECT_EQ(sum, want);
}

}  // namespace
}  // namespace kiln::comm
