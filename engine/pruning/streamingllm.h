// StreamingLLM (Xiao et al., 2024), as the KV-cache baseline practitioners use it
// (kvpress's StreamingLLMPress): after a dense prefill, each layer keeps the KV of
// the attention sinks (the first `sinks` tokens) and of the `recent` newest prompt
// tokens, the rest evicted (engine/pruning/kv_compression.h: per page of the KV
// cache, so a page holding a sink or a recent token stays whole); generated tokens
// are all kept. Not one of the five seeds: a reference point for the evaluation.
#pragma once

#include <memory>

#include "engine/pruning/kv_compression.h"
#include "engine/pruning/registry.h"
#include "model/model.h"

namespace ps {

struct StreamingLlmParams {
  int sinks = 4;      // the first prompt tokens kept
  int recent = 2044;  // the newest prompt tokens kept (the paper's 4 + 2044 cache)
};

// The registry's defaults: the paper's 4 sinks and a 2,048-token cache.
std::unique_ptr<StrategyParams> StreamingLlmDefaults(const ModelConfig& config, const CalibrationPtr& calibration);

class StreamingLlm : public KvCompression {
 public:
  StreamingLlm(const StreamingLlmParams& params, const ModelConfig& config)
      : KvCompression(config.n_layers, config.n_kv_heads), params_(params) {}
  std::string_view name() const override { return "streamingllm"; }
  std::unique_ptr<PruningStrategy> Fork() const override { return std::make_unique<StreamingLlm>(*this); }

 protected:
  void KeepPages(int layer, int32_t full_pages, int block_tokens, std::vector<std::vector<int32_t>>* keep) override;

 private:
  StreamingLlmParams params_;
};

}  // namespace ps
