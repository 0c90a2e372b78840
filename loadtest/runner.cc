#include "loadtest/runner.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <random>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps::loadtest {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

class Runner;

// One Generate call; deletes itself through the runner when it ends.
class Call final : public grpc::ClientReadReactor<pb::GenerateResponse> {
 public:
  Call(Runner* runner, uint64_t id, pb::GenerateRequest request, std::string strategy)
      : runner_(runner), id_(id), request_(std::move(request)) {
    record_.strategy = std::move(strategy);
  }
  void Start(pb::Generation::Stub& stub, std::optional<double> deadline_s) {
    if (deadline_s) {
      ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                               std::chrono::duration<double>(*deadline_s)));
      has_deadline_ = true;
    }
    sent_ = Clock::now();
    stub.async()->Generate(&ctx_, &request_, this);
    StartRead(&response_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    const auto now = Clock::now();
    switch (response_.event_case()) {
      case pb::GenerateResponse::kPromptInfo: record_.prompt_tokens = response_.prompt_info().prompt_tokens(); break;
      case pb::GenerateResponse::kChunk:
        if (const int n = response_.chunk().token_ids_size(); n > 0) {
          if (record_.output_tokens == 0) {
            record_.ttft = Seconds(now - sent_);
          } else {
            record_.itl.push_back(Seconds(now - last_));
          }
          last_ = now;
          record_.output_tokens += n;
        }
        break;
      case pb::GenerateResponse::kFinished:
        record_.output_tokens = static_cast<int>(response_.finished().usage().completion_tokens());
        record_.cached_tokens = static_cast<int>(response_.finished().usage().cached_tokens());
        break;
      default: break;
    }
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override;

  // Called under the runner's lock.
  void Cancel() {
    cancel_requested_ = true;
    ctx_.TryCancel();
  }
  // Called under the runner's lock: the request id to abort.
  std::string MarkAborted() {
    abort_requested_ = true;
    return request_.request_id();
  }

 private:
  friend class Runner;
  Runner* runner_;
  uint64_t id_;
  grpc::ClientContext ctx_;
  pb::GenerateRequest request_;
  pb::GenerateResponse response_;
  RequestRecord record_;
  Clock::time_point sent_, last_;
  bool has_deadline_ = false;
  bool cancel_requested_ = false;  // under the runner's lock
  bool abort_requested_ = false;   // under the runner's lock
};

class Runner {
 public:
  Runner(pb::Generation::Stub& stub, const RunOptions& o)
      : stub_(stub), o_(o), rng_(o.seed ^ 0x5eed), run_tag_(std::random_device()()) {}

  RunResult Go(Workload& workload, StrategyMix& mix, const RequestOptions& request) {
    Arrivals arrivals(o_.arrivals);
    start_ = Clock::now();
    Clock::time_point next = start_;
    std::bernoulli_distribution cancel(o_.cancel_fraction), deadline(o_.deadline_fraction);
    std::uniform_real_distribution<double> cancel_at(0, o_.cancel_within_s), abort_at(0, o_.abort_within_s);
    std::bernoulli_distribution abort(o_.abort_fraction);
    std::uniform_int_distribution<int> priority(0, std::max(1, o_.priorities) - 1);
    for (uint64_t id = 0;; ++id) {
      if (o_.num_requests > 0 && id >= static_cast<uint64_t>(o_.num_requests)) break;
      next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrivals.NextGap()));
      if (o_.duration_s > 0 && Seconds(next - start_) >= o_.duration_s) break;
      WaitUntil(next, [] { return false; });
      WaitUntil(Clock::time_point::max(),
                [&] { return o_.max_concurrency <= 0 || static_cast<int>(calls_.size()) < o_.max_concurrency; });
      // An unbounded rate never advances `next`: the time is up when a slot frees after it.
      if (o_.duration_s > 0 && Seconds(Clock::now() - start_) >= o_.duration_s) break;
      const std::string& strategy = mix.Draw(rng_);
      absl::StatusOr<pb::GenerateRequest> req = BuildRequest(workload.Next(), strategy, request);
      PS_CHECK(req.ok()) << req.status();  // the mix holds known strategies only
      req->set_priority(priority(rng_));
      const bool aborted = abort(rng_);
      if (aborted) req->set_request_id(absl::StrCat("loadtest-", run_tag_, "-", id));  // Abort finds it by id
      auto* call = new Call(this, id, *std::move(req), strategy);
      const std::optional<double> dl = deadline(rng_) ? std::optional<double>(o_.deadline_s) : std::nullopt;
      {
        std::lock_guard<std::mutex> lock(mu_);
        calls_[id] = call;
        ++alive_;
        ++sent_;
        if (cancel(rng_)) cancels_.push({After(cancel_at(rng_)), id, /*abort=*/false});
        if (aborted) cancels_.push({After(abort_at(rng_)), id, /*abort=*/true});
      }
      call->Start(stub_, dl);
    }
    WaitUntil(Clock::time_point::max(), [&] { return alive_ == 0; });
    if (o_.progress) {
      DrawProgress(Clock::now());
      std::fprintf(stderr, "\n");
    }
    const double duration = records_.empty() ? 0.0 : Seconds(last_end_ - start_);
    return RunResult{.records = std::move(records_), .duration_s = duration};
  }

  void Done(Call* call, const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      RequestRecord& r = call->record_;
      r.e2e = Seconds(Clock::now() - call->sent_);
      r.status_code = status.error_code();
      const bool induced =
          (status.error_code() == grpc::StatusCode::CANCELLED && (call->cancel_requested_ || call->abort_requested_)) ||
          (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && call->has_deadline_);
      r.outcome = status.ok() ? Outcome::kCompleted : induced ? Outcome::kCancelled : Outcome::kFailed;
      if (!status.ok()) r.error = status.error_message();
      failed_ += r.outcome == Outcome::kFailed;
      records_.push_back(std::move(r));
      calls_.erase(call->id_);
      last_end_ = Clock::now();
    }
    // The call's context goes before the run can end: once Go returns, the caller
    // may drop the channel and exit while a gRPC thread still frees a call.
    delete call;
    std::lock_guard<std::mutex> lock(mu_);
    --alive_;
    cv_.notify_all();  // under the lock: the runner outlives this notify
  }

 private:
  static Clock::time_point After(double seconds) {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }

  // Waits until `until` or `done()` (checked under the lock), firing the client
  // cancels and Aborts that fall due and redrawing the progress line meanwhile.
  template <typename Pred>
  void WaitUntil(Clock::time_point until, Pred done) {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      auto now = Clock::now();
      std::vector<std::string> aborts;
      while (!cancels_.empty() && cancels_.top().when <= now) {
        const Scheduled& s = cancels_.top();
        if (auto it = calls_.find(s.call); it != calls_.end()) {
          if (s.abort) {
            aborts.push_back(it->second->MarkAborted());
          } else {
            it->second->Cancel();
          }
        }
        cancels_.pop();
      }
      if (!aborts.empty()) {  // the RPCs outside the lock: the calls' ends take it
        lock.unlock();
        for (const std::string& request_id : aborts) SendAbort(request_id);
        lock.lock();
        now = Clock::now();
      }
      if (o_.progress && now >= next_progress_) {
        DrawProgress(now);
        next_progress_ = now + std::chrono::milliseconds(250);
      }
      if (done() || now >= until) return;
      Clock::time_point wake = until;
      if (!cancels_.empty()) wake = std::min(wake, cancels_.top().when);
      if (o_.progress) wake = std::min(wake, next_progress_);
      cv_.wait_until(lock, wake);
    }
  }

  // An Abort that finds nothing (the request ended first) is not an error.
  void SendAbort(const std::string& request_id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    pb::AbortRequest req;
    req.set_request_id(request_id);
    pb::AbortResponse resp;
    if (const grpc::Status s = stub_.Abort(&ctx, req, &resp); !s.ok()) {
      std::fprintf(stderr, "pruneserve-loadtest: Abort(%s): %s\n", request_id.c_str(), s.error_message().c_str());
    }
  }

  void DrawProgress(Clock::time_point now) {
    const double t = Seconds(now - start_);
    double frac =
        o_.num_requests > 0 ? static_cast<double>(records_.size()) / o_.num_requests : std::min(1.0, t / o_.duration_s);
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::fprintf(stderr, "\r[%s%s] %3.0f%%  sent %llu  in flight %zu  done %zu  failed %d  %.1f s ",
                 std::string(filled, '#').c_str(), std::string(kWidth - filled, ' ').c_str(), frac * 100,
                 static_cast<unsigned long long>(sent_), calls_.size(), records_.size(), failed_, t);
  }

  pb::Generation::Stub& stub_;
  const RunOptions& o_;
  std::mt19937_64 rng_;  // the sending thread's
  uint32_t run_tag_;     // in the request ids of aborted requests: unique beside other load generators
  Clock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Call*> calls_;  // in flight
  int alive_ = 0;                    // calls not yet deleted: in flight or ending
  struct Scheduled {
    Clock::time_point when;
    uint64_t call;
    bool abort;  // an Abort RPC; else the client's cancel
    bool operator>(const Scheduled& o) const { return when > o.when; }
  };
  std::priority_queue<Scheduled, std::vector<Scheduled>, std::greater<>> cancels_;  // the soonest on top
  std::vector<RequestRecord> records_;
  uint64_t sent_ = 0;
  int failed_ = 0;
  Clock::time_point last_end_{}, next_progress_{};
};

void Call::OnDone(const grpc::Status& status) { runner_->Done(this, status); }

}  // namespace

RunResult Run(pb::Generation::Stub& stub, Workload& workload, StrategyMix& mix, const RequestOptions& request,
              const RunOptions& options) {
  Runner runner(stub, options);
  return runner.Go(workload, mix, request);
}

}  // namespace ps::loadtest
