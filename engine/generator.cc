#include "engine/generator.h"

#include <chrono>

#include "base/status.h"

namespace ps {

Generator::Generator(const Model& model, ThreadPool& pool, const MatMulOptions& matmul)
    : model_(model), transformer_(model, pool, matmul) {}

absl::StatusOr<GenerationResult> Generator::Generate(std::span<const int32_t> prompt, const SamplingParams& sampling,
                                                     const StopCriteria& stop, const TokenCallback& on_token,
                                                     PruningStrategy* strategy) {
  const ModelConfig& c = model_.config();
  PS_RETURN_IF_ERROR(ValidateGeneration(c, prompt.size(), sampling, stop));
  ContiguousKvStore kv(c.n_layers, c.kv_dim(), c.n_ctx);
  const int64_t seq = next_seq_id_++;
  SequenceDecoder decoder(model_.tokenizer(), sampling, stop, prompt);
  GenerationResult result;
  std::vector<int32_t> step_tokens(prompt.begin(), prompt.end());
  std::vector<int32_t> step_pos(prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) step_pos[i] = static_cast<int32_t>(i);
  ForwardOutput fo;
  auto t0 = std::chrono::steady_clock::now();
  while (true) {
    SeqInput in{.seq_id = seq, .tokens = step_tokens, .positions = step_pos, .strategy = strategy};
    PS_RETURN_IF_ERROR(transformer_.Forward(std::span<const SeqInput>(&in, 1), kv, &fo));
    if (result.tokens.empty()) result.prompt_rows_computed = fo.rows_computed[0];
    const auto t1 = std::chrono::steady_clock::now();
    (result.tokens.empty() ? result.prefill_seconds : result.decode_seconds) +=
        std::chrono::duration<double>(t1 - t0).count();
    t0 = t1;
    StepOutcome step = decoder.Next(std::span<float>(fo.logits.data(), c.n_vocab));
    result.tokens.push_back(step.sampled.token);
    result.sampled.push_back(step.sampled);
    result.text += step.text;
    const bool keep_going = on_token ? on_token(step.sampled, step.text) : true;
    if (step.finished) {
      result.finish_reason = step.reason;
      result.matched_stop = step.matched_stop;
      break;
    }
    if (!keep_going) {
      result.finish_reason = FinishReason::kCancelled;
      break;
    }
    step_tokens.assign(1, step.sampled.token);
    step_pos.assign(1, fo.next_position[0]);
  }
  kv.Release(seq);
  return result;
}

}  // namespace ps
