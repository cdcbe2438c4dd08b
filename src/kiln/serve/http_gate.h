// The connection gate in front of the HTTP handlers. One thread waits (epoll) on every open
// connection until a whole request has arrived (request line, headers and a Content-Length
// body) within a deadline, and only then hands it to a worker; an idle kept-alive connection
// goes back to that thread. So a slow or idle client holds a file descriptor, never a worker,
// and cannot starve the others. The gate also caps open connections and header and body
// bytes, and drains: stop accepting, end what runs within a grace period, close the rest.
// cpp-httplib (Debian's 0.11) still parses and routes each request: the gate overrides its
// per-connection entry point and calls its request processor on a buffered stream.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

namespace kiln {

struct HttpGateConfig {
  int num_workers = 128;       // requests served at once (a stream holds one until it ends)
  int max_connections = 1024;  // open connections (waiting + served); more get 503 and are closed
  // Every byte of a request must arrive within this of its first byte (or of the accept):
  // past it the client gets 408 and the connection is closed.
  std::chrono::milliseconds request_timeout{10000};
  std::chrono::milliseconds keep_alive_timeout{5000};  // an idle kept-alive connection is closed
  std::chrono::milliseconds io_timeout{10000};         // a worker's read or write that makes no progress
  int64_t max_header_bytes = int64_t{64} << 10;        // request line + headers; more: 431
  int64_t max_body_bytes = int64_t{64} << 20;          // Content-Length (or chunked total); more: 413
  int64_t max_requests_per_connection = 1000;
};

struct HttpGateStats {
  int64_t open = 0;     // connections open now
  int64_t waiting = 0;  // of those, waiting for a request's bytes (or idle)
  int64_t active = 0;   // of those, being served by a worker
  int64_t closing = 0;  // rejected: the reply sent, the client's last bytes read until it closes
  int64_t accepted = 0, rejected_full = 0, timed_out = 0, too_large = 0;  // totals
};

class GatedHttpServer : public httplib::Server {
 public:
  explicit GatedHttpServer(HttpGateConfig config);
  ~GatedHttpServer() override;
  GatedHttpServer(const GatedHttpServer&) = delete;
  GatedHttpServer& operator=(const GatedHttpServer&) = delete;

  // Stops accepting (httplib::Server::stop), closes waiting connections, lets requests being
  // served run up to `grace`, then cuts their connections and joins every thread. Idempotent.
  void shutdown_gate(std::chrono::milliseconds grace);
  HttpGateStats stats() const;
  const HttpGateConfig& gate_config() const { return config_; }

  struct Conn;  // http_gate.cpp

 private:
  // httplib's accept loop calls this (through its task queue, which here runs it inline) for
  // every accepted socket: the gate takes the socket over and returns at once.
  bool process_and_close_socket(socket_t sock) override;

  void wait_loop();                     // the epoll thread
  void on_readable(Conn& c);            // epoll thread
  void serve(Conn& c);                  // a worker: one request, then back to waiting or closed
  void arm(Conn& c);                    // (re)register for the next request's bytes
  void close_conn(int fd);              // forget and close
  // Sends an error reply and closes after the client does (or after a second): closing at once
  // with its request unread would reset the connection before the client reads the reply.
  void reject(int fd, int status, const char* reason, const char* message);
  void drain_closing(Conn& c);  // epoll thread: read and drop what a rejected client still sends

  HttpGateConfig config_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: wakes the epoll thread to stop
  std::atomic<bool> stopping_{false};
  std::thread waiter_;
  std::unique_ptr<httplib::ThreadPool> workers_;

  mutable std::mutex mu_;
  std::condition_variable idle_cv_;  // signalled when a served request ends (drain waits on it)
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;
  HttpGateStats stats_;
  bool shut_ = false;
};

}  // namespace kiln
