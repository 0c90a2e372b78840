// A generation request as the scheduler sees it, and the events it produces.
// Created by the server (thread-safe parts: the cancel flag); everything else is
// touched only by the engine thread once submitted.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/pruning/params.h"
#include "engine/sequence.h"

namespace ps {

using Clock = std::chrono::steady_clock;

enum class CancelReason : int { kNone = 0, kClient, kDeadline, kAbort, kShutdown };
std::string_view CancelReasonName(CancelReason r);

struct RequestUsage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  // Prompt token-layer pairs computed / layers: the first pass over the prompt
  // (prefix passes included) and prompt tokens revived during decode.
  double prompt_tokens_computed = 0;
  // KV blocks the sequence held at most (it only grows, until a recompute drops it), all layers.
  int64_t kv_blocks = 0;
  // (layer, prompt tokens entering it) at layer 0 and wherever the count changes, first pass.
  std::vector<std::pair<int, int>> kept_per_layer;
  double queue_seconds = 0;
  double ttft_seconds = 0;
  double total_seconds = 0;
};

struct RequestEvent {
  enum class Kind { kTokens, kFinished } kind = Kind::kTokens;
  std::vector<SampledToken> tokens;  // kTokens: new tokens (deltas)
  std::string text;                  // text completed by them
  // kFinished:
  FinishReason reason = FinishReason::kLength;
  CancelReason cancel = CancelReason::kNone;
  std::string matched_stop;
  std::string error;
  RequestUsage usage;
  // With Request::report_pruning: the prompt token spans that reached the last
  // layer in the first pass.
  struct KeptSpan {
    int begin = 0, end = 0;  // [begin, end) prompt indices
    std::string text;
  };
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
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  StopCriteria stop;
  int priority = 0;
  PruningParams pruning;        // validated by the submitter
  bool report_pruning = false;  // return kept_spans in the Finished event
  std::string_view strategy() const { return StrategyName(pruning.strategy); }
  std::optional<Clock::time_point> deadline;
  std::shared_ptr<RequestSink> sink;

  // Thread-safe: the first reason wins.
  void Cancel(CancelReason r) {
    int expected = 0;
    cancel_.compare_exchange_strong(expected, static_cast<int>(r));
  }
  CancelReason cancel_reason() const { return static_cast<CancelReason>(cancel_.load()); }

  Clock::time_point arrival{};  // set by Scheduler::Submit

 private:
  std::atomic<int> cancel_{0};
};

}  // namespace ps
