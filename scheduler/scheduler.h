// Iteration-level scheduler: one engine thread runs steps that batch the prompts
// of newly admitted requests with one decode token of every running request,
// through one Transformer. Requests enter from any thread through Submit().
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "engine/forward.h"
#include "memory/paged_kv_store.h"
#include "scheduler/request.h"

namespace ps {

struct SchedulerOptions {
  int max_running = 16;       // sequences in a step at most
  int max_queue = 256;        // waiting requests at most (RESOURCE_EXHAUSTED beyond)
  int max_batch_tokens = 2048;  // prompt tokens admitted per step (a longer prompt runs alone)
  int kv_block_tokens = 16;     // tokens per KV block (one layer's K and V)
  // KV blocks of the device tier; 0 = enough for max_running full-context sequences.
  int64_t kv_device_blocks = 0;
  MatMulOptions matmul;
};

struct LoadSnapshot {
  int running = 0;
  int waiting = 0;
  int in_flight = 0;  // submitted and not yet finished (exact at any moment, unlike the step counts)
  int64_t kv_blocks_used = 0;      // device-tier KV blocks in use
  int64_t kv_blocks_total = 0;
  int64_t preemptions = 0;         // running requests whose KV was dropped for room (recomputed later)
};

// Step-level notifications, for metrics. Called on the engine thread.
class SchedulerObserver {
 public:
  virtual ~SchedulerObserver() = default;
  virtual void OnStep(const LoadSnapshot& load, int batch_tokens) = 0;
};

class Scheduler {
 public:
  Scheduler(const Model& model, ThreadPool& pool, const SchedulerOptions& options,
            SchedulerObserver* observer = nullptr);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request (thread-safe). ALREADY_EXISTS for an active id,
  // RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE after Stop().
  absl::Status Submit(std::shared_ptr<Request> request);
  // Cancels the active request with this id (thread-safe); false if none.
  bool Abort(const std::string& id);
  // Cancels every active request with `reason` (thread-safe); they finish at the next step.
  void CancelAll(CancelReason reason);
  LoadSnapshot Load() const;  // thread-safe
  int kv_block_tokens() const { return options_.kv_block_tokens; }
  // Finishes every request (kShutdown) and joins the engine thread. Idempotent.
  void Stop();

 private:
  struct Running {
    std::shared_ptr<Request> request;
    int64_t seq_id = 0;
    std::unique_ptr<SequenceDecoder> decoder;
    bool prefilled = false;
    bool evicted = false;  // KV dropped for room: the next step recomputes prompt + generated tokens
    int32_t last_token = 0;
    Clock::time_point admitted{}, first_token{};
    double rows_computed = 0;  // token-layer pairs
  };

  void Loop();
  void Step();
  void Finish(Running& r, FinishReason reason, CancelReason cancel, std::string error = {});
  void FinishWaiting(const std::shared_ptr<Request>& r, CancelReason cancel);
  CancelReason CheckCancel(const Request& r, Clock::time_point now) const;
  void Forget(const std::string& id);
  // Rows a running sequence feeds this step (prompt, recompute, or its last token).
  int RowsThisStep(const Running& r) const;

  const Model& model_;
  SchedulerOptions options_;
  SchedulerObserver* observer_;
  Transformer transformer_;
  BlockPool device_blocks_;
  BlockPool host_blocks_;  // the host tier (swapping is the next step; empty for now)
  KvCacheManager kv_manager_;
  PagedKvStore kv_;
  int64_t preemptions_ = 0;

  mutable std::mutex mu_;  // guards the fields below
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Request>> incoming_;
  std::map<std::string, std::weak_ptr<Request>> active_;  // id -> request, waiting or running
  bool stopping_ = false;
  LoadSnapshot load_;

  // Engine thread only.
  std::vector<std::shared_ptr<Request>> waiting_;
  std::vector<Running> running_;
  int64_t next_seq_id_ = 1;
  ForwardOutput out_;
  std::thread thread_;
};

}  // namespace ps
