#include "tests/engine/test_util.h"

#include <sys/stat.h>

#include "absl/strings/str_split.h"
#include "base/mapped_file.h"
#include "gtest/gtest.h"

namespace ps::testing {

std::string TestData(const std::string& rel) { return std::string(PS_TESTDATA) + "/" + rel; }
std::string StoriesGguf() { return TestData("stories260K/stories260K.gguf"); }

std::string DefaultModelPath() {
  const std::string p = std::string(PS_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? p : "";
}

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
  return m.ok() ? std::move(*m) : nullptr;
}

std::vector<int32_t> Greedy(const Model& m, Backend& backend, const std::vector<int32_t>& prompt, int n) {
  Generator gen(m, backend);
  auto r =
      gen.Generate(prompt, SamplingParams{.temperature = 0}, StopCriteria{.max_new_tokens = n, .ignore_eos = true});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->tokens : std::vector<int32_t>{};
}

PruningParams Strategy(const ModelConfig& config, const std::string& name, const std::vector<std::string>& args) {
  absl::StatusOr<StrategyDefaults> d = StrategyDefaults::ForModel(config);
  EXPECT_TRUE(d.ok()) << d.status();
  absl::StatusOr<PruningParams> p = d->WithArgs(name, args, "pruning");
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : PruningParams{};
}

std::unique_ptr<KvCache> KvFor(const Model& m, Backend& backend, int64_t max_tokens) {
  auto kv = OfflineKvCache(m, backend, max_tokens);
  EXPECT_TRUE(kv.ok()) << kv.status();
  return kv.ok() ? std::move(*kv) : nullptr;
}

}  // namespace ps::testing
