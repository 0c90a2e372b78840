// The part of a request's sink both fronts (gRPC and HTTP) share: it records the
// request's metrics (TTFT, inter-token latency, usage by strategy) and logs one
// line when it finishes, then hands each event to the front's Deliver.
#pragma once

#include <string>
#include <vector>

#include "scheduler/request.h"
#include "server/metrics.h"

namespace ps::server {

class MeteredSink : public RequestSink {
 public:
  MeteredSink(Metrics* metrics, std::string id, std::string strategy)
      : metrics_(metrics), id_(std::move(id)), strategy_(std::move(strategy)) {}
  void OnEvent(RequestEvent event) final;

 protected:
  // On the engine thread, after the metrics: must not block.
  virtual void Deliver(RequestEvent event) = 0;

 private:
  Metrics* metrics_;
  std::string id_, strategy_;
  // Engine thread only: each choice's last token (none yet: the epoch).
  std::vector<Clock::time_point> last_token_;
};

}  // namespace ps::server
