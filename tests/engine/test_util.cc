#include "tests/engine/test_util.h"

#include "tests/engine/test_calibration.h"
#include "tests/test_env.h"

#include <sys/stat.h>

#include "absl/strings/str_split.h"
#include "base/mapped_file.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"

namespace ps::testing {

std::string TestData(const std::string& rel) { return TestDataDir() + "/" + rel; }
std::string StoriesGguf() { return TestData("stories260K/stories260K.gguf"); }

namespace {
std::string ModelIfFetched(const std::string& file) {
  const std::string p = std::string(PS_MODELS_DIR) + "/" + file;
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? p : "";
}
}  // namespace

std::string DefaultModelPath() { return ModelIfFetched("SmolLM2-135M-Instruct.Q4_1.gguf"); }
std::string EvalModelPath() { return ModelIfFetched("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"); }

std::vector<int32_t> ParseIds(const std::string& s) {
  std::vector<int32_t> out;
  for (absl::string_view t : absl::StrSplit(s, ' ', absl::SkipEmpty())) out.push_back(std::stoi(std::string(t)));
  return out;
}

std::vector<float> ParseFloats(const std::string& s) {
  std::vector<float> out;
  for (absl::string_view t : absl::StrSplit(s, ' ', absl::SkipEmpty())) out.push_back(std::stof(std::string(t)));
  return out;
}

std::vector<std::vector<std::string>> ReadTsv(const std::string& path) {
  auto text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status();
  std::vector<std::vector<std::string>> rows;
  bool header = true;
  for (absl::string_view line : absl::StrSplit(text.value_or(""), '\n', absl::SkipEmpty())) {
    if (line[0] == '#') continue;
    if (header) {
      header = false;
      continue;
    }
    rows.push_back(absl::StrSplit(line, '\t'));
  }
  return rows;
}

std::unique_ptr<Model> LoadOrDie(const std::string& path) {
  auto m = Model::Load(path);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  ThreadPool pool(2);
  CpuBackend cpu(pool);
  const absl::StatusOr<size_t> packed = PrepareWeights(**m, cpu);
  EXPECT_TRUE(packed.ok()) << packed.status();
  return std::move(*m);
}

std::vector<int32_t> Greedy(const Model& m, Backend& backend, const std::vector<int32_t>& prompt, int n) {
  Generator gen(m, backend, DType::kF32);
  auto r =
      gen.Generate(prompt, SamplingParams{.temperature = 0}, StopCriteria{.max_new_tokens = n, .ignore_eos = true});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->tokens : std::vector<int32_t>{};
}

PruningParams Strategy(const ModelConfig& config, const std::string& name, const std::vector<std::string>& args) {
  absl::StatusOr<StrategyDefaults> d = StrategyDefaults::ForModel(config, {}, TestCalibration(config));
  EXPECT_TRUE(d.ok()) << d.status();
  absl::StatusOr<PruningParams> p = d->WithArgs(name, args, "pruning");
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : PruningParams{};
}

std::unique_ptr<KvCache> KvFor(const Model& m, Backend& backend, int64_t max_tokens) {
  auto kv = OfflineKvCache(m, backend, max_tokens, 16, DType::kF32);
  EXPECT_TRUE(kv.ok()) << kv.status();
  return kv.ok() ? std::move(*kv) : nullptr;
}

std::string Unescape(const std::string& e) {
  std::string s;
  for (size_t i = 0; i < e.size(); ++i) {
    if (e[i] == '\\' && i + 1 < e.size()) {
      const char c = e[++i];
      s.push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c);
    } else {
      s.push_back(e[i]);
    }
  }
  return s;
}

void ExpectGreedyMatchesGolden(const Model& m, Backend& backend, const std::string& tsv_path, float near_tie) {
  const auto rows = ReadTsv(tsv_path);
  ASSERT_FALSE(rows.empty()) << tsv_path;
  for (const auto& row : rows) {
    ASSERT_EQ(row.size(), 4u) << tsv_path;
    const auto prompt = ParseIds(row[1]);
    const auto want = ParseIds(row[2]);
    const auto margins = ParseFloats(row[3]);
    EXPECT_EQ(m.tokenizer()->Encode(Unescape(row[0]), false, true), prompt) << "tokenisation of " << row[0];
    Generator gen(m, backend, DType::kF32);
    auto r = gen.Generate(prompt, SamplingParams{.temperature = 0, .top_logprobs = 2},
                          StopCriteria{.max_new_tokens = static_cast<int>(want.size()), .ignore_eos = true});
    ASSERT_TRUE(r.ok()) << r.status();
    size_t i = 0;
    while (i < want.size() && r->tokens[i] == want[i]) ++i;
    if (i < want.size()) {
      const auto& top = r->sampled[i].top;
      const float ours = top[0].logprob - top[1].logprob;  // logit margin: same as logprob margin
      EXPECT_LT(margins[i], near_tie) << "diverged at step " << i << " without a near-tie in llama.cpp";
      EXPECT_LT(ours, near_tie) << "diverged at step " << i << " without a near-tie here";
      std::printf(
          "golden '%.24s...' (%zu prompt tokens): %zu/%zu tokens equal; divergence at a near-tie "
          "(llama.cpp margin %.3f, ours %.3f)\n",
          row[0].c_str(), prompt.size(), i, want.size(), margins[i], ours);
    } else {
      std::printf("golden '%.24s...' (%zu prompt tokens): %zu/%zu tokens equal\n", row[0].c_str(), prompt.size(), i,
                  want.size());
    }
  }
}

}  // namespace ps::testing
