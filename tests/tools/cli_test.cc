// pruneserve-run as a user runs it: output on good input, an error message and a
// non-zero exit (never a crash) on bad arguments and broken model files.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <random>

#include "base/mapped_file.h"
#include "gtest/gtest.h"
#include "tests/command.h"

namespace {

// Exit code and stdout + stderr.
ps::testing::CommandResult RunCli(const std::string& args) {
  return ps::testing::RunCommand(std::string(PS_BINARY_DIR) + "/pruneserve-run " + args + " 2>&1");
}

const std::string kStories = std::string(PS_TESTDATA) + "/stories260K/stories260K.gguf";

TEST(Cli, GeneratesAndTokenizes) {
  auto r = RunCli("--model " + kStories + " --prompt 'Once upon a time' --max-new-tokens 8 --print-ids");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "432 383 286 261 376 298 315 421\n");  // llama.cpp's greedy tokens (greedy.tsv)
  r = RunCli("--model " + kStories + " --prompt 'Once upon a time' --max-new-tokens 8 --print-ids --kv-dtype f32");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "432 383 286 261 376 298 315 421\n");  // the same over an F32 KV
  r = RunCli("--model " + kStories + " --prompt 'Once upon a time' --tokenize");
  EXPECT_EQ(r.output, "1 403 407 261 378\n");
  r = RunCli("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("--max-new-tokens"), std::string::npos);
}

TEST(Cli, TakesAStrategyAndItsArguments) {
  const std::string base =
      "--model " + kStories + " --prompt 'Once upon a time' --max-new-tokens 8 --print-ids --stats";
  auto r = RunCli(base + " --strategy lazyllm --strategy-arg layers=1,2,3,4 --strategy-arg keep=1,1,1,1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("432 383 286 261 376 298 315 421\n"), std::string::npos) << r.output;  // keep 1.0 == full
  EXPECT_NE(r.output.find("strategy lazyllm: prompt tokens computed 100.0%"), std::string::npos) << r.output;
  r = RunCli(base + " --strategy lazyllm");  // default schedule on 5 tokens: 5, 5, 5, 2, 1 rows in layers 0-4
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("strategy lazyllm: prompt tokens computed 72.0%"), std::string::npos) << r.output;
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--strategy h2o", "unknown strategy 'h2o'"},
           {"--strategy gemfilter --strategy-arg top_k", "is not key=value"},
           {"--strategy gemfilter --strategy-arg topk=3", "no parameter 'topk'"},
           {"--strategy gemfilter --strategy-arg pool_kernel=2", "--strategy-arg.gemfilter.pool_kernel"}}) {
    r = RunCli(base + " " + args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
  }
}

TEST(Cli, BadArgumentsFailWithAMessage) {
  for (const std::string& args : std::vector<std::string>{
           "--prompt hi", "--model /nonexistent.gguf --prompt hi",
           "--model " + kStories + " --prompt hi --temperature -1", "--model " + kStories + " --prompt hi --top-p 0",
           "--model " + kStories + " --prompt hi --max-new-tokens 0",
           "--model " + kStories + " --prompt hi --max-new-tokens 100000",
           "--model " + kStories + " --prompt hi --threads abc", "--model " + kStories + " --bogus-flag",
           "--model " + kStories + " --prompt hi --kv-dtype fp8",
           "--model " + kStories + " --prompt '' --no-special"}) {
    const ps::testing::CommandResult r = RunCli(args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("pruneserve-run: "), std::string::npos) << args << "\n" << r.output;
  }
}

TEST(Cli, BrokenModelFilesFailWithAMessage) {
  auto bytes = ps::ReadFileToString(kStories);
  ASSERT_TRUE(bytes.ok());
  const std::string path = ::testing::TempDir() + "/broken_" + std::to_string(::getpid()) + ".gguf";
  std::mt19937 rng(3);
  std::vector<std::string> variants;
  for (size_t cut : {size_t{2}, size_t{16}, size_t{1000}, bytes->size() / 3, bytes->size() - 7}) {
    variants.push_back(bytes->substr(0, cut));
  }
  for (int i = 0; i < 12; ++i) {  // bit flips in the first 4 KiB (header, metadata, tensor table)
    std::string b = *bytes;
    b[std::uniform_int_distribution<size_t>(0, 4095)(rng)] ^= static_cast<char>(1 << (i % 8));
    variants.push_back(b);
  }
  int rejected = 0;
  for (size_t i = 0; i < variants.size(); ++i) {
    std::ofstream(path, std::ios::binary) << variants[i];
    const ps::testing::CommandResult r = RunCli("--model " + path + " --prompt 'Once upon' --max-new-tokens 4");
    ASSERT_LT(r.exit_code, 128) << "crashed on variant " << i << ":\n" << r.output;  // a signal is a crash
    if (r.exit_code != 0) {
      EXPECT_EQ(r.exit_code, 1);
      EXPECT_NE(r.output.find("pruneserve-run: "), std::string::npos) << r.output;
      ++rejected;
    }
  }
  std::remove(path.c_str());
  EXPECT_GE(rejected, 5);  // every truncated copy at least
}

}  // namespace
