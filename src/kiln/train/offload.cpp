// Optimizer-state offloading: the file, its I/O thread and the chunk pipeline (offload.h).
#include "kiln/train/offload.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace kiln {

namespace {

constexpr int64_t kAlign = 4096;  // O_DIRECT: buffers, offsets and lengths in whole blocks

std::string errno_text(int e) { return std::strerror(e); }

// An unnamed file in dir: O_TMPFILE, else a named one unlinked at once. Direct I/O first.
int open_unnamed(const std::string& dir, bool direct, int* err) {
  const int flags = O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0);
  int fd = ::open(dir.c_str(), flags | O_TMPFILE, 0600);
  if (fd >= 0) return fd;
  *err = errno;
  if (*err == EINVAL && direct) return -1;  // the file system refuses O_DIRECT (tmpfs)
  if (*err == ENOENT || *err == ENOTDIR || *err == EACCES || *err == EROFS) return -1;
  // O_TMPFILE not supported here: a named file, unlinked before anything is written to it.
  std::string name = dir + "/kiln-moments-XXXXXX";
  fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  ::unlink(name.c_str());
  if (direct && ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_DIRECT) != 0) {
    *err = EINVAL;
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

Expected<std::unique_ptr<OffloadedMoments>> OffloadedMoments::create(const std::string& dir, int64_t n,
                                                                      int64_t chunk_floats) {
  if (n < 0) return invalid_argument("optimizer offload: {} moments to keep (must be >= 0)", n);
  if (chunk_floats <= 0) return invalid_argument("optimizer offload: chunk of {} floats (must be > 0)", chunk_floats);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    return not_found("optimizer offload directory {}: {} (create it, or name another)", dir, errno_text(errno));
  if (!S_ISDIR(st.st_mode)) return invalid_argument("optimizer offload directory {}: not a directory", dir);

  std::unique_ptr<OffloadedMoments> s(new OffloadedMoments());
  s->dir_ = dir;
  s->n_ = n;
  s->chunk_ = whole_blocks(chunk_floats);
  int err = 0;
  s->fd_ = open_unnamed(dir, true, &err);
  s->direct_ = s->fd_ >= 0;
  if (s->fd_ < 0 && err == EINVAL) s->fd_ = open_unnamed(dir, false, &err);
  if (s->fd_ < 0)
    return invalid_argument("optimizer offload directory {}: cannot create a file there: {}", dir, errno_text(err));

  const int64_t bytes = s->file_bytes();
  struct statvfs vfs {};
  if (::fstatvfs(s->fd_, &vfs) == 0) {
    const auto free_bytes = static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
    if (free_bytes < bytes)
      return resource_exhausted("optimizer offload directory {}: the moments need {:.1f} MiB, {:.1f} MiB are free there",
                                dir, bytes / 1048576.0, free_bytes / 1048576.0);
  }
  // Reserve the blocks now (zero), so a full disk shows here; where the file system cannot
  // reserve, a sparse file of that size (reads give zeros too).
  if (bytes > 0) {
    const int rc = ::posix_fallocate(s->fd_, 0, bytes);
    if (rc != 0 && (rc != EOPNOTSUPP && rc != EINVAL))
      return resource_exhausted("optimizer offload directory {}: cannot reserve {:.1f} MiB: {}", dir, bytes / 1048576.0,
                                errno_text(rc));
    if (rc != 0 && ::ftruncate(s->fd_, bytes) != 0)
      return resource_exhausted("optimizer offload directory {}: cannot size the file to {:.1f} MiB: {}", dir,
                                bytes / 1048576.0, errno_text(errno));
  }
  void* mem = std::aligned_alloc(kAlign, static_cast<size_t>(s->staging_bytes()));
  if (mem == nullptr)
    return resource_exhausted("optimizer offload: cannot allocate {:.1f} MiB of staging buffers",
                              s->staging_bytes() / 1048576.0);
  s->staging_ = static_cast<float*>(mem);
  s->io_ = std::thread([p = s.get()] { p->io_loop(); });
  return s;
}

OffloadedMoments::~OffloadedMoments() {
  if (io_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    io_.join();
  }
  std::free(staging_);
  if (fd_ >= 0) ::close(fd_);
}

void OffloadedMoments::submit(const Job& j) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(j);
  }
  cv_.notify_all();
}

// Serves the queue in order: a write of chunk c is done before a later read reuses its buffer.
void OffloadedMoments::io_loop() {
  const int64_t bytes = 2 * chunk_ * 4;
  for (;;) {
    Job j;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_, nothing left
      j = queue_.front();
      queue_.pop_front();
    }
    char* buf = reinterpret_cast<char*>(stage_of(j.chunk));
    const off_t at = static_cast<off_t>(j.chunk * bytes);
    const auto t0 = std::chrono::steady_clock::now();
    int64_t moved = 0;
    int err = 0;
    while (moved < bytes) {
      const ssize_t r = j.write ? ::pwrite(fd_, buf + moved, static_cast<size_t>(bytes - moved), at + moved)
                                : ::pread(fd_, buf + moved, static_cast<size_t>(bytes - moved), at + moved);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        err = r < 0 ? errno : EIO;  // a read of 0 bytes: the file is shorter than it was made
        break;
      }
      moved += r;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.io_seconds += secs;
      (j.write ? stats_.bytes_written : stats_.bytes_read) += moved;
      if (err != 0 && error_.ok())
        error_ = data_loss("optimizer offload file in {}: {} of chunk {} failed: {}", dir_, j.write ? "pwrite" : "pread",
                           j.chunk, errno_text(err));
      done_ = j.ticket;
    }
    cv_.notify_all();
  }
}

Status OffloadedMoments::wait_for(uint64_t ticket) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= ticket; });
  stats_.exposed_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return error_;
}

Status OffloadedMoments::stream(const std::function<void(int64_t, int64_t, float*, float*)>& fn, bool write_back) {
  const int64_t chunks = num_chunks();
  std::vector<uint64_t> read_ticket(static_cast<size_t>(chunks));
  const auto read = [&](int64_t c) {
    read_ticket[static_cast<size_t>(c)] = ++submitted_;
    submit({false, c, submitted_});
  };
  // Two reads ahead of the update; with the write behind it, three buffers are in use.
  for (int64_t c = 0; c < std::min<int64_t>(chunks, kStages - 1); ++c) read(c);
  Status status;
  for (int64_t c = 0; c < chunks; ++c) {
    status = wait_for(read_ticket[static_cast<size_t>(c)]);
    if (!status.ok()) break;
    float* m = stage_of(c);
    const int64_t begin = c * chunk_;
    fn(begin, std::min(chunk_, n_ - begin), m, m + chunk_);
    if (write_back) submit({true, c, ++submitted_});
    // Chunk c + 2's buffer was chunk c - 1's, whose write was queued before this read.
    if (c + kStages - 1 < chunks) read(c + kStages - 1);
  }
  const Status last = wait_for(submitted_);  // every write has landed (or failed)
  return status.ok() ? last : status;
}

OffloadStats OffloadedMoments::take_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  const OffloadStats s = stats_;
  stats_ = {};
  return s;
}

}  // namespace kiln
