#include "engine/generator.h"

#include <algorithm>
#include <chrono>

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

Generator::Generator(const Model& model, ThreadPool& pool, const MatMulOptions& matmul)
    : model_(model), transformer_(model, pool, matmul) {}

absl::StatusOr<GenerationResult> Generator::Generate(std::span<const int32_t> prompt, const SamplingParams& sampling,
                                                     const StopCriteria& stop, const TokenCallback& on_token) {
  const ModelConfig& c = model_.config();
  PS_RETURN_IF_ERROR(ValidateSamplingParams(sampling));
  if (prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  if (stop.max_new_tokens <= 0) return absl::InvalidArgumentError("max_new_tokens must be > 0");
  if (static_cast<int64_t>(prompt.size()) + stop.max_new_tokens > c.n_ctx) {
    return absl::InvalidArgumentError(absl::StrCat("prompt (", prompt.size(), " tokens) + max_new_tokens (",
                                                   stop.max_new_tokens, ") exceeds the context length ", c.n_ctx));
  }
  for (const std::string& s : stop.stop_strings) {
    if (s.empty()) return absl::InvalidArgumentError("stop strings must not be empty");
  }
  const Tokenizer* tok = model_.tokenizer();
  ContiguousKvStore kv(c.n_layers, c.kv_dim(), c.n_ctx);
  const int64_t seq = next_seq_id_++;
  Sampler sampler(sampling);
  std::optional<StreamDecoder> decoder;
  if (tok != nullptr) decoder.emplace(*tok);
  StopMatcher matcher(stop.stop_strings);
  GenerationResult result;
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  std::vector<int32_t> step_tokens(prompt.begin(), prompt.end());
  std::vector<int32_t> step_pos(prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) step_pos[i] = static_cast<int32_t>(i);
  ForwardOutput fo;
  auto t0 = std::chrono::steady_clock::now();
  while (true) {
    SeqInput in{.seq_id = seq, .tokens = step_tokens, .positions = step_pos};
    PS_RETURN_IF_ERROR(transformer_.Forward(std::span<const SeqInput>(&in, 1), kv, &fo));
    auto t1 = std::chrono::steady_clock::now();
    (result.tokens.empty() ? result.prefill_seconds : result.decode_seconds) +=
        std::chrono::duration<double>(t1 - t0).count();
    t0 = t1;
    std::vector<float> logits(fo.logits.begin(), fo.logits.begin() + c.n_vocab);
    const int n_gen = static_cast<int>(result.tokens.size());
    const bool may_stop = n_gen >= stop.min_new_tokens;
    if (!may_stop && tok != nullptr) {
      for (int32_t id : tok->end_of_generation_ids()) logits[id] = -std::numeric_limits<float>::infinity();
    }
    SampledToken st = sampler.Sample(logits, history);
    result.tokens.push_back(st.token);
    result.sampled.push_back(st);
    history.push_back(st.token);
    const bool is_eog = !stop.ignore_eos && tok != nullptr && tok->IsEndOfGeneration(st.token);
    const bool is_stop_id =
        std::find(stop.stop_token_ids.begin(), stop.stop_token_ids.end(), st.token) != stop.stop_token_ids.end();
    std::string delta;
    std::string matched;
    if (!(may_stop && (is_eog || is_stop_id)) && decoder) delta = matcher.Push(decoder->Push(st.token), &matched);
    result.text += delta;
    bool keep_going = true;
    if (on_token) keep_going = on_token(st, delta);
    if (may_stop && (is_eog || is_stop_id)) {
      result.finish_reason = FinishReason::kStop;
      break;
    }
    if (!matched.empty() && may_stop) {
      result.finish_reason = FinishReason::kStopSequence;
      result.matched_stop = matched;
      break;
    }
    if (!keep_going) {
      result.finish_reason = FinishReason::kCancelled;
      break;
    }
    if (static_cast<int>(result.tokens.size()) >= stop.max_new_tokens) {
      result.finish_reason = FinishReason::kLength;
      std::string tail = decoder ? matcher.Push(decoder->Flush(), &matched) : "";
      tail += matcher.Flush();
      result.text += tail;
      if (on_token && !tail.empty()) on_token(SampledToken{.token = -1}, tail);
      break;
    }
    step_tokens.assign(1, st.token);
    step_pos.assign(1, static_cast<int32_t>(history.size() - 1));
  }
  kv.Release(seq);
  return result;
}

}  // namespace ps
