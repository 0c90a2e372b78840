// The iteration-level scheduler, a pure planner: Schedule(now) -> StepPlan and
// Update(StepResult) -> events. It holds no model, no thread and no clock of its
// own; it plans with token and block counts, and reserves each step's KV blocks
// through the KV owner's planning face (memory/kv_planner.h) before the engine
// runs, so the engine never runs out of blocks half way; it releases a sequence's
// blocks there when the sequence ends or loses its KV. Every step batches one decode token of
// every running request with prefill chunks of prompts; when the device tier runs
// out, the lowest-priority, latest-arrived sequences are preempted: their blocks
// are swapped to the host tier (or dropped and recomputed later) and come back
// when room returns. A request with n > 1 choices runs as one sequence until its first
// token is sampled; then n - 1 forks that share its KV join the running set (planned in
// StepPlan::Run::forks), each a sequence of its own that finishes on its own.
//
// Order and starvation: every decision walks requests by (priority desc,
// arrival asc). Admission stops at the first request that does not fit and never
// passes a preempted request of the same or higher rank, and victims are taken
// from the back of that order; so within a priority level the oldest request
// always makes progress. Across levels priority is strict: lower levels wait
// while higher ones use the whole cache.
//
// Single-threaded: call from one thread (the engine loop's), but CheckFits.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/step.h"
#include "memory/kv_planner.h"
#include "scheduler/request.h"

namespace ps {

#ifdef NDEBUG
inline constexpr bool kDebugBuild = false;
#else
inline constexpr bool kDebugBuild = true;
#endif

enum class PreemptionMode { kSwap, kRecompute };
std::string_view PreemptionModeName(PreemptionMode m);

struct SchedulerOptions {
  int max_running = 64;         // sequences in the running set at most (swapped ones count)
  int max_queue = 256;          // waiting requests at most (RESOURCE_EXHAUSTED beyond)
  int max_batch_tokens = 2048;  // token rows per step: every decode, then prefill chunks
  int prefill_chunk = 512;      // prompt tokens of one sequence per step at most
  PreemptionMode preemption = PreemptionMode::kSwap;
  // Tests: the first step waits until this many requests have been submitted, so that
  // they meet in the engine however fast it runs (e.g. to force preemption). 0: none.
  int gather_first = 0;
  // The KV owner's invariant check after every step (KvPlanner::VerifyIntegrity; a
  // failure stops the process): always in debug builds, on demand (tests) in release.
  bool verify_kv = kDebugBuild;
};

struct KvTierLoad {
  int64_t used = 0;  // blocks
  int64_t total = 0;
  int64_t cached = 0;  // of `used`, the prefix cache's blocks (shared with requests, some of them)
};

struct LoadSnapshot {
  int running = 0;  // in the running set, swapped ones included
  int waiting = 0;
  int in_flight = 0;                // submitted and not yet finished (exact at any moment, unlike the step counts)
  int swapped = 0;                  // running requests whose KV sits in the host tier
  KvTierLoad kv[2];                 // indexed by Tier; the host tier includes the host row store
  int64_t preemptions[2] = {0, 0};  // indexed by PreemptionMode
  uint64_t swap_bytes_to_host = 0, swap_bytes_to_device = 0;  // totals since start (swaps and block moves)
  double move_wait_seconds = 0;  // total since start: the engine waiting for a strategy's block moves
  PrefixCacheCounts prefix;      // totals since start
};

// Step-level notifications, for metrics. Called on the engine loop's thread.
class SchedulerObserver {
 public:
  virtual ~SchedulerObserver() = default;
  virtual void OnStep(const LoadSnapshot& load, int batch_tokens) = 0;
  virtual void OnPreemption(PreemptionMode mode) = 0;
  // One sequence's blocks moved to `to`: bytes, and seconds from submission to completion.
  virtual void OnSwap(Tier to, uint64_t bytes, double seconds) = 0;
};

// An event for a request's sink, produced by Schedule or Update.
struct Outgoing {
  std::shared_ptr<Request> request;
  RequestEvent event;
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& options, KvPlanner& kv, SchedulerObserver* observer = nullptr);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const SchedulerOptions& options() const { return options_; }
  // OK when the request's prompt fits the device tier; RESOURCE_EXHAUSTED with the
  // numbers otherwise (it could never run). Thread-safe: reads what never changes.
  absl::Status CheckFits(const Request& request) const;
  // A new request (its arrival time set); it waits for admission.
  void Add(std::shared_ptr<Request> request);

  // The next step: cancellations, admission, preemption, block reservations, rows.
  StepPlan Schedule(Clock::time_point now);
  // Applies what the engine did with the plan; ends the step's reservations.
  void Update(const StepResult& result, Clock::time_point now);
  // The events of the last Schedule and Update, in order.
  std::vector<Outgoing> TakeEvents();

  bool idle() const { return waiting_.empty() && running_.empty() && ending_.empty(); }
  int running() const { return static_cast<int>(running_.size()); }
  int waiting() const { return static_cast<int>(waiting_.size()); }
  int swapped() const;
  int64_t preemptions(PreemptionMode m) const { return preemptions_[static_cast<int>(m)]; }

  // Reservation shortfalls a sequence survives (each time its KV is recomputed with
  // a larger margin) before it fails alone.
  static constexpr int kMaxShortfalls = 3;

 private:
  struct Running {
    std::shared_ptr<Request> request;
    int64_t seq_id = 0;
    int index = 0;     // the choice it generates (GenerationSpec::n)
    int history = 0;   // prompt + generated tokens
    int computed = 0;  // leading history tokens whose KV is cached (0 after a recompute preemption)
    int cached = 0;    // leading prompt tokens whose KV came from the prefix cache
    // What keeps its prefix apart in the prefix cache (the strategy's key and the
    // salt); none: its KV is not cacheable, or the cache is off.
    std::optional<std::string> prefix_extra;
    bool prefilled = false;  // the first token has been sampled
    bool preempted = false;  // KV swapped out or dropped; waits for room before running again
    Clock::time_point admitted{}, first_token{};
    int64_t added_rows = 0;  // rows its strategy may add per layer next step (engine-reported)
    int64_t margin = 0;      // extra device blocks reserved after reservation shortfalls
    int shortfalls = 0;
    std::string failure;  // set: ends with this error at the next Schedule
    int Remaining() const { return history - computed; }
    // Its KV sits in the host tier (a preemption that dropped the KV leaves computed = 0).
    bool Swapped() const { return preempted && computed > 0; }
  };
  // A sequence the plan ended; its Finished event waits for the engine's accounting.
  struct Ending {
    Running run;
    FinishReason reason = FinishReason::kCancelled;
    CancelReason cancel = CancelReason::kNone;
    std::string error;
  };

  void Admit(Clock::time_point now, StepPlan* plan);
  // Token rows each running sequence feeds this step: decodes first, then prefill
  // chunks in priority order, within max_batch_tokens.
  std::vector<int> PlanRows(const std::vector<size_t>& order) const;
  // Ends running_[i] in this plan (its KV released now).
  void EndRunning(size_t i, FinishReason reason, CancelReason cancel, std::string error, StepPlan* plan);
  void Preempt(size_t i, StepPlan* plan);
  // Its KV is released to be recomputed from the first token.
  void Recompute(Running& run);
  // A running choice's kFinished event, with its request's usage so far (n > 1).
  void EmitFinished(const Running& run, RequestEvent event);
  void FinishWaiting(const std::shared_ptr<Request>& r, CancelReason cancel, Clock::time_point now);
  void Emit(const std::shared_ptr<Request>& r, RequestEvent event) { events_.push_back({r, std::move(event)}); }
  RequestEvent Finished(const Running& run, const SeqOutcome& outcome, FinishReason reason, CancelReason cancel,
                        std::string error, Clock::time_point now) const;

  SchedulerOptions options_;
  KvPlanner& kv_;
  SchedulerObserver* observer_;
  // What never changes (CheckFits reads them from other threads).
  const int64_t device_blocks_;
  const int n_layers_;
  const int block_tokens_;
  const int blocks_per_page_;

  std::vector<std::shared_ptr<Request>> waiting_;
  std::vector<Running> running_;
  std::map<int64_t, Ending> ending_;
  // Forks planned this step (n > 1), by sequence id: running once the engine reports them.
  std::map<int64_t, Running> forks_;
  // Requests with n > 1 in the running set: choices not yet finished (forks yet to be
  // made included) and the usage of those that did.
  struct Choices {
    int left = 0;
    Usage usage;
  };
  std::map<const Request*, Choices> choices_;
  int64_t next_seq_id_ = 1;
  int64_t preemptions_[2] = {0, 0};
  std::vector<Outgoing> events_;
};

}  // namespace ps
