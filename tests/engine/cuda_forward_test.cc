// The whole forward pass on the CUDA backend (the plug-in, as the server opens it):
// stories260K against llama.cpp's golden tokens and logits, and every strategy's
// greedy tokens equal to the CPU backend's. Skips without a GPU.
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/engine/test_calibration.h"
#include "tests/engine/test_util.h"

namespace ps {
namespace {

using testing::ParseFloats;
using testing::ParseIds;
using testing::ReadTsv;
using testing::TestData;

class CudaForwardTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::setenv("PS_CUDA_PLUGIN", PS_BINARY_DIR "/libps_cuda.so", /*overwrite=*/0);  // a bundle sets its own
    model_ = testing::LoadOrDie(testing::StoriesGguf()).release();
  }
  static void TearDownTestSuite() { delete model_; }
  void SetUp() override {
    std::string note;
    auto b = CreateBackend("cuda", pool_, {}, &note);
    if (!b.ok()) GTEST_SKIP() << b.status();
    gpu_ = std::move(*b);
  }
  std::vector<int32_t> Generate(Backend& backend, const std::vector<int32_t>& prompt, int n,
                                const PruningParams& pruning) {
    Generator gen(*model_, backend);
    const std::unique_ptr<PruningStrategy> strategy = pruning.Make(model_->config());
    auto r = gen.Generate(prompt, SamplingParams{.temperature = 0},
                          StopCriteria{.max_new_tokens = n, .ignore_eos = true}, nullptr, strategy.get());
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->tokens : std::vector<int32_t>{};
  }

  static inline Model* model_ = nullptr;
  ThreadPool pool_{2};
  CpuBackend cpu_{pool_};
  std::unique_ptr<Backend> gpu_;
};

TEST_F(CudaForwardTest, StoriesGreedyMatchesLlamaCpp) {
  const auto rows = ReadTsv(TestData("stories260K/greedy.tsv"));
  ASSERT_EQ(rows.size(), 4u);
  for (const auto& row : rows) {
    EXPECT_EQ(absl::StrJoin(testing::Greedy(*model_, *gpu_, ParseIds(row[2]), 64), " "),
              absl::StrJoin(ParseIds(row[4]), " "))
        << "prompt: " << row[1];
  }
}

TEST_F(CudaForwardTest, StoriesLogitsAtEveryPromptPosition) {
  const auto rows = ReadTsv(TestData("stories260K/logits_all_positions.tsv"));
  std::vector<int32_t> tokens, positions;
  for (const auto& r : rows) {
    positions.push_back(std::stoi(r[0]));
    tokens.push_back(std::stoi(r[1]));
  }
  Transformer tf(*model_, *gpu_);
  auto kv = testing::KvFor(*model_, *gpu_, 512);
  SeqInput in{.seq_id = 1, .tokens = tokens, .positions = positions, .all_logits = true};
  ForwardOutput out;
  ASSERT_TRUE(tf.Forward({&in, 1}, *kv, &out).ok());
  ASSERT_TRUE(out.status[0].ok()) << out.status[0];
  double max_err = 0;
  for (size_t p = 0; p < rows.size(); ++p) {
    const auto want = ParseFloats(rows[p][2]);
    const auto got = out.Row(0, static_cast<int64_t>(p), 512);
    for (int i = 0; i < 512; ++i) max_err = std::max(max_err, std::fabs(double(got[i]) - want[i]));
  }
  EXPECT_LT(max_err, 1e-3);
  std::printf("max |logit - llama.cpp| on cuda over %zu positions x 512: %.3g\n", rows.size(), max_err);
}

TEST_F(CudaForwardTest, EveryStrategyGivesTheCpuTokens) {
  std::vector<int32_t> prompt = {1};
  for (int k = 0; k < 150; ++k) prompt.push_back(260 + (k * 17) % 250);
  auto defaults = StrategyDefaults::ForModel(model_->config(), {}, testing::TestCalibration(model_->config()));
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  const std::vector<std::pair<std::string, std::vector<std::string>>> strategies = {
      {"full", {}},
      {"lazyllm", {}},
      {"gemfilter", {"top_k=40", "filter_layer=2"}},
      {"critiprefill", {"segment_size=16", "block_size=4", "budget=8", "dense_prefix=0"}},
      {"sliminfer", {"layers=1,3", "budgets=48,24", "block_size=8", "unit_size=4"}},
      {"pod", {"sinks=4", "recent=16"}}};
  for (const auto& [name, args] : strategies) {
    absl::StatusOr<PruningParams> p = defaults->WithArgs(name, args, "pruning");
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(absl::StrJoin(Generate(*gpu_, prompt, 24, *p), " "), absl::StrJoin(Generate(cpu_, prompt, 24, *p), " "))
        << name;
  }
}

}  // namespace
}  // namespace ps
