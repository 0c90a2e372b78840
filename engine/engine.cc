#include "engine/engine.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "spdlog/spdlog.h"

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Runs of ascending prompt indices, with their text.
std::vector<KeptSpan> Spans(const std::vector<int32_t>& sorted, std::span<const int32_t> prompt, const Tokenizer* tok) {
  std::vector<KeptSpan> spans;
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

int64_t DefaultDeviceBlocks(const KvGeometry& g, int n_ctx) {
  // Enough for 64 full-context sequences, up to 1 GiB.
  const int64_t cap = (int64_t{1} << 30) / static_cast<int64_t>(g.block_bytes());
  return std::min<int64_t>({g.BlocksForTokens(n_ctx) * 64, cap, INT32_MAX});
}

}  // namespace

// One sequence's generation state.
struct Engine::Seq {
  Seq(const Model& model, const GenerationSpec& spec)
      : Seq(model, spec, SequenceDecoder(model.tokenizer(), spec.sampling, spec.stop, spec.prompt, spec.show_control),
            spec.pruning.Make(model.config())) {}
  Seq(const Model& model, const GenerationSpec& spec, SequenceDecoder decoder,
      std::unique_ptr<PruningStrategy> strategy)
      : spec(spec),
        decoder(std::move(decoder)),
        strategy(std::move(strategy)),
        layer_rows(model.config().n_layers, 0) {}
  const GenerationSpec& spec;
  SequenceDecoder decoder;                    // its history: prompt + generated tokens
  std::unique_ptr<PruningStrategy> strategy;  // null: full; recreated when the KV is dropped
  int32_t computed = 0;                       // leading history tokens whose KV is cached
  int32_t cached = 0;                         // of them, the prefix cache's when it started (until dropped)
  int32_t next_position = 0;                  // position of history[computed] (strategies may renumber)
  bool prefilled = false;                     // the prompt was computed once and the first token sampled
  double rows_computed = 0;                   // prompt token-layer pairs (Usage::prompt_tokens_computed)
  std::vector<int64_t> layer_rows;            // prompt rows entering each layer, first pass
  std::vector<int32_t> kept_prompt;           // prompt indices that reached the last layer, first pass
  int64_t peak_blocks = 0;                    // KV blocks held at most, both tiers, scratch passes included
  int64_t peak_device_blocks = 0;             // ... in the device tier
};

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const Model& model, Backend& backend, const EngineOptions& o) {
  const ModelConfig& c = model.config();
  KvCacheOptions kv{.geometry = {.n_layers = c.n_layers,
                                 .block_tokens = o.kv_block_tokens,
                                 .kv_dim = c.kv_dim(),
                                 .n_kv_heads = c.n_kv_heads,
                                 .dtype = o.kv_dtype},
                    .host_blocks = o.kv_host_blocks,
                    .host_row_bytes = static_cast<size_t>(c.n_embd) * sizeof(float),
                    .metered = true,
                    .prefix_cache = o.prefix_cache,
                    .copy = o.swap_copy};
  PS_RETURN_IF_ERROR(kv.geometry.Validate());
  kv.device_blocks = o.kv_device_blocks > 0 ? o.kv_device_blocks : DefaultDeviceBlocks(kv.geometry, c.n_ctx);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, KvCache::Create(kv, backend));
  return std::unique_ptr<Engine>(new Engine(model, backend, std::move(cache)));
}

Engine::Engine(const Model& model, Backend& backend, std::unique_ptr<KvCache> kv)
    : model_(model), kv_(std::move(kv)), transformer_(model, backend) {}

Engine::~Engine() = default;

Engine::Seq& Engine::Find(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  PS_CHECK(it != seqs_.end()) << "the plan names sequence " << seq_id << ", which the engine does not hold";
  return *it->second;
}

void Engine::DropKv(Seq& s) {
  s.computed = s.cached = 0;
  s.next_position = 0;
  s.strategy = s.spec.pruning.Make(model_.config());  // its state described the dropped KV
  if (!s.prefilled) {                                 // the first pass starts over
    s.rows_computed = 0;
    std::fill(s.layer_rows.begin(), s.layer_rows.end(), 0);
    s.kept_prompt.clear();
  }
}

void Engine::End(int64_t seq_id, SeqStatus status, std::string error, SeqOutcome* out) {
  Seq& s = Find(seq_id);
  const int n_layers = model_.config().n_layers;
  out->seq_id = seq_id;
  out->status = status;
  out->error = std::move(error);
  out->computed = s.computed;
  out->ended = true;
  Usage& u = out->usage;
  u.prompt_tokens = static_cast<int>(s.spec.prompt.size());
  u.strategy = s.strategy != nullptr ? std::string(s.strategy->name()) : "full";
  u.completion_tokens = s.decoder.num_generated();
  u.prompt_tokens_computed = s.rows_computed / n_layers;
  for (int l = 0; l < n_layers; ++l) {
    if (l == 0 || s.layer_rows[l] != s.layer_rows[l - 1]) {
      u.kept_per_layer.emplace_back(l, static_cast<int>(s.layer_rows[l]));
    }
  }
  const KvCacheManager::Peak peak = kv_->manager().PeakBlocks(seq_id);
  u.kv_blocks = std::max(s.peak_blocks, peak.total);
  u.kv_device_blocks = std::max(s.peak_device_blocks, peak.device);
  if (s.spec.report_pruning) out->kept_spans = Spans(s.kept_prompt, s.spec.prompt, model_.tokenizer());
  if (!out->token || !out->token->finished) out->held_text = s.decoder.Flush();  // not lost on a cancel or error
  seqs_.erase(seq_id);
}

StepResult Engine::Execute(const StepPlan& plan) {
  StepResult r;
  r.seqs.reserve(plan.finish.size() + plan.run.size() + plan.swap_out.size() + plan.swap_in.size());
  for (const StepPlan::Start& s : plan.start) {
    PS_CHECK(s.spec != nullptr && !seqs_.contains(s.seq_id)) << "bad start of sequence " << s.seq_id;
    Seq& seq = *(seqs_[s.seq_id] = std::make_unique<Seq>(model_, *s.spec));
    seq.computed = seq.next_position = seq.cached = s.cached;
    for (int32_t i = 0; i < s.cached; ++i) seq.kept_prompt.push_back(i);  // full's KV, at every layer
  }
  for (int64_t id : plan.finish) End(id, SeqStatus::kOk, "", &r.seqs.emplace_back());  // may have started above
  for (int64_t id : plan.drop) DropKv(Find(id));
  std::set<int64_t> lost;
  Swap(plan, &r, &lost);
  Run(plan, &r, lost);
  r.swap_bytes_to_host = kv_->swap().bytes_to_host();
  r.swap_bytes_to_device = kv_->swap().bytes_to_device();
  r.move_wait_seconds = kv_->move_wait_seconds();
  return r;
}

void Engine::Swap(const StepPlan& plan, StepResult* r, std::set<int64_t>* lost) {
  const uint64_t block_bytes = kv_->geometry().block_bytes();
  auto lose = [&](int64_t id, SeqStatus status, const std::string& error) {
    DropKv(Find(id));
    lost->insert(id);
    r->seqs.push_back({.seq_id = id, .status = status, .error = error});
  };
  // The prefix cache's evictions and the swap-outs first, all of them: their device
  // blocks are reused from here on.
  for (const SwapPlan& p : plan.evict) {
    const absl::Status st = kv_->Finish(kv_->Submit(p), p);
    if (!st.ok()) {
      kv_->manager().ForgetEvicted(p);
      spdlog::warn("moving {} cached KV blocks to the host tier failed ({}): those prefixes are dropped",
                   p.copies.size(), std::string(st.message()));
    }
  }
  struct InFlight {
    int64_t seq_id;
    SwapPlan plan;
    SwapTicket ticket;
    Clock::time_point submitted;
  };
  auto finish = [&](std::vector<InFlight>& flights, Tier to) {
    for (InFlight& f : flights) {
      const absl::Status st = kv_->Finish(f.ticket, f.plan);
      if (st.ok()) {
        r->swaps.push_back(
            {.to = to, .bytes = f.plan.copies.size() * block_bytes, .seconds = Seconds(f.submitted, Clock::now())});
      } else {
        // The destination holds no valid data: recompute this sequence instead.
        lose(f.seq_id, SeqStatus::kKvLost,
             absl::StrCat("swap to the ", std::string(TierName(to)), " tier failed: ", st.message()));
      }
    }
  };
  std::vector<InFlight> outs;
  for (const StepPlan::SwapOut& s : plan.swap_out) {
    outs.push_back({.seq_id = s.seq_id, .plan = s.plan, .ticket = kv_->Submit(s.plan), .submitted = Clock::now()});
  }
  finish(outs, Tier::kHost);
  std::vector<InFlight> ins;
  for (int64_t id : plan.swap_in) {
    if (const Seq& s = Find(id); s.cached > 0 && s.computed == s.cached) {
      // Started from a cached prefix found partly in the host tier, nothing computed
      // since: its pages come back layer by layer, each layer's copies awaited by the
      // first attention that reads them (KvCache::View), so they overlap the prefill
      // of the rest. They are whole pages: the step's rows go to pages of their own.
      if (const absl::Status st = MoveInByLayer(id); !st.ok()) {
        kv_->WaitMoves(id, -1).IgnoreError();  // the moves queued before the error
        lose(id, st.code() == absl::StatusCode::kResourceExhausted ? SeqStatus::kKvShort : SeqStatus::kKvLost,
             std::string(st.message()));
      }
      continue;
    }
    std::optional<SwapPlan> p = kv_->manager().PlanSwapIn(id);
    if (!p) {
      lose(id, SeqStatus::kKvShort, "no device blocks reserved to swap its KV back in");
      continue;
    }
    const SwapTicket ticket = kv_->Submit(*p);
    ins.push_back({.seq_id = id, .plan = std::move(*p), .ticket = ticket, .submitted = Clock::now()});
  }
  finish(ins, Tier::kDevice);
}

absl::Status Engine::MoveInByLayer(int64_t seq_id) {
  const KvCacheManager& m = kv_->manager();
  std::vector<int32_t> pages;
  for (int layer = 0; layer < m.n_layers(); ++layer) {
    const LayerTable& t = m.Table(seq_id, layer);
    PS_CHECK(static_cast<int64_t>(t.positions.size()) == t.pages() * m.block_tokens())
        << "sequence " << seq_id << " layer " << layer << ": a cached prefix of whole pages was expected";
    pages.clear();
    for (int32_t p = 0; p < t.pages(); ++p) {
      if (t.tiers[p] == Tier::kHost) pages.push_back(p);
    }
    if (!pages.empty()) PS_RETURN_IF_ERROR(kv_->Move(seq_id, layer, pages, Tier::kDevice));
  }
  return absl::OkStatus();
}

Engine::Seq& Engine::Fork(Seq& parent, int64_t parent_id, int64_t child, int k) {
  PS_CHECK(!parent.prefilled && !seqs_.contains(child)) << "bad fork of sequence " << parent_id << " into " << child;
  std::unique_ptr<PruningStrategy> strategy = parent.strategy != nullptr ? parent.strategy->Fork() : nullptr;
  const bool shares = parent.strategy == nullptr || strategy != nullptr;
  if (!shares) strategy = parent.spec.pruning.Make(model_.config());  // computes its prompt again
  Seq& c = *(seqs_[child] = std::make_unique<Seq>(model_, parent.spec, parent.decoder.Fork(k), std::move(strategy)));
  if (!shares) return c;
  kv_->Fork(parent_id, child);
  c.computed = parent.computed;
  c.next_position = parent.next_position;
  c.prefilled = true;  // its first pass is the parent's (the request's usage counts it once)
  return c;
}

void Engine::Run(const StepPlan& plan, StepResult* r, const std::set<int64_t>& lost) {
  std::vector<SeqInput> batch;
  std::vector<std::vector<int32_t>> positions;
  std::vector<int64_t> ids;
  std::vector<const std::vector<int64_t>*> forks;
  positions.reserve(plan.run.size());
  for (const StepPlan::Run& run : plan.run) {
    if (lost.contains(run.seq_id)) continue;
    Seq& s = Find(run.seq_id);
    const std::span<const int32_t> history = s.decoder.history();
    PS_CHECK(run.begin == s.computed && run.count > 0 && run.begin + run.count <= static_cast<int32_t>(history.size()))
        << "sequence " << run.seq_id << ": plan runs [" << run.begin << ", +" << run.count << ") of " << history.size()
        << " history tokens with " << s.computed << " cached";
    std::vector<int32_t>& pos = positions.emplace_back(run.count);
    for (int32_t p = 0; p < run.count; ++p) pos[p] = s.next_position + p;
    batch.push_back(SeqInput{.seq_id = run.seq_id,
                             .tokens = history.subspan(run.begin, run.count),
                             .positions = pos,
                             .no_logits = !run.sample,
                             .strategy = s.strategy.get(),
                             .report_kept = s.spec.report_pruning && !s.prefilled});
    ids.push_back(run.seq_id);
    forks.push_back(&run.forks);
    r->batch_tokens += run.count;
  }
  if (batch.empty()) return;
  const absl::Status step = transformer_.Forward(batch, *kv_, &out_);
  const int vocab = model_.config().n_vocab, n_layers = model_.config().n_layers;
  for (size_t b = 0; b < batch.size(); ++b) {
    const int64_t id = ids[b];
    Seq& s = Find(id);
    SeqOutcome& o = r->seqs.emplace_back(SeqOutcome{.seq_id = id});
    // Moves its strategy left in flight end with the step.
    const absl::Status moved = kv_->WaitMoves(id, -1);
    const absl::Status st = !step.ok() ? step : !out_.status[b].ok() ? out_.status[b] : moved;
    if (!st.ok()) {
      if (st.code() == absl::StatusCode::kResourceExhausted || st.code() == absl::StatusCode::kDataLoss) {
        // A short reservation, or a failed copy of its blocks (KvCache::Finish): recompute it.
        DropKv(s);
        o.status = st.code() == absl::StatusCode::kDataLoss ? SeqStatus::kKvLost : SeqStatus::kKvShort;
        o.error = std::string(st.message());
      } else {
        End(id, SeqStatus::kFailed, std::string(st.message()), &o);
      }
      continue;
    }
    const int n = static_cast<int>(batch[b].tokens.size());
    if (!s.prefilled) {  // the first pass over the prompt
      s.rows_computed += static_cast<double>(out_.rows_computed[b]);
      for (int l = 0; l < n_layers; ++l) s.layer_rows[l] += out_.layer_rows[b * n_layers + l];
      for (int32_t k : out_.kept_rows[b]) s.kept_prompt.push_back(s.computed + k);
    } else if (n == 1) {  // a decode step: rows beyond the new token's are revived prompt tokens
      s.rows_computed += static_cast<double>(std::max<int64_t>(0, out_.rows_computed[b] - n_layers));
    }
    s.computed += n;
    s.next_position = out_.next_position[b];
    const KvCacheManager::Peak peak = kv_->manager().PeakBlocks(id);  // forgotten if the sequence is dropped
    s.peak_blocks = std::max(s.peak_blocks, peak.total);
    s.peak_device_blocks = std::max(s.peak_device_blocks, peak.device);
    o.computed = s.computed;
    o.added_rows = s.strategy != nullptr ? s.strategy->MaxAddedRows() : 0;
    if (batch[b].no_logits) continue;
    const std::span<float> logits(out_.logits.data() + out_.row_offset[b] * vocab, vocab);
    // Forks (n > 1) before the parent samples: each samples its own first token from the
    // same logits (which sampling overwrites).
    std::vector<Seq*> children;
    if (!forks[b]->empty()) fork_logits_.assign(logits.begin(), logits.end());
    for (size_t k = 0; k < forks[b]->size(); ++k) {
      children.push_back(&Fork(s, id, (*forks[b])[k], static_cast<int>(k) + 1));
    }
    s.prefilled = true;
    o.token = s.decoder.Next(logits);
    if (o.token->finished) End(id, SeqStatus::kOk, "", &o);
    for (size_t k = 0; k < children.size(); ++k) {
      Seq& c = *children[k];
      const int64_t child = (*forks[b])[k];
      SeqOutcome co{.seq_id = child, .computed = c.computed};
      co.added_rows = c.strategy != nullptr ? c.strategy->MaxAddedRows() : 0;
      std::copy(fork_logits_.begin(), fork_logits_.end(), logits.begin());
      co.token = c.decoder.Next(logits);
      if (co.token->finished) End(child, SeqStatus::kOk, "", &co);
      r->seqs.push_back(std::move(co));
    }
  }
}

}  // namespace ps
