// The evaluation model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M: Q5_0, Q8_0, Q4_K, Q6_K
// tensors) against independent references: gguf's Python dequantisation of real
// rows, llama.cpp's tokenisation of 20 strings and its greedy continuations of three
// prompts (one of ~2k tokens). Skips when the model is not fetched
// (scripts/fetch_model.sh --eval: 491 MB, not part of the default test run).
#include <cstring>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "kernels/cpu/quant.h"
#include "model/gguf.h"
#include "tests/engine/test_util.h"

namespace ps {
namespace {

// Greedy ties: both sides multiply with int8 activations, llama.cpp in Q8_0 / Q8_K
// blocks (of 32 / 256), we in blocks of 32 throughout; a divergence is allowed only where
// the top-2 margin is < 0.05.
constexpr float kNearTie = 0.05f;

std::string Golden(const std::string& file) { return std::string(PS_SOURCE_DIR) + "/tests/golden/" + file; }

class EvalModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = testing::EvalModelPath();
    if (path.empty()) return;
    file_ = GgufFile::Open(path)->release();
    model_ = testing::LoadOrDie(path).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete file_;
    model_ = nullptr;
    file_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "evaluation model not fetched: run scripts/fetch_model.sh --eval";
  }
  static GgufFile* file_;
  static Model* model_;
  ThreadPool pool_{2};
  CpuBackend backend_{pool_};
};
GgufFile* EvalModelTest::file_ = nullptr;
Model* EvalModelTest::model_ = nullptr;

TEST_F(EvalModelTest, DequantisesRealRowsAsGgufPython) {
  const auto rows = testing::ReadTsv(Golden("gguf_dequant_eval.tsv"));
  ASSERT_EQ(rows.size(), 4u);  // Q8_0, Q5_0, Q6_K, Q4_K
  for (const auto& row : rows) {
    const GgufTensor* t = file_->FindTensor(row[1]);
    ASSERT_NE(t, nullptr) << row[1];
    EXPECT_EQ(DTypeName(t->type), row[0]);
    std::vector<uint32_t> want;
    for (absl::string_view h : absl::StrSplit(row[3], ' ')) want.push_back(std::stoul(std::string(h), nullptr, 16));
    ASSERT_EQ(static_cast<int64_t>(want.size()), t->dims[0]);
    std::vector<float> got(want.size()), ref(want.size());
    DequantizeRow(t->type, t->data, got.data(), t->dims[0]);
    reference::DequantizeRow(t->type, t->data, ref.data(), t->dims[0]);
    for (size_t i = 0; i < want.size(); ++i) {
      float w;
      std::memcpy(&w, &want[i], 4);
      ASSERT_EQ(got[i], w) << row[1] << " element " << i;
      ASSERT_EQ(ref[i], w) << row[1] << " element " << i << " (reference)";
    }
  }
}

TEST_F(EvalModelTest, TokenisesAsLlamaCpp) {
  const auto rows = testing::ReadTsv(Golden("qwen05b_llamacpp_tokens.tsv"));
  ASSERT_EQ(rows.size(), 20u);
  for (const auto& row : rows) {
    const std::string text = testing::Unescape(row[0]);
    EXPECT_EQ(model_->tokenizer()->Encode(text, false, false), testing::ParseIds(row.size() > 1 ? row[1] : ""))
        << "'" << row[0] << "'";
  }
}

TEST_F(EvalModelTest, GreedyMatchesLlamaCppGolden) {
  testing::ExpectGreedyMatchesGolden(*model_, backend_, Golden("qwen05b_llamacpp.tsv"), kNearTie);
}

}  // namespace
}  // namespace ps
