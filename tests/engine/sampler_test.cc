// Sampling: greedy, seeds, truncation (top-k, top-p, min-p), penalties, logprobs,
// and stop strings.
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "engine/generator.h"
#include "engine/sampler.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.0f, 0.5f, 2.9f}; }

int32_t SampleOnce(SamplingParams p, std::vector<float> logits, std::vector<int32_t> history = {}) {
  Sampler s(p);
  return s.Sample(logits, history).token;
}

TEST(Sampler, GreedyPicksArgmax) { EXPECT_EQ(SampleOnce({.temperature = 0}, Logits()), 1); }

TEST(Sampler, SameSeedSameTokens) {
  auto run = [](uint64_t seed) {
    Sampler s({.temperature = 1.0f, .seed = seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) {
      auto l = Logits();
      out.push_back(s.Sample(l, {}).token);
    }
    return out;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

// Untruncated sampling (drawn in vocabulary order, without a sort) follows the
// tempered softmax: frequencies over 20,000 draws within 1.5 points of each probability,
// and a token at -inf (a grammar's mask) is never drawn.
TEST(Sampler, UntruncatedDrawsFollowTheTemperedSoftmax) {
  std::vector<float> logits = Logits();
  logits.push_back(-std::numeric_limits<float>::infinity());
  for (float temperature : {0.7f, 1.0f, 2.0f}) {
    std::vector<double> want(logits.size());
    double total = 0;
    for (size_t i = 0; i < logits.size(); ++i) total += want[i] = std::exp(logits[i] / temperature);
    Sampler s({.temperature = temperature, .seed = 5});
    std::vector<int> seen(logits.size(), 0);
    constexpr int kDraws = 20000;
    for (int i = 0; i < kDraws; ++i) {
      std::vector<float> l = logits;
      ++seen[s.Sample(l, {}).token];
    }
    for (size_t i = 0; i < logits.size(); ++i) {
      EXPECT_NEAR(static_cast<double>(seen[i]) / kDraws, want[i] / total, 0.015)
          << "token " << i << " at " << temperature;
    }
    EXPECT_EQ(seen.back(), 0);
  }
}

// Top-p and min-p sort only the candidates that hold their prefix: the same tokens as
// sorting the whole vocabulary (the reference below, the sampler's former way) for the
// same seeds, on 2,000-token distributions.
TEST(Sampler, NucleusFromCandidatesEqualsAFullSort) {
  auto reference = [](const SamplingParams& p, std::vector<float> logits) {
    std::mt19937_64 rng(p.seed);
    const std::vector<int32_t> order = TopK(logits, static_cast<int>(logits.size()));
    std::vector<double> probs(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      probs[i] = std::exp(static_cast<double>(logits[order[i]] - logits[order[0]]) / p.temperature);
    }
    size_t keep = order.size();
    if (p.min_p > 0) {
      keep = 1;
      while (keep < probs.size() && probs[keep] >= p.min_p * probs[0]) ++keep;
    }
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += probs[i];
    double cum = 0;
    size_t i = 0;
    for (; i < keep && p.top_p < 1.0f; ++i) {
      cum += probs[i];
      if (cum >= p.top_p * total) break;
    }
    if (p.top_p < 1.0f) keep = std::min(keep, i + 1);
    total = 0;
    for (size_t j = 0; j < keep; ++j) total += probs[j];
    std::uniform_real_distribution<double> u(0.0, total);
    const double r = u(rng);
    cum = 0;
    for (size_t j = 0; j < keep; ++j) {
      cum += probs[j];
      if (r < cum) return order[j];
    }
    return order[keep - 1];
  };
  std::mt19937 gen(3);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  int same = 0, runs = 0;
  for (float top_p : {0.5f, 0.9f, 0.99f, 1.0f}) {
    for (float min_p : {0.0f, 0.01f, 0.2f}) {
      if (top_p == 1.0f && min_p == 0.0f) continue;  // untruncated: drawn without a sort (tested above)
      for (float temperature : {0.6f, 1.3f}) {
        for (uint64_t seed = 0; seed < 40; ++seed) {
          std::vector<float> logits(2000);
          for (float& l : logits) l = logit(gen);
          const SamplingParams p{.temperature = temperature, .top_p = top_p, .min_p = min_p, .seed = seed};
          std::vector<float> copy = logits;
          same += Sampler(p).Sample(copy, {}).token == reference(p, logits);
          ++runs;
        }
      }
    }
  }
  // Sums in another order may move a boundary token by a rounding error, rarely.
  EXPECT_GE(same, runs - 2) << same << " of " << runs;
}

TEST(Sampler, TopKOneIsGreedy) {
  for (uint64_t seed = 0; seed < 20; ++seed)
    EXPECT_EQ(SampleOnce({.temperature = 5.0f, .top_k = 1, .seed = seed}, Logits()), 1);
}

TEST(Sampler, TopKRestrictsSupport) {
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const int32_t t = SampleOnce({.temperature = 10.0f, .top_k = 2, .seed = seed}, Logits());
    EXPECT_TRUE(t == 1 || t == 4) << t;
  }
}

TEST(Sampler, TopPKeepsSmallestNucleus) {
  // probabilities at T=1: token 1 ~0.39, token 4 ~0.35, token 2 ~0.14 ... top_p 0.5 keeps {1, 4}
  std::map<int32_t, int> seen;
  for (uint64_t seed = 0; seed < 300; ++seed)
    ++seen[SampleOnce({.temperature = 1.0f, .top_p = 0.5f, .seed = seed}, Logits())];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[4], 0);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  // min_p 0.5: keep tokens with p >= 0.5 * p_max -> tokens 1 (p_max) and 4 (e^-0.1 ~ 0.9 of it)
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const int32_t t = SampleOnce({.temperature = 1.0f, .min_p = 0.5f, .seed = seed}, Logits());
    EXPECT_TRUE(t == 1 || t == 4) << t;
  }
}

TEST(Sampler, PenaltiesDemoteSeenTokens) {
  EXPECT_EQ(SampleOnce({.temperature = 0, .repetition_penalty = 2.0f}, Logits(), {1}), 4);     // 3/2 < 2.9
  EXPECT_EQ(SampleOnce({.temperature = 0, .presence_penalty = 0.2f}, Logits(), {1}), 4);       // 2.8 < 2.9
  EXPECT_EQ(SampleOnce({.temperature = 0, .frequency_penalty = 0.06f}, Logits(), {1, 1}), 4);  // 2.88
  EXPECT_EQ(SampleOnce({.temperature = 0, .frequency_penalty = 0.06f}, Logits(), {1}), 1);     // 2.94
}

TEST(Sampler, LogprobsOfRawDistribution) {
  Sampler s({.temperature = 0, .top_logprobs = 3});
  auto l = Logits();
  const SampledToken t = s.Sample(l, {});
  double z = 0;
  for (float v : Logits()) z += std::exp(v);
  EXPECT_NEAR(t.logprob, 3.0 - std::log(z), 1e-5);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].token, 1);
  EXPECT_EQ(t.top[1].token, 4);
  EXPECT_EQ(t.top[2].token, 2);
  EXPECT_NEAR(t.top[1].logprob, 2.9 - std::log(z), 1e-5);
}

TEST(Sampler, ValidationNamesTheField) {
  EXPECT_NE(ValidateSamplingParams({.temperature = -1}).message().find("temperature"), std::string::npos);
  EXPECT_NE(ValidateSamplingParams({.top_p = 0}).message().find("top_p"), std::string::npos);
  EXPECT_NE(ValidateSamplingParams({.top_p = 1.5f}).message().find("top_p"), std::string::npos);
  EXPECT_NE(ValidateSamplingParams({.top_k = -1}).message().find("top_k"), std::string::npos);
  EXPECT_NE(ValidateSamplingParams({.min_p = 2}).message().find("min_p"), std::string::npos);
  EXPECT_NE(ValidateSamplingParams({.repetition_penalty = 0}).message().find("repetition_penalty"), std::string::npos);
  EXPECT_TRUE(ValidateSamplingParams({}).ok());
}

TEST(StopMatcher, HoldsBackPartialMatchesAndStops) {
  StopMatcher m({"END", "\n\n"});
  std::string matched;
  EXPECT_EQ(m.Push("Hello E", &matched), "Hello ");
  EXPECT_EQ(m.Push("N", &matched), "");
  EXPECT_EQ(m.Push("X more", &matched), "ENX more");
  EXPECT_TRUE(matched.empty());
  EXPECT_EQ(m.Push(" tail\n", &matched), " tail");
  EXPECT_EQ(m.Push("\nrest", &matched), "");
  EXPECT_EQ(matched, "\n\n");
}

TEST(TopK, OrdersByValueThenIndex) {
  std::vector<float> v = {1, 5, 5, 2};
  EXPECT_EQ(TopK(v, 3), (std::vector<int32_t>{1, 2, 3}));
}

}  // namespace
}  // namespace ps
