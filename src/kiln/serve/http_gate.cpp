// See http_gate.h. Sockets are non-blocking; the epoll thread owns every waiting connection,
// a worker the one it serves (Conn::state says which, under mu_). A request is framed by its
// header block and Content-Length; a chunked body is left to httplib, bounded by its payload
// limit and the worker's I/O timeout.
#include "kiln/serve/http_gate.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <vector>

namespace kiln {

using Clock = std::chrono::steady_clock;

struct GatedHttpServer::Conn {
  enum class State { kWaiting, kActive, kClosing };
  int fd = -1;
  uint32_t id = 0;    // with fd, epoll's tag: a reused fd number never reaches the wrong connection
  std::string buf;    // bytes received and not yet consumed by httplib, from pos on
  size_t pos = 0;
  State state = State::kWaiting;
  bool idle = false;  // waiting with no byte of the next request yet (keep-alive)
  bool registered = false;
  Clock::time_point deadline;
  int64_t served = 0;
  bool close_after = false;  // the request asked for it (Connection: close, or HTTP/1.0)
  std::string remote_ip, local_ip;
  int remote_port = 0, local_port = 0;
};

namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// The value of header `name` in a header block (request line first), or "" when absent.
std::string_view header_value(std::string_view head, std::string_view name) {
  size_t eol = head.find('\n');
  while (eol != std::string_view::npos && eol + 1 < head.size()) {
    const size_t start = eol + 1;
    eol = head.find('\n', start);
    const std::string_view line = head.substr(start, (eol == std::string_view::npos ? head.size() : eol) - start);
    const size_t colon = line.find(':');
    if (colon != std::string_view::npos && iequals(trim(line.substr(0, colon)), name))
      return trim(line.substr(colon + 1));
  }
  return {};
}

enum class Framing { kIncomplete, kComplete, kHeaderTooLarge, kBodyTooLarge };

// Whether `buf` (the unread bytes of a connection) holds a whole request.
Framing frame_request(std::string_view buf, const HttpGateConfig& c, bool& close_after) {
  size_t head_len = 0;
  if (const size_t at = buf.find("\r\n\r\n"); at != std::string_view::npos) head_len = at + 4;
  else if (const size_t at2 = buf.find("\n\n"); at2 != std::string_view::npos) head_len = at2 + 2;
  if (head_len == 0)
    return static_cast<int64_t>(buf.size()) > c.max_header_bytes ? Framing::kHeaderTooLarge : Framing::kIncomplete;
  if (static_cast<int64_t>(head_len) > c.max_header_bytes) return Framing::kHeaderTooLarge;
  const std::string_view head = buf.substr(0, head_len);
  const std::string_view request_line = trim(head.substr(0, head.find('\n')));
  const std::string_view connection = header_value(head, "Connection");
  const bool http10 = request_line.ends_with("HTTP/1.0");
  close_after = iequals(connection, "close") || (http10 && !iequals(connection, "keep-alive"));
  // A chunked body, or one the client sends only after "100 Continue": httplib reads it.
  if (!header_value(head, "Transfer-Encoding").empty() || !header_value(head, "Expect").empty())
    return Framing::kComplete;
  const std::string_view length = header_value(head, "Content-Length");
  if (length.empty()) return Framing::kComplete;
  int64_t n = 0;
  for (const char ch : length) {
    if (ch < '0' || ch > '9') return Framing::kComplete;  // malformed: httplib answers 400
    n = n * 10 + (ch - '0');
    if (n > c.max_body_bytes) return Framing::kBodyTooLarge;
  }
  return static_cast<int64_t>(buf.size() - head_len) >= n ? Framing::kComplete : Framing::kIncomplete;
}

// Waits up to timeout for `events` on fd; false on timeout, error or hang-up.
bool wait_fd(int fd, short events, std::chrono::milliseconds timeout) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, static_cast<int>(timeout.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    if (events == POLLOUT && (p.revents & (POLLERR | POLLHUP))) return false;
    return (p.revents & (events | POLLHUP)) != 0;
  }
}

// Sends what it can of `bytes` without blocking past a short bound (replies to rejected clients).
void send_best_effort(int fd, std::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t r = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r > 0) {
      done += static_cast<size_t>(r);
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, std::chrono::milliseconds(100))) return;
    } else {
      return;
    }
  }
}

void peer_and_local(int fd, std::string& rip, int& rport, std::string& lip, int& lport) {
  auto describe = [](const sockaddr_storage& a, std::string& ip, int& port) {
    char text[INET6_ADDRSTRLEN] = {0};
    if (a.ss_family == AF_INET) {
      const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
      inet_ntop(AF_INET, &v4.sin_addr, text, sizeof(text));
      port = ntohs(v4.sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
      inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof(text));
      port = ntohs(v6.sin6_port);
    }
    ip = text;
  };
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) describe(a, rip, rport);
  len = sizeof(a);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) describe(a, lip, lport);
}

// httplib's accept loop hands each socket to its task queue; this one runs the hand-off on the
// accept thread itself (it only registers the socket with the gate).
class InlineQueue final : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

// httplib reads and writes a request through this: first the bytes the gate buffered, then
// the socket, each wait bounded by the I/O timeout.
class ConnStream final : public httplib::Stream {
 public:
  ConnStream(GatedHttpServer::Conn& c, std::chrono::milliseconds io_timeout) : c_(c), timeout_(io_timeout) {}
  bool is_readable() const override { return c_.pos < c_.buf.size() || wait_fd(c_.fd, POLLIN, timeout_); }
  bool is_writable() const override {
    if (!wait_fd(c_.fd, POLLOUT, timeout_)) return false;
    char b;  // a peer that closed reads as 0 bytes
    const ssize_t r = ::recv(c_.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r > 0 || (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
  }
  ssize_t read(char* ptr, size_t size) override {
    if (c_.pos < c_.buf.size()) {
      const size_t k = std::min(size, c_.buf.size() - c_.pos);
      std::memcpy(ptr, c_.buf.data() + c_.pos, k);
      c_.pos += k;
      return static_cast<ssize_t>(k);
    }
    for (;;) {
      const ssize_t r = ::recv(c_.fd, ptr, size, MSG_DONTWAIT);
      if (r >= 0) return r;
      if (errno == EINTR) continue;
      if ((errno == EAGAIN || errno == EWOULDBLOCK) && wait_fd(c_.fd, POLLIN, timeout_)) continue;
      return -1;
    }
  }
  ssize_t write(const char* ptr, size_t size) override {
    size_t done = 0;
    while (done < size) {
      const ssize_t r = ::send(c_.fd, ptr + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r > 0) {
        done += static_cast<size_t>(r);
      } else if (r < 0 && errno == EINTR) {
        continue;
      } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_fd(c_.fd, POLLOUT, timeout_)) {
        continue;
      } else {
        return -1;
      }
    }
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.remote_ip;
    port = c_.remote_port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.local_ip;
    port = c_.local_port;
  }
  socket_t socket() const override { return c_.fd; }

 private:
  GatedHttpServer::Conn& c_;
  std::chrono::milliseconds timeout_;
};

std::string error_reply(int status, const char* reason, const char* message) {
  const std::string body =
      fmt::format(R"({{"error":{{"message":"{}","type":"invalid_request_error","param":null,"code":null}}}})", message);
  return fmt::format("HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                     status, reason, body.size(), body);
}

}  // namespace

GatedHttpServer::GatedHttpServer(HttpGateConfig config) : config_(config) {
  // Room for the connections the gate admits (each holds a descriptor), when the hard limit allows.
  rlimit lim{};
  const auto want = static_cast<rlim_t>(config_.max_connections + 64);
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < want) {
    lim.rlim_cur = std::min(want, lim.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &lim);
    ::getrlimit(RLIMIT_NOFILE, &lim);
    config_.max_connections = std::max<int>(1, std::min<int>(config_.max_connections, static_cast<int>(lim.rlim_cur) - 64));
  }
  new_task_queue = [] { return new InlineQueue(); };
  set_payload_max_length(static_cast<size_t>(config_.max_body_bytes));
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // connection ids start at 1
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  workers_ = std::make_unique<httplib::ThreadPool>(static_cast<size_t>(std::max(1, config_.num_workers)));
  waiter_ = std::thread([this] { wait_loop(); });
}

GatedHttpServer::~GatedHttpServer() {
  shutdown_gate(std::chrono::milliseconds(0));
  ::close(epoll_fd_);
  ::close(wake_fd_);
}

HttpGateStats GatedHttpServer::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

bool GatedHttpServer::process_and_close_socket(socket_t sock) {
  ::fcntl(sock, F_SETFL, ::fcntl(sock, F_GETFL) | O_NONBLOCK);
  const int one = 1;
  ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // SSE events go out as written
  std::unique_lock lk(mu_);
  ++stats_.accepted;
  static std::atomic<uint32_t> next_id{1};
  const bool full = static_cast<int64_t>(conns_.size()) - stats_.closing >= config_.max_connections;
  if (stopping_ || full) {
    ++stats_.rejected_full;
    // Rejected ones linger while they are few; past that they are closed at once.
    if (stopping_ || stats_.closing >= config_.max_connections) {
      lk.unlock();
      send_best_effort(sock, error_reply(503, "Service Unavailable", "Too many open connections."));
      ::close(sock);
      return true;
    }
    auto c = std::make_unique<Conn>();
    c->fd = sock;
    c->id = next_id++;
    conns_[sock] = std::move(c);
    ++stats_.open;
    ++stats_.waiting;
    lk.unlock();
    reject(sock, 503, "Service Unavailable", "Too many open connections.");
    return true;
  }
  auto c = std::make_unique<Conn>();
  c->fd = sock;
  c->id = next_id++;
  c->deadline = Clock::now() + config_.request_timeout;
  peer_and_local(sock, c->remote_ip, c->remote_port, c->local_ip, c->local_port);
  Conn& ref = *c;
  conns_[sock] = std::move(c);
  ++stats_.open;
  ++stats_.waiting;
  arm(ref);  // (under mu_: a shutdown cannot close it in between)
  return true;
}

void GatedHttpServer::arm(Conn& c) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
  ev.data.u64 = (uint64_t{c.id} << 32) | static_cast<uint32_t>(c.fd);
  ::epoll_ctl(epoll_fd_, c.registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c.fd, &ev);
  c.registered = true;
}

void GatedHttpServer::close_conn(int fd) {
  {
    std::lock_guard lk(mu_);
    auto it = conns_.find(fd);
    if (it == conns_.end()) return;
    const Conn::State st = it->second->state;
    --(st == Conn::State::kActive ? stats_.active : st == Conn::State::kClosing ? stats_.closing : stats_.waiting);
    --stats_.open;
    conns_.erase(it);
  }
  ::close(fd);  // (also leaves the epoll set)
  idle_cv_.notify_all();
}

void GatedHttpServer::reject(int fd, int status, const char* reason, const char* message) {
  send_best_effort(fd, error_reply(status, reason, message));
  ::shutdown(fd, SHUT_WR);
  std::lock_guard lk(mu_);
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  Conn& c = *it->second;
  if (c.state == Conn::State::kWaiting) --stats_.waiting;
  ++stats_.closing;
  c.state = Conn::State::kClosing;
  c.buf.clear();
  c.pos = 0;
  c.deadline = Clock::now() + std::chrono::seconds(1);
  arm(c);
}

void GatedHttpServer::drain_closing(Conn& c) {
  char chunk[4096];
  for (;;) {
    const ssize_t r = ::recv(c.fd, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (r > 0) continue;
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      std::lock_guard lk(mu_);
      arm(c);
      return;
    }
    close_conn(c.fd);  // the client closed too
    return;
  }
}

void GatedHttpServer::wait_loop() {
  std::vector<epoll_event> events(64);
  while (!stopping_) {
    const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), 50);
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[static_cast<size_t>(i)].data.u64;
      if (tag == 0) continue;  // the wake-up eventfd: the loop condition says why
      const auto fd = static_cast<int>(tag & 0xffffffffu);
      const auto id = static_cast<uint32_t>(tag >> 32);
      Conn* c = nullptr;
      {
        std::lock_guard lk(mu_);
        auto it = conns_.find(fd);
        if (it != conns_.end() && it->second->id == id && it->second->state != Conn::State::kActive)
          c = it->second.get();
      }
      if (c && c->state == Conn::State::kClosing) drain_closing(*c);
      else if (c) on_readable(*c);
    }
    // Deadlines: an idle kept-alive connection is closed; a request still incomplete gets 408.
    const auto now = Clock::now();
    std::vector<std::pair<int, bool>> expired;  // (fd, close silently: idle or already rejected)
    {
      std::lock_guard lk(mu_);
      for (auto& [fd, conn] : conns_)
        if (conn->state != Conn::State::kActive && conn->deadline < now)
          expired.emplace_back(fd, conn->idle || conn->state == Conn::State::kClosing);
      stats_.timed_out += static_cast<int64_t>(std::count_if(expired.begin(), expired.end(), [](auto& e) { return !e.second; }));
    }
    for (const auto& [fd, idle] : expired) {
      if (idle) close_conn(fd);
      else reject(fd, 408, "Request Timeout", "The request did not arrive in time.");
    }
  }
}

void GatedHttpServer::on_readable(Conn& c) {
  char chunk[16384];
  const auto cap = static_cast<size_t>(config_.max_header_bytes + config_.max_body_bytes) + sizeof(chunk);
  for (;;) {
    const ssize_t r = ::recv(c.fd, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (r > 0) {
      if (c.idle) {  // the next request begins: its deadline runs from here
        c.idle = false;
        c.deadline = Clock::now() + config_.request_timeout;
      }
      c.buf.append(chunk, static_cast<size_t>(r));
      if (c.buf.size() - c.pos > cap) break;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close_conn(c.fd);  // the peer closed (r == 0) or the socket failed
    return;
  }
  bool close_after = false;
  switch (frame_request(std::string_view(c.buf).substr(c.pos), config_, close_after)) {
    case Framing::kIncomplete:
      arm(c);
      return;
    case Framing::kHeaderTooLarge:
      {
        std::lock_guard lk(mu_);
        ++stats_.too_large;
      }
      reject(c.fd, 431, "Request Header Fields Too Large", "The request header is too large.");
      return;
    case Framing::kBodyTooLarge:
      {
        std::lock_guard lk(mu_);
        ++stats_.too_large;
      }
      reject(c.fd, 413, "Payload Too Large", "The request body is too large.");
      return;
    case Framing::kComplete:
      break;
  }
  c.close_after = close_after;
  {
    std::lock_guard lk(mu_);
    c.state = Conn::State::kActive;
    --stats_.waiting;
    ++stats_.active;
  }
  workers_->enqueue([this, &c] { serve(c); });
}

void GatedHttpServer::serve(Conn& c) {
  ConnStream strm(c, config_.io_timeout);
  const bool last = stopping_ || c.close_after || c.served + 1 >= config_.max_requests_per_connection;
  bool connection_closed = false;
  bool ok = false;
  try {
    ok = process_request(strm, last, connection_closed, [](httplib::Request&) {});
  } catch (...) {  // httplib's own exception handler answers the handlers' exceptions
    ok = false;
  }
  ++c.served;
  if (c.pos == c.buf.size()) {
    c.buf.clear();
    c.pos = 0;
  }
  if (!ok || connection_closed || last || stopping_) {
    close_conn(c.fd);
    return;
  }
  // A pipelined request already buffered whole runs at once; else back to waiting, for the
  // next request's first byte (idle) or the rest of it. (Under mu_: a shutdown that starts
  // now either sees this connection waiting and closes it, or finds it still active.)
  const bool has_bytes = c.pos < c.buf.size();
  bool close_after = false;
  const bool pipelined =
      has_bytes && frame_request(std::string_view(c.buf).substr(c.pos), config_, close_after) == Framing::kComplete;
  std::unique_lock lk(mu_);
  if (stopping_) {
    lk.unlock();
    close_conn(c.fd);
    return;
  }
  if (pipelined) {
    c.close_after = close_after;
    lk.unlock();
    workers_->enqueue([this, &c] { serve(c); });
    return;
  }
  c.state = Conn::State::kWaiting;
  c.idle = !has_bytes;
  c.deadline = Clock::now() + (has_bytes ? config_.request_timeout : config_.keep_alive_timeout);
  --stats_.active;
  ++stats_.waiting;
  arm(c);
  lk.unlock();
  idle_cv_.notify_all();
}

void GatedHttpServer::shutdown_gate(std::chrono::milliseconds grace) {
  {
    std::lock_guard lk(mu_);
    if (shut_) return;
    shut_ = true;
  }
  // New connections get 503 from here on (httplib's accept loop still runs: its stop() also
  // ends every chunked reply at once, so it comes after the grace period).
  stopping_ = true;
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t w = ::write(wake_fd_, &one, sizeof(one));
  if (waiter_.joinable()) waiter_.join();
  // Waiting connections have nothing in flight: close them. Served ones get the grace period.
  std::vector<int> waiting;
  {
    std::lock_guard lk(mu_);
    for (auto& [fd, c] : conns_)
      if (c->state != Conn::State::kActive) waiting.push_back(fd);
  }
  for (int fd : waiting) close_conn(fd);
  {
    std::unique_lock lk(mu_);
    idle_cv_.wait_for(lk, grace, [&] { return stats_.active == 0; });
    // Past the grace period: cut the connections still served, so their reads and writes fail.
    for (auto& [fd, c] : conns_) ::shutdown(fd, SHUT_RDWR);
  }
  stop();  // httplib: the accept loop ends
  workers_->shutdown();
  std::vector<int> rest;
  {
    std::lock_guard lk(mu_);
    for (auto& [fd, c] : conns_) rest.push_back(fd);
  }
  for (int fd : rest) close_conn(fd);
}

}  // namespace kiln
