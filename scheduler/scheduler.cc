#include "scheduler/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps {

std::string_view CancelReasonName(CancelReason r) {
  switch (r) {
    case CancelReason::kNone: return "none";
    case CancelReason::kClient: return "client";
    case CancelReason::kDeadline: return "deadline";
    case CancelReason::kAbort: return "abort";
    case CancelReason::kShutdown: return "shutdown";
  }
  return "unknown";
}

namespace {
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

Scheduler::Scheduler(const Model& model, ThreadPool& pool, const SchedulerOptions& options,
                     SchedulerObserver* observer)
    : model_(model),
      options_(options),
      observer_(observer),
      transformer_(model, pool, options.matmul),
      kv_(model.config().n_layers, model.config().kv_dim(), model.config().n_ctx) {
  load_.kv_capacity_tokens = static_cast<int64_t>(options_.max_running) * model.config().n_ctx;
  thread_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() { Stop(); }

absl::Status Scheduler::Submit(std::shared_ptr<Request> request) {
  PS_CHECK(request->sink != nullptr) << "request without a sink";
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return absl::UnavailableError("the server is shutting down");
  if (auto it = active_.find(request->id); it != active_.end() && !it->second.expired()) {
    return absl::AlreadyExistsError(absl::StrCat("request_id '", request->id, "' is already active"));
  }
  if (load_.waiting + static_cast<int>(incoming_.size()) >= options_.max_queue) {
    return absl::ResourceExhaustedError(absl::StrCat("the queue is full (", options_.max_queue, " waiting requests)"));
  }
  request->arrival = Clock::now();
  active_[request->id] = request;
  incoming_.push_back(std::move(request));
  wake_.notify_one();
  return absl::OkStatus();
}

bool Scheduler::Abort(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = active_.find(id);
  if (it == active_.end()) return false;
  auto r = it->second.lock();
  if (r == nullptr) return false;
  r->Cancel(CancelReason::kAbort);
  wake_.notify_one();
  return true;
}

void Scheduler::CancelAll(CancelReason reason) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, weak] : active_) {
    if (auto r = weak.lock()) r->Cancel(reason);
  }
  wake_.notify_one();
}

LoadSnapshot Scheduler::Load() const {
  std::lock_guard<std::mutex> lock(mu_);
  LoadSnapshot s = load_;
  s.waiting += static_cast<int>(incoming_.size());
  s.in_flight = static_cast<int>(active_.size());
  return s;
}

void Scheduler::Stop() {
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

void Scheduler::Forget(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  active_.erase(id);
}

CancelReason Scheduler::CheckCancel(const Request& r, Clock::time_point now) const {
  if (CancelReason c = r.cancel_reason(); c != CancelReason::kNone) return c;
  if (r.deadline && now >= *r.deadline) return CancelReason::kDeadline;
  return CancelReason::kNone;
}

void Scheduler::FinishWaiting(const std::shared_ptr<Request>& r, CancelReason cancel) {
  RequestEvent ev{.kind = RequestEvent::Kind::kFinished, .reason = FinishReason::kCancelled, .cancel = cancel};
  ev.usage.prompt_tokens = static_cast<int>(r->prompt.size());
  ev.usage.queue_seconds = ev.usage.total_seconds = Seconds(r->arrival, Clock::now());
  Forget(r->id);
  r->sink->OnEvent(std::move(ev));
}

void Scheduler::Finish(Running& run, FinishReason reason, CancelReason cancel, std::string error) {
  Request& r = *run.request;
  const auto now = Clock::now();
  RequestEvent ev{.kind = RequestEvent::Kind::kFinished, .reason = reason, .cancel = cancel, .error = std::move(error)};
  ev.usage.prompt_tokens = static_cast<int>(r.prompt.size());
  ev.usage.completion_tokens = run.decoder->num_generated();
  ev.usage.prompt_tokens_computed = run.rows_computed / model_.config().n_layers;
  ev.usage.queue_seconds = Seconds(r.arrival, run.admitted);
  ev.usage.ttft_seconds = run.prefilled ? Seconds(r.arrival, run.first_token) : 0.0;
  ev.usage.total_seconds = Seconds(r.arrival, now);
  if (reason == FinishReason::kCancelled || reason == FinishReason::kError) {
    ev.text = run.decoder->Flush();  // text held back (partial characters) is not lost
  }
  kv_.Release(run.seq_id);
  Forget(r.id);
  r.sink->OnEvent(std::move(ev));
  run.request.reset();
}

void Scheduler::Loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !incoming_.empty() || !waiting_.empty() || !running_.empty(); });
      if (stopping_ && incoming_.empty() && waiting_.empty() && running_.empty()) return;
      for (auto& r : incoming_) waiting_.push_back(std::move(r));
      incoming_.clear();
    }
    Step();
  }
}

void Scheduler::Step() {
  const auto now = Clock::now();
  // 1. Cancellations and deadlines, waiting and running.
  std::erase_if(waiting_, [&](const std::shared_ptr<Request>& r) {
    const CancelReason c = CheckCancel(*r, now);
    if (c == CancelReason::kNone) return false;
    FinishWaiting(r, c);
    return true;
  });
  for (Running& run : running_) {
    if (const CancelReason c = CheckCancel(*run.request, now); c != CancelReason::kNone) {
      Finish(run, FinishReason::kCancelled, c);
    }
  }
  std::erase_if(running_, [](const Running& r) { return r.request == nullptr; });

  // 2. Admission: highest priority first, then first come; prompt tokens per step bounded.
  std::stable_sort(waiting_.begin(), waiting_.end(), [](const auto& a, const auto& b) {
    return a->priority > b->priority || (a->priority == b->priority && a->arrival < b->arrival);
  });
  int batch_prompt_tokens = 0;
  size_t admitted = 0;
  while (admitted < waiting_.size() && static_cast<int>(running_.size()) < options_.max_running) {
    const auto& r = waiting_[admitted];
    const int n = static_cast<int>(r->prompt.size());
    if (batch_prompt_tokens > 0 && batch_prompt_tokens + n > options_.max_batch_tokens) break;
    batch_prompt_tokens += n;
    Running run;
    run.request = r;
    run.seq_id = next_seq_id_++;
    run.decoder = std::make_unique<SequenceDecoder>(model_.tokenizer(), r->sampling, r->stop, r->prompt);
    run.admitted = now;
    running_.push_back(std::move(run));
    ++admitted;
  }
  waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(admitted));

  // 3. One forward step over every running sequence.
  std::vector<SeqInput> batch;
  std::vector<std::vector<int32_t>> positions(running_.size());
  std::vector<int32_t> decode_tokens(running_.size());
  int batch_tokens = 0;
  for (size_t i = 0; i < running_.size(); ++i) {
    Running& run = running_[i];
    const int n_prompt = static_cast<int>(run.request->prompt.size());
    SeqInput in{.seq_id = run.seq_id, .strategy = nullptr};
    if (!run.prefilled) {
      positions[i].resize(n_prompt);
      for (int p = 0; p < n_prompt; ++p) positions[i][p] = p;
      in.tokens = run.request->prompt;
    } else {
      positions[i].assign(1, n_prompt + run.decoder->num_generated() - 1);
      decode_tokens[i] = run.last_token;
      in.tokens = std::span<const int32_t>(&decode_tokens[i], 1);
    }
    in.positions = positions[i];
    batch_tokens += static_cast<int>(in.tokens.size());
    batch.push_back(in);
  }
  if (!batch.empty()) {
    if (absl::Status st = transformer_.Forward(batch, kv_, &out_); !st.ok()) {
      for (Running& run : running_) Finish(run, FinishReason::kError, CancelReason::kNone, std::string(st.message()));
      running_.clear();
    }
  }
  // 4. Sample, stream, finish.
  const int vocab = model_.config().n_vocab;
  const auto after = Clock::now();
  int64_t kv_tokens = 0;
  for (size_t i = 0; i < running_.size(); ++i) {
    Running& run = running_[i];
    if (!run.prefilled) {
      run.prefilled = true;
      run.first_token = after;
      run.rows_computed += static_cast<double>(out_.rows_computed[i]);
    }
    StepOutcome step = run.decoder->Next(std::span<float>(out_.logits.data() + out_.row_offset[i] * vocab, vocab));
    run.last_token = step.sampled.token;
    RequestEvent ev{.kind = RequestEvent::Kind::kTokens};
    ev.tokens.push_back(step.sampled);
    ev.text = std::move(step.text);
    run.request->sink->OnEvent(std::move(ev));
    if (step.finished) {
      Finish(run, step.reason, CancelReason::kNone);
      continue;
    }
    kv_tokens += static_cast<int64_t>(run.request->prompt.size()) + run.decoder->num_generated();
  }
  std::erase_if(running_, [](const Running& r) { return r.request == nullptr; });

  LoadSnapshot snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    load_.running = static_cast<int>(running_.size());
    load_.waiting = static_cast<int>(waiting_.size());
    load_.kv_tokens = kv_tokens;
    snapshot = load_;
    snapshot.waiting += static_cast<int>(incoming_.size());
    snapshot.in_flight = static_cast<int>(active_.size());
  }
  if (observer_ != nullptr) observer_->OnStep(snapshot, batch_tokens);
}

}  // namespace ps
