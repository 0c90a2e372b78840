#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/vec.h"

namespace ps {

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  auto bad = [](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(field, " ", why));
  };
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature)) return bad("temperature", "must be >= 0");
  if (p.top_k < 0) return bad("top_k", "must be >= 0");
  if (!(p.top_p > 0 && p.top_p <= 1)) return bad("top_p", "must be in (0, 1]");
  if (!(p.min_p >= 0 && p.min_p <= 1)) return bad("min_p", "must be in [0, 1]");
  if (!(p.repetition_penalty > 0) || !std::isfinite(p.repetition_penalty))
    return bad("repetition_penalty", "must be > 0");
  if (!std::isfinite(p.presence_penalty) || std::fabs(p.presence_penalty) > 2)
    return bad("presence_penalty", "must be in [-2, 2]");
  if (!std::isfinite(p.frequency_penalty) || std::fabs(p.frequency_penalty) > 2)
    return bad("frequency_penalty", "must be in [-2, 2]");
  if (p.top_logprobs < 0 || p.top_logprobs > 20) return bad("top_logprobs", "must be in [0, 20]");
  return absl::OkStatus();
}

std::vector<int32_t> TopK(std::span<const float> values, int k) {
  k = std::min<int>(k, static_cast<int>(values.size()));
  std::vector<int32_t> idx(values.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int32_t a, int32_t b) { return values[a] > values[b] || (values[a] == values[b] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), better);
  idx.resize(k);
  return idx;
}

Sampler::Sampler(const SamplingParams& params) : p_(params), rng_(params.seed) {}

void Sampler::SeedChoice(int k) {
  if (k == 0) return;
  // SplitMix64's finalizer over the seed and the choice: nearby seeds and choices give
  // unrelated streams.
  uint64_t z = p_.seed + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(k);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  rng_.seed(z ^ (z >> 31));
}

// min-p and top-p keep a prefix of the tokens sorted by logit: the candidates are the
// tokens above a weight floor (relative to the most likely), sorted, once they are
// sure to hold that prefix (min_p at or above the floor; their mass reaching top_p of
// what min-p keeps); else the floor drops. Sorting a few hundred tokens instead of a
// 151k vocabulary saves ~25 ms a token on a 2-core Xeon.
std::vector<int32_t> Sampler::NucleusCandidates(std::span<const float> logits, double* kept_mass_out) const {
  const int n = static_cast<int>(logits.size());
  const float m = *std::max_element(logits.begin(), logits.end());
  auto weight = [&](int i) { return std::exp(static_cast<double>(logits[i] - m) / p_.temperature); };
  double kept_mass = 0;  // what min-p keeps (everything without it)
  for (int i = 0; i < n; ++i) {
    const double w = weight(i);
    if (w >= p_.min_p) kept_mass += w;
  }
  *kept_mass_out = kept_mass;
  std::vector<int32_t> out;
  for (double floor = 1e-4;; floor *= 1e-4) {
    const bool all = floor < 1e-280;
    out.clear();
    for (int i = 0; i < n; ++i) {
      if (all || weight(i) >= floor) out.push_back(i);
    }
    std::sort(out.begin(), out.end(),
              [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    if (all) return out;
    if (p_.min_p > 0 && p_.min_p < floor) continue;  // min-p keeps tokens below the floor
    if (p_.top_p >= 1.0f) return out;                // min-p's set is inside
    double cum = 0;
    for (int32_t i : out) {
      const double w = weight(i);
      if (w < p_.min_p) break;
      cum += w;
      if (cum >= p_.top_p * kept_mass) return out;
    }
  }
}

SampledToken Sampler::Sample(std::span<float> logits, std::span<const int32_t> history) {
  const int n = static_cast<int>(logits.size());
  SampledToken out;
  // Log-probabilities of the unmodified distribution.
  logprobs_.assign(logits.begin(), logits.end());
  const float lse = LogSumExp(logprobs_.data(), n);
  for (float& v : logprobs_) v -= lse;
  if (p_.top_logprobs > 0) {
    for (int32_t id : TopK(logprobs_, p_.top_logprobs)) out.top.push_back({id, logprobs_[id]});
  }

  // Penalties over the history.
  if (p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    counts_.clear();
    for (int32_t t : history) {
      if (t >= 0 && t < n) ++counts_[t];
    }
    for (const auto& [t, cnt] : counts_) {
      float& v = logits[t];
      if (p_.repetition_penalty != 1.0f) v = v > 0 ? v / p_.repetition_penalty : v * p_.repetition_penalty;
      v -= p_.presence_penalty + p_.frequency_penalty * static_cast<float>(cnt);
    }
  }

  int32_t chosen;
  if (p_.temperature == 0.0f) {
    chosen = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  } else if (p_.top_k <= 0 && p_.top_p >= 1.0f && p_.min_p <= 0) {
    // Nothing truncates the distribution: draw from it in vocabulary order, without
    // sorting (a sort of a 151k vocabulary costs a fifth of a small model's decode step).
    const float m = *std::max_element(logits.begin(), logits.end());
    probs_.resize(n);
    double total = 0;
    for (int i = 0; i < n; ++i) {
      probs_[i] = std::exp(static_cast<double>(logits[i] - m) / p_.temperature);
      total += probs_[i];
    }
    std::uniform_real_distribution<double> u(0.0, total);
    const double r = u(rng_);
    double cum = 0;
    chosen = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    for (int i = 0; i < n; ++i) {
      cum += probs_[i];
      if (r < cum && probs_[i] > 0) {
        chosen = i;
        break;
      }
    }
  } else {
    // Candidates sorted by logit, truncated by top-k, then probabilities with temperature.
    double kept_mass = -1;  // without top-k: the mass of all min-p keeps, beyond the candidates
    order_ = p_.top_k > 0 ? TopK(logits, std::min(p_.top_k, n)) : NucleusCandidates(logits, &kept_mass);
    const float m = logits[order_[0]];
    std::vector<double> probs(order_.size());
    for (size_t i = 0; i < order_.size(); ++i) {
      probs[i] = std::exp(static_cast<double>(logits[order_[i]] - m) / p_.temperature);
    }
    size_t keep = order_.size();
    if (p_.min_p > 0) {  // relative to the most likely token
      const double floor = p_.min_p * probs[0];
      keep = 1;
      while (keep < probs.size() && probs[keep] >= floor) ++keep;
    }
    if (p_.top_p < 1.0f) {
      double total = 0;
      for (size_t i = 0; i < keep; ++i) total += probs[i];
      if (kept_mass >= 0) total = kept_mass;
      double cum = 0;
      size_t i = 0;
      for (; i < keep; ++i) {
        cum += probs[i];
        if (cum >= p_.top_p * total) break;
      }
      keep = std::min(keep, i + 1);
    }
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += probs[i];
    std::uniform_real_distribution<double> u(0.0, total);
    const double r = u(rng_);
    double cum = 0;
    chosen = order_[keep - 1];
    for (size_t i = 0; i < keep; ++i) {
      cum += probs[i];
      if (r < cum) {
        chosen = order_[i];
        break;
      }
    }
  }
  out.token = chosen;
  out.logprob = logprobs_[chosen];
  return out;
}

}  // namespace ps
