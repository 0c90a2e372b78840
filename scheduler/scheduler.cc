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

int32_t DeviceBlocks(const SchedulerOptions& o, const ModelConfig& c) {
  if (o.kv_device_blocks > 0) return static_cast<int32_t>(std::min<int64_t>(o.kv_device_blocks, INT32_MAX));
  const int64_t per_seq = static_cast<int64_t>(c.n_layers) * ((c.n_ctx + o.kv_block_tokens - 1) / o.kv_block_tokens);
  return static_cast<int32_t>(std::min<int64_t>(per_seq * o.max_running, INT32_MAX));
}
}  // namespace

int Scheduler::RowsThisStep(const Running& r) const {
  if (!r.prefilled) return static_cast<int>(r.request->prompt.size());
  if (r.evicted) return static_cast<int>(r.decoder->history().size());
  return 1;
}

Scheduler::Scheduler(const Model& model, ThreadPool& pool, const SchedulerOptions& options,
                     SchedulerObserver* observer)
    : model_(model),
      options_(options),
      observer_(observer),
      transformer_(model, pool, options.matmul),
      device_blocks_(Tier::kDevice, DeviceBlocks(options, model.config()),
                     PagedKvStore::BlockBytes(options.kv_block_tokens, model.config().kv_dim())),
      host_blocks_(Tier::kHost, 0, device_blocks_.block_bytes()),
      kv_manager_(device_blocks_, host_blocks_, model.config().n_layers, options.kv_block_tokens),
      kv_(kv_manager_, device_blocks_, model.config().kv_dim()) {
  load_.kv_blocks_total = device_blocks_.num_blocks();
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

  // 2. Admission: highest priority first, then first come; bounded by prompt tokens
  // per step and by free device blocks (after what running sequences need now).
  // Admission stops at the first request that does not fit, so a large request is
  // not overtaken forever by smaller ones behind it.
  auto by_priority = [](const Request& a, const Request& b) {
    return a.priority > b.priority || (a.priority == b.priority && a.arrival < b.arrival);
  };
  std::stable_sort(waiting_.begin(), waiting_.end(), [&](const auto& a, const auto& b) { return by_priority(*a, *b); });
  int64_t reserved = 0;
  for (const Running& run : running_) reserved += kv_manager_.BlocksNeeded(run.seq_id, RowsThisStep(run));
  int batch_prompt_tokens = 0;
  size_t admitted = 0;
  while (admitted < waiting_.size() && static_cast<int>(running_.size()) < options_.max_running) {
    const auto& r = waiting_[admitted];
    const int n = static_cast<int>(r->prompt.size());
    if (batch_prompt_tokens > 0 && batch_prompt_tokens + n > options_.max_batch_tokens) break;
    const int64_t need = kv_manager_.BlocksNeeded(next_seq_id_, n);
    if (!running_.empty() && reserved + need > device_blocks_.num_free()) break;
    reserved += need;
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

  // 3. Which running sequences take part, in priority order: each needs blocks for
  // its rows; when one does not fit, the KV of the lowest-priority, latest-arrived
  // sequences behind it is dropped (they recompute later, in the same order).
  std::vector<size_t> order(running_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return by_priority(*running_[a].request, *running_[b].request);
  });
  int64_t free_blocks = device_blocks_.num_free();
  std::vector<size_t> in_step;
  for (size_t k = 0; k < order.size(); ++k) {
    Running& run = running_[order[k]];
    const int64_t need = kv_manager_.BlocksNeeded(run.seq_id, RowsThisStep(run));
    for (size_t v = order.size(); need > free_blocks && v-- > k + 1;) {
      Running& victim = running_[order[v]];
      const int64_t held = kv_manager_.BlocksIn(victim.seq_id, Tier::kDevice);
      if (held == 0) continue;
      kv_.Release(victim.seq_id);
      victim.evicted = victim.prefilled;
      free_blocks += held;
      ++preemptions_;
    }
    if (need <= free_blocks) {
      free_blocks -= need;
      in_step.push_back(order[k]);
    }
  }
  if (in_step.empty() && !running_.empty()) {  // the first in line cannot fit even alone
    Running& run = running_[order[0]];
    Finish(run, FinishReason::kError, CancelReason::kNone,
           absl::StrCat("the KV cache (", device_blocks_.num_blocks(), " blocks) cannot hold this request"));
  }

  // 4. One forward step over those sequences.
  std::vector<SeqInput> batch;
  std::vector<std::vector<int32_t>> positions(in_step.size());
  std::vector<int32_t> decode_tokens(in_step.size());
  int batch_tokens = 0;
  for (size_t b = 0; b < in_step.size(); ++b) {
    Running& run = running_[in_step[b]];
    const int n_prompt = static_cast<int>(run.request->prompt.size());
    SeqInput in{.seq_id = run.seq_id, .strategy = nullptr};
    if (!run.prefilled || run.evicted) {  // the prompt, or everything so far after an eviction
      in.tokens = run.prefilled ? run.decoder->history() : std::span<const int32_t>(run.request->prompt);
      positions[b].resize(in.tokens.size());
      for (size_t p = 0; p < in.tokens.size(); ++p) positions[b][p] = static_cast<int32_t>(p);
    } else {
      positions[b].assign(1, n_prompt + run.decoder->num_generated() - 1);
      decode_tokens[b] = run.last_token;
      in.tokens = std::span<const int32_t>(&decode_tokens[b], 1);
    }
    in.positions = positions[b];
    batch_tokens += static_cast<int>(in.tokens.size());
    batch.push_back(in);
  }
  if (!batch.empty()) {
    if (absl::Status st = transformer_.Forward(batch, kv_, &out_); !st.ok()) {
      for (size_t i : in_step) Finish(running_[i], FinishReason::kError, CancelReason::kNone, std::string(st.message()));
      in_step.clear();
    }
  }
  // 5. Sample, stream, finish.
  const int vocab = model_.config().n_vocab;
  const auto after = Clock::now();
  for (size_t b = 0; b < in_step.size(); ++b) {
    Running& run = running_[in_step[b]];
    if (!run.prefilled) {
      run.prefilled = true;
      run.first_token = after;
      run.rows_computed += static_cast<double>(out_.rows_computed[b]);
    }
    run.evicted = false;
    StepOutcome step = run.decoder->Next(std::span<float>(out_.logits.data() + out_.row_offset[b] * vocab, vocab));
    run.last_token = step.sampled.token;
    RequestEvent ev{.kind = RequestEvent::Kind::kTokens};
    ev.tokens.push_back(step.sampled);
    ev.text = std::move(step.text);
    run.request->sink->OnEvent(std::move(ev));
    if (step.finished) Finish(run, step.reason, CancelReason::kNone);
  }
  std::erase_if(running_, [](const Running& r) { return r.request == nullptr; });

  LoadSnapshot snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    load_.running = static_cast<int>(running_.size());
    load_.waiting = static_cast<int>(waiting_.size());
    load_.kv_blocks_used = device_blocks_.num_blocks() - device_blocks_.num_free();
    load_.preemptions = preemptions_;
    snapshot = load_;
    snapshot.waiting += static_cast<int>(incoming_.size());
    snapshot.in_flight = static_cast<int>(active_.size());
  }
  if (observer_ != nullptr) observer_->OnStep(snapshot, batch_tokens);
}

}  // namespace ps
