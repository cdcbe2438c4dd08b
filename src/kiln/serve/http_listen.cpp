// See http_listen.h. Calling listen() again on Linux raises the backlog of a socket that
// already listens; httplib hands out the listening socket only through its socket-options hook.
#include "kiln/serve/http_listen.h"

#include <httplib.h>
#include <sys/socket.h>

namespace kiln {

Expected<int> bind_http_server(httplib::Server& http, const std::string& host, int port) {
  int listen_fd = -1;
  http.set_socket_options([&listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd = sock;
  });
  int bound = -1;
  if (port == 0) {
    bound = http.bind_to_any_port(host);
  } else if (http.bind_to_port(host, port)) {
    bound = port;
  }
  http.set_socket_options(httplib::default_socket_options);  // the hook above captures a local
  if (bound <= 0) {
    if (port == 0) return Status(StatusCode::kUnavailable, fmt::format("[serve] cannot bind {} to a free port", host));
    return Status(StatusCode::kUnavailable, fmt::format("[serve] cannot bind {}:{} (in use?)", host, port));
  }
  if (listen_fd >= 0) ::listen(listen_fd, 1024);
  return bound;
}

}  // namespace kiln
