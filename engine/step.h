// One engine step as data: what the scheduler asks for (StepPlan) and what the
// engine reports back (StepResult). The scheduler plans with token and block
// counts only; the engine owns the sequences' tokens, strategies and samplers.
// vLLM v1's SchedulerOutput / ModelRunnerOutput are the model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/pruning/registry.h"
#include "engine/sequence.h"
#include "memory/kv_planner.h"

namespace ps {

// What a sequence generates: its prompt, sampling, stop rules and strategy.
struct GenerationSpec {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  StopCriteria stop;
  PruningParams pruning;        // validated
  bool report_pruning = false;  // return the kept prompt spans when it ends
  // Keeps prompt prefixes of other tenants apart in the prefix cache (the
  // authenticated principal and the request's own salt); "" shares with every
  // request that gives none.
  std::string cache_salt;
  // The text shows control tokens (a Mistral tool call's [TOOL_CALLS] and [ARGS]).
  bool show_control = false;
  // Choices: the prompt is computed once, then n - 1 forks of the first choice share
  // its KV, each sampling its own tokens (seed stream k for choice k).
  int n = 1;
};

// A request's accounting, filled by the engine (tokens, blocks) and the scheduler (times).
struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens whose KV came from the prefix cache (not computed)
  // Prompt token-layer pairs computed / layers: the first pass over the prompt
  // (prefix passes included) and prompt tokens revived during decode.
  double prompt_tokens_computed = 0;
  // KV blocks the sequence held at most (it only grows, until a recompute drops it), all layers.
  int64_t kv_blocks = 0;
  // Of those, the most held in the device tier at once (a strategy may keep part of
  // its KV in the host tier).
  int64_t kv_device_blocks = 0;
  // (layer, prompt tokens entering it) at layer 0 and wherever the count changes, first pass.
  std::vector<std::pair<int, int>> kept_per_layer;
  double queue_seconds = 0;
  double ttft_seconds = 0;
  double total_seconds = 0;
  std::string strategy;  // the strategy that ran (`auto` names its choice)
};

// Prompt tokens [begin, end) that reached the last layer in the first pass, with their text.
struct KeptSpan {
  int begin = 0, end = 0;
  std::string text;
};

struct StepPlan {
  // Sequences that end here (cancelled, or failed by the scheduler; possibly one
  // started in this plan): the engine reports their usage and forgets them. The
  // scheduler released their KV when it planned this.
  std::vector<int64_t> finish;
  // New sequences; `spec` stays valid until the sequence ends.
  struct Start {
    int64_t seq_id = 0;
    const GenerationSpec* spec = nullptr;
    int32_t cached = 0;  // leading prompt tokens whose KV the sequence shares with the prefix cache
  };
  std::vector<Start> start;
  // The prefix cache's evictions to the host tier (KvPlanner::PlanEvict): run
  // first, before the step reuses the device blocks they free.
  std::vector<SwapPlan> evict;
  // Sequences whose KV the scheduler released (recompute preemption): the next run
  // starts again from the first history token, with a fresh strategy.
  std::vector<int64_t> drop;
  // Whole-sequence swaps to the host tier (planned through the KV owner's planning face);
  // the engine completes them before anything else touches the device tier.
  struct SwapOut {
    int64_t seq_id = 0;
    SwapPlan plan;
  };
  std::vector<SwapOut> swap_out;
  // Sequences to bring back from the host tier, on their reservation.
  std::vector<int64_t> swap_in;
  // The rows to compute: `count` history tokens (prompt + generated) from `begin`
  // (= the tokens whose KV is cached); `sample` when they reach the end of the
  // history, so the next token is sampled.
  struct Run {
    int64_t seq_id = 0;
    int32_t begin = 0, count = 0;
    bool sample = false;
    // With `sample` on the sequence's first token (n > 1): new sequences that share its KV
    // once the rows are computed and sample their own first token from the same logits.
    std::vector<int64_t> forks;
  };
  std::vector<Run> run;

  bool empty() const {
    return finish.empty() && start.empty() && evict.empty() && drop.empty() && swap_out.empty() && run.empty();
  }
};

enum class SeqStatus {
  kOk,
  kKvLost,   // a swap of its KV failed: the scheduler releases its KV; recompute it
  kKvShort,  // it needed more device blocks than reserved: released as kKvLost; recompute it
  kFailed,   // an error of this sequence alone: it ended (`error`)
};

struct SeqOutcome {
  int64_t seq_id = 0;
  SeqStatus status = SeqStatus::kOk;
  std::string error;
  int32_t computed = 0;              // history tokens whose KV is cached after the step
  std::optional<StepOutcome> token;  // the token sampled this step
  int64_t added_rows = 0;            // its strategy's MaxAddedRows() for the next step
  // The engine let the sequence go (its decoder finished, the plan ended it, or it
  // failed; the scheduler releases its KV): its final accounting and any text held back.
  bool ended = false;
  Usage usage;
  std::vector<KeptSpan> kept_spans;
  std::string held_text;
};

// One sequence's blocks moved between tiers, for metrics.
struct SwapRecord {
  Tier to = Tier::kHost;
  uint64_t bytes = 0;
  double seconds = 0;
};

struct StepResult {
  std::vector<SeqOutcome> seqs;
  std::vector<SwapRecord> swaps;
  int batch_tokens = 0;                                       // rows computed this step (the runs' counts)
  uint64_t swap_bytes_to_host = 0, swap_bytes_to_device = 0;  // totals since start (swaps and block moves)
  double move_wait_seconds = 0;  // total since start: the engine waiting for a strategy's block moves
};

// What executes plans: the Engine, or a fake in the scheduler tests.
class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual StepResult Execute(const StepPlan& plan) = 0;
  // The KV accounting the scheduler plans with (the executor's).
  virtual KvPlanner& kv() = 0;
};

}  // namespace ps
