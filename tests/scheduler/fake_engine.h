// A StepExecutor without a model, for the planner's tests: it does the engine's
// bookkeeping on a real KvCacheManager, the KV owner's tables (appends within the
// reservations, swaps, the prefix cache's evictions; the scheduler releases the blocks) and makes up its tokens from
// the prompt and the token's index, so every request's tokens are known in advance whatever the batching, preemption or
// recomputation. A request can be made to take more blocks than the scheduler reserved (a strategy that under-reports
// what it adds).
#pragma once

#include <map>
#include <memory>

#include "engine/step.h"
#include "memory/kv_cache_manager.h"

namespace ps::testing {

// The tokens the fake engine generates for a prompt: one per index, whatever happens.
inline int32_t FakeToken(const std::vector<int32_t>& prompt, int index) {
  return (prompt.front() * 31 + index * 7) % 500;
}

class FakeEngine final : public StepExecutor {
 public:
  explicit FakeEngine(KvCacheManager& kv) : kv_(kv) {}

  // The sequence of `spec` appends `rows` more rows at every layer than planned,
  // in its next `times` runs.
  void AddRogueRows(const GenerationSpec* spec, int rows, int times) { rogue_[spec] = {rows, times}; }
  // Swaps of the sequence of `spec` fail (its KV is lost).
  void FailSwaps(const GenerationSpec* spec) { failing_swaps_[spec] = true; }

  KvPlanner& kv() override { return kv_; }

  StepResult Execute(const StepPlan& plan) override {
    StepResult r;
    for (const StepPlan::Start& s : plan.start) {
      seqs_[s.seq_id] = Seq{.spec = s.spec, .history = s.spec->prompt, .computed = s.cached};
    }
    for (const SwapPlan& p : plan.evict) kv_.Complete(p);
    for (int64_t id : plan.finish) End(id, &r.seqs.emplace_back());
    for (int64_t id : plan.drop) seqs_.at(id).computed = 0;
    for (const StepPlan::SwapOut& s : plan.swap_out) {
      kv_.Complete(s.plan);
      if (failing_swaps_.contains(seqs_.at(s.seq_id).spec)) Lose(s.seq_id, SeqStatus::kKvLost, &r);
    }
    for (int64_t id : plan.swap_in) {
      std::optional<SwapPlan> p = kv_.PlanSwapIn(id);
      if (!p) {
        Lose(id, SeqStatus::kKvShort, &r);
        continue;
      }
      kv_.Complete(*p);
    }
    for (const StepPlan::Run& run : plan.run) {
      auto it = seqs_.find(run.seq_id);
      if (it == seqs_.end()) continue;  // lost above
      Seq& s = it->second;
      if (run.begin != s.computed || run.begin + run.count > static_cast<int32_t>(s.history.size())) {
        r.seqs.push_back({.seq_id = run.seq_id, .status = SeqStatus::kFailed, .error = "bad run", .ended = true});
        continue;
      }
      int extra = 0;
      if (auto rogue = rogue_.find(s.spec); rogue != rogue_.end() && rogue->second.second > 0) {
        extra = rogue->second.first;
        --rogue->second.second;
      }
      std::vector<int32_t> positions(run.count + extra);
      for (size_t i = 0; i < positions.size(); ++i) positions[i] = run.begin + static_cast<int32_t>(i);
      bool ok = true;
      for (int l = 0; l < kv_.n_layers() && ok; ++l) ok = kv_.Append(run.seq_id, l, positions);
      if (!ok) {
        Lose(run.seq_id, SeqStatus::kKvShort, &r);
        continue;
      }
      r.batch_tokens += run.count;
      s.computed += run.count;
      SeqOutcome& o = r.seqs.emplace_back(SeqOutcome{.seq_id = run.seq_id, .computed = s.computed});
      if (!run.sample) continue;
      const int index = static_cast<int>(s.history.size() - s.spec->prompt.size());
      const int32_t token = FakeToken(s.spec->prompt, index);
      s.history.push_back(token);
      StepOutcome step{.sampled = {.token = token}, .text = "t" + std::to_string(token) + " "};
      step.finished = index + 1 >= s.spec->stop.max_new_tokens;
      step.reason = FinishReason::kLength;
      o.token = step;
      if (step.finished) End(run.seq_id, &o);
    }
    return r;
  }

 private:
  struct Seq {
    const GenerationSpec* spec = nullptr;
    std::vector<int32_t> history;
    int32_t computed = 0;
  };
  void End(int64_t id, SeqOutcome* o) {
    const Seq& s = seqs_.at(id);
    o->seq_id = id;
    o->ended = true;
    o->usage.prompt_tokens = static_cast<int>(s.spec->prompt.size());
    o->usage.completion_tokens = static_cast<int>(s.history.size() - s.spec->prompt.size());
    seqs_.erase(id);
  }
  void Lose(int64_t id, SeqStatus status, StepResult* r) {
    seqs_.at(id).computed = 0;
    r->seqs.push_back({.seq_id = id, .status = status, .error = "lost its KV"});
  }

  KvCacheManager& kv_;
  std::map<int64_t, Seq> seqs_;
  std::map<const GenerationSpec*, std::pair<int, int>> rogue_;
  std::map<const GenerationSpec*, bool> failing_swaps_;
};

}  // namespace ps::testing
