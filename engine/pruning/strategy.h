// Per-request token pruning policy, called by the forward pass at fixed hooks.
// A sequence without a strategy (`full`) keeps every row at every layer and
// attends to every cached row. Strategies (LazyLLM, GemFilter, ...) subclass this,
// one file each with their parameters (registry.h); the engine never
// special-cases one. One instance serves one sequence for the life of its KV (a
// recompute preemption starts a fresh one); the engine calls it on the engine
// thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "kernels/activations.h"
#include "kernels/types.h"
#include "memory/kv_cache_manager.h"

namespace ps {

// The rows a sequence feeds one step, as BeginStep may rewrite them.
struct StepRows {
  std::vector<int32_t> tokens, positions;
  // For each row, its index among the step's rows as the caller gave them
  // (what the pruning report maps back to prompt tokens).
  std::vector<int32_t> origin;
};

// Engine services for one sequence during a step.
class SeqContext {
 public:
  virtual ~SeqContext() = default;
  // Runs layers 0..last_layer over `tokens` at `positions` on scratch KV, each
  // layer's released once its attention is done (one layer's at a time). The strategy's hooks see the pass as usual; at
  // `last_layer` only the last row's attention is computed (for AfterAttention).
  virtual absl::Status RunPrefix(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                                 int last_layer) = 0;
  // The sequence's Aux Cache (host-tier blocks): one hidden-state row (n_embd
  // floats) per position. Put is false when the host tier is full.
  virtual bool AuxPut(int32_t position, const float* hidden) = 0;
  virtual bool AuxTake(int32_t position, float* hidden) = 0;
  // The sequence's KV at `layer`: pages (with their tiers) and positions; slot s
  // lives in page s / KvBlockTokens().
  virtual const LayerTable& Kv(int layer) const = 0;
  virtual int KvBlockTokens() const = 0;
  // Moves pages (indices into Kv(layer).tiers) of `layer` to `to`; the next
  // attention over that layer waits for the copies. ResourceExhausted when the
  // destination has no room (nothing moved).
  virtual absl::Status MovePages(int layer, std::span<const int32_t> pages, Tier to) = 0;
  // Frees KV head kv_head's K and V rows in `pages` of `layer`: the strategy's
  // selections never name them again (KV eviction; the pages' other heads stay).
  virtual absl::Status DropHeadPages(int layer, int kv_head, std::span<const int32_t> pages) = 0;
};

// One sequence's rows entering a layer, as RowsForLayer may edit them. Hidden states
// and queries and keys stay where the backend keeps them (device memory on a GPU): a
// hook reads what it needs through its ActivationRows (kernels/activations.h), a
// few rows or their reductions, and that alone crosses to the host.
struct LayerRows {
  std::span<const int32_t> positions;             // the rows still active; the last one is the newest token
  ActivationRows* hidden = nullptr;               // [positions.size(), n_embd]: hidden states at this layer's input
  std::vector<char>* keep = nullptr;              // keep[i] = 0 prunes row i (all 1 on entry; the last must stay)
  std::vector<int32_t>* add_positions = nullptr;  // rows to add (revived), placed before the kept rows
  std::vector<float>* add_hidden = nullptr;       // their hidden states at this layer's input, n_embd each
};

// One sequence's attention inputs at a layer, after RoPE, as SelectKv sees them.
struct LayerAttention {
  std::span<const int32_t> q_positions;  // the query rows
  ActivationRows* q = nullptr;           // their queries: [q_positions.size(), n_heads * head_dim]
  // The rows this step appended to the layer's KV (the last rows of SeqContext::Kv)
  // and their keys: [new_positions.size(), n_kv_heads * head_dim].
  std::span<const int32_t> new_positions;
  ActivationRows* k = nullptr;
  AttentionShape shape;
};

// Attention scores shared across layers (PoD) at one layer. For each KV head, the
// layer whose queries and keys score its distant keys: the layer itself means
// ordinary attention for that head. Otherwise the head's query rows attend to their
// proximal keys (positions below `sinks` or within the `recent` newest up to their
// own) as usual, and to the distant ones with the base layer's scores (its queries
// and keys) and this layer's values; a gate from the two parts' log-sum-exps,
// g = 1 / (1 + exp(lse_D - lse_P)), mixes them: o = g o_P + (1 - g) o_D. When
// gate_skip > 0, a single query row skips its distant part at a layer where the gate
// (from the distant log-sum-exp this step's first non-base layer of the group left
// in distant_lse) is at least gate_skip for every head of the group. With
// drop_distant_keys (a plan naming the same base layers at every step), the engine
// frees the layer's own keys of such a head once they are distant to every query to
// come: they are never read again (PoD's KV saving).
struct SharedScores {
  std::vector<int> base;             // [n_kv_heads]
  std::vector<const float*> base_q;  // [n_kv_heads]: the base layer's queries of this step's query rows
  int64_t q_stride = 0;              // floats between base_q rows
  int32_t sinks = 0, recent = 0;
  float gate_skip = 0;
  // [n_kv_heads][n_heads / n_kv_heads]: the distant log-sum-exps of the step's single
  // query row at its group (valid where distant_lse_valid[kv head]); the engine fills
  // them at the group's first non-base layer, the strategy resets the flags per step.
  float* distant_lse = nullptr;
  char* distant_lse_valid = nullptr;
  int64_t* distant_skipped = nullptr;  // distant parts skipped, counted by the engine
  bool drop_distant_keys = true;
};

// What AfterAttention receives about the last query row at a layer.
enum class LastQueryStat {
  kNone,
  kProbs,   // attention probabilities, mean over heads (LazyLLM)
  kLogits,  // scaled pre-softmax scores q·k, summed over heads, -inf where masked (GemFilter)
};

class PruningStrategy {
 public:
  virtual ~PruningStrategy() = default;
  virtual std::string_view name() const = 0;

  // A copy for a sequence forked from this one once its prompt step is done (n > 1):
  // the fork shares the sequence's KV and goes on from this state. Null: the state
  // does not fork (it holds rows outside the KV, in the host row store): the fork
  // computes its prompt again with a fresh strategy.
  virtual std::unique_ptr<PruningStrategy> Fork() const { return nullptr; }

  // Upper bound on the rows RowsForLayer may add at one layer in the next step
  // (KV blocks the scheduler reserves).
  virtual int64_t MaxAddedRows() const { return 0; }

  // Before the step. The strategy may rewrite the rows (e.g. replace the prompt
  // by a selection of it) and run a prefix pass through `ctx`.
  virtual absl::Status BeginStep(StepRows* rows, SeqContext& ctx) {
    (void)rows, (void)ctx;
    return absl::OkStatus();
  }

  // Before layer `layer` (>= 1): prune rows (saving their hidden states where
  // the strategy wants them back later) and add revived ones.
  virtual void RowsForLayer(int layer, LayerRows& rows, SeqContext& ctx) { (void)layer, (void)rows, (void)ctx; }

  // After the step's rows were appended to `layer`'s KV: which cached rows (indices
  // into ctx.Kv(layer)) the query rows of `att` attend to. Leaving `selection`
  // empty means all of them (and costs nothing).
  virtual void SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) {
    (void)layer, (void)att, (void)ctx, (void)selection;
  }

  // Scores shared across layers at `layer` (PoD), or null: ordinary attention (over
  // the selection). Valid until the next call. Called after SelectKv, which must
  // leave the selection empty when this returns a plan.
  virtual const SharedScores* ShareScores(int layer) {
    (void)layer;
    return nullptr;
  }

  virtual LastQueryStat WantsLastQuery(int layer) const {
    (void)layer;
    return LastQueryStat::kNone;
  }
  // values[i] belongs to the cached KV row at position kv_positions[i].
  virtual void AfterAttention(int layer, std::span<const float> values, std::span<const int32_t> kv_positions,
                              SeqContext& ctx) {
    (void)layer, (void)values, (void)kv_positions, (void)ctx;
  }
};

}  // namespace ps
