// pruneserve-eval against a real server on stories260K at a small length: it
// completes, prints its table, appends one CSV row per request (accuracy: every
// task's prompt under every strategy, a variant NAME:key=value under its label;
// timing: the repeats), writes the summary and the auto table, and a second run
// with the same arguments resumes: no request is repeated; --table-only prints the
// table from the file with no server.
#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/command.h"
#include "tests/server/server_process.h"
#include "tools/eval/results.h"

namespace ps::testing {
namespace {

int Lines(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) ++n;
  return n;
}

TEST(Eval, SmokeOnStoriesAndResume) {
  ServerProcess server({"--model", std::string(PS_TESTDATA) + "/stories260K/stories260K.gguf", "--threads", "2",
                        "--prefill-chunk", "4096", "--max-batch-tokens", "4096",
                        // As scripts/eval.sh: every request computed cold (prompts share essays' openings).
                        "--prefix-cache", "off"});
  const std::string dir = ::testing::TempDir() + "/eval_smoke_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string csv = dir + "/results.csv", summary = dir + "/summary.csv", auto_table = dir + "/auto.json";
  const std::string cmd =
      std::string(PS_BINARY_DIR) + "/pruneserve-eval --addr " + server.address() + " --haystack " + PS_TESTDATA +
      "/haystack/paul_graham_essays --lengths 1024 --prompts 1024:1 --timing-prompts 1 --repeats 2 --csv " + csv +
      " --summary " + summary + " --auto-table " + auto_table +
      " --strategy-arg gemfilter.top_k=64 --strategy-arg gemfilter.filter_layer=1 --strategy-arg lazyllm.layers=1,3"
      " --strategy-arg lazyllm.keep=0.5,0.2 --strategy-arg sliminfer.layers=1,3"
      " --strategy-arg sliminfer.budgets=128,64 --strategy-arg streamingllm.recent=128 --strategy-arg snapkv.budget=128"
      " --strategies full,lazyllm,gemfilter,critiprefill,sliminfer,streamingllm,snapkv,gemfilter:top_k=4096";
  const CommandResult run = RunCommand(cmd + " 2>" + dir + "/log");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, ::testing::HasSubstr("length 1024 (timing on: "));
  EXPECT_THAT(run.output, ::testing::ContainsRegex("gemfilter:top_k=4096 +[0-9.]+ \\["));

  absl::StatusOr<std::vector<eval::ResultRow>> rows = eval::ReadResults(csv);
  ASSERT_TRUE(rows.ok()) << rows.status();
  std::map<std::string, int> accuracy, timing;  // strategy -> rows
  std::map<std::string, double> computed;
  for (const eval::ResultRow& r : *rows) {
    EXPECT_EQ(r.length, 1024);
    EXPECT_LE(r.prompt_tokens, 1024) << "prompts stay within their length";
    EXPECT_THAT(r.cpu, ::testing::HasSubstr(" family "));
    if (r.phase == "accuracy") {
      ++accuracy[r.strategy];
      computed[r.strategy] += r.computed_pct;
    } else {
      EXPECT_EQ(r.phase, "timing");
      EXPECT_EQ(r.completion_tokens, 64) << "timing requests generate 64 tokens";
      ++timing[r.strategy];
    }
    EXPECT_EQ(r.chosen, r.strategy.substr(0, r.strategy.find(':'))) << "Usage.strategy names what ran";
  }
  const std::vector<std::string> labels = {"full",      "lazyllm",      "gemfilter", "critiprefill",
                                           "sliminfer", "streamingllm", "snapkv",    "gemfilter:top_k=4096"};
  for (const std::string& s : labels) {
    EXPECT_EQ(accuracy[s], 7) << s << ": one prompt of each task";
    EXPECT_EQ(timing[s], 2) << s << ": one prompt, two repeats";
  }
  EXPECT_DOUBLE_EQ(computed["full"], 7 * 100.0);
  EXPECT_LT(computed["lazyllm"], 7 * 90.0);
  EXPECT_LT(computed["gemfilter"], 7 * 100.0);
  EXPECT_DOUBLE_EQ(computed["gemfilter:top_k=4096"], 7 * 100.0);  // the variant's own top_k keeps all
  EXPECT_DOUBLE_EQ(computed["snapkv"], 7 * 100.0) << "a dense prefill";
  EXPECT_GT(Lines(summary), 8 * 2);
  std::ifstream auto_in(auto_table);
  const std::string json((std::istreambuf_iterator<char>(auto_in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(json, ::testing::HasSubstr("\"length\": 1024"));
  EXPECT_THAT(json, ::testing::Not(::testing::HasSubstr("top_k=4096"))) << "variants are not auto's to pick";

  // Resumed: every row is there, so nothing runs again.
  const int lines = Lines(csv);
  const CommandResult again = RunCommand(cmd + " 2>" + dir + "/log2");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(Lines(csv), lines);
  EXPECT_EQ(Lines(dir + "/log2"), 0) << "no request was made";
  // The table from the file alone, with no server; the strategies asked for first, then the
  // file's others, so that auto's table written from a run of two still has them all.
  const std::string auto_of_two = dir + "/auto2.json";
  const CommandResult table = RunCommand(std::string(PS_BINARY_DIR) + "/pruneserve-eval --table-only --csv " + csv +
                                         " --strategies snapkv,full --addr 127.0.0.1:1 --auto-table " + auto_of_two);
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_THAT(table.output, ::testing::HasSubstr("length 1024 (timing on: "));
  EXPECT_THAT(table.output, ::testing::ContainsRegex("snapkv +[0-9.]+ \\[[0-9.]+,[0-9.]+\\] n=7"));
  EXPECT_LT(table.output.find("\nsnapkv "), table.output.find("\nlazyllm ")) << "the asked-for order first";
  std::ifstream auto_two_in(auto_of_two);
  const std::string json_of_two((std::istreambuf_iterator<char>(auto_two_in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(json_of_two, ::testing::HasSubstr("\"name\": \"lazyllm\"")) << "the file's other strategies too";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ps::testing
