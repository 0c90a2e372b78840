// The load generator's parts without a server: arrival gaps, the dataset and
// strategy-mix parsers, synthetic prompts, and the vLLM-defined figures.
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "loadtest/arrivals.h"
#include "loadtest/report.h"
#include "loadtest/workload.h"

namespace ps::loadtest {
namespace {

// Mean and coefficient of variation of n gaps.
std::pair<double, double> GapStats(const ArrivalOptions& o, int n) {
  Arrivals a(o);
  double sum = 0, sum2 = 0;
  for (int i = 0; i < n; ++i) {
    const double g = a.NextGap();
    sum += g;
    sum2 += g * g;
  }
  const double mean = sum / n;
  return {mean, std::sqrt(sum2 / n - mean * mean) / mean};
}

TEST(Arrivals, PoissonAndGammaGapsHaveTheRateAndBurstiness) {
  // Gamma(k, 1/(rate k)): mean 1/rate, coefficient of variation 1/sqrt(k).
  for (double k : {1.0, 0.25, 4.0}) {
    auto [mean, cv] = GapStats({.rate = 8, .burstiness = k, .seed = 7}, 200000);
    EXPECT_NEAR(mean, 1.0 / 8, 0.01 / 8) << k;
    EXPECT_NEAR(cv, 1 / std::sqrt(k), 0.03 / std::sqrt(k)) << k;
  }
  Arrivals unpaced({.rate = std::numeric_limits<double>::infinity()});
  EXPECT_TRUE(unpaced.unpaced());
  EXPECT_EQ(unpaced.NextGap(), 0);
}

TEST(Report, PercentilesInterpolateAsNumpy) {
  // numpy.percentile([1, 2, 3, 4, 10], q) for q = 0, 50, 90, 99, 100.
  const std::vector<double> v = {10, 2, 4, 1, 3};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 3);
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 7.6);
  EXPECT_DOUBLE_EQ(Percentile(v, 99), 9.76);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 10);
  EXPECT_DOUBLE_EQ(Percentile({5}, 99), 5);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
}

TEST(Report, SummaryFollowsVllmDefinitions) {
  std::vector<RequestRecord> r(5);
  // Two completed full requests, one completed lazyllm request, one cancelled, one failed.
  r[0] = {.strategy = "full",
          .outcome = Outcome::kCompleted,
          .prompt_tokens = 100,
          .output_tokens = 11,
          .ttft = 0.5,
          .e2e = 1.5,
          .itl = {0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1}};
  r[1] = {.strategy = "full",
          .outcome = Outcome::kCompleted,
          .prompt_tokens = 50,
          .output_tokens = 1,
          .ttft = 0.2,
          .e2e = 0.2};
  r[2] = {.strategy = "lazyllm",
          .outcome = Outcome::kCompleted,
          .prompt_tokens = 10,
          .output_tokens = 3,
          .ttft = 0.1,
          .e2e = 0.5,
          .itl = {0.2, 0.2}};
  r[3] = {.strategy = "full", .outcome = Outcome::kCancelled, .status_code = 1, .prompt_tokens = 7, .output_tokens = 2};
  r[4] = {.strategy = "lazyllm", .outcome = Outcome::kFailed, .status_code = 13};
  const nlohmann::json s = Summarize(r, 2.0, {.ttft_ms = 300, .tpot_ms = 150});
  EXPECT_EQ(s["sent"], 5);
  EXPECT_EQ(s["completed"], 3);
  EXPECT_EQ(s["cancelled"], 1);
  EXPECT_EQ(s["failed"], 1);
  EXPECT_EQ(s["failures"]["13"], 1);
  EXPECT_EQ(s["total_input_tokens"], 160);  // completed requests only
  EXPECT_EQ(s["total_output_tokens"], 15);
  EXPECT_DOUBLE_EQ(s["request_throughput"], 1.5);
  EXPECT_DOUBLE_EQ(s["output_throughput"], 7.5);
  EXPECT_DOUBLE_EQ(s["total_token_throughput"], 87.5);
  // TPOT = (E2E - TTFT) / (n - 1) of requests with n > 1: 100 ms and 200 ms.
  EXPECT_DOUBLE_EQ(s["mean_tpot_ms"], 150);
  EXPECT_DOUBLE_EQ(s["median_ttft_ms"], 200);
  EXPECT_NEAR(s["mean_itl_ms"].get<double>(), 1400.0 / 12, 1e-9);  // every gap, all requests
  EXPECT_DOUBLE_EQ(s["p99_e2el_ms"], Percentile({1.5, 0.2, 0.5}, 99) * 1e3);
  // Within the SLOs: r[1] only (r[0]'s TTFT is 500 ms > 300, r[2]'s TPOT 200 ms > 150): one in 2 s.
  EXPECT_DOUBLE_EQ(s["request_goodput"], 0.5);
  EXPECT_EQ(s["ttfts"].size(), 3u);
  ASSERT_EQ(s["per_strategy"].size(), 2u);
  EXPECT_EQ(s["per_strategy"]["full"]["completed"], 2);
  EXPECT_EQ(s["per_strategy"]["full"]["cancelled"], 1);
  EXPECT_EQ(s["per_strategy"]["lazyllm"]["failed"], 1);
  EXPECT_DOUBLE_EQ(s["per_strategy"]["lazyllm"]["mean_tpot_ms"], 200);
  const std::string table = FormatSummary(s);
  EXPECT_NE(table.find("strategy lazyllm"), std::string::npos);
  EXPECT_NE(table.find("p99 ttft (ms):"), std::string::npos);
  EXPECT_FALSE(Summarize(r, 2.0, {}).contains("request_goodput"));  // no SLO, no goodput
}

TEST(Workload, ParsesTheThreeDatasetShapes) {
  std::istringstream in(
      "{\"prompt\": \"hello\", \"max_tokens\": 7}\n"
      "\n"
      "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"u\"}]}\n"
      "{\"conversations\": [{\"from\": \"human\", \"value\": \"q\"}, {\"from\": \"gpt\", \"value\": \"a b c\"}]}\n");
  int counted = 0;
  absl::StatusOr<std::vector<Prompt>> p = ParseDataset(in, [&](const std::string& text) -> absl::StatusOr<int> {
    ++counted;
    return static_cast<int>(text.size());  // a stand-in tokenizer: one token per byte
  });
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->size(), 3u);
  EXPECT_EQ((*p)[0].text, "hello");
  EXPECT_EQ((*p)[0].max_tokens, 7);
  ASSERT_EQ((*p)[1].messages.size(), 2u);
  EXPECT_EQ((*p)[1].messages[1], (std::pair<std::string, std::string>{"user", "u"}));
  EXPECT_EQ((*p)[1].max_tokens, 0);
  ASSERT_EQ((*p)[2].messages.size(), 1u);
  EXPECT_EQ((*p)[2].messages[0].second, "q");
  EXPECT_EQ((*p)[2].max_tokens, 5);  // the reply's length
  EXPECT_EQ(counted, 1);
}

TEST(Workload, DatasetErrorsNameTheLine) {
  auto parse = [](const std::string& text) {
    std::istringstream in(text);
    return ParseDataset(in, [](const std::string&) -> absl::StatusOr<int> { return 1; }).status();
  };
  EXPECT_EQ(parse("{\"prompt\": \"a\"}\n{oops\n").message(), "line 2: not valid JSON");
  EXPECT_EQ(parse("{\"prompt\": \"\"}").message(), "line 1: prompt must be a non-empty string");
  EXPECT_EQ(parse("{\"prompt\": \"a\", \"max_tokens\": -1}").message(),
            "line 1: max_tokens must be a positive integer");
  EXPECT_EQ(parse("{\"text\": \"a\"}").message(), "line 1: needs one of prompt, messages or conversations");
  EXPECT_EQ(parse("{\"conversations\": [{\"from\": \"gpt\", \"value\": \"a\"}]}").message(),
            "line 1: the conversation has no human turn");
  EXPECT_EQ(parse("\n\n").message(), "the dataset has no prompts");
}

TEST(Workload, SyntheticPromptsAreWindowsOfTheSourceWithinTheRange) {
  std::vector<int32_t> source(1000);
  for (int i = 0; i < 1000; ++i) source[i] = i;
  Workload w = Workload::Synthetic(source, {.input_len = 100, .output_len = 20, .range_ratio = 0.5}, 3);
  for (int i = 0; i < 200; ++i) {
    const Prompt p = w.Next();
    ASSERT_GE(p.token_ids.size(), 50u);
    ASSERT_LE(p.token_ids.size(), 150u);
    ASSERT_GE(p.max_tokens, 10);
    ASSERT_LE(p.max_tokens, 30);
    for (size_t j = 1; j < p.token_ids.size(); ++j) ASSERT_EQ(p.token_ids[j], (p.token_ids[j - 1] + 1) % 1000);
  }
  Workload d = Workload::FromDataset({Prompt{.text = "a"}, Prompt{.text = "b"}}, 1);
  const std::string first = d.Next().text, second = d.Next().text;
  EXPECT_NE(first, second);
  EXPECT_EQ(d.Next().text, first);  // cycles
}

TEST(Workload, SharedPrefixAsksEveryDocumentItsQuestionsOnce) {
  std::vector<int32_t> source(5000);
  for (int i = 0; i < 5000; ++i) source[i] = i;
  Workload w = Workload::SharedPrefix(source, {.input_len = 200, .output_len = 8},
                                      {.documents = 3, .questions = 4, .question_len = 10}, 5);
  std::map<std::vector<int32_t>, std::set<std::vector<int32_t>>> asked;  // document -> questions
  for (int i = 0; i < 12; ++i) {
    const Prompt p = w.Next();
    ASSERT_EQ(p.token_ids.size(), 210u);
    EXPECT_EQ(p.max_tokens, 8);
    const std::vector<int32_t> doc(p.token_ids.begin(), p.token_ids.begin() + 200);
    asked[doc].insert(std::vector<int32_t>(p.token_ids.begin() + 200, p.token_ids.end()));
  }
  ASSERT_EQ(asked.size(), 3u);
  for (const auto& [doc, questions] : asked) EXPECT_EQ(questions.size(), 4u);
  const Prompt again = w.Next();  // then the same prompts again
  EXPECT_TRUE(asked.contains(std::vector<int32_t>(again.token_ids.begin(), again.token_ids.begin() + 200)));
}

TEST(StrategyMix, ParsesWeightsAndDrawsInProportion) {
  absl::StatusOr<StrategyMix> mix = StrategyMix::Parse("full=0.5, lazyllm=0.25,gemfilter=0.25");
  ASSERT_TRUE(mix.ok()) << mix.status();
  std::mt19937_64 rng(5);
  std::map<std::string, int> n;
  for (int i = 0; i < 40000; ++i) ++n[mix->Draw(rng)];
  EXPECT_NEAR(n["full"], 20000, 600);
  EXPECT_NEAR(n["lazyllm"], 10000, 500);
  EXPECT_NEAR(n["gemfilter"], 10000, 500);
  EXPECT_TRUE(StrategyMix::Parse("pod").ok());
  EXPECT_NE(StrategyMix::Parse("full=1,bogus=1").status().message().find("bogus"), std::string::npos);
  EXPECT_FALSE(StrategyMix::Parse("full=-1").ok());
  EXPECT_FALSE(StrategyMix::Parse("full=0").ok());
  EXPECT_FALSE(StrategyMix::Parse("full,full").ok());
  EXPECT_FALSE(StrategyMix::Parse("").ok());
}

TEST(Workload, RequestsCarryThePromptStrategyAndLimits) {
  absl::StatusOr<pb::GenerateRequest> r =
      BuildRequest(Prompt{.token_ids = {5, 6}}, "gemfilter", {.output_len = 9, .ignore_eos = true, .seed = 3});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->token_ids().ids_size(), 2);
  EXPECT_EQ(r->stopping().max_new_tokens(), 9u);
  EXPECT_TRUE(r->stopping().ignore_eos());
  EXPECT_EQ(r->sampling().seed(), 3u);
  EXPECT_TRUE(r->pruning().has_gemfilter());
  r = BuildRequest(Prompt{.messages = {{"user", "hi"}}, .max_tokens = 4}, "full", {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->messages().messages(0).content(), "hi");
  EXPECT_EQ(r->stopping().max_new_tokens(), 4u);
  EXPECT_FALSE(r->sampling().has_seed());
}

}  // namespace
}  // namespace ps::loadtest
