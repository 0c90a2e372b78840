// A generation request as the scheduler sees it, and the events it produces.
// Created by the server (thread-safe parts: the cancel flag); everything else is
// touched only by the engine loop's thread once submitted.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/step.h"

namespace ps {

using Clock = std::chrono::steady_clock;

// kSlowClient: the client stopped reading its stream and the server's backlog for it filled.
enum class CancelReason : int { kNone = 0, kClient, kDeadline, kAbort, kShutdown, kSlowClient };
std::string_view CancelReasonName(CancelReason r);

struct RequestEvent {
  enum class Kind { kTokens, kFinished } kind = Kind::kTokens;
  int index = 0;                     // the choice (GenerationSpec::n): each streams and finishes on its own
  std::vector<SampledToken> tokens;  // kTokens: new tokens (deltas)
  std::string text;                  // text completed by them
  // kFinished:
  FinishReason reason = FinishReason::kLength;
  CancelReason cancel = CancelReason::kNone;
  std::string matched_stop;
  std::string error;
  // The request's last choice ended: nothing follows. Before that (n > 1) a choice's
  // kFinished carries the usage of the choices ended so far (the prompt once); the last
  // one's covers the whole request.
  bool last = true;
  Usage usage;
  // With GenerationSpec::report_pruning: the prompt token spans that reached the
  // last layer in the first pass.
  std::vector<KeptSpan> kept_spans;
};

// Receives a request's events. Called on the engine thread: must not block.
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  virtual void OnEvent(RequestEvent event) = 0;
};

struct Request {
  std::string id;
  GenerationSpec spec;  // prompt, sampling, stop rules, strategy (validated by the submitter)
  int priority = 0;
  std::string_view strategy() const { return spec.pruning.name(); }
  std::optional<Clock::time_point> deadline;
  std::shared_ptr<RequestSink> sink;

  // Thread-safe: the first reason wins.
  void Cancel(CancelReason r) {
    int expected = 0;
    cancel_.compare_exchange_strong(expected, static_cast<int>(r));
  }
  CancelReason cancel_reason() const { return static_cast<CancelReason>(cancel_.load()); }

  Clock::time_point arrival{};  // set on submission

 private:
  std::atomic<int> cancel_{0};
};

}  // namespace ps
