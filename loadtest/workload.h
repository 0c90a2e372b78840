// What the load generator sends: prompts from a JSONL dataset or synthetic ones of
// given token lengths cut from a long text, each with a strategy drawn from a mix,
// as GenerateRequests. Knows nothing of the model beyond token ids the server gave.
#pragma once

#include <cstdint>
#include <functional>
#include <istream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "pruneserve/v1/generation.pb.h"

namespace ps::loadtest {

namespace pb = ::pruneserve::v1;

// One request's input: exactly one of text, messages and token_ids is set.
struct Prompt {
  std::string text;                                           // a completion prompt
  std::vector<std::pair<std::string, std::string>> messages;  // chat (role, content), the model's template
  std::vector<int32_t> token_ids;                             // synthetic prompts
  int max_tokens = 0;                                         // 0: the run's --output-len
};

// Tokens in a text, as the server counts them (its Tokenize call).
using TokenCounter = std::function<absl::StatusOr<int>(const std::string& text)>;

// Reads a JSONL dataset, one object per line (blank lines skipped):
//   {"prompt": "...", "max_tokens": N}                                    a completion
//   {"messages": [{"role": "user", "content": "..."}, ...], "max_tokens": N}   a chat
//   {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}
// The last is ShareGPT's: the first human turn is the user message and, unless
// max_tokens is given, the first reply's length in tokens (`count`) is the output
// length, as vLLM's ShareGPT dataset does. Errors name the line.
absl::StatusOr<std::vector<Prompt>> ParseDataset(std::istream& in, const TokenCounter& count);

// The text of the files of `dir` (sorted by name), concatenated until at least
// `min_bytes` (all of them if fewer).
absl::StatusOr<std::string> ReadTextFiles(const std::string& dir, size_t min_bytes);

struct SyntheticOptions {
  int input_len = 1024;    // mean prompt tokens
  int output_len = 128;    // mean output tokens
  double range_ratio = 0;  // lengths uniform in [len * (1 - r), len * (1 + r)], as vLLM's random dataset
};

// Questions over shared documents (a prefix cache's workload): `documents`
// documents of SyntheticOptions::input_len tokens, each asked `questions` different
// questions of `question_len` tokens (document then question in one prompt).
struct SharedPrefixOptions {
  int documents = 4;
  int questions = 8;
  int question_len = 32;
};

// The prompts of a run, drawn one at a time: a dataset's (shuffled, then again
// from the start when exhausted), synthetic windows of a token sequence, or
// questions over shared documents cut from it.
class Workload {
 public:
  static Workload FromDataset(std::vector<Prompt> prompts, uint64_t seed);
  // `source`: token ids of a long text; prompt i is a window of it at a random
  // offset (the text repeats when a window runs past its end).
  static Workload Synthetic(std::vector<int32_t> source, const SyntheticOptions& options, uint64_t seed);
  // Every (document, question) pair once, in a random order (then again): documents
  // and questions are windows of `source` at random offsets; lengths as `options`.
  static Workload SharedPrefix(const std::vector<int32_t>& source, const SyntheticOptions& options,
                               const SharedPrefixOptions& shared, uint64_t seed);
  Prompt Next();

 private:
  explicit Workload(uint64_t seed) : rng_(seed) {}
  int Length(int mean);
  std::vector<int32_t> Window(const std::vector<int32_t>& source, int n);  // at a random offset, wrapping
  std::vector<Prompt> prompts_;
  size_t next_ = 0;
  std::vector<int32_t> source_;
  SyntheticOptions synthetic_;
  std::mt19937_64 rng_;
};

// A strategy mix "full=0.5,lazyllm=0.25,gemfilter=0.25" (weights need not sum to 1;
// a bare name weighs 1). Names are checked against the API's strategies.
class StrategyMix {
 public:
  static absl::StatusOr<StrategyMix> Parse(const std::string& spec);
  const std::string& Draw(std::mt19937_64& rng) { return names_[pick_(rng)]; }
  const std::vector<std::string>& names() const { return names_; }

 private:
  std::vector<std::string> names_;
  std::discrete_distribution<int> pick_;
};

struct RequestOptions {
  int output_len = 128;    // max_new_tokens where the prompt gives none
  bool ignore_eos = true;  // generate exactly max_new_tokens
  double temperature = 0;
  int64_t seed = -1;  // sampling seed (-1: the server's)
};

// The request for one prompt under `strategy` (the server's defaults for its parameters).
absl::StatusOr<pb::GenerateRequest> BuildRequest(const Prompt& prompt, const std::string& strategy,
                                                 const RequestOptions& options);

}  // namespace ps::loadtest
