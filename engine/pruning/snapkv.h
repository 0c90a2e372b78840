// SnapKV (Li et al., 2024): after a dense prefill, each layer and KV head keeps the
// prompt KV that the prompt's last `window` queries (the observation window) attend
// to. Votes: for each window query and query head of the KV head's group, the
// softmax of its scaled scores over the keys it sees, summed onto the keys before
// the window; pooled along the prompt (average, `kernel` wide, zero padded, as the
// official code); the window itself is always kept, and the best-voted others up to
// `budget` tokens in all. Here per page of the KV cache (a page's votes summed), the
// rest evicted (engine/pruning/kv_compression.h); generated tokens are all kept. Not
// one of the five seeds: a reference point for the evaluation.
#pragma once

#include <memory>
#include <vector>

#include "engine/pruning/kv_compression.h"
#include "engine/pruning/registry.h"
#include "model/model.h"

namespace ps {

struct SnapKvParams {
  int window = 32;    // observation window: the prompt's last queries
  int budget = 2048;  // prompt tokens kept per layer and KV head, the window included
  int kernel = 5;     // pooling width (odd)
};

// The registry's defaults: the official code's window 32, capacity 2,048, kernel 5.
std::unique_ptr<StrategyParams> SnapKvDefaults(const ModelConfig& config, const CalibrationPtr& calibration);

class SnapKv : public KvCompression {
 public:
  SnapKv(const SnapKvParams& params, const ModelConfig& config)
      : KvCompression(config.n_layers, config.n_kv_heads), params_(params), scores_(config.n_layers) {}
  std::string_view name() const override { return "snapkv"; }
  std::unique_ptr<PruningStrategy> Fork() const override { return std::make_unique<SnapKv>(*this); }

 protected:
  void ObservePrompt(int layer, const LayerAttention& att, SeqContext& ctx) override;
  void KeepPages(int layer, int32_t full_pages, int block_tokens, std::vector<std::vector<int32_t>>* keep) override;

 private:
  SnapKvParams params_;
  std::vector<std::vector<std::vector<float>>> scores_;  // [layer][kv_head][full page]: pooled votes
  std::vector<float> votes_, logits_;                    // scratch
};

}  // namespace ps
