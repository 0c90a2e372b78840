// The load generator's figures, with the definitions of vLLM's `bench serve`:
// request and token throughput over the run's duration, goodput against SLOs,
// and mean / median / std / p90 / p99 of TTFT, TPOT = (E2E - TTFT) / (n - 1),
// ITL (every gap between streamed chunks) and E2E latency, over the completed
// requests; overall and per strategy, as JSON and as a table.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ps::loadtest {

enum class Outcome { kCompleted, kCancelled, kFailed };

// One request as the client saw it.
struct RequestRecord {
  std::string strategy;
  Outcome outcome = Outcome::kFailed;
  int status_code = 0;  // the gRPC status code
  std::string error;    // the status message when not OK
  int prompt_tokens = 0;
  int cached_tokens = 0;  // of prompt_tokens, those the server's prefix cache held (Finished)
  int output_tokens = 0;
  double ttft = -1;         // seconds from the send to the first token (-1: no token)
  double e2e = 0;           // seconds from the send to the call's end
  std::vector<double> itl;  // seconds between consecutive token chunks
};

// Service-level objectives in milliseconds (0: not part of goodput).
struct Slo {
  double ttft_ms = 0, tpot_ms = 0, e2el_ms = 0;
};

// q-th percentile (0..100) of `values` with linear interpolation (numpy's default).
double Percentile(std::vector<double> values, double q);

// The summary of one run. Keys follow vLLM's result JSON (duration, completed,
// request_throughput, output_throughput, mean_ttft_ms, p99_itl_ms, ...), plus
// sent / cancelled / failed counts, failures by status code, the raw per-request
// ttfts (seconds, completed requests) and per_strategy summaries.
nlohmann::json Summarize(const std::vector<RequestRecord>& records, double duration_s, const Slo& slo);

// The summary as a text table (vLLM's layout), per strategy below when there are several.
std::string FormatSummary(const nlohmann::json& summary);

}  // namespace ps::loadtest
