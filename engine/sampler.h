// Token selection from logits: penalties, temperature, top-k, top-p, min-p and a
// seeded generator (same seed, same tokens), plus log-probabilities.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"

namespace ps {

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off (CTRL-style: divide positive logits, multiply negative)
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  int top_logprobs = 0;  // alternatives reported per token
};

// Checks ranges; the message names the field.
absl::Status ValidateSamplingParams(const SamplingParams& p);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

struct SampledToken {
  int32_t token = 0;
  float logprob = 0;              // log-probability under the model (raw logits)
  std::vector<TokenLogprob> top;  // top alternatives, most likely first
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Chooses the next token. `logits` is modified (used as scratch). `history` holds
  // the tokens the penalties look at (prompt and generated so far).
  SampledToken Sample(std::span<float> logits, std::span<const int32_t> history);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<float> logprobs_;
  std::vector<int32_t> order_;
  std::unordered_map<int32_t, int> counts_;
};

// Indices of the k largest values, largest first (ties: lower index first).
std::vector<int32_t> TopK(std::span<const float> values, int k);

}  // namespace ps
