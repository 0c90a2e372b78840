// Single-sequence generation loop (prompt, then one token per step) over a
// private, unmetered KV cache sized for the request. Used by pruneserve-run, the
// tests (the reference the server's tokens are compared with) and benchmarks;
// the server's engine runs batches of plans instead.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/forward.h"
#include "engine/sequence.h"
#include "memory/kv_cache.h"
#include "memory/kv_geometry.h"

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

// A KV cache for one sequence of up to max_tokens tokens of `model` (prefix passes,
// revivals, the host row store and moves to the host tier included), allocating on
// demand (unmetered), in 16-token blocks of the default KV type unless told otherwise.
absl::StatusOr<std::unique_ptr<KvCache>> OfflineKvCache(const Model& model, Backend& backend, int64_t max_tokens,
                                                        int block_tokens = 16, DType dtype = kDefaultKvDType);

class Generator {
 public:
  // `kv_dtype`: the KV cache's element type (the served default unless told otherwise).
  Generator(const Model& model, Backend& backend, DType kv_dtype = kDefaultKvDType)
      : model_(model), backend_(backend), kv_dtype_(kv_dtype), transformer_(model, backend) {}
  // `strategy` (null: full) serves this one generation.
  absl::StatusOr<GenerationResult> Generate(std::span<const int32_t> prompt, const SamplingParams& sampling,
                                            const StopCriteria& stop, const TokenCallback& on_token = nullptr,
                                            PruningStrategy* strategy = nullptr);

 private:
  const Model& model_;
  Backend& backend_;
  DType kv_dtype_;
  Transformer transformer_;
};

}  // namespace ps
