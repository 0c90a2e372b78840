// Per-request generation state shared by the offline generator and the server's
// scheduler: sampling, stop conditions and streaming detokenisation of one
// sequence, fed one row of logits per step.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/sampler.h"
#include "model/model.h"

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

// Checks a request against the model: non-empty prompt within the context,
// max_new_tokens in (0, context - prompt], valid sampling. Messages name the field.
absl::Status ValidateGeneration(const ModelConfig& config, size_t prompt_tokens, const SamplingParams& sampling,
                                const StopCriteria& stop);

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

// What one step produced for a sequence.
struct StepOutcome {
  SampledToken sampled;
  std::string text;  // newly completed text (may be empty)
  bool finished = false;
  FinishReason reason = FinishReason::kLength;
  std::string matched_stop;
};

// The tokenizer's tokens as a grammar's vocabulary: their bytes, control tokens never
// produced under a grammar, the end-of-generation tokens as its stops.
std::shared_ptr<const grammar::Vocabulary> GrammarVocabulary(const Tokenizer& tok);

class SequenceDecoder {
 public:
  // `tok` may be null (no text, no end-of-generation ids). `show_control`: the text
  // shows control tokens (else they have none).
  SequenceDecoder(const Tokenizer* tok, const SamplingParams& sampling, const StopCriteria& stop,
                  std::span<const int32_t> prompt, bool show_control = false);
  // Samples the next token from `logits` (modified in place) and applies the stop rules.
  StepOutcome Next(std::span<float> logits);
  // A copy for choice k of the request (n > 1), sampling with its own seed stream.
  SequenceDecoder Fork(int k) const;
  // Text still held back (partial characters, possible stop prefixes), for a sequence
  // that ends without Next() saying so (cancellation).
  std::string Flush();
  int num_generated() const { return num_generated_; }
  std::span<const int32_t> history() const { return history_; }

 private:
  const Tokenizer* tok_;
  StopCriteria stop_;
  Sampler sampler_;
  std::optional<grammar::Matcher> grammar_;
  std::vector<uint64_t> mask_;  // the grammar's allowed tokens, a bit each
  std::optional<StreamDecoder> text_;
  StopMatcher matcher_;
  std::vector<int32_t> history_;  // prompt + generated, for penalties
  int num_generated_ = 0;
};

}  // namespace ps
