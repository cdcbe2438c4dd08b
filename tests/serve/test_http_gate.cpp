// The connection gate (serve/http_gate.h) on loopback: slow and idle clients hold
// connections, never workers, so a server with 2 workers still answers while 40 clients send
// half a header; a request that does not arrive in time gets 408, an oversized header 431, an
// oversized body 413, a connection past the limit 503; keep-alive and pipelined requests are
// served; a drain cuts a reply that outlives its grace period.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kiln/serve/http_gate.h"
#include "kiln/serve/http_listen.h"

namespace kiln {
namespace {

using namespace std::chrono_literals;

// A gated server with /health, /echo (POST: the body back) and /slow (a reply that writes a
// chunk every 50 ms for 20 s).
struct GateFixture {
  explicit GateFixture(HttpGateConfig config) : http(config) {
    http.Get("/health", [](const httplib::Request&, httplib::Response& r) { r.set_content("ok", "text/plain"); });
    http.Post("/echo", [](const httplib::Request& q, httplib::Response& r) { r.set_content(q.body, "text/plain"); });
    http.Get("/slow", [](const httplib::Request&, httplib::Response& r) {
      auto t0 = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
      r.set_chunked_content_provider("text/plain", [t0](size_t, httplib::DataSink& sink) {
        std::this_thread::sleep_for(50ms);
        if (std::chrono::steady_clock::now() - *t0 > 20s) {
          sink.done();
          return true;
        }
        return sink.write("x", 1);
      });
    });
    port = bind_http_server(http, "127.0.0.1", 0).value();
    thread = std::thread([this] { http.listen_after_bind(); });
    for (int i = 0; i < 5000 && !http.is_running(); ++i) std::this_thread::sleep_for(1ms);
  }
  ~GateFixture() {
    http.shutdown_gate(0ms);
    thread.join();
  }
  GatedHttpServer http;
  int port = 0;
  std::thread thread;
};

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

void send_all(int fd, const std::string& s) { ASSERT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), ssize_t(s.size())); }

// Reads until the peer closes or `timeout` passes without data.
std::string read_reply(int fd, std::chrono::milliseconds timeout = 10s) {
  std::string out;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// A liveness bound, not a speed claim: without the gate these requests wait for the slow
// clients' read timeouts (or forever, for clients that trickle bytes).
httplib::Client client(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(10s);
  c.set_read_timeout(10s);
  return c;
}

TEST(HttpGate, SlowClientsDoNotStarveOthers) {
  HttpGateConfig cfg;
  cfg.num_workers = 2;
  cfg.request_timeout = 60s;
  GateFixture f(cfg);
  std::vector<int> slow;
  for (int i = 0; i < 40; ++i) {
    slow.push_back(connect_to(f.port));
    send_all(slow.back(), "GET /health HTTP/1.1\r\nHost: x\r\n");  // half a header
  }
  std::this_thread::sleep_for(100ms);
  for (int fd : slow) send_all(fd, "X-Trickle: 1\r\n");  // and they keep trickling
  auto c = client(f.port);
  for (int i = 0; i < 5; ++i) {
    auto res = c.Get("/health");
    ASSERT_TRUE(res) << "request " << i << ": " << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 200);
  }
  EXPECT_GE(f.http.stats().waiting, 40);
  // The slow ones are still served once their headers complete.
  send_all(slow[0], "Connection: close\r\n\r\n");
  EXPECT_NE(read_reply(slow[0], 5s).find("HTTP/1.1 200"), std::string::npos);
  for (int fd : slow) ::close(fd);
}

TEST(HttpGate, IncompleteRequestGets408AndIdleConnectionIsClosed) {
  HttpGateConfig cfg;
  cfg.request_timeout = 300ms;
  cfg.keep_alive_timeout = 300ms;
  GateFixture f(cfg);
  const int half = connect_to(f.port);
  send_all(half, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc");  // body short
  EXPECT_NE(read_reply(half).find("HTTP/1.1 408"), std::string::npos);
  ::close(half);
  const int idle = connect_to(f.port);
  send_all(idle, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string r = read_reply(idle);  // the reply, then the idle connection is closed
  EXPECT_NE(r.find("HTTP/1.1 200"), std::string::npos);
  EXPECT_EQ(r.find("408"), std::string::npos);
  ::close(idle);
  EXPECT_GE(f.http.stats().timed_out, 1);
}

TEST(HttpGate, OversizedHeaderAndBodyAreRejected) {
  HttpGateConfig cfg;
  cfg.max_header_bytes = 1024;
  cfg.max_body_bytes = 4096;
  GateFixture f(cfg);
  const int h = connect_to(f.port);
  send_all(h, "GET /health HTTP/1.1\r\nX-Big: " + std::string(2000, 'a') + "\r\n\r\n");
  EXPECT_NE(read_reply(h).find("HTTP/1.1 431"), std::string::npos);
  ::close(h);
  const int b = connect_to(f.port);
  send_all(b, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n");
  EXPECT_NE(read_reply(b).find("HTTP/1.1 413"), std::string::npos);
  ::close(b);
  auto c = client(f.port);
  auto res = c.Post("/echo", std::string(4096, 'z'), "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body, std::string(4096, 'z'));
}

TEST(HttpGate, ConnectionsPastTheLimitGet503) {
  HttpGateConfig cfg;
  cfg.max_connections = 4;
  cfg.request_timeout = 60s;
  GateFixture f(cfg);
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(connect_to(f.port));
  for (int i = 0; i < 200 && f.http.stats().open < 4; ++i) std::this_thread::sleep_for(5ms);
  const int extra = connect_to(f.port);
  EXPECT_NE(read_reply(extra).find("HTTP/1.1 503"), std::string::npos);
  ::close(extra);
  for (int fd : held) ::close(fd);
  for (int i = 0; i < 200 && f.http.stats().open > 0; ++i) std::this_thread::sleep_for(5ms);
  auto c = client(f.port);
  auto res = c.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST(HttpGate, KeepAliveAndPipelinedRequestsAreServed) {
  GateFixture f(HttpGateConfig{});
  auto c = client(f.port);
  c.set_keep_alive(true);
  for (int i = 0; i < 3; ++i) {
    auto res = c.Post("/echo", "body" + std::to_string(i), "text/plain");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->body, "body" + std::to_string(i));
  }
  EXPECT_EQ(f.http.stats().accepted, 1) << "three requests on one kept-alive connection";
  const int fd = connect_to(f.port);
  send_all(fd,
           "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\none"
           "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\ntwo");
  const std::string r = read_reply(fd);
  const size_t a = r.find("\r\n\r\none"), b = r.find("\r\n\r\ntwo");
  EXPECT_NE(a, std::string::npos) << r;
  EXPECT_NE(b, std::string::npos) << r;
  EXPECT_LT(a, b);
  ::close(fd);
}

TEST(HttpGate, DrainLetsARunningReplyGoOnForTheGraceThenCutsIt) {
  // (httplib's own stop() would end the reply at once: the gate lets it run for the grace.)
  auto f = std::make_unique<GateFixture>(HttpGateConfig{});
  const int fd = connect_to(f->port);
  send_all(fd, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n");
  for (int i = 0; i < 200 && f->http.stats().active < 1; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(f->http.stats().active, 1);
  std::string got;
  std::thread reader([&] { got = read_reply(fd, 30s); });  // ends when the server cuts the connection
  std::thread drain([&] { f->http.shutdown_gate(1000ms); });
  std::this_thread::sleep_for(200ms);
  // While it drains: new connections are answered 503, the running reply still flows.
  const int late = connect_to(f->port);
  EXPECT_NE(read_reply(late, 5s).find("HTTP/1.1 503"), std::string::npos);
  ::close(late);
  drain.join();
  reader.join();
  EXPECT_NE(got.find("HTTP/1.1 200"), std::string::npos);
  EXPECT_GT(std::count(got.begin(), got.end(), 'x'), 10) << "chunks kept coming during the grace period";
  EXPECT_EQ(f->http.stats().open, 0);
  ::close(fd);
}

}  // namespace
}  // namespace kiln
