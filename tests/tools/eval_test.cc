// pruneserve-eval against a real server on stories260K at small sizes: it
// completes, prints its table, and writes one CSV row per (prompt, strategy) with
// full's and the strategies' figures side by side, a variant (NAME:key=value) under its label.
#include <fstream>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/command.h"
#include "tests/server/server_process.h"

namespace ps::testing {
namespace {

TEST(Eval, SmokeOnStories) {
  ServerProcess server({"--model", std::string(PS_TESTDATA) + "/stories260K/stories260K.gguf", "--threads", "2"});
  const std::string csv = ::testing::TempDir() + "/eval_smoke_" + std::to_string(::getpid()) + ".csv";
  const std::string cmd =
      std::string(PS_BINARY_DIR) + "/pruneserve-eval --addr " + server.address() + " --haystack " + PS_TESTDATA +
      "/haystack/paul_graham_essays --lengths 300,500 --depths 0,50,100 --csv " + csv +
      " --strategy-arg gemfilter.top_k=64 --strategy-arg gemfilter.filter_layer=1 --strategy-arg lazyllm.layers=1,3"
      " --strategy-arg lazyllm.keep=0.5,0.2 --strategy-arg sliminfer.layers=1,3"
      " --strategy-arg sliminfer.budgets=128,64"
      " --strategies full,lazyllm,gemfilter,critiprefill,sliminfer,gemfilter:top_k=4096 2>/dev/null";
  const CommandResult run = RunCommand(cmd);
  const std::string& table = run.output;
  ASSERT_EQ(run.exit_code, 0) << table;
  EXPECT_THAT(table, ::testing::HasSubstr("strategy          length  accuracy"));
  EXPECT_THAT(table, ::testing::ContainsRegex("gemfilter +500 "));

  std::ifstream in(csv);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line,
            "model,task,length,depth,strategy,prompt_tokens,correct,ttft_s,prompt_computed_pct,kv_blocks,kv_device_"
            "blocks,answer");
  std::map<std::string, int> rows;  // strategy -> rows
  std::map<std::string, double> computed;
  while (std::getline(in, line)) {
    const std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(',', 11));
    ASSERT_EQ(f.size(), 12u) << line;
    EXPECT_LE(std::stoi(f[10]), std::stoi(f[9])) << "device-tier blocks are part of the blocks held";
    EXPECT_EQ(f[0], "llama");
    EXPECT_THAT(f[1], ::testing::AnyOf("needle", "magic", "passkey", "multikey"));
    EXPECT_THAT(f[2], ::testing::AnyOf("300", "500"));
    EXPECT_LE(std::stoi(f[5]), std::stoi(f[2])) << "prompts stay within their length";
    ++rows[f[4]];
    computed[f[4]] += std::stod(f[8]);
  }
  // 2 lengths x 3 depths x 4 tasks, under each strategy.
  EXPECT_EQ(rows, (std::map<std::string, int>{{"critiprefill", 24},
                                              {"full", 24},
                                              {"gemfilter", 24},
                                              {"lazyllm", 24},
                                              {"sliminfer", 24},
                                              {"gemfilter:top_k=4096", 24}}));
  EXPECT_DOUBLE_EQ(computed["full"], 24 * 100.0);
  EXPECT_LT(computed["lazyllm"], 24 * 90.0);  // 48% in prefill, decode-time revivals on top
  EXPECT_LT(computed["gemfilter"], 24 * 100.0);
  EXPECT_LT(computed["sliminfer"], 24 * 100.0);
  EXPECT_DOUBLE_EQ(computed["gemfilter:top_k=4096"], 24 * 100.0);  // the variant's own top_k keeps all
  std::remove(csv.c_str());
}

}  // namespace
}  // namespace ps::testing
