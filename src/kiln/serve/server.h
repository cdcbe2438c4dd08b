// The OpenAI-compatible HTTP server (cpp-httplib) in front of the Engine: /v1/completions and
// /v1/chat/completions (JSON or SSE streaming), /v1/models, /health and /metrics (Prometheus).
// Malformed requests get 4xx with an OpenAI-style error object; a client that goes away
// mid-stream has its sequences freed; the server keeps serving everyone else.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "kiln/core/status.h"
#include "kiln/serve/chat_template.h"
#include "kiln/quant/qmodel.h"
#include "kiln/serve/engine.h"
#include "kiln/tokenizer/bpe.h"

namespace kiln {

class GatedHttpServer;

struct ServerConfig {
  std::string host = "127.0.0.1";  // loopback unless asked otherwise
  int port = 8000;                 // 0: any free port (see Server::port())
  std::string api_key;             // non-empty: /v1/* needs "Authorization: Bearer <key>"
  std::string model_name = "kiln";
  int num_http_threads = 128;      // requests served at once (a stream holds one); --http-threads
  // Slow or idle clients (serve/http_gate.h): they hold a connection, never a thread.
  int max_connections = 1024;                           // --max-connections
  std::chrono::milliseconds request_timeout{10000};     // a request's bytes must all arrive in this
  std::chrono::milliseconds keep_alive_timeout{5000};   // idle kept-alive connections are closed
};

class Server {
 public:
  // The engine must outlive the server; its background loop is started here if needed.
  static Expected<std::unique_ptr<Server>> create(Engine& engine, tok::Tokenizer tokenizer, ChatTemplate chat,
                                                  const ServerConfig& config);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port; Unavailable when it cannot.
  Status bind();
  int port() const { return port_; }
  bool running() const;  // listening (after start() or inside listen())
  // Serves until stop() (blocks). start(): the same on a background thread.
  void listen();
  void start();
  void stop();
  // Graceful shutdown (SIGTERM): stops accepting, answers new requests 503, ends every running
  // request with an engine error (a stream gets a final error event), lets replies finish for
  // up to `grace`, then closes what is left. Returns within about grace + 1 s.
  void drain(std::chrono::milliseconds grace);

  struct Impl;  // handlers (server.cpp)

 private:
  Server() = default;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<GatedHttpServer> http_;
  std::thread thread_;
  int port_ = 0;
};

// The one loader of `serve` and `generate`: a model directory the way `kiln train` writes it
// (config.json, model.safetensors in fp32, bf16 or f16, tokenizer.json), one `kiln quantize`
// writes (its Linears on the quantized backends), or a llama.cpp `.gguf` file (its Q8_0 / Q4_0
// matrices on the quantized backends with the file's values, quant/gguf_weights.h; F32 / F16
// ones in fp32; its tokenizer from the file); plus the chat template (the default when there
// is none).
struct ServedModel {
  std::unique_ptr<Transformer> model;
  tok::Tokenizer tokenizer;
  ChatTemplate chat;
  quant::QuantizedState quantized;  // a kiln-quantized model's or a GGUF's quantized weights (sliced under --tp); empty otherwise
};
Expected<ServedModel> load_served_model(const std::string& path);

}  // namespace kiln
