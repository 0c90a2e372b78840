// Single-sequence generation loop (prompt, then one token per step). Used by
// pruneserve-run, the tests and benchmarks; the server's scheduler drives the
// Transformer directly for batches.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/forward.h"
#include "engine/sequence.h"

namespace ps {

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (stop token included when it ended generation)
  std::string text;             // streamed text (stop strings excluded)
  FinishReason finish_reason = FinishReason::kLength;
  std::string matched_stop;
  std::vector<SampledToken> sampled;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t prompt_rows_computed = 0;  // token-layer pairs of the prompt pass (prefix passes included)
};

// Called for each generated token with the newly completed text; return false to cancel.
using TokenCallback = std::function<bool(const SampledToken&, std::string_view text_delta)>;

class Generator {
 public:
  Generator(const Model& model, ThreadPool& pool, const MatMulOptions& matmul = {});
  // `strategy` (null: full) serves this one generation.
  absl::StatusOr<GenerationResult> Generate(std::span<const int32_t> prompt, const SamplingParams& sampling,
                                            const StopCriteria& stop, const TokenCallback& on_token = nullptr,
                                            PruningStrategy* strategy = nullptr);

 private:
  const Model& model_;
  Transformer transformer_;
  int64_t next_seq_id_ = 1;
};

}  // namespace ps
