// The real default model (SmolLM2-135M-Instruct Q4_1): quantised kernels against
// the same weights dequantised to F32, llama.cpp's greedy output as a peer golden,
// and a sensible chat answer. Needs scripts/fetch_model.sh (the README's test
// command runs it).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/mapped_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/quant.h"
#include "model/tokenizer/chat_template.h"
#include "tests/engine/test_util.h"

namespace ps {
namespace {

using testing::ParseFloats;
using testing::ParseIds;

class DefaultModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = testing::DefaultModelPath();
    if (path.empty()) return;
    file_ = GgufFile::Open(path)->release();
    model_ = testing::LoadOrDie(path).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete file_;
  }
  void SetUp() override { ASSERT_NE(model_, nullptr) << "default model missing: run scripts/fetch_model.sh"; }
  // The same weights with every quantised tensor dequantised to F32 in memory.
  std::unique_ptr<Model> Dequantised() {
    TensorMap tensors;
    for (const GgufTensor& t : file_->tensors()) {
      if (t.type == DType::kF32) {
        tensors[t.name] = {t.type, t.dims, t.data, t.nbytes};
        continue;
      }
      auto& buf = f32_[t.name];
      buf.resize(t.num_elements());
      const int64_t cols = t.dims[0], rows = t.num_elements() / cols;
      for (int64_t r = 0; r < rows; ++r) {
        DequantizeRow(t.type, t.data + r * RowBytes(t.type, cols), buf.data() + r * cols, cols);
      }
      tensors[t.name] = {DType::kF32, t.dims, reinterpret_cast<const uint8_t*>(buf.data()), buf.size() * 4};
    }
    auto m = Model::Build(model_->config(), tensors, nullptr, nullptr);
    EXPECT_TRUE(m.ok()) << m.status();
    return std::move(*m);
  }

  static GgufFile* file_;
  static Model* model_;
  std::map<std::string, std::vector<float>> f32_;
  ThreadPool pool_{2};
  CpuBackend backend_{pool_};
};
GgufFile* DefaultModelTest::file_ = nullptr;
Model* DefaultModelTest::model_ = nullptr;

// The quantised kernels vs the same weights dequantised to F32. Default kernels
// (F32 activations) differ only in summation order: greedy tokens equal and logits
// within 0.01 (float rounding, ~1e-6 relative, accumulated over 30 layers on logits
// of magnitude ~20). The int8-activation kernels (llama.cpp's numerics, opt-in) are
// measured and printed, not asserted: SmolLM2's outlier activations make int8
// rounding visible (the figures are in the note).
TEST_F(DefaultModelTest, QuantisedKernelsAgreeWithDequantisedWeights) {
  auto f32 = Dequantised();
  const Tokenizer* tok = model_->tokenizer();
  const std::vector<std::string> texts = {
      "The history of the Roman Empire spans many centuries, beginning with the founding of the city of Rome and",
      "In mathematics, a prime number is a natural number greater than one that has no positive divisors other",
      "Photosynthesis is the process by which green plants and some other organisms use sunlight to synthesize"};
  const int vocab = model_->config().n_vocab;
  auto argmax = [&](const float* l) { return static_cast<int32_t>(std::max_element(l, l + vocab) - l); };
  for (bool int8 : {false, true}) {
    CpuBackend quantised(pool_, CpuBackendOptions{.int8_activations = int8});
    double worst = 0, sum = 0;
    int64_t count = 0;
    int equal_prompts = 0;
    for (const std::string& text : texts) {
      auto prompt = tok->Encode(text, true, false);
      prompt.resize(32);
      ASSERT_EQ(prompt.size(), 32u);
      // Both models decode 32 tokens along the F32 model's greedy path; the quantised
      // model's greedy choice is compared at every step (equal choices all along ==
      // equal greedy generations) and so are the full logits.
      Transformer tq(*model_, quantised), tf(*f32, backend_);
      std::unique_ptr<KvCache> kq = testing::KvFor(*model_, quantised, 128), kf = testing::KvFor(*f32, backend_, 128);
      std::vector<int32_t> pos(prompt.size());
      for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
      SeqInput in{.seq_id = 1, .tokens = prompt, .positions = pos};
      ForwardOutput oq, of;
      ASSERT_TRUE(tq.Forward({&in, 1}, *kq, &oq).ok() && oq.status[0].ok());
      ASSERT_TRUE(tf.Forward({&in, 1}, *kf, &of).ok() && of.status[0].ok());
      bool same = true;
      for (int step = 0; step < 32; ++step) {
        const int32_t next = argmax(of.logits.data());
        same = same && argmax(oq.logits.data()) == next;
        for (int v = 0; v < vocab; ++v) {
          const double d = std::fabs(oq.logits[v] - of.logits[v]);
          worst = std::max(worst, d);
          sum += d;
          ++count;
        }
        const int32_t p = static_cast<int32_t>(prompt.size()) + step;
        SeqInput a{.seq_id = 1, .tokens = {&next, 1}, .positions = {&p, 1}};
        ASSERT_TRUE(tq.Forward({&a, 1}, *kq, &oq).ok() && oq.status[0].ok());
        ASSERT_TRUE(tf.Forward({&a, 1}, *kf, &of).ok() && of.status[0].ok());
      }
      equal_prompts += same;
      if (!int8) {
        EXPECT_TRUE(same) << "greedy tokens differ for: " << text;
      }
    }
    std::printf("%s activations vs F32 weights: greedy equal for %d/3 prompts; max |logit diff| %.4f, mean %.5f\n",
                int8 ? "int8" : "F32 ", equal_prompts, worst, sum / count);
    if (!int8) {
      EXPECT_LT(worst, 0.01);
      EXPECT_LT(sum / count, 1e-3);
    }
  }
}

// llama.cpp's greedy tokens (tools/record_llamacpp_golden.py, F32 KV cache).
// Tokens must be equal up to the first step where both engines see a near-tie.
// Why 0.25 and not 0.05: llama.cpp quantises activations to int8, and SmolLM2's
// outlier activations make that noisy; its logits differ from the same weights in
// F32 by 0.16 on average and up to ~1.4 on these prompts (measured, see the note),
// so ties closer than that are decided by rounding on either side.
constexpr float kNearTie = 0.25f;

TEST_F(DefaultModelTest, GreedyMatchesLlamaCppGolden) {
  testing::ExpectGreedyMatchesGolden(*model_, backend_,
                                     std::string(PS_SOURCE_DIR) + "/tests/golden/smollm2_q4_1_llamacpp.tsv", kNearTie);
}

TEST_F(DefaultModelTest, AnswersChatSensibly) {
  const Tokenizer* tok = model_->tokenizer();
  const absl::StatusOr<ChatTemplatePtr> t = ChatTemplate::Load(*tok, "");
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<ChatMessage> msgs = {{"user", "What is the capital of France? Answer in one sentence."}};
  // SmolLM2's own template adds its default system turn.
  const absl::StatusOr<std::string> text = (*t)->Apply(msgs);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_THAT(*text, ::testing::StartsWith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"));
  Generator gen(*model_, backend_, DType::kF32);
  auto r = gen.Generate(*(*t)->Encode(msgs), SamplingParams{.temperature = 0}, StopCriteria{.max_new_tokens = 32});
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->text.find("Paris"), std::string::npos) << r->text;
  EXPECT_EQ(r->finish_reason, FinishReason::kStop) << "the answer should end with <|im_end|>";
}

// Each KV type against an F32 KV on a real prompt: the greedy tokens are equal up to
// the first step where the F32 run sees a near-tie (top-1/top-2 margin below
// kNearTie), and the rounding of K and V moves the first step's logits by little
// (printed; bounded per type at about 3x what this prompt measured: F16 0.055,
// BF16 0.15, Q8_0 0.10 on an AVX2 EPYC). Q8_0 rounds each value to 1/254 of its
// 32-value block's largest, BF16 to 2^-9 relative, F16 to 2^-12.
TEST_F(DefaultModelTest, EveryKvTypeStaysCloseToF32) {
  const std::string text = *ReadFileToString(testing::TestData("haystack/paul_graham_essays/addiction.txt"));
  const std::vector<int32_t> prompt = model_->tokenizer()->Encode(text.substr(0, 2400), true, false);
  constexpr int kTokens = 32;
  auto run = [&](DType dtype) {
    Generator gen(*model_, backend_, dtype);
    auto r = gen.Generate(prompt, SamplingParams{.temperature = 0, .top_logprobs = 2},
                          StopCriteria{.max_new_tokens = kTokens, .ignore_eos = true});
    EXPECT_TRUE(r.ok()) << r.status();
    return *std::move(r);
  };
  const GenerationResult want = run(DType::kF32);
  for (auto [dtype, tolerance] : {std::pair{DType::kF16, 0.15f}, {DType::kBF16, 0.4f}, {DType::kQ8_0, 0.4f}}) {
    const GenerationResult got = run(dtype);
    const std::string name(DTypeName(dtype));
    // The first step's logprobs of the top token and the runner-up (logit differences).
    const float first_diff = std::fabs(got.sampled[0].top[0].logprob - want.sampled[0].top[0].logprob);
    int same = 0;
    while (same < kTokens && got.tokens[same] == want.tokens[same]) ++same;
    std::printf("%s KV, %zu prompt tokens: %d/%d greedy tokens as F32's, first step's top logprob off by %.4f\n",
                name.c_str(), prompt.size(), same, kTokens, first_diff);
    EXPECT_LT(first_diff, tolerance) << name;
    if (same < kTokens) {
      const auto& top = want.sampled[same].top;
      EXPECT_LT(top[0].logprob - top[1].logprob, kNearTie)
          << name << " diverged at step " << same << " without a near-tie";
    }
  }
}

// Pruning settings that prune nothing (LazyLLM keeping every token, GemFilter with
// top_k >= the prompt) give exactly full attention's tokens on the real model.
TEST_F(DefaultModelTest, NoOpPruningGivesExactlyFullTokens) {
  const std::string text = *ReadFileToString(testing::TestData("haystack/paul_graham_essays/addiction.txt"));
  std::vector<int32_t> prompt = model_->tokenizer()->Encode(text.substr(0, 1200), true, false);
  const int n = static_cast<int>(prompt.size());
  ASSERT_GT(n, 200);
  auto run = [&](const std::string& name, std::vector<std::string> args) {
    const std::unique_ptr<PruningStrategy> strategy =
        testing::Strategy(model_->config(), name, args).Make(model_->config());
    Generator gen(*model_, backend_, DType::kF32);
    return gen
        .Generate(prompt, SamplingParams{.temperature = 0}, StopCriteria{.max_new_tokens = 24, .ignore_eos = true},
                  nullptr, strategy.get())
        ->tokens;
  };
  const std::vector<int32_t> full = run("full", {});
  EXPECT_EQ(run("lazyllm", {"layers=6,12,18,24", "keep=1,1,1,1"}), full);
  EXPECT_EQ(run("gemfilter", {absl::StrCat("top_k=", n)}), full);
  // And the defaults do prune: the tokens differ at least somewhere.
  EXPECT_NE(run("gemfilter", {"top_k=64"}), full);
}

}  // namespace
}  // namespace ps
