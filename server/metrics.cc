#include "server/metrics.h"

#include <algorithm>
#include <string>

namespace ps::server {
namespace {

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

// Moving one sequence's blocks takes from about 0.1 ms (a short prompt) to tens of ms.
prometheus::Histogram::BucketBoundaries SwapBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
}

std::string SwapDirection(Tier to) { return to == Tier::kHost ? "to_host" : "to_device"; }

// A counter that follows an engine total: advanced by what the total gained since `seen`.
template <typename T>
void Follow(prometheus::Counter& counter, T total, T& seen) {
  if (total > seen) counter.Increment(static_cast<double>(total - seen));
  seen = std::max(seen, total);
}

}  // namespace

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      ttft_(prometheus::BuildHistogram()
                .Name("pruneserve_time_to_first_token_seconds")
                .Help("Time from arrival to the first generated token")
                .Register(*registry_)),
      itl_(prometheus::BuildHistogram()
               .Name("pruneserve_inter_token_latency_seconds")
               .Help("Time between consecutive generated tokens of a request")
               .Register(*registry_)),
      e2e_(prometheus::BuildHistogram()
               .Name("pruneserve_e2e_request_latency_seconds")
               .Help("Time from arrival to the end of a request")
               .Register(*registry_)),
      queue_(prometheus::BuildHistogram()
                 .Name("pruneserve_request_queue_time_seconds")
                 .Help("Time a request waited before its first step")
                 .Register(*registry_)),
      running_(prometheus::BuildGauge()
                   .Name("pruneserve_num_requests_running")
                   .Help("Requests in the running batch")
                   .Register(*registry_)),
      waiting_(prometheus::BuildGauge()
                   .Name("pruneserve_num_requests_waiting")
                   .Help("Requests waiting to be scheduled")
                   .Register(*registry_)),
      swapped_(prometheus::BuildGauge()
                   .Name("pruneserve_num_requests_swapped")
                   .Help("Running requests preempted with their KV in the host tier (counted in running)")
                   .Register(*registry_)),
      prompt_tokens_(prometheus::BuildCounter()
                         .Name("pruneserve_prompt_tokens_total")
                         .Help("Prompt tokens of finished requests")
                         .Register(*registry_)),
      prompt_tokens_computed_(prometheus::BuildCounter()
                                  .Name("pruneserve_prompt_tokens_computed_total")
                                  .Help("Prompt tokens computed (token-layer pairs / layers)")
                                  .Register(*registry_)),
      prompt_tokens_pruned_(prometheus::BuildCounter()
                                .Name("pruneserve_prompt_tokens_pruned_total")
                                .Help("Prompt tokens not computed: prompt tokens - prompt tokens computed")
                                .Register(*registry_)),
      prompt_tokens_kept_(prometheus::BuildCounter()
                              .Name("pruneserve_prompt_tokens_kept_total")
                              .Help("Prompt tokens entering a layer where the strategy changed the count (first pass)")
                              .Register(*registry_)),
      generation_tokens_(prometheus::BuildCounter()
                             .Name("pruneserve_generation_tokens_total")
                             .Help("Generated tokens")
                             .Register(*registry_)),
      requests_(prometheus::BuildCounter()
                    .Name("pruneserve_requests_total")
                    .Help("Finished requests by finish reason")
                    .Register(*registry_)),
      kv_blocks_(prometheus::BuildGauge()
                     .Name("pruneserve_kv_blocks")
                     .Help("KV cache blocks by tier and state")
                     .Register(*registry_)),
      kv_usage_(prometheus::BuildGauge()
                    .Name("pruneserve_kv_cache_usage_ratio")
                    .Help("Fraction of the tier's KV blocks in use")
                    .Register(*registry_)),
      preemptions_(prometheus::BuildCounter()
                       .Name("pruneserve_preemptions_total")
                       .Help("Running requests preempted for KV room, by mode (swap to the host tier, or recompute)")
                       .Register(*registry_)),
      batch_tokens_(prometheus::BuildHistogram()
                        .Name("pruneserve_batch_tokens")
                        .Help("Token rows per engine step")
                        .Register(*registry_)),
      swap_bytes_(prometheus::BuildCounter()
                      .Name("pruneserve_kv_swap_bytes_total")
                      .Help("KV bytes moved between the tiers, by direction")
                      .Register(*registry_)),
      swap_seconds_(prometheus::BuildHistogram()
                        .Name("pruneserve_kv_swap_seconds")
                        .Help("Time to move one sequence's KV blocks between the tiers")
                        .Register(*registry_)),
      move_wait_(prometheus::BuildCounter()
                     .Name("pruneserve_kv_move_wait_seconds_total")
                     .Help("Time the engine waited for KV blocks moved between the tiers during a step (a "
                           "strategy's moves, a prefix hit's host-tier pages: copies not hidden behind compute)")
                     .Register(*registry_)),
      prefix_queried_(prometheus::BuildCounter()
                          .Name("pruneserve_prefix_cache_queried_tokens_total")
                          .Help("Prompt tokens of the requests that looked for a cached prefix")
                          .Register(*registry_)),
      prefix_hit_(prometheus::BuildCounter()
                      .Name("pruneserve_prefix_cache_hit_tokens_total")
                      .Help("Prompt tokens found in the prefix cache (not computed), by the tier that held them")
                      .Register(*registry_)),
      prefix_blocks_(prometheus::BuildGauge()
                         .Name("pruneserve_prefix_cache_blocks")
                         .Help("KV blocks the prefix cache holds, by tier (shared with running requests, some of "
                               "them; counted in pruneserve_kv_blocks' used)")
                         .Register(*registry_)),
      prefix_evicted_(prometheus::BuildCounter()
                          .Name("pruneserve_prefix_cache_evicted_blocks_total")
                          .Help("Cached KV blocks no request held, evicted for room: moved to the host tier, or "
                                "dropped")
                          .Register(*registry_)) {
  running_.Add({}).Set(0);
  waiting_.Add({}).Set(0);
  swapped_.Add({}).Set(0);
  for (PreemptionMode m : {PreemptionMode::kSwap, PreemptionMode::kRecompute}) {
    preemptions_.Add({{"mode", std::string(PreemptionModeName(m))}});
  }
  for (Tier t : {Tier::kHost, Tier::kDevice}) swap_bytes_.Add({{"direction", SwapDirection(t)}});
  move_wait_.Add({});
  swap_seconds_.Add({}, SwapBuckets());
  prefix_queried_.Add({});
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    prefix_hit_.Add({{"tier", std::string(TierName(t))}});
    prefix_blocks_.Add({{"tier", std::string(TierName(t))}});
  }
  for (const char* to : {"host", "dropped"}) prefix_evicted_.Add({{"to", to}});
}

void Metrics::SetCacheConfig(int block_tokens, const std::string& kv_dtype, int64_t device_blocks,
                             int64_t host_blocks) {
  prometheus::BuildGauge()
      .Name("pruneserve_cache_config_info")
      .Help("The KV cache's configuration (value 1): block_size in tokens per page, KV element type, blocks per tier")
      .Register(*registry_)
      .Add({{"block_size", std::to_string(block_tokens)},
            {"kv_dtype", kv_dtype},
            {"num_device_blocks", std::to_string(device_blocks)},
            {"num_host_blocks", std::to_string(host_blocks)}})
      .Set(1);
}

void Metrics::AddStrategies(const std::vector<std::string>& strategies) {
  for (const std::string& s : strategies) {
    for (auto* family : {&prompt_tokens_, &prompt_tokens_computed_, &prompt_tokens_pruned_, &generation_tokens_}) {
      family->Add({{"strategy", s}});
    }
    for (FinishReason r : {FinishReason::kStop, FinishReason::kLength, FinishReason::kStopSequence,
                           FinishReason::kCancelled, FinishReason::kError}) {
      requests_.Add({{"finish_reason", std::string(FinishReasonName(r))}, {"strategy", s}});
    }
  }
}

void Metrics::OnStep(const LoadSnapshot& load, int batch_tokens) {
  running_.Add({}).Set(load.running);
  waiting_.Add({}).Set(load.waiting);
  swapped_.Add({}).Set(load.swapped);
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    const KvTierLoad& kv = load.kv[static_cast<int>(t)];
    const std::string tier(TierName(t));
    kv_blocks_.Add({{"tier", tier}, {"state", "used"}}).Set(static_cast<double>(kv.used));
    kv_blocks_.Add({{"tier", tier}, {"state", "free"}}).Set(static_cast<double>(kv.total - kv.used));
    kv_usage_.Add({{"tier", tier}}).Set(kv.total > 0 ? static_cast<double>(kv.used) / kv.total : 0.0);
    prefix_blocks_.Add({{"tier", tier}}).Set(static_cast<double>(kv.cached));
    Follow(prefix_hit_.Add({{"tier", tier}}), load.prefix.hit_tokens[static_cast<int>(t)],
           seen_prefix_.hit_tokens[static_cast<int>(t)]);
  }
  // Whole-sequence swaps and a strategy's block moves alike.
  for (auto [to, total] :
       {std::pair{Tier::kHost, load.swap_bytes_to_host}, {Tier::kDevice, load.swap_bytes_to_device}}) {
    Follow(swap_bytes_.Add({{"direction", SwapDirection(to)}}), total, seen_swap_bytes_[static_cast<int>(to)]);
  }
  Follow(move_wait_.Add({}), load.move_wait_seconds, seen_move_wait_);
  Follow(prefix_queried_.Add({}), load.prefix.queried_tokens, seen_prefix_.queried_tokens);
  Follow(prefix_evicted_.Add({{"to", "host"}}), load.prefix.evicted_to_host, seen_prefix_.evicted_to_host);
  Follow(prefix_evicted_.Add({{"to", "dropped"}}), load.prefix.dropped, seen_prefix_.dropped);
  if (batch_tokens > 0) {
    batch_tokens_
        .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096})
        .Observe(batch_tokens);
  }
}

void Metrics::OnPreemption(PreemptionMode mode) {
  preemptions_.Add({{"mode", std::string(PreemptionModeName(mode))}}).Increment();
}

void Metrics::OnSwap(Tier to, uint64_t bytes, double seconds) {
  (void)to, (void)bytes;  // the bytes counter follows the engine's totals (OnStep)
  swap_seconds_.Add({}, SwapBuckets()).Observe(seconds);
}

void Metrics::OnFirstToken(const std::string& strategy, double ttft_seconds) {
  ttft_.Add({{"strategy", strategy}}, LatencyBuckets()).Observe(ttft_seconds);
}

void Metrics::OnInterToken(const std::string& strategy, double seconds) {
  itl_.Add({{"strategy", strategy}}, LatencyBuckets()).Observe(seconds);
}

void Metrics::OnFinished(const std::string& strategy, FinishReason reason, const Usage& u) {
  e2e_.Add({{"strategy", strategy}}, LatencyBuckets()).Observe(u.total_seconds);
  queue_.Add({{"strategy", strategy}}, LatencyBuckets()).Observe(u.queue_seconds);
  prompt_tokens_.Add({{"strategy", strategy}}).Increment(u.prompt_tokens);
  prompt_tokens_computed_.Add({{"strategy", strategy}}).Increment(u.prompt_tokens_computed);
  prompt_tokens_pruned_.Add({{"strategy", strategy}})
      .Increment(std::max(0.0, u.prompt_tokens - u.prompt_tokens_computed));
  for (const auto& [layer, tokens] : u.kept_per_layer) {
    prompt_tokens_kept_.Add({{"strategy", strategy}, {"layer", std::to_string(layer)}}).Increment(tokens);
  }
  generation_tokens_.Add({{"strategy", strategy}}).Increment(u.completion_tokens);
  requests_.Add({{"finish_reason", std::string(FinishReasonName(reason))}, {"strategy", strategy}}).Increment();
}

}  // namespace ps::server
