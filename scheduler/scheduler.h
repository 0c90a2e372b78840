// Iteration-level scheduler: one engine thread runs steps that batch one decode
// token of every running request with prefill chunks of prompts, through one
// Transformer. KV lives in paged blocks of the device tier; when it runs out, the
// lowest-priority, latest-arrived sequences are preempted: their blocks are
// swapped to the host tier (or dropped and recomputed later) and come back when
// room returns. Requests enter from any thread through Submit().
//
// Order and starvation: every decision walks requests by (priority desc,
// arrival asc). Admission stops at the first request that does not fit and
// never passes a preempted request of the same or higher rank, and victims are
// taken from the back of that order; so within a priority level the oldest
// request always makes progress. Across levels priority is strict: lower levels
// wait while higher ones use the whole cache.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "engine/forward.h"
#include "memory/paged_kv_store.h"
#include "memory/swap_engine.h"
#include "scheduler/request.h"

namespace ps {

enum class PreemptionMode { kSwap, kRecompute };
std::string_view PreemptionModeName(PreemptionMode m);

struct SchedulerOptions {
  int max_running = 64;         // sequences in the running set at most (swapped ones count)
  int max_queue = 256;          // waiting requests at most (RESOURCE_EXHAUSTED beyond)
  int max_batch_tokens = 2048;  // token rows per step: every decode, then prefill chunks
  int prefill_chunk = 512;      // prompt tokens of one sequence per step at most
  int kv_block_tokens = 16;     // tokens per KV block (one layer's K and V)
  DType kv_dtype = DType::kF32;  // KV element type: F32, F16 or BF16
  // KV blocks of the device tier; 0 = enough for max_running full-context sequences, up to 1 GiB.
  int64_t kv_device_blocks = 0;
  int64_t kv_host_blocks = 0;   // host tier (swap space); 0 = none: every preemption recomputes
  PreemptionMode preemption = PreemptionMode::kSwap;
  MatMulOptions matmul;
  CpuSwapEngine::CopyFn swap_copy;  // tests: inject copy failures (null = memcpy)
};

struct KvTierLoad {
  int64_t used = 0;   // blocks
  int64_t total = 0;
};

struct LoadSnapshot {
  int running = 0;  // in the running set, swapped ones included
  int waiting = 0;
  int in_flight = 0;  // submitted and not yet finished (exact at any moment, unlike the step counts)
  int swapped = 0;    // running requests whose KV sits in the host tier
  KvTierLoad kv[2];   // indexed by Tier
  int64_t preemptions[2] = {0, 0};  // indexed by PreemptionMode
  uint64_t swap_bytes_to_host = 0, swap_bytes_to_device = 0;
};

// Step-level notifications, for metrics. Called on the engine thread.
class SchedulerObserver {
 public:
  virtual ~SchedulerObserver() = default;
  virtual void OnStep(const LoadSnapshot& load, int batch_tokens) = 0;
  virtual void OnPreemption(PreemptionMode mode) = 0;
  // One sequence's blocks moved to `to`: bytes, and seconds from submission to completion.
  virtual void OnSwap(Tier to, uint64_t bytes, double seconds) = 0;
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
    std::unique_ptr<SequenceDecoder> decoder;  // its history: prompt + generated tokens
    int computed = 0;        // leading history tokens whose KV is cached (0 after a recompute preemption)
    bool prefilled = false;  // the prompt has been computed once and the first token sampled
    bool preempted = false;  // KV swapped out or dropped; waits for room before running again
    Clock::time_point admitted{}, first_token{};
    std::unique_ptr<PruningStrategy> strategy;  // null: full; recreated when the KV is dropped
    int next_position = 0;  // position of history[computed] (strategies may renumber)
    double rows_computed = 0;           // prompt token-layer pairs (RequestUsage::prompt_tokens_computed)
    std::vector<int64_t> layer_rows;    // prompt rows entering each layer, first pass
    std::vector<int32_t> kept_prompt;   // prompt indices that reached the last layer, first pass
    int64_t peak_blocks = 0;            // before the last time its KV was dropped
    int Remaining() const { return static_cast<int>(decoder->history().size()) - computed; }
    // Its KV sits in the host tier (a preemption that dropped the KV leaves computed = 0).
    bool Swapped() const { return preempted && computed > 0; }
  };
  struct PendingSwap {
    SwapTicket ticket = 0;
    size_t run = 0;  // index in running_
    SwapPlan plan;
    Clock::time_point submitted;
  };
  void Loop();
  void Step();
  void Admit(Clock::time_point now);
  // Token rows each running sequence feeds this step: decodes first, then prefill
  // chunks in priority order, within max_batch_tokens.
  std::vector<int> PlanRows(const std::vector<size_t>& order) const;
  // Swaps out (or drops) the victims' KV; returns after their device blocks are free.
  void Preempt(const std::vector<size_t>& victims);
  // Waits for a swap; on failure the sequence's KV is dropped (recomputed later) and false returned.
  bool CompleteSwap(PendingSwap& swap, Tier to);
  void DropKv(Running& run);
  int64_t BlocksHeld(const Running& run) const;  // both tiers
  void Finish(Running& r, FinishReason reason, CancelReason cancel, std::string error = {});
  void FinishWaiting(const std::shared_ptr<Request>& r, CancelReason cancel, FinishReason reason = FinishReason::kCancelled,
                     std::string error = {});
  CancelReason CheckCancel(const Request& r, Clock::time_point now) const;
  void Forget(const std::string& id);
  void PublishLoad(int batch_tokens);

  const Model& model_;
  SchedulerOptions options_;
  SchedulerObserver* observer_;
  Transformer transformer_;
  BlockPool device_blocks_;
  BlockPool host_blocks_;
  KvCacheManager kv_manager_;
  PagedKvStore kv_;
  CpuSwapEngine swap_;
  int64_t preemptions_[2] = {0, 0};

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
  std::vector<std::pair<std::shared_ptr<RequestSink>, RequestEvent>> outbox_;  // sent at the end of a step
  std::thread thread_;
};

}  // namespace ps
