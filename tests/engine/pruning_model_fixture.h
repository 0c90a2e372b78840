// The fixture of the pruning tests on stories260K (pruning_model_test.cc,
// pruning_kv_model_test.cc): greedy runs with a strategy, a prompt's logits, prompts.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/forward.h"
#include "engine/generator.h"
#include "engine/pruning/registry.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/engine/test_util.h"

namespace ps {

class PruningModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = testing::LoadOrDie(testing::StoriesGguf()).release(); }
  static void TearDownTestSuite() { delete model_; }

  std::vector<int32_t> Run(const std::vector<int32_t>& prompt, int n, PruningStrategy* strategy,
                           int64_t* rows = nullptr) {
    Generator gen(*model_, backend_);
    auto r = gen.Generate(prompt, SamplingParams{.temperature = 0},
                          StopCriteria{.max_new_tokens = n, .ignore_eos = true}, nullptr, strategy);
    EXPECT_TRUE(r.ok()) << r.status();
    if (rows != nullptr) *rows = r->prompt_rows_computed;
    return r->tokens;
  }
  std::unique_ptr<PruningStrategy> Make(const std::string& name, std::vector<std::string> args) {
    return testing::Strategy(model_->config(), name, args).Make(model_->config());
  }
  // The logits of a prompt's single forward step (every row's).
  std::vector<float> PromptLogits(const std::vector<int32_t>& prompt, PruningStrategy* strategy) {
    Transformer t(*model_, backend_);
    std::unique_ptr<KvCache> kv = testing::KvFor(*model_, backend_, 256);
    std::vector<int32_t> positions(prompt.size());
    std::iota(positions.begin(), positions.end(), 0);
    SeqInput in{.seq_id = 1, .tokens = prompt, .positions = positions, .strategy = strategy};
    ForwardOutput out;
    EXPECT_TRUE(t.Forward(std::span<const SeqInput>(&in, 1), *kv, &out).ok() && out.status[0].ok());
    return out.logits;
  }
  static float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float d = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
    return d;
  }
  static std::vector<int32_t> Prompt(int n) {
    std::vector<int32_t> p = {1};
    for (int i = 1; i < n; ++i) p.push_back(260 + (i * 37) % 240);
    return p;
  }

  static inline Model* model_ = nullptr;
  ThreadPool pool_{2};
  CpuBackend backend_{pool_};
};

}  // namespace ps
