#include "engine/sequence.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps {

std::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kStopSequence: return "stop_sequence";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

absl::Status ValidateGeneration(const ModelConfig& c, size_t prompt_tokens, const SamplingParams& sampling,
                                const StopCriteria& stop) {
  if (prompt_tokens == 0) return absl::InvalidArgumentError("input: the prompt is empty");
  if (prompt_tokens >= static_cast<size_t>(c.n_ctx)) {
    return absl::InvalidArgumentError(
        absl::StrCat("input: the prompt has ", prompt_tokens, " tokens; the context holds ", c.n_ctx));
  }
  if (stop.max_new_tokens <= 0) return absl::InvalidArgumentError("max_new_tokens must be > 0");
  if (prompt_tokens + stop.max_new_tokens > static_cast<size_t>(c.n_ctx)) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens: ", prompt_tokens, " prompt tokens + ",
                                                   stop.max_new_tokens, " exceed the context length ", c.n_ctx));
  }
  if (stop.min_new_tokens < 0 || stop.min_new_tokens > stop.max_new_tokens) {
    return absl::InvalidArgumentError("min_new_tokens must be in [0, max_new_tokens]");
  }
  for (const std::string& s : stop.stop_strings) {
    if (s.empty()) return absl::InvalidArgumentError("stop: stop strings must not be empty");
  }
  for (int32_t id : stop.stop_token_ids) {
    if (id < 0 || id >= c.n_vocab)
      return absl::InvalidArgumentError(absl::StrCat("stop_token_ids: ", id, " is out of range"));
  }
  return ValidateSamplingParams(sampling);
}

std::string StopMatcher::Push(std::string_view text, std::string* matched) {
  held_ += text;
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at != std::string::npos && (first == std::string::npos || at < first)) {
      first = at;
      *matched = s;
    }
  }
  if (first != std::string::npos) {
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::Flush() {
  std::string out;
  out.swap(held_);
  return out;
}

std::shared_ptr<const grammar::Vocabulary> GrammarVocabulary(const Tokenizer& tok) {
  std::vector<std::string> tokens(tok.vocab_size());
  std::vector<bool> special(tok.vocab_size());
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    tokens[id] = tok.TokenBytes(id);
    special[id] = tok.IsControl(id);
  }
  const std::span<const int32_t> eog = tok.end_of_generation_ids();
  return std::make_shared<const grammar::Vocabulary>(std::move(tokens), special,
                                                     std::vector<int32_t>(eog.begin(), eog.end()));
}

SequenceDecoder::SequenceDecoder(const Tokenizer* tok, const SamplingParams& sampling, const StopCriteria& stop,
                                 std::span<const int32_t> prompt, bool show_control)
    : tok_(tok), stop_(stop), sampler_(sampling), matcher_(stop.stop_strings), history_(prompt.begin(), prompt.end()) {
  if (tok_ != nullptr) text_.emplace(*tok_, /*skip_special=*/!show_control);
  if (sampling.grammar != nullptr) grammar_.emplace(*sampling.grammar);
}

SequenceDecoder SequenceDecoder::Fork(int k) const {
  SequenceDecoder fork = *this;
  fork.sampler_.SeedChoice(k);
  return fork;
}

StepOutcome SequenceDecoder::Next(std::span<float> logits) {
  const bool may_stop = num_generated_ >= stop_.min_new_tokens || grammar_;  // a grammar says when it may end
  constexpr float kNever = -std::numeric_limits<float>::infinity();
  if (!may_stop && tok_ != nullptr && !stop_.ignore_eos) {
    for (int32_t id : tok_->end_of_generation_ids()) logits[id] = kNever;
  }
  if (grammar_) {
    mask_.resize((logits.size() + 63) / 64);
    grammar_->FillMask(mask_);
    for (size_t w = 0; w < mask_.size(); ++w) {
      if (mask_[w] == ~uint64_t{0}) continue;
      const size_t end = std::min(logits.size(), 64 * w + 64);
      for (size_t t = 64 * w; t < end; ++t) {
        if (!((mask_[w] >> (t & 63)) & 1)) logits[t] = kNever;
      }
    }
  }
  StepOutcome out;
  out.sampled = sampler_.Sample(logits, history_);
  const int32_t t = out.sampled.token;
  history_.push_back(t);
  ++num_generated_;
  // The grammar takes the token (a stop where it may end ends it). It refuses one only
  // when it allowed none (a vocabulary without some byte): the output ends there.
  const bool grammar_ends = grammar_ && (!grammar_->AcceptToken(t) || grammar_->Done());
  const bool is_eog = (!stop_.ignore_eos || grammar_) && tok_ != nullptr && tok_->IsEndOfGeneration(t);
  const bool is_stop_id =
      std::find(stop_.stop_token_ids.begin(), stop_.stop_token_ids.end(), t) != stop_.stop_token_ids.end();
  if (may_stop && (is_eog || is_stop_id)) {
    out.finished = true;
    out.reason = FinishReason::kStop;
    out.text = Flush();
    return out;
  }
  if (text_) out.text = matcher_.Push(text_->Push(t), &out.matched_stop);
  if (!out.matched_stop.empty()) {
    out.finished = true;
    out.reason = FinishReason::kStopSequence;
  } else if (grammar_ends) {
    out.finished = true;
    out.reason = FinishReason::kStop;
    out.text += Flush();
  } else if (num_generated_ >= stop_.max_new_tokens) {
    out.finished = true;
    out.reason = FinishReason::kLength;
    out.text += Flush();
  }
  return out;
}

std::string SequenceDecoder::Flush() {
  std::string matched;  // a stop string cannot complete from held-back text alone
  std::string out = text_ ? matcher_.Push(text_->Flush(), &matched) : "";
  return matched.empty() ? out + matcher_.Flush() : out;
}

}  // namespace ps
