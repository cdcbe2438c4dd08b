// Binding an HTTP server (cpp-httplib) so that bursts of clients are accepted: Debian's
// libcpp-httplib listens with a backlog of 5 compiled in, and a burst of more connections
// stalls ~1 s in kernel retries or fails. Used by `kiln serve` and by test servers.
#pragma once

#include <string>

#include "kiln/core/status.h"

namespace httplib {
class Server;
}

namespace kiln {

// Binds `http` to host:port (port 0: any free port) and raises the listen backlog to 1024.
// Returns the bound port, or Unavailable naming the address.
Expected<int> bind_http_server(httplib::Server& http, const std::string& host, int port);

}  // namespace kiln
