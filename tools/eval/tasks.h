// The evaluation's tasks, in the mould of RULER (Hsieh et al., 2024): prompts of a
// target length in tokens built deterministically from a seed and a filler text
// (no downloads), each with its exact expected answers and how an answer is scored.
//   niah_single      one magic number for a key, hidden in essays; asked for it
//   niah_multikey    four numbers for four keys; asked for one key's
//   niah_multivalue  four numbers for one key; asked for all of them
//   niah_multiquery  four numbers for four keys; asked for all four keys' numbers
//   vt               variable tracking: a chain of 4 assignments from a number
//                    spread through the essays; asked which variables hold it
//   cwe              common-word extraction: a numbered list of words in which 10
//                    words appear often and the others rarely; asked for the 10
//   qa               eight short biographies among the essays; asked for one
//                    person's city of birth (scored by token F1)
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ps::eval {

// How an answer is scored, in [0, 1].
enum class Scoring {
  kAll,     // 1 when every expected string is in the answer (case-insensitive), else 0
  kRecall,  // the share of the expected strings in the answer
  kF1,      // token F1 of the answer's first line against the one expected answer
};

struct EvalPrompt {
  std::string task;
  int length = 0;    // target prompt tokens (the prompt, chat template included, stays below)
  int index = 0;     // the prompt's number at this task and length
  std::string text;  // the user message (or the whole text without a chat template)
  std::vector<std::string> answers;
  Scoring scoring = Scoring::kAll;
};

// The tokenizer the prompts are measured with (the server's, over gRPC; tests use a
// stand-in): ids and the text of each id.
class TextCodec {
 public:
  virtual ~TextCodec() = default;
  struct Tokens {
    std::vector<int32_t> ids;
    std::vector<std::string> pieces;
  };
  virtual absl::StatusOr<Tokens> Tokenize(const std::string& text) = 0;
  virtual absl::StatusOr<std::string> Detokenize(std::span<const int32_t> ids) = 0;
};

// The task names, in the order above.
const std::vector<std::string>& TaskNames();

struct PromptOptions {
  int length = 4096;
  int index = 0;
  uint64_t seed = 1;
  bool chat = true;    // the text becomes a chat user message (else a "Question/Answer" text)
  int reserved = 112;  // tokens kept free for the chat template and the first answer tokens
};

// Prompt `index` of `task` at `length`; filler is the essays' text, tokenized once
// by the caller. Same arguments, same prompt.
absl::StatusOr<EvalPrompt> MakePrompt(TextCodec& codec, const TextCodec::Tokens& filler, const std::string& task,
                                      const PromptOptions& options);

}  // namespace ps::eval
