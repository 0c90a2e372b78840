// Single-sequence generation loop (prompt, then one token per step) with stop
// conditions. Used by pruneserve-run, the tests and benchmarks; the server's
// scheduler drives the Transformer directly for batches.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/forward.h"
#include "engine/sampler.h"

namespace ps {

struct StopCriteria {
  int max_new_tokens = 256;
  int min_new_tokens = 0;
  std::vector<std::string> stop_strings;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
};

enum class FinishReason { kStop, kLength, kStopSequence, kCancelled, kError };
std::string_view FinishReasonName(FinishReason r);

// Finds stop strings in streamed text. Text that might be the start of a stop
// string is held back until it is known not to be.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds text; returns what may be emitted now. Sets *matched when a stop string
  // completes (the stop string itself and what follows are not emitted).
  std::string Push(std::string_view text, std::string* matched);
  // Text held back at the end of generation.
  std::string Flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (stop token included when it ended generation)
  std::string text;             // streamed text (stop strings excluded)
  FinishReason finish_reason = FinishReason::kLength;
  std::string matched_stop;
  std::vector<SampledToken> sampled;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

// Called for each generated token with the newly completed text; return false to
// cancel. A final call with token -1 carries text held back until the end.
using TokenCallback = std::function<bool(const SampledToken&, std::string_view text_delta)>;

class Generator {
 public:
  Generator(const Model& model, ThreadPool& pool, const MatMulOptions& matmul = {});
  absl::StatusOr<GenerationResult> Generate(std::span<const int32_t> prompt, const SamplingParams& sampling,
                                            const StopCriteria& stop, const TokenCallback& on_token = nullptr);

 private:
  const Model& model_;
  Transformer transformer_;
  int64_t next_seq_id_ = 1;
};

}  // namespace ps
