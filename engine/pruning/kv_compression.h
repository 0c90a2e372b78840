// KV compression after prefill, the mechanism of the KV-cache baselines
// (StreamingLLM, SnapKV): the prompt is computed densely in one step (a prefix may
// come from the prefix cache: the KV dense attention leaves is `full`'s); at the first
// step after it, each layer's whole prompt pages that a KV head does not keep lose
// that head's K and V blocks (freed), and from then on each head's queries attend to
// its kept prompt pages, the prompt's last partial page and every generated token.
// Eviction is per page (KvBlockTokens tokens), per layer and KV head. A prompt whose
// pages all stay costs nothing (the selection stays empty: dense attention).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/pruning/strategy.h"

namespace ps {

class KvCompression : public PruningStrategy {
 public:
  KvCompression(int n_layers, int n_kv_heads);

  absl::Status BeginStep(StepRows* rows, SeqContext& ctx) override;
  void SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) override;

  int32_t prompt_tokens() const { return prompt_; }
  // Prompt pages kept at (layer, kv_head) once evicted there (ascending), else empty.
  const std::vector<int32_t>& Kept(int layer, int kv_head) const { return kept_[layer][kv_head]; }

 protected:
  // In the prompt's step, at each layer before its attention (SnapKV scores here).
  virtual void ObservePrompt(int layer, const LayerAttention& att, SeqContext& ctx) {
    (void)layer, (void)att, (void)ctx;
  }
  // The prompt pages (of `full_pages` whole ones) each KV head keeps at `layer`:
  // (*keep)[h] ascending; called once per layer at the first step after the prompt.
  virtual void KeepPages(int layer, int32_t full_pages, int block_tokens, std::vector<std::vector<int32_t>>* keep) = 0;

  int n_kv_heads() const { return n_kv_heads_; }

 private:
  int n_layers_, n_kv_heads_;
  int32_t prompt_ = 0;
  bool in_prompt_ = false;     // this step computes the prompt
  std::vector<char> evicted_;  // [layer]: 0 not yet, 1 evicted (kept_ holds the pages), 2 nothing to evict
  std::vector<std::vector<std::vector<int32_t>>> kept_;  // [layer][kv_head]: kept prompt pages
  std::vector<int32_t> dropped_;                         // scratch
};

}  // namespace ps
