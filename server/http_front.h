// The OpenAI-compatible HTTP front (cpp-httplib): /v1/completions and
// /v1/chat/completions (whole or streamed as server-sent events), /v1/models,
// /health and /metrics, beside the gRPC service on the same engine loop. Each
// connection is served on a thread of its own pool; a streaming request holds its
// thread until it ends, and a client that goes away cancels its request.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "server/access.h"
#include "server/generation_service.h"
#include "server/tls.h"

namespace httplib {
class Server;
}

namespace ps::server {

struct HttpFrontOptions {
  std::string host = "0.0.0.0";
  int port = 0;                              // 0: pick a free one
  int threads = 128;                         // connections served at once
  size_t max_body_bytes = size_t{32} << 20;  // larger bodies get 413
  std::vector<std::string> served_models;    // the names "model" may take; the first is listed first
  TlsFiles tls;                              // HTTPS when enabled
};

class HttpFront {
 public:
  // Binds the port and serves on a thread of its own: 503 until SetState.
  // `access` (may be null: no token, no per-client limit) must outlive the front;
  // /v1/ asks for its token, /health and /metrics do not.
  static absl::StatusOr<std::unique_ptr<HttpFront>> Start(const HttpFrontOptions& options,
                                                          std::shared_ptr<prometheus::Registry> metrics,
                                                          AccessControl* access = nullptr);
  ~HttpFront();  // stops serving (open streams end; their requests are cancelled)

  int port() const { return port_; }
  // `state` must outlive this front or the next SetState.
  void SetState(const ServiceState* state) { state_.store(state); }
  // While draining, new generation requests get 503.
  void SetDraining(bool draining) { draining_.store(draining); }

 private:
  HttpFront() = default;
  void Route();

  HttpFrontOptions options_;
  std::shared_ptr<prometheus::Registry> metrics_;
  AccessControl* access_ = nullptr;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<const ServiceState*> state_{nullptr};
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace ps::server
