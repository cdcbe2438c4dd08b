// Optimizer-state offloading: the AdamW moments m and v kept in a file instead of in memory,
// streamed through a few staging buffers during the optimizer step (ZeRO-Offload moves them
// from GPU memory to CPU memory; ZeRO-Infinity one tier further, to NVMe: on a CPU that is the
// tier below, so here it is a file on a disk).
//
// The file holds the state in chunks of C floats, chunk c at byte 8·C·c as [m | v]. One I/O
// thread serves the compute thread's requests in order, so while the update runs on chunk c the
// thread reads chunk c+1 and then writes chunk c back: three staging buffers of 8·C bytes are
// the memory it takes, in place of 8 bytes per parameter. The price is the link: every step
// moves 16 bytes per parameter (m and v read, then written), so the step slows by what the disk
// cannot hide behind the update (OffloadStats::exposed_seconds).
//
// The file is opened with O_DIRECT where the file system takes it, so the moments bypass the
// page cache (which would otherwise keep them in memory after all), and O_TMPFILE (or created
// and unlinked at once), so it disappears with the process, however it ends. Its space is
// reserved up front: a full disk is an error at start, not in the middle of a step.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/status.h"

namespace kiln {

struct OffloadStats {
  int64_t bytes_read = 0, bytes_written = 0;
  double io_seconds = 0;       // the I/O thread inside pread / pwrite
  double exposed_seconds = 0;  // the compute thread waiting for it (I/O not hidden by the update)
};

class OffloadedMoments {
 public:
  // 1 Mi floats: 8 MiB per chunk of m and v, 24 MiB of staging in all.
  static constexpr int64_t kDefaultChunkFloats = int64_t{1} << 20;
  static constexpr int kStages = 3;  // staging buffers: one read ahead, one updated, one written behind

  // n floats of m and of v, zero, in an unnamed file in `dir`. chunk_floats is rounded up to a
  // multiple of 1024 (so every transfer is a whole number of 4 KiB blocks, as O_DIRECT needs).
  // Errors name the directory and what is wrong with it (missing, not a directory, not
  // writable, too little space for the bytes it needs).
  static Expected<std::unique_ptr<OffloadedMoments>> create(const std::string& dir, int64_t n,
                                                            int64_t chunk_floats = kDefaultChunkFloats);
  ~OffloadedMoments();
  OffloadedMoments(const OffloadedMoments&) = delete;
  OffloadedMoments& operator=(const OffloadedMoments&) = delete;

  int64_t size() const { return n_; }
  int64_t chunk_floats() const { return chunk_; }
  int64_t num_chunks() const { return (n_ + chunk_ - 1) / chunk_; }
  bool direct_io() const { return direct_; }
  const std::string& dir() const { return dir_; }
  int64_t staging_bytes() const { return staging_bytes_for(chunk_); }
  static int64_t staging_bytes_for(int64_t chunk_floats = kDefaultChunkFloats) {
    return static_cast<int64_t>(kStages) * 2 * whole_blocks(chunk_floats) * 4;
  }
  int64_t file_bytes() const { return num_chunks() * 2 * chunk_ * 4; }

  // Visits the state in order, one chunk at a time: fn(begin, count, m, v) with m and v holding
  // elements [begin, begin + count). With write_back the chunk goes back to the file after fn
  // (fn may change it); without, fn only reads. Returns after every write has landed; an I/O
  // error is returned with the file's directory and the failing call, and the state is then
  // unreliable (the caller stops).
  Status stream(const std::function<void(int64_t begin, int64_t count, float* m, float* v)>& fn,
                bool write_back = true);

  // The counters since the last call.
  OffloadStats take_stats();

 private:
  OffloadedMoments() = default;
  // Floats rounded up to whole 4 KiB blocks (1024 floats).
  static int64_t whole_blocks(int64_t floats) { return (floats + 1023) / 1024 * 1024; }
  // The staging buffer [m | v] chunk c passes through.
  float* stage_of(int64_t chunk) const { return staging_ + (chunk % kStages) * 2 * chunk_; }

  struct Job {
    bool write = false;
    int64_t chunk = 0;
    uint64_t ticket = 0;
  };
  void io_loop();
  void submit(const Job& j);
  Status wait_for(uint64_t ticket);  // until the jobs up to `ticket` are done

  std::string dir_;
  int fd_ = -1;
  bool direct_ = false;
  int64_t n_ = 0, chunk_ = 0;
  float* staging_ = nullptr;  // kStages buffers of [m | v], 4 KiB aligned

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  uint64_t submitted_ = 0, done_ = 0;
  Status error_;  // the first I/O error
  bool stop_ = false;
  OffloadStats stats_;
  std::thread io_;
};

}  // namespace kiln
