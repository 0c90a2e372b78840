#include "engine/generator.h"

#include <chrono>

#include "base/status.h"

namespace ps {

absl::StatusOr<std::unique_ptr<KvCache>> OfflineKvCache(const Model& model, Backend& backend, int64_t max_tokens,
                                                        int block_tokens, DType dtype) {
  const ModelConfig& c = model.config();
  KvCacheOptions o{.geometry = {.n_layers = c.n_layers,
                                .block_tokens = block_tokens,
                                .kv_dim = c.kv_dim(),
                                .n_kv_heads = c.n_kv_heads,
                                .dtype = dtype},
                   .host_row_bytes = static_cast<size_t>(c.n_embd) * sizeof(float)};
  // Twice the sequence: a prefix pass's scratch KV next to the sequence's own.
  o.device_blocks = 2 * o.geometry.BlocksForTokens(max_tokens);
  const int64_t row_blocks =
      static_cast<int64_t>((max_tokens * o.host_row_bytes + o.geometry.block_bytes() - 1) / o.geometry.block_bytes());
  o.host_blocks = o.device_blocks + row_blocks + 1;
  return KvCache::Create(o, backend);
}

absl::StatusOr<GenerationResult> Generator::Generate(std::span<const int32_t> prompt, const SamplingParams& sampling,
                                                     const StopCriteria& stop, const TokenCallback& on_token,
                                                     PruningStrategy* strategy) {
  const ModelConfig& c = model_.config();
  PS_RETURN_IF_ERROR(ValidateGeneration(c, prompt.size(), sampling, stop));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv,
                      OfflineKvCache(model_, backend_, static_cast<int64_t>(prompt.size()) + stop.max_new_tokens,
                                     /*block_tokens=*/16, kv_dtype_));
  constexpr int64_t kSeq = 1;
  SequenceDecoder decoder(model_.tokenizer(), sampling, stop, prompt);
  GenerationResult result;
  std::vector<int32_t> step_tokens(prompt.begin(), prompt.end());
  std::vector<int32_t> step_pos(prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) step_pos[i] = static_cast<int32_t>(i);
  ForwardOutput fo;
  auto t0 = std::chrono::steady_clock::now();
  while (true) {
    SeqInput in{.seq_id = kSeq, .tokens = step_tokens, .positions = step_pos, .strategy = strategy};
    PS_RETURN_IF_ERROR(transformer_.Forward(std::span<const SeqInput>(&in, 1), *kv, &fo));
    PS_RETURN_IF_ERROR(fo.status[0]);
    PS_RETURN_IF_ERROR(kv->WaitAllMoves());
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
  return result;
}

}  // namespace ps
