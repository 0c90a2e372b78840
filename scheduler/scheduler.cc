#include "scheduler/scheduler.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "spdlog/spdlog.h"

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

std::string_view PreemptionModeName(PreemptionMode m) {
  return m == PreemptionMode::kSwap ? "swap" : "recompute";
}

namespace {
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Prompt rows a sequence may take in one step: strategies that score from the
// last prompt token take the whole prompt at once.
int StepLimit(const PruningStrategy* strategy, int prefill_chunk) {
  return strategy != nullptr && strategy->WholePrompt() ? std::numeric_limits<int>::max() : prefill_chunk;
}

// Runs of ascending prompt indices, with their text.
std::vector<RequestEvent::KeptSpan> Spans(const std::vector<int32_t>& sorted, std::span<const int32_t> prompt,
                                          const Tokenizer* tok) {
  std::vector<RequestEvent::KeptSpan> spans;
  for (int32_t i : sorted) {
    if (!spans.empty() && spans.back().end == i) {
      ++spans.back().end;
    } else {
      spans.push_back({.begin = i, .end = i + 1});
    }
  }
  if (tok != nullptr) {
    for (auto& s : spans) s.text = tok->Decode(prompt.subspan(s.begin, s.end - s.begin));
  }
  return spans;
}

int32_t DeviceBlocks(const SchedulerOptions& o, const ModelConfig& c) {
  if (o.kv_device_blocks > 0) return static_cast<int32_t>(std::min<int64_t>(o.kv_device_blocks, INT32_MAX));
  // Enough for max_running full-context sequences, up to 1 GiB.
  const int64_t per_seq = static_cast<int64_t>(c.n_layers) * ((c.n_ctx + o.kv_block_tokens - 1) / o.kv_block_tokens);
  const int64_t cap = (int64_t{1} << 30) / static_cast<int64_t>(PagedKvStore::BlockBytes(o.kv_block_tokens, c.kv_dim(), o.kv_dtype));
  return static_cast<int32_t>(std::min<int64_t>({per_seq * o.max_running, cap, INT32_MAX}));
}
}  // namespace

Scheduler::Scheduler(const Model& model, ThreadPool& pool, const SchedulerOptions& options,
                     SchedulerObserver* observer)
    : model_(model),
      options_(options),
      observer_(observer),
      transformer_(model, pool, options.matmul),
      device_blocks_(Tier::kDevice, DeviceBlocks(options, model.config()),
                     PagedKvStore::BlockBytes(options.kv_block_tokens, model.config().kv_dim(), options.kv_dtype)),
      host_blocks_(Tier::kHost, static_cast<int32_t>(std::min<int64_t>(options.kv_host_blocks, INT32_MAX)),
                   device_blocks_.block_bytes()),
      kv_manager_(device_blocks_, host_blocks_, model.config().n_layers, options.kv_block_tokens),
      kv_(kv_manager_, device_blocks_, model.config().kv_dim(), options.kv_dtype),
      swap_(device_blocks_, host_blocks_, options.swap_copy) {
  PS_CHECK(options.max_running > 0 && options.max_batch_tokens > 0 && options.prefill_chunk > 0)
      << "scheduler limits must be positive";
  load_.kv[static_cast<int>(Tier::kDevice)].total = device_blocks_.num_blocks();
  load_.kv[static_cast<int>(Tier::kHost)].total = host_blocks_.num_blocks();
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

void Scheduler::FinishWaiting(const std::shared_ptr<Request>& r, CancelReason cancel, FinishReason reason,
                              std::string error) {
  RequestEvent ev{.kind = RequestEvent::Kind::kFinished, .reason = reason, .cancel = cancel, .error = std::move(error)};
  ev.usage.prompt_tokens = static_cast<int>(r->prompt.size());
  ev.usage.queue_seconds = ev.usage.total_seconds = Seconds(r->arrival, Clock::now());
  Forget(r->id);
  outbox_.emplace_back(r->sink, std::move(ev));
}

void Scheduler::Finish(Running& run, FinishReason reason, CancelReason cancel, std::string error) {
  Request& r = *run.request;
  const auto now = Clock::now();
  RequestEvent ev{.kind = RequestEvent::Kind::kFinished, .reason = reason, .cancel = cancel, .error = std::move(error)};
  ev.usage.prompt_tokens = static_cast<int>(r.prompt.size());
  ev.usage.completion_tokens = run.decoder->num_generated();
  ev.usage.prompt_tokens_computed = run.rows_computed / model_.config().n_layers;
  for (size_t l = 0; l < run.layer_rows.size(); ++l) {
    if (l == 0 || run.layer_rows[l] != run.layer_rows[l - 1]) {
      ev.usage.kept_per_layer.emplace_back(static_cast<int>(l), static_cast<int>(run.layer_rows[l]));
    }
  }
  ev.usage.kv_blocks = std::max(run.peak_blocks, BlocksHeld(run));
  if (r.report_pruning) ev.kept_spans = Spans(run.kept_prompt, r.prompt, model_.tokenizer());
  ev.usage.queue_seconds = Seconds(r.arrival, run.admitted);
  ev.usage.ttft_seconds = run.prefilled ? Seconds(r.arrival, run.first_token) : 0.0;
  ev.usage.total_seconds = Seconds(r.arrival, now);
  if (reason == FinishReason::kCancelled || reason == FinishReason::kError) {
    ev.text = run.decoder->Flush();  // text held back (partial characters) is not lost
  }
  kv_.Release(run.seq_id);
  Forget(r.id);
  outbox_.emplace_back(r.sink, std::move(ev));
  run.request.reset();
}

void Scheduler::Loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !incoming_.empty() || !waiting_.empty() || !running_.empty(); });
      if (stopping_ && incoming_.empty() && waiting_.empty() && running_.empty()) return;
      // Still waiting until the step publishes its load: Submit counts them against --max-queue.
      load_.waiting += static_cast<int>(incoming_.size());
      for (auto& r : incoming_) waiting_.push_back(std::move(r));
      incoming_.clear();
    }
    Step();
  }
}

namespace {
bool ByPriority(const Request& a, const Request& b) {
  return a.priority > b.priority || (a.priority == b.priority && a.arrival < b.arrival);
}
}  // namespace

void Scheduler::Admit(Clock::time_point now) {
  // Highest priority first, then first come. A request joins the running set when
  // the device tier can hold its whole prompt next to what the running sequences
  // need this step; admission stops at the first request that does not fit, so a
  // large request is not overtaken forever by smaller ones behind it, and it never
  // passes a preempted request of the same or higher rank (that one resumes first).
  std::stable_sort(waiting_.begin(), waiting_.end(), [](const auto& a, const auto& b) { return ByPriority(*a, *b); });
  const Request* first_preempted = nullptr;
  int64_t reserved = 0;
  for (const Running& run : running_) {
    if (run.preempted) {
      if (first_preempted == nullptr || ByPriority(*run.request, *first_preempted)) first_preempted = run.request.get();
    } else {
      reserved += kv_manager_.BlocksNeeded(run.seq_id, std::min(run.Remaining(), StepLimit(run.strategy.get(), options_.prefill_chunk)));
    }
  }
  size_t taken = 0;
  while (taken < waiting_.size() && static_cast<int>(running_.size()) < options_.max_running) {
    const std::shared_ptr<Request>& r = waiting_[taken];
    if (first_preempted != nullptr && !ByPriority(*r, *first_preempted)) break;
    const int64_t need = kv_manager_.BlocksNeeded(next_seq_id_, static_cast<int>(r->prompt.size()));
    if (need > device_blocks_.num_blocks()) {  // could never run: fail it now rather than block the queue
      FinishWaiting(r, CancelReason::kNone, FinishReason::kError,
                    absl::StrCat("the KV cache (", device_blocks_.num_blocks(), " blocks of ", options_.kv_block_tokens,
                                 " tokens per layer) cannot hold this request's prompt (", need, " blocks)"));
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(taken));
      continue;
    }
    if (!running_.empty() && reserved + need > device_blocks_.num_free()) break;
    reserved += need;
    Running run;
    run.request = r;
    run.seq_id = next_seq_id_++;
    run.decoder = std::make_unique<SequenceDecoder>(model_.tokenizer(), r->sampling, r->stop, r->prompt);
    run.strategy = MakeStrategy(r->pruning, model_.config());
    run.layer_rows.assign(model_.config().n_layers, 0);
    run.admitted = now;
    running_.push_back(std::move(run));
    ++taken;
  }
  waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(taken));
}

std::vector<int> Scheduler::PlanRows(const std::vector<size_t>& order) const {
  std::vector<int> rows(running_.size(), 0);
  int budget = options_.max_batch_tokens;
  for (size_t i : order) {  // decodes first: they keep flowing while long prompts are prefilled
    if (running_[i].Remaining() == 1) {
      rows[i] = 1;
      --budget;
    }
  }
  bool prefill_planned = false;
  for (size_t i : order) {
    const int remaining = running_[i].Remaining();
    if (remaining <= 1 || budget <= 0) continue;
    const PruningStrategy* strategy = running_[i].strategy.get();
    if (strategy != nullptr && strategy->WholePrompt() && remaining > budget) {
      // The prompt cannot be split: it takes a step's prefill share alone, over budget if need be.
      if (prefill_planned) continue;
      rows[i] = remaining;
    } else {
      rows[i] = std::min({remaining, StepLimit(strategy, options_.prefill_chunk), budget});
    }
    budget -= rows[i];
    prefill_planned = true;
  }
  return rows;
}

int64_t Scheduler::BlocksHeld(const Running& run) const {
  return kv_manager_.BlocksIn(run.seq_id, Tier::kDevice) + kv_manager_.BlocksIn(run.seq_id, Tier::kHost);
}

void Scheduler::DropKv(Running& run) {
  run.peak_blocks = std::max(run.peak_blocks, BlocksHeld(run));
  kv_.Release(run.seq_id);
  run.computed = 0;
  run.next_position = 0;
  run.strategy = MakeStrategy(run.request->pruning, model_.config());  // its state described the dropped KV
  if (!run.prefilled) {  // the first pass starts over
    run.rows_computed = 0;
    std::fill(run.layer_rows.begin(), run.layer_rows.end(), 0);
    run.kept_prompt.clear();
  }
}

bool Scheduler::CompleteSwap(PendingSwap& swap, Tier to) {
  Running& run = running_[swap.run];
  const absl::Status st = swap_.Wait(swap.ticket);
  kv_manager_.Release(swap.plan.release_after);  // the source blocks: read by the copy until now
  if (!st.ok()) {
    // The destination holds no valid data: recompute this sequence instead.
    spdlog::warn("request {}: swap to the {} tier failed ({}); its KV will be recomputed", run.request->id,
                std::string(TierName(to)), std::string(st.message()));
    DropKv(run);
    run.preempted = true;
    return false;
  }
  const uint64_t bytes = swap.plan.copies.size() * device_blocks_.block_bytes();
  if (observer_ != nullptr) observer_->OnSwap(to, bytes, Seconds(swap.submitted, Clock::now()));
  return true;
}

void Scheduler::Preempt(const std::vector<size_t>& victims) {
  std::vector<PendingSwap> swaps;
  for (size_t v : victims) {
    Running& run = running_[v];
    run.preempted = true;
    std::optional<SwapPlan> plan;
    if (options_.preemption == PreemptionMode::kSwap) plan = kv_manager_.PlanSwapOut(run.seq_id);
    if (plan.has_value()) {
      swaps.push_back({.ticket = swap_.Submit(plan->copies), .run = v, .plan = std::move(*plan), .submitted = Clock::now()});
    } else {  // recompute mode, or no room in the host tier
      DropKv(run);
    }
    const PreemptionMode mode = plan.has_value() ? PreemptionMode::kSwap : PreemptionMode::kRecompute;
    spdlog::debug("request {} preempted ({}): {} device blocks free", run.request->id,
                 std::string(PreemptionModeName(mode)), device_blocks_.num_free());
    ++preemptions_[static_cast<int>(mode)];
    if (observer_ != nullptr) observer_->OnPreemption(mode);
  }
  for (PendingSwap& s : swaps) CompleteSwap(s, Tier::kHost);
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

  // 2. Admission.
  Admit(now);

  // 3. The plan, in priority order: each sequence with rows this step needs device
  // blocks for them (and for its swapped-out blocks); when they do not fit, the
  // sequences at the back of the order are preempted until they do.
  std::vector<size_t> order(running_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return ByPriority(*running_[a].request, *running_[b].request); });
  std::vector<int> rows = PlanRows(order);
  std::vector<char> victim(running_.size(), 0);
  std::vector<size_t> in_step, victims;
  int64_t free_blocks = device_blocks_.num_free();
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    if (rows[i] == 0 || victim[i]) continue;
    const Running& run = running_[i];
    const int64_t added = run.strategy != nullptr ? run.strategy->MaxAddedRows() : 0;  // revivals
    const int64_t need = kv_manager_.BlocksNeeded(run.seq_id, static_cast<int>(std::min<int64_t>(rows[i] + added, INT32_MAX))) +
                         (run.Swapped() ? kv_manager_.BlocksIn(run.seq_id, Tier::kHost) : 0);
    for (size_t v = order.size(); need > free_blocks && v-- > k + 1;) {
      const size_t j = order[v];
      const int64_t held = kv_manager_.BlocksIn(running_[j].seq_id, Tier::kDevice);
      if (victim[j] || held == 0) continue;
      victim[j] = 1;
      victims.push_back(j);
      free_blocks += held;
    }
    if (need <= free_blocks) {
      free_blocks -= need;
      in_step.push_back(i);
    } else if (k == 0) {  // first in line and alone in the cache: it can never fit
      Finish(running_[i], FinishReason::kError, CancelReason::kNone,
             absl::StrCat("the KV cache (", device_blocks_.num_blocks(), " blocks) cannot hold this request"));
    }
  }
  Preempt(victims);

  // 4. Bring swapped-out participants back, then one forward step over them.
  std::vector<PendingSwap> swap_ins;
  for (size_t i : in_step) {
    Running& run = running_[i];
    if (!run.Swapped()) continue;
    std::optional<SwapPlan> plan = kv_manager_.PlanSwapIn(run.seq_id);
    PS_CHECK(plan.has_value()) << "device blocks were reserved for the swap-in";
    swap_ins.push_back({.ticket = swap_.Submit(plan->copies), .run = i, .plan = std::move(*plan), .submitted = Clock::now()});
  }
  std::vector<char> skip(running_.size(), 0);
  for (PendingSwap& s : swap_ins) skip[s.run] = !CompleteSwap(s, Tier::kDevice);  // failed: recomputes next step
  std::vector<SeqInput> batch;
  std::vector<size_t> batch_runs;
  std::vector<std::vector<int32_t>> positions;
  positions.reserve(in_step.size());
  int batch_tokens = 0;
  for (size_t i : in_step) {
    Running& run = running_[i];
    if (run.request == nullptr || skip[i]) continue;  // finished above, or its swap-in failed
    run.preempted = false;
    const int n = std::min(rows[i], run.Remaining());
    const std::span<const int32_t> history = run.decoder->history();
    positions.emplace_back(n);
    for (int p = 0; p < n; ++p) positions.back()[p] = run.next_position + p;
    batch.push_back(SeqInput{.seq_id = run.seq_id,
                             .tokens = history.subspan(run.computed, n),
                             .positions = positions.back(),
                             .no_logits = run.computed + n < static_cast<int>(history.size()),
                             .strategy = run.strategy.get(),
                             .report_kept = run.request->report_pruning && !run.prefilled});
    batch_runs.push_back(i);
    batch_tokens += n;
  }
  if (!batch.empty()) {
    if (absl::Status st = transformer_.Forward(batch, kv_, &out_); !st.ok()) {
      for (size_t i : batch_runs) Finish(running_[i], FinishReason::kError, CancelReason::kNone, std::string(st.message()));
      batch_runs.clear();
    }
  }

  // 5. Sample where a chunk reached the end of the history; stream; finish.
  const int vocab = model_.config().n_vocab;
  const auto after = Clock::now();
  for (size_t b = 0; b < batch_runs.size(); ++b) {
    Running& run = running_[batch_runs[b]];
    const int n = static_cast<int>(batch[b].tokens.size());
    const int n_layers = model_.config().n_layers;
    if (!run.prefilled) {  // the first pass over the prompt
      run.rows_computed += static_cast<double>(out_.rows_computed[b]);
      for (int l = 0; l < n_layers; ++l) run.layer_rows[l] += out_.layer_rows[b * n_layers + l];
      for (int32_t k : out_.kept_rows[b]) run.kept_prompt.push_back(run.computed + k);
    } else if (n == 1) {  // a decode step: rows beyond the new token's are revived prompt tokens
      run.rows_computed += static_cast<double>(std::max<int64_t>(0, out_.rows_computed[b] - n_layers));
    }
    run.computed += n;
    run.next_position = out_.next_position[b];
    if (batch[b].no_logits) continue;
    if (!run.prefilled) {
      run.prefilled = true;
      run.first_token = after;
    }
    StepOutcome step = run.decoder->Next(std::span<float>(out_.logits.data() + out_.row_offset[b] * vocab, vocab));
    RequestEvent ev{.kind = RequestEvent::Kind::kTokens};
    ev.tokens.push_back(step.sampled);
    ev.text = std::move(step.text);
    outbox_.emplace_back(run.request->sink, std::move(ev));
    if (step.finished) Finish(run, step.reason, CancelReason::kNone);
  }
  std::erase_if(running_, [](const Running& r) { return r.request == nullptr; });
  PublishLoad(batch_tokens);
  // Events go out after the load is published: a client that sees its request
  // finish also sees its blocks free in Load().
  for (auto& [sink, ev] : outbox_) sink->OnEvent(std::move(ev));
  outbox_.clear();
}

void Scheduler::PublishLoad(int batch_tokens) {
  LoadSnapshot snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    load_.running = static_cast<int>(running_.size());
    load_.waiting = static_cast<int>(waiting_.size());
    load_.swapped = 0;
    for (const Running& run : running_) load_.swapped += run.Swapped();
    for (const BlockPool* p : {&device_blocks_, &host_blocks_}) {
      load_.kv[static_cast<int>(p->tier())].used = p->num_blocks() - p->num_free();
    }
    load_.preemptions[0] = preemptions_[0];
    load_.preemptions[1] = preemptions_[1];
    load_.swap_bytes_to_host = swap_.bytes_to_host();
    load_.swap_bytes_to_device = swap_.bytes_to_device();
    snapshot = load_;
    snapshot.waiting += static_cast<int>(incoming_.size());
    snapshot.in_flight = static_cast<int>(active_.size());
  }
  if (observer_ != nullptr) observer_->OnStep(snapshot, batch_tokens);
}

}  // namespace ps
