#include "scheduler/scheduler.h"

#include <algorithm>
#include <limits>
#include <span>

#include "absl/strings/str_cat.h"
#include "base/fault.h"
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
    case CancelReason::kSlowClient: return "slow_client";
  }
  return "unknown";
}

std::string_view PreemptionModeName(PreemptionMode m) { return m == PreemptionMode::kSwap ? "swap" : "recompute"; }

namespace {

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

bool ByPriority(const Request& a, const Request& b) {
  return a.priority > b.priority || (a.priority == b.priority && a.arrival < b.arrival);
}

CancelReason CheckCancel(const Request& r, Clock::time_point now) {
  if (CancelReason c = r.cancel_reason(); c != CancelReason::kNone) return c;
  if (r.deadline && now >= *r.deadline) return CancelReason::kDeadline;
  return CancelReason::kNone;
}

// Prompt rows a sequence may take in one step: strategies that score from the
// last prompt token take the whole prompt at once.
int StepLimit(const Request& r, int prefill_chunk) {
  return r.spec.pruning.WholePrompt() ? std::numeric_limits<int>::max() : prefill_chunk;
}

// The prefix cache's `extra` for a request (KvPlanner::AttachPrefix): the strategy's
// key and the salt, apart.
std::optional<std::string> PrefixExtra(const KvPlanner& kv, const Request& r) {
  std::optional<std::string> key = r.spec.pruning.PrefixCacheKey();
  if (!kv.prefix_cache() || !key) return std::nullopt;
  return absl::StrCat(key->size(), ":", *key, r.spec.cache_salt);
}

}  // namespace

Scheduler::Scheduler(const SchedulerOptions& options, KvPlanner& kv, SchedulerObserver* observer)
    : options_(options),
      kv_(kv),
      observer_(observer),
      device_blocks_(kv.TotalBlocks(Tier::kDevice)),
      n_layers_(kv.n_layers()),
      block_tokens_(kv.block_tokens()),
      blocks_per_page_(kv.blocks_per_page()) {
  PS_CHECK(options.max_running > 0 && options.max_batch_tokens > 0 && options.prefill_chunk > 0 &&
           options.max_queue > 0)
      << "scheduler limits must be positive";
  PS_CHECK(kv.metered()) << "the scheduler reserves blocks: the KV cache must be metered";
}

absl::Status Scheduler::CheckFits(const Request& r) const {
  if (r.spec.n < 1 || r.spec.n > options_.max_running) {
    return absl::InvalidArgumentError(
        absl::StrCat("n: must be in [1, ", options_.max_running, "] (the server's running sequences at most)"));
  }
  const int64_t tokens = static_cast<int64_t>(r.spec.prompt.size());
  const int64_t pages = (tokens + block_tokens_ - 1) / block_tokens_;  // per layer
  const int64_t need = pages * n_layers_ * blocks_per_page_;
  if (need <= device_blocks_) return absl::OkStatus();
  const int64_t room = device_blocks_ / (n_layers_ * blocks_per_page_);
  return absl::ResourceExhaustedError(
      absl::StrCat("the KV cache cannot hold this request's prompt: ", tokens, " tokens need ", need, " blocks (",
                   pages, " pages of ", block_tokens_, " tokens per layer x ", n_layers_, " layers x ",
                   blocks_per_page_, " blocks per page), but the device tier has ", device_blocks_, " blocks in all (",
                   room, " pages per layer: ", room * block_tokens_, " tokens)"));
}

void Scheduler::Add(std::shared_ptr<Request> request) { waiting_.push_back(std::move(request)); }

int Scheduler::swapped() const {
  int n = 0;
  for (const Running& run : running_) n += run.Swapped();
  return n;
}

std::vector<Outgoing> Scheduler::TakeEvents() {
  std::vector<Outgoing> out;
  out.swap(events_);
  return out;
}

void Scheduler::FinishWaiting(const std::shared_ptr<Request>& r, CancelReason cancel, Clock::time_point now) {
  RequestEvent ev{.kind = RequestEvent::Kind::kFinished, .reason = FinishReason::kCancelled, .cancel = cancel};
  ev.usage.prompt_tokens = static_cast<int>(r->spec.prompt.size());
  ev.usage.queue_seconds = ev.usage.total_seconds = Seconds(r->arrival, now);
  Emit(r, std::move(ev));
}

RequestEvent Scheduler::Finished(const Running& run, const SeqOutcome& o, FinishReason reason, CancelReason cancel,
                                 std::string error, Clock::time_point now) const {
  const Request& r = *run.request;
  RequestEvent ev{.kind = RequestEvent::Kind::kFinished,
                  .text = o.held_text,
                  .reason = reason,
                  .cancel = cancel,
                  .error = std::move(error),
                  .usage = o.usage,
                  .kept_spans = o.kept_spans};
  if (o.token) ev.matched_stop = o.token->matched_stop;
  ev.usage.cached_tokens = run.cached;
  ev.usage.queue_seconds = Seconds(r.arrival, run.admitted);
  ev.usage.ttft_seconds = run.prefilled ? Seconds(r.arrival, run.first_token) : 0.0;
  ev.usage.total_seconds = Seconds(r.arrival, now);
  return ev;
}

void Scheduler::EmitFinished(const Running& run, RequestEvent ev) {
  ev.index = run.index;
  auto it = choices_.find(run.request.get());
  if (it != choices_.end()) {
    Choices& c = it->second;
    // The first choice ending before its prompt step (cancelled, failed) takes the
    // forks never made with it.
    c.left -= run.index == 0 && !run.prefilled ? run.request->spec.n : 1;
    Usage& total = c.usage;
    const Usage& u = ev.usage;
    total.prompt_tokens = u.prompt_tokens;
    total.completion_tokens += u.completion_tokens;
    total.prompt_tokens_computed += u.prompt_tokens_computed;  // forks that computed the prompt again add theirs
    total.cached_tokens = std::max(total.cached_tokens, u.cached_tokens);
    total.kv_blocks = std::max(total.kv_blocks, u.kv_blocks);  // the largest choice's (forks share the prompt's)
    total.kv_device_blocks = std::max(total.kv_device_blocks, u.kv_device_blocks);
    total.queue_seconds = u.queue_seconds;
    total.ttft_seconds = std::max(total.ttft_seconds, u.ttft_seconds);
    total.total_seconds = std::max(total.total_seconds, u.total_seconds);
    if (run.index == 0) {  // the first pass is the first choice's
      total.kept_per_layer = u.kept_per_layer;
      total.strategy = u.strategy;
    }
    ev.usage = total;
    ev.last = c.left <= 0;
    if (ev.last) choices_.erase(it);
  }
  Emit(run.request, std::move(ev));
}

void Scheduler::EndRunning(size_t i, FinishReason reason, CancelReason cancel, std::string error, StepPlan* plan) {
  Running& run = running_[i];
  kv_.Release(run.seq_id);
  plan->finish.push_back(run.seq_id);
  ending_[run.seq_id] = Ending{.run = std::move(run), .reason = reason, .cancel = cancel, .error = std::move(error)};
  running_[i].request.reset();  // erased by the caller
}

void Scheduler::Admit(Clock::time_point now, StepPlan* plan) {
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
      reserved +=
          kv_.BlocksNeeded(run.seq_id, std::min(run.Remaining(), StepLimit(*run.request, options_.prefill_chunk)));
    }
  }
  size_t taken = 0;
  while (taken < waiting_.size()) {
    const std::shared_ptr<Request>& r = waiting_[taken];
    // Room in the running set for every choice (the forks join it after the prompt step).
    if (static_cast<int>(running_.size()) + r->spec.n > options_.max_running) break;
    if (first_preempted != nullptr && !ByPriority(*r, *first_preempted)) break;
    const int64_t need = kv_.BlocksNeeded(next_seq_id_, static_cast<int64_t>(r->spec.prompt.size()));
    if (!running_.empty() && reserved + need > kv_.Available(Tier::kDevice) + kv_.Evictable(Tier::kDevice)) break;
    reserved += need;
    Running run{.request = r,
                .seq_id = next_seq_id_++,
                .history = static_cast<int>(r->spec.prompt.size()),
                .prefix_extra = PrefixExtra(kv_, *r),
                .admitted = now};
    if (run.prefix_extra) {  // starts from the longest cached prefix of its prompt
      const PrefixHit hit = kv_.AttachPrefix(run.seq_id, r->spec.prompt, *run.prefix_extra);
      run.computed = run.cached = static_cast<int>(hit.tokens);
      run.preempted = hit.host_tokens > 0;  // brought in like a swapped sequence
    }
    plan->start.push_back({.seq_id = run.seq_id, .spec = &r->spec, .cached = run.cached});
    if (r->spec.n > 1) choices_[r.get()].left = r->spec.n;
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
    int remaining = running_[i].Remaining();
    if (remaining <= 1 || budget <= 0) continue;
    const Request& r = *running_[i].request;
    // A whole-prompt strategy recomputing after a preemption replays its prompt step
    // alone, then the generated tokens: the fresh strategy scores what it scored the
    // first time, so prompt-scoring selections and their tokens stay the same.
    const int prompt_left = static_cast<int>(r.spec.prompt.size()) - running_[i].computed;
    if (r.spec.pruning.WholePrompt() && prompt_left > 0) remaining = prompt_left;
    if (r.spec.pruning.WholePrompt() && remaining > budget) {
      // The prompt cannot be split: it takes a step's prefill share alone, over budget if need be.
      if (prefill_planned) continue;
      rows[i] = remaining;
    } else {
      rows[i] = std::min({remaining, StepLimit(r, options_.prefill_chunk), budget});
    }
    budget -= rows[i];
    prefill_planned = true;
  }
  return rows;
}

void Scheduler::Preempt(size_t i, StepPlan* plan) {
  Running& run = running_[i];
  run.preempted = true;
  const int64_t held = kv_.BlocksIn(run.seq_id, Tier::kDevice);
  std::optional<SwapPlan> swap;
  if (options_.preemption == PreemptionMode::kSwap && kv_.Available(Tier::kHost) >= held &&
      !fault::Hit(fault::Point::kHostTierFull)) {
    swap = kv_.PlanSwapOut(run.seq_id);
  }
  if (swap) {
    plan->swap_out.push_back({.seq_id = run.seq_id, .plan = std::move(*swap)});
  } else {  // recompute mode, or no room in the host tier
    Recompute(run);
    plan->drop.push_back(run.seq_id);
  }
  const PreemptionMode mode = swap ? PreemptionMode::kSwap : PreemptionMode::kRecompute;
  spdlog::debug("request {} preempted ({}): {} device blocks available", run.request->id,
                std::string(PreemptionModeName(mode)), kv_.Available(Tier::kDevice));
  ++preemptions_[static_cast<int>(mode)];
  if (observer_ != nullptr) observer_->OnPreemption(mode);
}

void Scheduler::Recompute(Running& run) {
  kv_.Release(run.seq_id);
  run.computed = run.cached = 0;
}

StepPlan Scheduler::Schedule(Clock::time_point now) {
  StepPlan plan;
  // 1. Cancellations and deadlines, waiting and running; sequences failed by Update.
  std::erase_if(waiting_, [&](const std::shared_ptr<Request>& r) {
    const CancelReason c = CheckCancel(*r, now);
    if (c == CancelReason::kNone) return false;
    FinishWaiting(r, c, now);
    return true;
  });
  for (size_t i = 0; i < running_.size(); ++i) {
    if (!running_[i].failure.empty()) {
      std::string error = std::move(running_[i].failure);
      EndRunning(i, FinishReason::kError, CancelReason::kNone, std::move(error), &plan);
    } else if (const CancelReason c = CheckCancel(*running_[i].request, now); c != CancelReason::kNone) {
      EndRunning(i, FinishReason::kCancelled, c, "", &plan);
    }
  }
  std::erase_if(running_, [](const Running& r) { return r.request == nullptr; });

  // 2. Admission.
  Admit(now, &plan);

  // 3. The plan, in priority order: each sequence with rows this step needs device
  // blocks for them (and for its swapped-out blocks); when they do not fit, the
  // sequences at the back of the order are preempted until they do.
  std::vector<size_t> order(running_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return ByPriority(*running_[a].request, *running_[b].request); });
  const std::vector<int> rows = PlanRows(order);
  std::vector<char> victim(running_.size(), 0);
  std::vector<size_t> victims;
  std::vector<std::pair<size_t, int64_t>> in_step;  // (index, blocks to reserve)
  // Cached prefixes no sequence holds give way to running sequences.
  int64_t free_blocks = kv_.Available(Tier::kDevice) + kv_.Evictable(Tier::kDevice);
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    if (rows[i] == 0 || victim[i]) continue;
    const Running& run = running_[i];
    const int64_t need = kv_.BlocksNeeded(run.seq_id, rows[i] + run.added_rows) + run.margin +
                         (run.Swapped() ? kv_.BlocksIn(run.seq_id, Tier::kHost) : 0);
    for (size_t v = order.size(); need > free_blocks && v-- > k + 1;) {
      const size_t j = order[v];
      const int64_t own = kv_.OwnBlocks(running_[j].seq_id, Tier::kDevice);  // blocks others share stay
      if (victim[j] || own == 0) continue;
      victim[j] = 1;
      victims.push_back(j);
      free_blocks += own;
    }
    if (need <= free_blocks) {
      free_blocks -= need;
      in_step.emplace_back(i, need);
    } else if (k == 0) {  // first in line and alone in the cache: it can never fit
      EndRunning(i, FinishReason::kError, CancelReason::kNone,
                 absl::StrCat("the KV cache (", device_blocks_, " blocks, pages of ", block_tokens_,
                              " tokens) cannot hold this request (", need, " blocks)"),
                 &plan);
    }
  }
  for (size_t v : victims) Preempt(v, &plan);

  // 4. Reservations and rows: cached prefixes evicted as far as the step needs
  // their blocks, swapped-out participants come back first.
  int64_t step_need = 0;
  for (const auto& [i, need] : in_step) step_need += need;
  if (const int64_t short_by = step_need - kv_.Available(Tier::kDevice); short_by > 0) {
    SwapPlan evict = kv_.PlanEvict(short_by);  // pages dropped outright need no copy
    if (!evict.copies.empty()) plan.evict.push_back(std::move(evict));
  }
  for (const auto& [i, need] : in_step) {
    Running& run = running_[i];
    PS_CHECK(kv_.Reserve(run.seq_id, need))
        << "the plan reserves " << need << " blocks with " << kv_.Available(Tier::kDevice) << " available";
    if (run.Swapped()) plan.swap_in.push_back(run.seq_id);
    run.preempted = false;
    const int count = std::min(rows[i], run.Remaining());
    StepPlan::Run& planned = plan.run.emplace_back(StepPlan::Run{
        .seq_id = run.seq_id, .begin = run.computed, .count = count, .sample = run.computed + count == run.history});
    if (planned.sample && !run.prefilled) {  // the first token: the other choices fork here
      for (int k = 1; k < run.request->spec.n; ++k) {
        Running fork{.request = run.request,
                     .seq_id = next_seq_id_++,
                     .index = k,
                     .history = run.history,
                     .prefilled = true,
                     .admitted = run.admitted};
        planned.forks.push_back(fork.seq_id);
        forks_[fork.seq_id] = std::move(fork);
      }
    }
  }
  std::erase_if(running_, [](const Running& r) { return r.request == nullptr; });
  return plan;
}

void Scheduler::Update(const StepResult& result, Clock::time_point now) {
  kv_.EndStep();
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < running_.size(); ++i) index[running_[i].seq_id] = i;
  for (const SeqOutcome& o : result.seqs) {
    if (auto e = ending_.find(o.seq_id); e != ending_.end()) {  // ended by the plan
      Ending& end = e->second;
      EmitFinished(end.run, Finished(end.run, o, end.reason, end.cancel, std::move(end.error), now));
      ending_.erase(e);
      continue;
    }
    if (auto f = forks_.find(o.seq_id); f != forks_.end()) {  // a fork the engine made: it runs from here
      f->second.first_token = now;
      index[o.seq_id] = running_.size();
      running_.push_back(std::move(f->second));
      forks_.erase(f);
    }
    auto it = index.find(o.seq_id);
    PS_CHECK(it != index.end()) << "the engine reports sequence " << o.seq_id << ", which is not running";
    Running& run = running_[it->second];
    switch (o.status) {
      case SeqStatus::kOk:
        run.computed = o.computed;
        run.added_rows = o.added_rows;
        if (run.prefix_extra && !run.prefilled) {  // the prompt's whole pages as they are computed
          const std::span<const int32_t> prompt = run.request->spec.prompt;
          kv_.CachePrefix(run.seq_id, prompt.first(std::min<size_t>(run.computed, prompt.size())), *run.prefix_extra);
        }
        break;
      case SeqStatus::kKvLost:  // a failed swap: its KV is released and recomputed
        Recompute(run);
        spdlog::warn("request {}: {}; its KV will be recomputed", run.request->id, o.error);
        run.preempted = true;
        break;
      case SeqStatus::kKvShort:  // more blocks than reserved: recomputed with a margin, or failed alone
        Recompute(run);
        run.preempted = true;
        run.margin += n_layers_ * blocks_per_page_;  // a page per layer
        ++preemptions_[static_cast<int>(PreemptionMode::kRecompute)];
        if (observer_ != nullptr) observer_->OnPreemption(PreemptionMode::kRecompute);
        if (++run.shortfalls > kMaxShortfalls) {
          run.failure =
              absl::StrCat("the request needed more KV blocks than reserved ", run.shortfalls, " times: ", o.error);
        }
        spdlog::warn("request {}: {}; preempted for recomputation ({} blocks of margin)", run.request->id, o.error,
                     run.margin);
        break;
      case SeqStatus::kFailed: break;
    }
    if (o.token) {
      ++run.history;
      if (!run.prefilled) {
        run.prefilled = true;
        run.first_token = now;
      }
      RequestEvent ev{.kind = RequestEvent::Kind::kTokens, .index = run.index, .text = o.token->text};
      ev.tokens.push_back(o.token->sampled);
      Emit(run.request, std::move(ev));
    }
    if (o.ended) {
      const FinishReason reason = o.status == SeqStatus::kOk && o.token ? o.token->reason : FinishReason::kError;
      EmitFinished(run, Finished(run, o, reason, CancelReason::kNone, o.error, now));
      kv_.Release(run.seq_id);
      run.request.reset();
    }
  }
  forks_.clear();  // planned, but the engine made none (the first choice's step failed): planned again
  std::erase_if(running_, [](const Running& r) { return r.request == nullptr; });
}

}  // namespace ps
