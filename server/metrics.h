// Prometheus metrics of the server (prometheus-cpp), exposed on --metrics-port.
// Thread-safe: updated from the engine thread and gRPC threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "scheduler/scheduler.h"

namespace ps::server {

class Metrics final : public SchedulerObserver {
 public:
  Metrics();
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  // Creates every per-strategy counter of `strategies` at zero (every finish reason
  // too), so rates and ratios over them have data before the first request ends.
  void AddStrategies(const std::vector<std::string>& strategies);
  // pruneserve_cache_config_info = 1 with the KV cache's configuration as labels
  // (block_size in tokens, as vLLM's cache_config_info, which routers read).
  void SetCacheConfig(int block_tokens, const std::string& kv_dtype, int64_t device_blocks, int64_t host_blocks);

  void OnStep(const LoadSnapshot& load, int batch_tokens) override;
  void OnPreemption(PreemptionMode mode) override;
  void OnSwap(Tier to, uint64_t bytes, double seconds) override;
  void OnFirstToken(const std::string& strategy, double ttft_seconds);
  void OnInterToken(const std::string& strategy, double seconds);
  void OnFinished(const std::string& strategy, FinishReason reason, const Usage& usage);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>& ttft_;
  prometheus::Family<prometheus::Histogram>& itl_;
  prometheus::Family<prometheus::Histogram>& e2e_;
  prometheus::Family<prometheus::Histogram>& queue_;
  prometheus::Family<prometheus::Gauge>& running_;
  prometheus::Family<prometheus::Gauge>& waiting_;
  prometheus::Family<prometheus::Gauge>& swapped_;
  prometheus::Family<prometheus::Counter>& prompt_tokens_;
  prometheus::Family<prometheus::Counter>& prompt_tokens_computed_;
  prometheus::Family<prometheus::Counter>& prompt_tokens_pruned_;
  prometheus::Family<prometheus::Counter>& prompt_tokens_kept_;
  prometheus::Family<prometheus::Counter>& generation_tokens_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Gauge>& kv_blocks_;
  prometheus::Family<prometheus::Gauge>& kv_usage_;
  prometheus::Family<prometheus::Counter>& preemptions_;
  prometheus::Family<prometheus::Histogram>& batch_tokens_;
  prometheus::Family<prometheus::Counter>& swap_bytes_;
  prometheus::Family<prometheus::Histogram>& swap_seconds_;
  prometheus::Family<prometheus::Counter>& move_wait_;
  prometheus::Family<prometheus::Counter>& prefix_queried_;
  prometheus::Family<prometheus::Counter>& prefix_hit_;
  prometheus::Family<prometheus::Gauge>& prefix_blocks_;
  prometheus::Family<prometheus::Counter>& prefix_evicted_;
  // The engine's totals at the last OnStep (the counters advance by the difference;
  // OnStep comes from the engine loop's thread only).
  uint64_t seen_swap_bytes_[2] = {0, 0};  // indexed by Tier (the destination)
  double seen_move_wait_ = 0;
  PrefixCacheCounts seen_prefix_;
};

}  // namespace ps::server
