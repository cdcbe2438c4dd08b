// Optimizer-state offloading (train/offload.h): the chunk stream round-trips the moments and
// counts its bytes; a bad directory is an error naming it; a run with its moments in a file
// gives bitwise the losses and weights of the run with them in memory, checkpoints move between
// the two, and the moments' memory is given back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "kiln/core/allocator.h"
#include "kiln/core/thread_pool.h"
#include "kiln/perf/memory_model.h"
#include "kiln/train/offload.h"
#include "kiln/train/trainer.h"
#include "tests/temp_dir.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

TEST(OffloadedMoments, StreamRoundTripsAndCountsBytes) {
  const fs::path dir = tmp_dir("kiln_offload_stream");
  const int64_t n = 5000;  // 1024-float chunks: four whole, one partial
  auto s = OffloadedMoments::create(dir.string(), n, 1000).value();
  EXPECT_EQ(s->chunk_floats(), 1024);  // rounded up to whole 4 KiB blocks
  EXPECT_EQ(s->num_chunks(), 5);
  EXPECT_TRUE(fs::is_empty(dir));  // the file has no name: nothing is left behind
  int64_t seen = 0;
  ASSERT_TRUE(s->stream([&](int64_t begin, int64_t count, float* m, float* v) {
                 EXPECT_EQ(begin, seen);
                 for (int64_t i = 0; i < count; ++i) {
                   EXPECT_EQ(m[i], 0.0f);  // a new file reads as zeros
                   EXPECT_EQ(v[i], 0.0f);
                   m[i] = static_cast<float>(begin + i);
                   v[i] = -static_cast<float>(begin + i) - 0.5f;
                 }
                 seen += count;
               }).ok());
  EXPECT_EQ(seen, n);
  OffloadStats st = s->take_stats();
  EXPECT_EQ(st.bytes_read, s->file_bytes());
  EXPECT_EQ(st.bytes_written, s->file_bytes());
  EXPECT_EQ(s->file_bytes(), 5 * 2 * 1024 * 4);
  // Read only: the values written, and nothing written back.
  int64_t wrong = 0;
  ASSERT_TRUE(s->stream(
                   [&](int64_t begin, int64_t count, float* m, float* v) {
                     for (int64_t i = 0; i < count; ++i)
                       wrong += m[i] != static_cast<float>(begin + i) || v[i] != -static_cast<float>(begin + i) - 0.5f;
                   },
                   /*write_back=*/false)
                  .ok());
  EXPECT_EQ(wrong, 0);
  st = s->take_stats();
  EXPECT_EQ(st.bytes_read, s->file_bytes());
  EXPECT_EQ(st.bytes_written, 0);
}

TEST(OffloadedMoments, BadDirectoriesAreNamed) {
  const fs::path dir = tmp_dir("kiln_offload_bad");
  auto missing = OffloadedMoments::create((dir / "nope").string(), 100);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find((dir / "nope").string()), std::string::npos);
  { std::ofstream(dir / "file") << "x"; }
  auto file = OffloadedMoments::create((dir / "file").string(), 100);
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("not a directory"), std::string::npos);
  // More than the disk holds: refused at the start, with the sizes.
  auto huge = OffloadedMoments::create(dir.string(), int64_t{1} << 50);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("MiB"), std::string::npos);
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directories(dir / "ro");
    fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    auto ro = OffloadedMoments::create((dir / "ro").string(), 100);
    EXPECT_FALSE(ro.ok());
    fs::permissions(dir / "ro", fs::perms::owner_all);
  }
}

ModelConfig small_llama() {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.vocab_size = 13; c.d_model = 32; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 2;
  c.d_ff = 64; c.max_seq_len = 8;
  return c;
}

TokenShard random_tokens() {
  TokenShard data;
  data.vocab_size = 13;
  Rng rng(5);
  for (int i = 0; i < 800; ++i) data.tokens.push_back(static_cast<int32_t>(rng.below(13)));
  return data;
}

TrainOptions options() {
  TrainOptions o;
  o.batch = 2; o.seq_len = 8; o.max_steps = 8; o.warmup_steps = 2; o.eval_every = 0;
  o.clip_norm = 0.5;  // clipped on most steps: the clip factor reaches the offloaded update too
  return o;
}

// The update is elementwise, so the chunks that cut the pieces cannot change a value: bitwise.
TEST(OffloadedMoments, TrainingMatchesTheMomentsInMemory) {
  set_num_threads(2);
  const TokenShard data = random_tokens();
  const TrainOptions o = options();
  auto ref_model = Transformer::create(small_llama(), 7).value();
  Trainer ref(*ref_model, data, nullptr, o);
  auto model = Transformer::create(small_llama(), 7).value();
  Trainer t(*model, data, nullptr, o);
  ASSERT_GT(model->num_params(), 4 * 1024);  // many chunks, most pieces cut by one
  ASSERT_TRUE(t.offload_optimizer_state(tmp_dir("kiln_offload_train").string(), 1024).ok());
  ASSERT_NE(t.offloaded_moments(), nullptr);
  const int64_t moved = 2 * t.offloaded_moments()->file_bytes();
  bool clipped = false;
  for (int i = 0; i < o.max_steps; ++i) {
    const StepStats a = ref.step(), b = t.step();
    EXPECT_EQ(a.loss, b.loss) << "step " << i + 1;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << i + 1;
    clipped |= a.grad_norm > o.clip_norm;
    EXPECT_EQ(b.offload.bytes_read + b.offload.bytes_written, moved);
    EXPECT_EQ(a.offload.bytes_read, 0);
  }
  EXPECT_TRUE(clipped);
  int64_t differ = 0;
  for (size_t i = 0; i < model->params().size(); ++i) differ += model->params()[i] != ref_model->params()[i];
  EXPECT_EQ(differ, 0);
  EXPECT_FALSE(t.offload_optimizer_state(tmp_dir("kiln_offload_train2").string()).ok());  // already offloaded
}

// A checkpoint written with the moments in a file resumes in memory, and the other way round,
// to the losses of the run that was not interrupted.
TEST(OffloadedMoments, CheckpointsMoveBetweenFileAndMemory) {
  set_num_threads(1);
  const TokenShard data = random_tokens();
  const TrainOptions o = options();
  auto straight_model = Transformer::create(small_llama(), 3).value();
  const auto straight = train(*straight_model, data, nullptr, o, nullptr);
  const fs::path dir = tmp_dir("kiln_offload_ckpt");
  const std::string a = (dir / "a.bin").string(), b = (dir / "b.bin").string();
  {
    auto m = Transformer::create(small_llama(), 3).value();
    Trainer t(*m, data, nullptr, o);
    ASSERT_TRUE(t.offload_optimizer_state(dir.string(), 1024).ok());
    for (int i = 0; i < 3; ++i) EXPECT_EQ(t.step().loss, straight[i].loss);
    ASSERT_TRUE(t.save_checkpoint(a).ok());
  }
  {
    auto m = Transformer::create(small_llama(), 99).value();
    Trainer t(*m, data, nullptr, o);  // in memory
    ASSERT_TRUE(t.load_checkpoint(a).ok());
    for (int i = 3; i < 5; ++i) EXPECT_EQ(t.step().loss, straight[i].loss) << "step " << i + 1;
    ASSERT_TRUE(t.save_checkpoint(b).ok());
  }
  auto m = Transformer::create(small_llama(), 99).value();
  Trainer t(*m, data, nullptr, o);
  ASSERT_TRUE(t.offload_optimizer_state(dir.string(), 1024).ok());
  ASSERT_TRUE(t.load_checkpoint(b).ok());  // into the file
  for (int i = 5; i < o.max_steps; ++i) EXPECT_EQ(t.step().loss, straight[i].loss) << "step " << i + 1;
  set_num_threads(2);
}

TEST(OffloadedMoments, TheMomentsMemoryIsGivenBack) {
  const TokenShard data = random_tokens();
  TrainOptions o = options();
  auto m = Transformer::create(small_llama(), 3).value();
  Trainer t(*m, data, nullptr, o);
  const int64_t before = default_allocator().stats().bytes_in_use;
  ASSERT_TRUE(t.offload_optimizer_state(tmp_dir("kiln_offload_mem").string(), 1024).ok());
  const int64_t after = default_allocator().stats().bytes_in_use;
  EXPECT_GE(before - after, 2 * 4 * m->num_params());  // m and v, each 4 bytes a parameter
  o.graph_capture = true;  // a captured step writes the moments in place: refused
  Trainer captured(*m, data, nullptr, o);
  const Status st = captured.offload_optimizer_state(tmp_dir("kiln_offload_mem2").string());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("graph capture"), std::string::npos);
}

// The memory model drops the moments (8 bytes a parameter) and names the staging instead.
TEST(OffloadedMoments, MemoryModelDropsTheMoments) {
  const ModelConfig c = small_llama();
  const perf::MemoryPrediction in_memory = perf::predict_memory(c, 2, 8, Precision::kF32, CheckpointMode::kNone);
  perf::MemoryPrediction offloaded = in_memory;
  perf::offload_optimizer_state(offloaded, OffloadedMoments::staging_bytes_for(1000));
  EXPECT_EQ(OffloadedMoments::staging_bytes_for(1000), 3 * 2 * 1024 * 4);
  EXPECT_EQ(in_memory.total_bytes() - offloaded.total_bytes(), 8 * in_memory.num_params);
  EXPECT_EQ(in_memory.bytes_per_param - offloaded.bytes_per_param, 8);
  EXPECT_NE(offloaded.notes.find("offloaded"), std::string::npos);
  const std::string peak = fmt::format("{} {:.2f} MiB", perf::step_phase_name(offloaded.peak_phase()),
                                       static_cast<double>(offloaded.total_block_bytes()) / 1048576.0);
  EXPECT_NE(offloaded.notes.find(peak), std::string::npos) << offloaded.notes;  // the phases restated
}

}  // namespace
}  // namespace kiln
