// Sharded checkpoints (parallel/sharded_checkpoint.h) at every rank count: ragged layouts saved
// and loaded bitwise, resharded to other layouts and other rank counts (sub-communicators),
// single-process files loaded sharded, sharded directories read whole; and every fault (a
// missing, flipped or truncated file, no manifest, another num_params, ranges that do not tile)
// refused on every rank with one message naming the file, the state untouched.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kiln/comm/communicator.h"
#include "kiln/core/crc32c.h"
#include "kiln/core/file_io.h"
#include "kiln/train/sharded_checkpoint.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using comm::Communicator;
using nlohmann::json;

Communicator& world() {
  return Communicator::world();
}

// Element i of section s (0 params, 1 m, 2 v) of the state numbered `seed`: scattered bit
// patterns in [-1, 1), so a misplaced element shows in a bitwise comparison.
float value_at(uint32_t seed, int s, int64_t i) {
  uint32_t x =
      static_cast<uint32_t>(i) * 2654435761u ^ (seed * 40503u + static_cast<uint32_t>(s) * 97u);
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return static_cast<float>(static_cast<int32_t>(x)) * 0x1p-31f;
}

// A ragged layout of n elements over p ranks: 3p + 2 pieces of uneven sizes (some empty), each
// dealt to a rank by `seed`, so ranks hold several ranges, adjacent or not, and some none.
std::vector<std::vector<FlatRange>> ragged_layout(int64_t n, int p, uint32_t seed) {
  uint32_t x = seed * 747796405u + 1;
  auto next = [&x] {
    x = x * 1664525u + 1013904223u;
    return x >> 8;
  };
  std::vector<int64_t> cuts = {0, n};
  for (int k = 1; k < 3 * p + 2; ++k)
    cuts.push_back(static_cast<int64_t>(next() % static_cast<uint32_t>(n + 1)));
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::vector<FlatRange>> out(p);
  for (size_t k = 0; k + 1 < cuts.size(); ++k) out[next() % p].push_back({cuts[k], cuts[k + 1]});
  return out;
}

// ZeRO's layout: rank r holds [r n / p, (r + 1) n / p).
std::vector<std::vector<FlatRange>> even_layout(int64_t n, int p) {
  std::vector<std::vector<FlatRange>> out(p);
  for (int r = 0; r < p; ++r) out[r].push_back({r * n / p, (r + 1) * n / p});
  return out;
}

// One rank's state in a layout: its ranges and their params, m, v.
struct Local {
  int64_t n = 0;
  std::vector<FlatRange> ranges;
  std::vector<float> s[3];

  // The values of state `seed` in `ranges`.
  Local(int64_t num_params, std::vector<FlatRange> r, uint32_t seed)
      : n(num_params), ranges(std::move(r)) {
    for (int k = 0; k < 3; ++k)
      for (const FlatRange& fr : ranges)
        for (int64_t i = fr.begin; i < fr.end; ++i) s[k].push_back(value_at(seed, k, i));
  }
  ShardView view() { return {n, ranges, s[0], s[1], s[2]}; }
  // Elements whose bits differ from state `seed`.
  int64_t wrong(uint32_t seed) const {
    int64_t bad = 0;
    for (int k = 0; k < 3; ++k) {
      size_t at = 0;
      for (const FlatRange& fr : ranges)
        for (int64_t i = fr.begin; i < fr.end; ++i, ++at) {
          const float want = value_at(seed, k, i);
          bad += std::memcmp(&s[k][at], &want, 4) != 0;
        }
    }
    return bad;
  }
};

constexpr int64_t kN = 5003;
// Sections of 4.4 MB: a file's sections are read in pieces of 4 MiB, and copies cross them.
constexpr int64_t kLargeN = 1'100'003;

CheckpointHeader meta_of(int64_t n) {
  CheckpointHeader h;
  h.step = 123;
  h.num_params = n;
  h.model = "gpt2 test model";
  h.options = {{"lr", 3e-4}, {"batch", 4}, {"precision", "bf16"}};
  h.loss_scale = 1024.0;
  h.loss_scale_good_steps = 17;
  h.time_budget_steps = 500;
  return h;
}

void expect_meta(const CheckpointHeader& h, int64_t n) {
  const CheckpointHeader want = meta_of(n);
  EXPECT_EQ(h.step, want.step);
  EXPECT_EQ(h.num_params, n);
  EXPECT_EQ(h.model, want.model);
  EXPECT_EQ(h.options, want.options);
  EXPECT_EQ(h.loss_scale, want.loss_scale);
  EXPECT_EQ(h.loss_scale_good_steps, want.loss_scale_good_steps);
  EXPECT_EQ(h.time_budget_steps, want.time_budget_steps);
}

// A fresh directory for this test at this rank count (the np1..np4 jobs run at the same time).
std::string test_dir() {
  const fs::path dir = fs::path(KILN_BINARY_DIR) / "test_parallel_tmp" /
                       ("np" + std::to_string(world().size())) /
                       testing::UnitTest::GetInstance()->current_test_info()->name();
  if (world().rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  world().barrier();
  return dir.string();
}

// Saves state `seed` in layout[rank] over `c`; every rank of c expects success.
void save(Communicator& c, const std::string& dir, int64_t n,
          const std::vector<std::vector<FlatRange>>& layout, uint32_t seed) {
  Local mine(n, layout[c.rank()], seed);
  const Status s = save_sharded_checkpoint(c, dir, meta_of(n), mine.view());
  ASSERT_TRUE(s.ok()) << s.to_string();
}

// Loads `path` into layout[rank] over `c` and expects state `seed`, bitwise, and the metadata.
void expect_loads(Communicator& c, const std::string& path, int64_t n,
                  const std::vector<std::vector<FlatRange>>& layout, uint32_t seed) {
  Local mine(n, layout[c.rank()], seed + 1000);  // other values, so a missed element shows
  const Expected<CheckpointHeader> h = load_sharded_checkpoint(c, path, mine.view());
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(mine.wrong(seed), 0);
  expect_meta(*h, n);
}

json manifest_of(const std::string& dir) {
  return json::parse(read_file((fs::path(dir) / kManifestFileName).string()).value());
}

std::string shard_path(const std::string& dir, int shard, int num_shards) {
  return (fs::path(dir) / shard_file_name(shard, num_shards)).string();
}

bool same_on_every_rank(const std::string& s) {
  unsigned h = crc32c(s), lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UNSIGNED, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UNSIGNED, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

// An error on every rank, the same message everywhere, holding every one of `needles`.
void expect_error_everywhere(const Status& s, const std::vector<std::string>& needles) {
  ASSERT_FALSE(s.ok());
  for (const std::string& needle : needles)
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message() << "\nlacks: " << needle;
  EXPECT_TRUE(same_on_every_rank(s.message())) << s.message();
}

// Every rank loads `path` into `mine` (state 99) and is refused; the state is untouched.
void expect_refused(const std::string& path, Local& mine, const std::vector<std::string>& needles) {
  expect_error_everywhere(load_sharded_checkpoint(world(), path, mine.view()).status(), needles);
  EXPECT_EQ(mine.wrong(99), 0) << "a refused load overwrote the state";
}

// The same into a ragged layout of view_n elements.
void expect_refused(const std::string& path, int64_t view_n,
                    const std::vector<std::string>& needles) {
  Local mine(view_n, ragged_layout(view_n, world().size(), 9)[world().rank()], 99);
  expect_refused(path, mine, needles);
}

// Every rank saves its part of `layout` into dir and is refused; no manifest is left there.
void expect_save_refused(const std::string& dir, const std::vector<std::vector<FlatRange>>& layout,
                         const std::string& needle) {
  Local mine(kN, layout[world().rank()], 14);
  expect_error_everywhere(save_sharded_checkpoint(world(), dir, meta_of(kN), mine.view()),
                          {needle});
  EXPECT_FALSE(fs::exists(fs::path(dir) / kManifestFileName));
}

void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  char c = 0;
  f.seekg(static_cast<std::streamoff>(offset));
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x40));
  ASSERT_TRUE(f.good()) << path;
}

// The shard file with the most elements (its sections are not empty).
int largest_shard(const json& manifest) {
  int best = 0;
  for (int i = 0; i < static_cast<int>(manifest["shards"].size()); ++i)
    if (manifest["shards"][i]["sections"][0]["bytes"] >
        manifest["shards"][best]["sections"][0]["bytes"])
      best = i;
  return best;
}

// Rank 0 runs `edit` on the saved files, then every rank waits for it.
template <class F>
void on_rank0(F edit) {
  if (world().rank() == 0) edit();
  world().barrier();
}

TEST(ShardedCheckpoint, SameLayoutLoadsBitwise) {
  const std::string dir = test_dir();
  const int p = world().size();
  const auto layout = ragged_layout(kN, p, 1);
  save(world(), dir, kN, layout, 1);
  expect_loads(world(), dir, kN, layout, 1);
  const json m = manifest_of(dir);
  EXPECT_EQ(m["format"], std::string(kShardedCheckpointFormat));
  EXPECT_EQ(m["num_shards"], p);
  for (int r = 0; r < p; ++r) EXPECT_TRUE(fs::exists(shard_path(dir, r, p)));
  // Saving again replaces the checkpoint (once every rank has read the manifest).
  world().barrier();
  save(world(), dir, kN, layout, 2);
  expect_loads(world(), dir, kN, layout, 2);
}

TEST(ShardedCheckpoint, ReshardsToOtherLayouts) {
  const std::string dir = test_dir();
  const int p = world().size();
  save(world(), dir, kN, ragged_layout(kN, p, 1), 3);
  expect_loads(world(), dir, kN, ragged_layout(kN, p, 2), 3);
  expect_loads(world(), dir, kN, even_layout(kN, p), 3);
}

TEST(ShardedCheckpoint, SavedOnFewerRanksLoadsOnAll) {
  const std::string dir = test_dir();
  const int p = world().size(), q = std::max(1, p - 1);
  auto sub = world().split(world().rank() < q ? 0 : 1, world().rank());
  ASSERT_TRUE(sub.ok());
  if (world().rank() < q) save(**sub, dir, kN, ragged_layout(kN, q, 4), 5);
  world().barrier();
  EXPECT_EQ(manifest_of(dir)["num_shards"], q);
  expect_loads(world(), dir, kN, ragged_layout(kN, p, 6), 5);
}

TEST(ShardedCheckpoint, SavedOnAllLoadsOnFewer) {
  const std::string dir = test_dir();
  const int p = world().size(), q = (p + 1) / 2;
  save(world(), dir, kN, ragged_layout(kN, p, 7), 6);
  auto sub = world().split(world().rank() < q ? 0 : 1, world().rank());
  ASSERT_TRUE(sub.ok());
  if (world().rank() < q) expect_loads(**sub, dir, kN, ragged_layout(kN, q, 8), 6);
}

TEST(ShardedCheckpoint, SingleProcessFileLoadsSharded) {
  const std::string dir = test_dir();
  const std::string file = dir + "/single.ckpt";
  on_rank0([&] {
    Local all(kLargeN, {{0, kLargeN}}, 7);
    const Status s = save_checkpoint_file(file, meta_of(kLargeN), all.view());
    ASSERT_TRUE(s.ok()) << s.to_string();
    // The train/checkpoint.h format itself: the header parses and every section's CRC-32C holds.
    const std::string bytes = read_file(file).value();
    const Expected<CheckpointHeader> h = parse_checkpoint_header(bytes, bytes.size());
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    for (const CheckpointSection& sec : h->sections)
      EXPECT_EQ(crc32c(std::string_view(bytes).substr(sec.offset, sec.bytes)), sec.crc32c)
          << sec.name;
  });
  expect_loads(world(), file, kLargeN, ragged_layout(kLargeN, world().size(), 10), 7);
  expect_loads(world(), file, kLargeN, even_layout(kLargeN, world().size()), 7);
}

TEST(ShardedCheckpoint, ShardedDirectoryReadWholeByOneProcess) {
  const std::string dir = test_dir();
  save(world(), dir, kLargeN, ragged_layout(kLargeN, world().size(), 11), 8);
  world().barrier();
  on_rank0([&] {
    Expected<FullCheckpoint> full = load_checkpoint_whole(dir);
    ASSERT_TRUE(full.ok()) << full.status().to_string();
    expect_meta(full->meta, kLargeN);
    Local all(kLargeN, {{0, kLargeN}}, 0);
    all.s[0] = full->params;
    all.s[1] = full->m;
    all.s[2] = full->v;
    EXPECT_EQ(all.wrong(8), 0);
    // Export: the whole state as a single-process file, which reads back the same.
    const std::string file = dir + "/exported.ckpt";
    const Status s = save_checkpoint_file(file, full->meta, all.view());
    ASSERT_TRUE(s.ok()) << s.to_string();
    Expected<FullCheckpoint> again = load_checkpoint_whole(file);
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_EQ(std::memcmp(again->v.data(), full->v.data(), kLargeN * 4), 0);
  });
}

// ---- Faults: each refused on every rank, with one message naming the file ----

// A checkpoint of state 11 saved by every rank in a ragged layout of kN elements.
std::string saved_dir() {
  const std::string dir = test_dir();
  save(world(), dir, kN, ragged_layout(kN, world().size(), 12), 11);
  world().barrier();
  return dir;
}

TEST(ShardedCheckpointFaults, MissingShardFile) {
  const std::string dir = saved_dir();
  const int p = world().size();
  on_rank0([&] { fs::remove(shard_path(dir, p - 1, p)); });
  expect_refused(dir, kN, {shard_path(dir, p - 1, p), "missing"});
}

TEST(ShardedCheckpointFaults, MissingShardFileThatNoRankReads) {
  const std::string dir = test_dir();
  const int p = world().size();
  save(world(), dir, kN, even_layout(kN, p), 11);
  world().barrier();
  on_rank0([&] { fs::remove(shard_path(dir, p - 1, p)); });
  // Every rank loads one element of shard 0, which is intact unless p = 1.
  Local mine(kN, {{world().rank(), world().rank() + 1}}, 99);
  expect_refused(dir, mine, {shard_path(dir, p - 1, p), "missing"});
}

// Ranks 1.. pass views that are not sorted, each its own (rank 0 too where p = 1): every rank
// returns rank 1's error, and rank 0, whose reads all verified, keeps its state.
TEST(ShardedCheckpointFaults, RefusedOnSomeRanksIsRefusedOnAll) {
  const std::string dir = saved_dir();
  const int p = world().size(), r = world().rank();
  const int lowest_failing = p == 1 ? 0 : 1;
  std::vector<FlatRange> ranges = ragged_layout(kN, p, 9)[r];
  if (r >= lowest_failing) ranges = {{100, 200}, {r, r + 1}};
  Local mine(kN, ranges, 99);
  expect_refused(dir, mine, {fmt::format("range 1 [{}, {})", lowest_failing, lowest_failing + 1)});
}

TEST(ShardedCheckpointFaults, FlippedByteInSection) {
  const std::string dir = saved_dir();
  const int p = world().size();
  const json m = manifest_of(dir);
  const int k = largest_shard(m);
  on_rank0([&] {
    flip_byte(shard_path(dir, k, p), m["shards"][k]["sections"][1]["offset"].get<uint64_t>() + 5);
  });
  expect_refused(dir, kN, {shard_path(dir, k, p), "section m", "CRC-32C mismatch"});
}

TEST(ShardedCheckpointFaults, FlippedByteInShardHeader) {
  const std::string dir = saved_dir();
  const int p = world().size();
  const int k = largest_shard(manifest_of(dir));
  on_rank0([&] { flip_byte(shard_path(dir, k, p), 30); });
  expect_refused(dir, kN, {shard_path(dir, k, p), "shard header", "CRC-32C"});
}

TEST(ShardedCheckpointFaults, TruncatedShardFile) {
  const std::string dir = saved_dir();
  const int p = world().size();
  const int k = largest_shard(manifest_of(dir));
  on_rank0(
      [&] { fs::resize_file(shard_path(dir, k, p), fs::file_size(shard_path(dir, k, p)) - 7); });
  expect_refused(dir, kN, {shard_path(dir, k, p), "truncated"});
}

TEST(ShardedCheckpointFaults, ManifestMissingIsIncomplete) {
  const std::string dir = saved_dir();
  on_rank0([&] { fs::remove(fs::path(dir) / kManifestFileName); });
  expect_refused(dir, kN, {dir, "incomplete"});
}

TEST(ShardedCheckpointFaults, OtherNumParams) {
  const std::string dir = saved_dir();
  // The run's vector is larger than the checkpoint's.
  expect_refused(dir, kN + 1, {dir, "holds 5003 parameters", "5004"});
  // A manifest that says fewer parameters than its shards hold.
  on_rank0([&] {
    json m = manifest_of(dir);
    m["num_params"] = kN - 1;
    ASSERT_TRUE(write_file_atomic(dir + "/manifest.json", {m.dump()}).ok());
  });
  expect_refused(dir, kN - 1,
                 {std::string(kManifestFileName), "passes the end of the 5002 parameters"});
}

TEST(ShardedCheckpointFaults, RangesThatDoNotTile) {
  const std::string dir = test_dir();
  const int p = world().size();
  save(world(), dir, kN, even_layout(kN, p), 13);
  world().barrier();
  // Shard 0's one range moved up by one element: element 0 held by no shard (and, where p > 1,
  // one element by two). The sizes and CRCs all still agree.
  on_rank0([&] {
    json m = manifest_of(dir);
    m["shards"][0]["ranges"][0] = json::array({1, kN / p + 1});
    ASSERT_TRUE(write_file_atomic(dir + "/manifest.json", {m.dump()}).ok());
  });
  expect_refused(dir, kN,
                 {std::string(kManifestFileName), p > 1 ? "do not tile" : "passes the end"});
}

TEST(ShardedCheckpointFaults, SaveRefusesBadViewOnOneRank) {
  const std::string dir = test_dir();
  const int p = world().size();
  auto layout = even_layout(kN, p);
  layout[p - 1].push_back({0, 1});  // after its own range: not sorted, and another rank's element
  expect_save_refused(dir, layout, "not sorted");
}

TEST(ShardedCheckpointFaults, SaveRefusesLayoutsThatDoNotTile) {
  const std::string dir =
      saved_dir();  // a complete checkpoint there first: a failed save removes it
  const int p = world().size();
  auto layout = even_layout(kN, p);
  layout[p - 1].back().end -= 1;  // the last element held by nobody
  expect_save_refused(dir, layout, "do not tile");
  expect_refused(dir, kN, {"incomplete"});
}

TEST(ShardedCheckpointFaults, SingleProcessFileDamaged) {
  const std::string dir = test_dir();
  const std::string file = dir + "/single.ckpt";
  const CheckpointHeader h = meta_of(kN);
  on_rank0([&] {
    Local all(kN, {{0, kN}}, 16);
    ASSERT_TRUE(save_checkpoint_file(file, h, all.view()).ok());
    const uint64_t size = fs::file_size(file);
    flip_byte(file, size - 4 * kN + 3);  // inside v, the last section
  });
  expect_refused(file, kN, {file, "section v", "CRC-32C mismatch"});
  on_rank0([&] { fs::resize_file(file, fs::file_size(file) - 7); });
  expect_refused(file, kN, {file, "truncated"});
  expect_refused(dir + "/nothing-here", kN, {"no checkpoint at", "nothing-here"});
}

}  // namespace
}  // namespace kiln
