// The engine loop: one thread that moves requests from the inbox to the scheduler,
// runs Schedule -> Execute -> Update, publishes the load and fans the events out
// to the requests' sinks. The thread-safe face of serving: Submit, Abort,
// CancelAll, Load and Stop may be called from any thread (gRPC reactors).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/step.h"
#include "scheduler/scheduler.h"

namespace ps {

class EngineLoop {
 public:
  // `scheduler` plans over `executor`'s KV (both used on the loop's thread only from
  // now on); `clock` gives the scheduler its time (tests may pass their own).
  EngineLoop(
      Scheduler& scheduler, StepExecutor& executor, SchedulerObserver* observer = nullptr,
      std::function<Clock::time_point()> clock = [] { return Clock::now(); });
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Queues a request. ALREADY_EXISTS for an active id, RESOURCE_EXHAUSTED when the
  // queue is full or the prompt can never fit the device tier, UNAVAILABLE after Stop().
  absl::Status Submit(std::shared_ptr<Request> request);
  // Cancels the active request with this id; false if none.
  bool Abort(const std::string& id);
  // Cancels every active request with `reason`; they finish at the next step.
  void CancelAll(CancelReason reason);
  LoadSnapshot Load() const;
  // Drops every cached prompt prefix no request holds (KvPlanner::FlushPrefixCache)
  // between two steps, then calls `done` with the blocks freed (on the loop's thread),
  // or with UNAVAILABLE once the loop stops (on the caller's thread after Stop()).
  using FlushDone = std::function<void(absl::StatusOr<int64_t>)>;
  void FlushPrefixCache(FlushDone done);
  // The prefix cache's changes, for prefix-aware routers: `sink` gets every page
  // cached when it joins (as stored events, maybe none), then each step's changes
  // (never none), on the loop's thread, and nullptr when the loop stops (the end);
  // it must not block. The id is UnsubscribeKvEvents'.
  using KvEventSink = std::function<void(const std::vector<PrefixEvent>* events)>;
  int64_t SubscribeKvEvents(KvEventSink sink);
  void UnsubscribeKvEvents(int64_t id);
  // Finishes every request (kShutdown) and joins the thread. Idempotent.
  void Stop();

 private:
  void Loop();
  void Step();
  void Publish(const StepResult& result, const std::vector<Outgoing>& events);
  void PublishKv();               // the KV counts into load_ (mu_ held)
  LoadSnapshot Snapshot() const;  // load_ with the inbox counted (mu_ held)
  void DeliverKvEvents();         // the prefix cache's changes to the subscribers

  Scheduler& scheduler_;
  StepExecutor& executor_;
  SchedulerObserver* observer_;
  std::function<Clock::time_point()> clock_;

  mutable std::mutex mu_;  // guards the fields below
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Request>> incoming_;
  std::vector<FlushDone> flushes_;  // FlushPrefixCache calls waiting
  struct KvSubscriber {
    int64_t id;
    KvEventSink sink;
    bool started;  // has had its snapshot
  };
  std::vector<KvSubscriber> kv_subscribers_;
  int64_t next_subscriber_ = 1;
  bool exited_ = false;                                   // the loop's thread has returned
  std::map<std::string, std::weak_ptr<Request>> active_;  // id -> request, waiting or running
  bool stopping_ = false;
  int gather_;  // requests the first step waits for (SchedulerOptions::gather_first), then 0
  LoadSnapshot load_;
  std::thread thread_;
};

}  // namespace ps
