#include "scheduler/engine_loop.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps {

EngineLoop::EngineLoop(Scheduler& scheduler, StepExecutor& executor, SchedulerObserver* observer,
                       std::function<Clock::time_point()> clock)
    : scheduler_(scheduler),
      executor_(executor),
      observer_(observer),
      clock_(std::move(clock)),
      gather_(scheduler.options().gather_first) {
  for (Tier t : {Tier::kDevice, Tier::kHost}) load_.kv[static_cast<int>(t)].total = executor.kv().TotalBlocks(t);
  thread_ = std::thread([this] { Loop(); });
}

EngineLoop::~EngineLoop() { Stop(); }

absl::Status EngineLoop::Submit(std::shared_ptr<Request> request) {
  PS_CHECK(request->sink != nullptr) << "request without a sink";
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return absl::UnavailableError("the server is shutting down");
  if (auto it = active_.find(request->id); it != active_.end() && !it->second.expired()) {
    return absl::AlreadyExistsError(absl::StrCat("request_id '", request->id, "' is already active"));
  }
  PS_RETURN_IF_ERROR(scheduler_.CheckFits(*request));
  if (load_.waiting + static_cast<int>(incoming_.size()) >= scheduler_.options().max_queue) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the queue is full (", scheduler_.options().max_queue, " waiting requests)"));
  }
  request->arrival = clock_();
  active_[request->id] = request;
  incoming_.push_back(std::move(request));
  wake_.notify_one();
  return absl::OkStatus();
}

bool EngineLoop::Abort(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = active_.find(id);
  if (it == active_.end()) return false;
  auto r = it->second.lock();
  if (r == nullptr) return false;
  r->Cancel(CancelReason::kAbort);
  wake_.notify_one();
  return true;
}

void EngineLoop::CancelAll(CancelReason reason) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, weak] : active_) {
    if (auto r = weak.lock()) r->Cancel(reason);
  }
  wake_.notify_one();
}

LoadSnapshot EngineLoop::Load() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Snapshot();
}

LoadSnapshot EngineLoop::Snapshot() const {
  LoadSnapshot s = load_;
  s.waiting += static_cast<int>(incoming_.size());
  s.in_flight = static_cast<int>(active_.size());
  return s;
}

void EngineLoop::FlushPrefixCache(FlushDone done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      flushes_.push_back(std::move(done));
      wake_.notify_one();
      return;
    }
  }
  done(absl::UnavailableError("the server is shutting down"));
}

int64_t EngineLoop::SubscribeKvEvents(KvEventSink sink) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!exited_) {
      const int64_t id = next_subscriber_++;
      kv_subscribers_.push_back({.id = id, .sink = std::move(sink), .started = false});
      wake_.notify_one();  // its snapshot comes from the loop's thread
      return id;
    }
  }
  sink(nullptr);  // the loop has stopped: the end at once
  return 0;
}

void EngineLoop::UnsubscribeKvEvents(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(kv_subscribers_, [&](const KvSubscriber& s) { return s.id == id; });
}

void EngineLoop::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    for (auto& [id, weak] : active_) {
      if (auto r = weak.lock()) r->Cancel(CancelReason::kShutdown);
    }
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::Loop() {
  while (true) {
    std::vector<FlushDone> flushes;
    bool done = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] {
        const bool gathered = static_cast<int>(incoming_.size()) >= gather_;
        const bool joined = std::ranges::any_of(kv_subscribers_, [](const KvSubscriber& s) { return !s.started; });
        return stopping_ || (gathered && !incoming_.empty()) || !scheduler_.idle() || !flushes_.empty() || joined;
      });
      flushes.swap(flushes_);
      done = stopping_ && incoming_.empty() && scheduler_.idle();
      // Not on a flush alone before the first step has gathered its requests.
      if (!done && (stopping_ || static_cast<int>(incoming_.size()) >= gather_)) {
        gather_ = 0;
        // Still waiting until the step publishes its load: Submit counts them against --max-queue.
        load_.waiting += static_cast<int>(incoming_.size());
        for (auto& r : incoming_) scheduler_.Add(std::move(r));
        incoming_.clear();
      }
    }
    if (done) {
      for (FlushDone& f : flushes) f(absl::UnavailableError("the server is shutting down"));
      std::vector<KvSubscriber> subscribers;
      {
        std::lock_guard<std::mutex> lock(mu_);
        subscribers.swap(kv_subscribers_);
        exited_ = true;
      }
      for (const KvSubscriber& s : subscribers) s.sink(nullptr);  // the end of their streams
      return;
    }
    DeliverKvEvents();  // new subscribers' snapshots before this iteration changes anything
    if (!flushes.empty()) {
      const int64_t freed = executor_.kv().FlushPrefixCache();
      LoadSnapshot snapshot;
      {
        std::lock_guard<std::mutex> lock(mu_);
        PublishKv();
        snapshot = Snapshot();
      }
      if (observer_ != nullptr) observer_->OnStep(snapshot, 0);  // the gauges without their blocks
      DeliverKvEvents();
      for (FlushDone& f : flushes) f(freed);
    }
    if (!scheduler_.idle()) Step();
  }
}

void EngineLoop::Step() {
  const StepPlan plan = scheduler_.Schedule(clock_());
  const StepResult result = executor_.Execute(plan);
  scheduler_.Update(result, clock_());
  if (scheduler_.options().verify_kv) {
    const absl::Status kv = executor_.kv().VerifyIntegrity();
    PS_CHECK(kv.ok()) << "the KV owner's invariants after a step: " << kv.message();
  }
  if (observer_ != nullptr) {
    for (const SwapRecord& s : result.swaps) observer_->OnSwap(s.to, s.bytes, s.seconds);
  }
  std::vector<Outgoing> events = scheduler_.TakeEvents();
  Publish(result, events);
  // Events go out after the load is published: a client that sees its request
  // finish also sees its blocks free in Load().
  for (Outgoing& o : events) o.request->sink->OnEvent(std::move(o.event));
  DeliverKvEvents();
}

void EngineLoop::DeliverKvEvents() {
  const std::vector<PrefixEvent> events = executor_.kv().TakePrefixEvents();
  std::vector<std::pair<KvEventSink, bool>> sinks;  // and whether it joined since the last delivery
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (KvSubscriber& s : kv_subscribers_) {
      sinks.emplace_back(s.sink, !s.started);
      s.started = true;
    }
  }
  std::optional<std::vector<PrefixEvent>> snapshot;
  for (const auto& [sink, joined] : sinks) {
    if (joined) {
      if (!snapshot) snapshot = executor_.kv().PrefixSnapshot();
      sink(&*snapshot);  // the state after `events`: it needs none of them
    } else if (!events.empty()) {
      sink(&events);
    }
  }
}

void EngineLoop::Publish(const StepResult& result, const std::vector<Outgoing>& events) {
  LoadSnapshot snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Outgoing& o : events) {
      if (o.event.kind == RequestEvent::Kind::kFinished && o.event.last) active_.erase(o.request->id);
    }
    load_.running = scheduler_.running();
    load_.waiting = scheduler_.waiting();
    load_.swapped = scheduler_.swapped();
    PublishKv();
    for (PreemptionMode m : {PreemptionMode::kSwap, PreemptionMode::kRecompute}) {
      load_.preemptions[static_cast<int>(m)] = scheduler_.preemptions(m);
    }
    load_.swap_bytes_to_host = result.swap_bytes_to_host;
    load_.swap_bytes_to_device = result.swap_bytes_to_device;
    load_.move_wait_seconds = result.move_wait_seconds;
    snapshot = Snapshot();
  }
  if (observer_ != nullptr) observer_->OnStep(snapshot, result.batch_tokens);
}

void EngineLoop::PublishKv() {
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    load_.kv[static_cast<int>(t)].used = executor_.kv().UsedBlocks(t);
    load_.kv[static_cast<int>(t)].cached = executor_.kv().CachedBlocks(t);
  }
  load_.prefix = executor_.kv().prefix_counts();
}

}  // namespace ps
