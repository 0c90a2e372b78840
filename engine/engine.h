// The engine executes plans: Execute(StepPlan) -> StepResult. It owns the
// sequences' generation state (history, sampler, stop rules, streaming text), their
// strategies, the KV cache (both tiers, the swap engine, the host row store) and the
// forward pass on a Backend. A failure belongs to one sequence, never to the batch.
// Engine thread only.
#pragma once

#include <map>
#include <memory>
#include <set>

#include "absl/status/statusor.h"
#include "engine/forward.h"
#include "engine/step.h"
#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "memory/kv_geometry.h"
#include "model/model.h"

namespace ps {

struct EngineOptions {
  int kv_block_tokens = 16;          // tokens per KV page (memory/kv_geometry.h)
  DType kv_dtype = kDefaultKvDType;  // KV element type: F32, F16, BF16 or Q8_0 (CPU)
  // KV blocks of the device tier; 0 = enough for 64 full-context sequences, up to 1 GiB.
  int64_t kv_device_blocks = 0;
  int64_t kv_host_blocks = 0;       // host tier (swap space, parked rows); 0 = none
  bool prefix_cache = false;        // reuse the KV of cached prompt prefixes (memory/prefix_index.h)
  CpuSwapEngine::CopyFn swap_copy;  // tests: inject copy failures (null = memcpy)
};

class Engine final : public StepExecutor {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const Model& model, Backend& backend,
                                                        const EngineOptions& options);
  ~Engine() override;

  StepResult Execute(const StepPlan& plan) override;
  KvPlanner& kv() override { return kv_->manager(); }

 private:
  struct Seq;
  Engine(const Model& model, Backend& backend, std::unique_ptr<KvCache> kv);
  Seq& Find(int64_t seq_id);
  // Starts the sequence's strategy over, to recompute from the first token (its KV
  // blocks go back when the scheduler releases them).
  void DropKv(Seq& s);
  // Releases the sequence: its final accounting into `out`.
  void End(int64_t seq_id, SeqStatus status, std::string error, SeqOutcome* out);
  // The plan's swaps; sequences whose KV was lost on the way go into *lost.
  void Swap(const StepPlan& plan, StepResult* r, std::set<int64_t>* lost);
  // Queues the moves of the host-tier pages of a sequence started from a cached
  // prefix back to the device tier, layer by layer (the step's attention waits for them).
  absl::Status MoveInByLayer(int64_t seq_id);
  // Sequence `child`, choice k of `parent`'s request, forked once the parent's prompt
  // step is done (before it samples): it shares the parent's KV and strategy state when
  // the strategy forks; otherwise it computes the prompt again with a fresh strategy.
  Seq& Fork(Seq& parent, int64_t parent_id, int64_t child, int k);
  // The plan's runs (but those of `lost`): the forward pass, sampling, accounting.
  void Run(const StepPlan& plan, StepResult* r, const std::set<int64_t>& lost);

  const Model& model_;
  std::unique_ptr<KvCache> kv_;
  Transformer transformer_;
  std::map<int64_t, std::unique_ptr<Seq>> seqs_;
  ForwardOutput out_;               // reused across steps
  std::vector<float> fork_logits_;  // the logits forks sample from
};

}  // namespace ps
