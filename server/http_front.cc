#include "server/http_front.h"

#include <httplib.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>
#include <span>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "server/metered_sink.h"
#include "server/openai_api.h"

namespace ps::server {
namespace {

using openai::Api;
using openai::Json;

// How often a stream waiting for tokens writes an SSE comment: it finds a client
// that went away (the write fails) during a long prefill, and keeps proxies from
// timing the connection out.
constexpr auto kKeepAlive = std::chrono::seconds(1);

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

void SendError(httplib::Response& res, Api api, const absl::Status& status) {
  auto [http, body] = openai::ErrorResponse(api, status);
  res.status = http;
  res.set_content(Dump(body), "application/json");
}

// A request's events, handed from the engine thread to the connection's thread.
class HttpSink final : public MeteredSink {
 public:
  // `request` is cancelled (kSlowClient) when more than `max_backlog` tokens wait untaken.
  HttpSink(Metrics* metrics, const std::shared_ptr<Request>& request, size_t max_backlog)
      : MeteredSink(metrics, request->id, std::string(request->strategy())),
        request_(request),
        max_backlog_(max_backlog) {}
  // Waits up to `timeout` for events and takes them; true once the finish event was taken.
  bool Take(std::deque<RequestEvent>* out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
    out->swap(events_);
    events_.clear();
    untaken_tokens_ = 0;
    taken_finish_ = taken_finish_ || finished_;
    return taken_finish_;
  }

 private:
  void Deliver(RequestEvent ev) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      untaken_tokens_ += ev.tokens.size();
      if (ev.kind == RequestEvent::Kind::kTokens && untaken_tokens_ > max_backlog_) {
        if (auto r = request_.lock()) r->Cancel(CancelReason::kSlowClient);
      }
      finished_ = finished_ || (ev.kind == RequestEvent::Kind::kFinished && ev.last);
      events_.push_back(std::move(ev));
    }
    cv_.notify_one();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::weak_ptr<Request> request_;  // the request holds its sink
  size_t max_backlog_;
  std::deque<RequestEvent> events_;
  size_t untaken_tokens_ = 0;  // in events_
  bool finished_ = false, taken_finish_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HttpFront>> HttpFront::Start(const HttpFrontOptions& options,
                                                            std::shared_ptr<prometheus::Registry> metrics,
                                                            AccessControl* access) {
  std::unique_ptr<HttpFront> f(new HttpFront());
  f->options_ = options;
  f->metrics_ = std::move(metrics);
  f->access_ = access;
  const TlsFiles& tls = options.tls;
  PS_RETURN_IF_ERROR(CheckTlsFiles(tls));
  if (!tls.enabled()) {
    f->server_ = std::make_unique<httplib::Server>();
  } else {
    auto ssl = std::make_unique<httplib::SSLServer>(tls.cert.c_str(), tls.key.c_str(),
                                                    tls.client_ca.empty() ? nullptr : tls.client_ca.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat("HTTPS: cannot use the certificate ", tls.cert, " and key ",
                                                     tls.key, tls.client_ca.empty() ? "" : " and client CA ",
                                                     tls.client_ca));
    }
    f->server_ = std::move(ssl);
  }
  const int threads = std::max(1, options.threads);
  f->server_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  f->server_->set_payload_max_length(options.max_body_bytes);
  f->Route();
  f->port_ = options.port == 0 ? f->server_->bind_to_any_port(options.host)
                               : (f->server_->bind_to_port(options.host, options.port) ? options.port : -1);
  if (f->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.host, ":", options.port));
  }
  f->thread_ = std::thread([s = f->server_.get()] { s->listen_after_bind(); });
  return f;
}

HttpFront::~HttpFront() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpFront::Route() {
  // Responses go out uncompressed: they are small and latency-bound, and a client's
  // broken brotli must not break the API (cpp-httplib would compress JSON for a
  // client that accepts gzip or br).
  // The API asks for the token; /health and /metrics do not.
  server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const_cast<httplib::Request&>(req).headers.erase("Accept-Encoding");  // the server's own, mutable object
    if (access_ != nullptr && req.path.starts_with("/v1/")) {
      if (absl::Status s = access_->Authenticate(req.get_header_value("Authorization")).status(); !s.ok()) {
        SendError(res, req.path.starts_with("/v1/chat/") ? Api::kChat : Api::kCompletions, s);
        res.set_header("WWW-Authenticate", "Bearer");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  server_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const bool serving = state_.load() != nullptr && !draining_.load();
    res.status = serving ? 200 : 503;
    res.set_content(serving ? "{\"status\":\"ok\"}" : "{\"status\":\"unavailable\"}", "application/json");
  });
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus::TextSerializer().Serialize(metrics_->Collect()), "text/plain; version=0.0.4");
  });
  server_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const ServiceState* st = state_.load();
    if (st == nullptr) return SendError(res, Api::kCompletions, absl::UnavailableError("the model is loading"));
    res.set_content(Dump(openai::ModelList(options_.served_models, st->model->config().n_ctx, std::time(nullptr))),
                    "application/json");
  });
  for (auto [path, api] :
       {std::pair{"/v1/completions", Api::kCompletions}, std::pair{"/v1/chat/completions", Api::kChat}}) {
    server_->Post(path, [this, api = api](const httplib::Request& req, httplib::Response& res) {
      const ServiceState* st = state_.load();
      if (st == nullptr) return SendError(res, api, absl::UnavailableError("the model is loading"));
      if (draining_.load()) return SendError(res, api, absl::UnavailableError("the server is draining"));
      absl::StatusOr<openai::ApiRequest> parsed = openai::ParseRequest(api, req.body, options_.served_models);
      if (!parsed.ok()) return SendError(res, api, parsed.status());
      std::string principal;  // the pre-routing handler has let only known keys through
      if (access_ != nullptr) principal = access_->Authenticate(req.get_header_value("Authorization")).value_or("");
      absl::StatusOr<std::shared_ptr<Request>> built =
          RequestFromProto(parsed->request, *st->model, st->defaults, principal);
      if (!built.ok()) return SendError(res, api, built.status());
      std::shared_ptr<void> slot;  // the client's stream count, held until the response is written
      if (access_ != nullptr) {
        absl::StatusOr<std::shared_ptr<void>> opened = access_->OpenStream(PeerHost(req.remote_addr));
        if (!opened.ok()) return SendError(res, api, opened.status());
        slot = *std::move(opened);
      }
      std::shared_ptr<Request> r = *std::move(built);
      r->id = req.get_header_value("X-Request-Id");
      if (r->id.empty()) r->id = absl::StrCat("http-", next_id_.fetch_add(1));
      auto sink = std::make_shared<HttpSink>(st->metrics, r, st->max_stream_backlog);
      r->sink = sink;
      if (absl::Status s = st->loop->Submit(r); !s.ok()) return SendError(res, api, s);
      const Tokenizer* tok = st->model->tokenizer();
      const bool tools =
          parsed->request.tools_size() > 0 && parsed->request.tool_choice().mode() != pb::ToolChoice::NONE;
      auto writer = std::make_shared<openai::ResponseWriter>(
          *parsed, absl::StrCat(api == Api::kChat ? "chatcmpl-" : "cmpl-", r->id), std::time(nullptr),
          [tok](int32_t id) { return tok->Decode(std::span<const int32_t>(&id, 1)); },
          tools ? st->defaults.tool_format : ToolFormat::kNone);
      res.set_header("X-Request-Id", r->id);
      if (!parsed->stream) {
        std::deque<RequestEvent> events;
        for (bool done = false; !done;) {
          done = sink->Take(&events, kKeepAlive);
          for (const RequestEvent& ev : events) writer->Collect(ev);
        }
        if (absl::Status s = writer->Status(); !s.ok()) return SendError(res, api, s);
        res.set_content(Dump(writer->Final()), "application/json");
        return;
      }
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [sink, writer, weak = std::weak_ptr<Request>(r)](size_t, httplib::DataSink& out) {
            std::deque<RequestEvent> events;
            const bool done = sink->Take(&events, kKeepAlive);
            std::string text;
            for (const RequestEvent& ev : events) text += writer->StreamEvent(ev);
            if (text.empty() && !writer->closed()) text = ": keep-alive\n\n";
            if (!out.write(text.data(), text.size())) return false;
            if (done || writer->closed()) {
              // A failed choice ended the stream: the others stop too (n > 1).
              if (auto req = weak.lock(); req && !done) req->Cancel(CancelReason::kAbort);
              out.done();
            }
            return true;
          },
          [r, slot](bool success) {
            if (!success) r->Cancel(CancelReason::kClient);  // the client went away (or the server stops)
          });
    });
  }
}

}  // namespace ps::server
