// stories260K (a real llama2.c model) against llama.cpp's reference outputs.
#include <cmath>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace ps {
namespace {

using testing::ParseFloats;
using testing::ParseIds;
using testing::ReadTsv;
using testing::TestData;

class StoriesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = testing::LoadOrDie(testing::StoriesGguf()).release(); }
  static void TearDownTestSuite() { delete model_; }
  static Model* model_;
  ThreadPool pool_{2};
  CpuBackend backend_{pool_};
};
Model* StoriesTest::model_ = nullptr;

TEST_F(StoriesTest, Greedy64MatchesLlamaCpp) {
  const auto rows = ReadTsv(TestData("stories260K/greedy.tsv"));
  ASSERT_EQ(rows.size(), 4u);
  for (const auto& row : rows) {
    const auto prompt = ParseIds(row[2]);
    const auto want = ParseIds(row[4]);
    ASSERT_EQ(want.size(), 64u);
    EXPECT_EQ(absl::StrJoin(testing::Greedy(*model_, backend_, prompt, 64), " "), absl::StrJoin(want, " "))
        << "prompt: " << row[1];
  }
}

TEST_F(StoriesTest, Greedy200FromBosMatchesLlamaCpp) {
  const auto rows = ReadTsv(TestData("stories260K/greedy_bos_n200.tsv"));
  ASSERT_EQ(rows.size(), 200u);
  std::vector<int32_t> want;
  for (const auto& r : rows) want.push_back(std::stoi(r[2]));
  const auto got = testing::Greedy(*model_, backend_, {1}, 200);
  EXPECT_EQ(absl::StrJoin(got, " "), absl::StrJoin(want, " "));
  auto text = ReadFileToString(TestData("stories260K/greedy_bos_n200.txt"));
  ASSERT_TRUE(text.ok());
  std::string want_text = *text;
  if (!want_text.empty() && want_text.back() == '\n') want_text.pop_back();  // the file ends with a newline
  EXPECT_EQ(model_->tokenizer()->Decode(got), want_text);
}

TEST_F(StoriesTest, LogitsAtEveryPromptPositionWithin1e4) {
  const auto rows = ReadTsv(TestData("stories260K/logits_all_positions.tsv"));
  ASSERT_EQ(rows.size(), 5u);
  std::vector<int32_t> tokens, positions;
  for (const auto& r : rows) {
    positions.push_back(std::stoi(r[0]));
    tokens.push_back(std::stoi(r[1]));
  }
  Transformer tf(*model_, backend_);
  auto kv = testing::KvFor(*model_, backend_, 512);
  SeqInput in{.seq_id = 1, .tokens = tokens, .positions = positions, .all_logits = true};
  ForwardOutput out;
  ASSERT_TRUE(tf.Forward({&in, 1}, *kv, &out).ok());
  ASSERT_TRUE(out.status[0].ok()) << out.status[0];
  ASSERT_EQ(out.row_count[0], 5);
  double max_err = 0;
  for (size_t p = 0; p < rows.size(); ++p) {
    const auto want = ParseFloats(rows[p][2]);
    ASSERT_EQ(want.size(), 512u);
    const auto got = out.Row(0, static_cast<int64_t>(p), 512);
    for (int i = 0; i < 512; ++i) max_err = std::max(max_err, std::fabs(double(got[i]) - want[i]));
  }
  EXPECT_LT(max_err, 1e-4);
  std::printf("max |logit - llama.cpp| over 5 positions x 512: %.3g\n", max_err);
}

// The same prompt in one batch, one token at a time, and split between two
// sequences of one ragged batch gives the same logits.
TEST_F(StoriesTest, BatchingDoesNotChangeLogits) {
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 383, 286};
  const int n = static_cast<int>(prompt.size());
  std::vector<int32_t> pos(n);
  for (int i = 0; i < n; ++i) pos[i] = i;
  Transformer tf(*model_, backend_);
  auto kv = testing::KvFor(*model_, backend_, 512);
  ForwardOutput whole;
  SeqInput in{.seq_id = 1, .tokens = prompt, .positions = pos};
  ASSERT_TRUE(tf.Forward({&in, 1}, *kv, &whole).ok());
  ForwardOutput step;
  for (int i = 0; i < n; ++i) {
    SeqInput s{.seq_id = 2, .tokens = {&prompt[i], 1}, .positions = {&pos[i], 1}};
    // Interleave another sequence in the same batch to exercise ragged batching.
    SeqInput other{.seq_id = 3, .tokens = {&prompt[i], 1}, .positions = {&pos[i], 1}};
    SeqInput both[2] = {other, s};
    ASSERT_TRUE(tf.Forward(both, *kv, &step).ok());
    ASSERT_TRUE(step.status[0].ok() && step.status[1].ok());
  }
  for (int v = 0; v < 512; ++v) {
    EXPECT_NEAR(step.Row(1, 0, 512)[v], whole.Row(0, 0, 512)[v], 1e-4f);
    EXPECT_NEAR(step.Row(0, 0, 512)[v], whole.Row(0, 0, 512)[v], 1e-4f);
  }
}

}  // namespace
}  // namespace ps
