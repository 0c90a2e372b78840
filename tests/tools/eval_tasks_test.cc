// The evaluation's parts without a server: the tasks' prompts (fit their length,
// hold their answers, are the same for the same seed), the scoring and its
// intervals on hand-checked numbers, the results file's round trip and resume keys,
// and the table from hand-made rows.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/pruning/auto.h"
#include "engine/pruning/calibration.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/eval/results.h"
#include "tools/eval/scoring.h"
#include "tools/eval/summary.h"
#include "tools/eval/tasks.h"

namespace ps::eval {
namespace {

using ::testing::HasSubstr;

// Pieces are maximal runs of letters or digits, or single other characters: an
// exact round trip, and counts of the order of a real tokenizer's.
class FakeCodec final : public TextCodec {
 public:
  absl::StatusOr<Tokens> Tokenize(const std::string& text) override {
    Tokens t;
    for (size_t i = 0; i < text.size();) {
      size_t j = i + 1;
      if (std::isalnum(static_cast<unsigned char>(text[i]))) {
        while (j < text.size() && std::isalnum(static_cast<unsigned char>(text[j])) && j - i < 6) ++j;
      }
      t.pieces.push_back(text.substr(i, j - i));
      auto [it, fresh] = ids_.emplace(t.pieces.back(), static_cast<int32_t>(pieces_.size()));
      if (fresh) pieces_.push_back(t.pieces.back());
      t.ids.push_back(it->second);
      i = j;
    }
    return t;
  }
  absl::StatusOr<std::string> Detokenize(std::span<const int32_t> ids) override {
    std::string out;
    for (int32_t id : ids) out += pieces_.at(id);
    return out;
  }

 private:
  std::map<std::string, int32_t> ids_;
  std::vector<std::string> pieces_;
};

const char kFiller[] =
    "The first thing to know about startups is that they grow fast. Most founders learn this late. "
    "A good idea is rarely obvious at first, and the best ones often look like toys. Investors know "
    "little more than founders do about which will work. Persistence matters more than brilliance.\n";

// The essays above, then sentences of made-up words (cwe needs many distinct ones).
std::string Filler() {
  std::string text = kFiller;
  const char* syllables[] = {"ka", "lo", "mi", "ne", "pu", "ra", "si", "to", "vu", "ze"};
  for (int w = 0; w < 1000; ++w) {
    std::string word;
    for (int v = w; word.size() < 6; v /= 10) word += syllables[v % 10];
    text += word + (w % 12 == 11 ? ".\n" : " ");
  }
  return text;
}

TEST(EvalTasks, PromptsFitTheirLengthHoldTheirAnswersAndRepeat) {
  FakeCodec codec;
  const TextCodec::Tokens filler = *codec.Tokenize(Filler());
  for (const std::string& task : TaskNames()) {
    for (int length : {2048, 4096}) {
      SCOPED_TRACE(task + " " + std::to_string(length));
      const PromptOptions o{.length = length, .index = 3, .seed = 7};
      absl::StatusOr<EvalPrompt> p = MakePrompt(codec, filler, task, o);
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(p->task, task);
      const auto n = static_cast<int>(codec.Tokenize(p->text)->ids.size());
      EXPECT_LE(n, length - o.reserved) << "room left for the chat template and the answer";
      EXPECT_GT(n, length - o.reserved - 200) << "and filled close to it";
      ASSERT_FALSE(p->answers.empty());
      for (const std::string& a : p->answers) EXPECT_THAT(p->text, HasSubstr(a));
      EXPECT_DOUBLE_EQ(Score(absl::StrJoin(p->answers, ", "), p->answers, p->scoring), 1.0)
          << "the expected answer scores 1";
      EXPECT_DOUBLE_EQ(Score("???", p->answers, p->scoring), 0.0);
      absl::StatusOr<EvalPrompt> again = MakePrompt(codec, filler, task, o);
      EXPECT_EQ(again->text, p->text) << "same seed, same prompt";
      PromptOptions next = o;
      next.index = 4;
      EXPECT_NE(MakePrompt(codec, filler, task, next)->text, p->text);
    }
  }
  // qa's people share no first name or surname with one another: the asked one's each
  // appear in the question and in one biography only.
  const EvalPrompt qa = *MakePrompt(codec, filler, "qa", {.length = 2048, .index = 5});
  const size_t at = qa.text.rfind("In which city was ") + std::strlen("In which city was ");
  const std::vector<std::string> person = absl::StrSplit(qa.text.substr(at, qa.text.find(" born?", at) - at), ' ');
  ASSERT_EQ(person.size(), 2u);
  for (const std::string& part : person) {
    int count = 0;
    for (size_t i = qa.text.find(part); i != std::string::npos; i = qa.text.find(part, i + 1)) ++count;
    EXPECT_EQ(count, 2) << part;
  }
  const PromptOptions plain{.length = 2048, .chat = false};
  EXPECT_TRUE(absl::EndsWith(MakePrompt(codec, filler, "niah_single", plain)->text, "\nAnswer:"));
  EXPECT_THAT(std::string(MakePrompt(codec, filler, "summary", plain).status().message()), HasSubstr("known: "));
  EXPECT_FALSE(MakePrompt(codec, filler, "niah_single", {.length = 100}).ok()) << "no room for a haystack";
}

TEST(EvalScoring, MatchesAndF1OnHandCheckedAnswers) {
  EXPECT_EQ(Score("The number is 1234567.", {"1234567"}, Scoring::kAll), 1.0);
  EXPECT_EQ(Score("The number is 12345678.", {"1234567"}, Scoring::kAll), 0.0) << "whole words only";
  EXPECT_EQ(Score("LISBON", {"Lisbon"}, Scoring::kAll), 1.0) << "case-insensitive";
  EXPECT_EQ(Score("11, 22", {"11", "22", "33"}, Scoring::kAll), 0.0);
  EXPECT_DOUBLE_EQ(Score("11, 22", {"11", "22", "33", "44"}, Scoring::kRecall), 0.5);
  EXPECT_DOUBLE_EQ(TokenF1("Lisbon.", "Lisbon"), 1.0);
  EXPECT_DOUBLE_EQ(TokenF1("The city is Lisbon", "Lisbon"), 0.5);  // precision 1/2 ("the" dropped), recall 1
  EXPECT_DOUBLE_EQ(TokenF1("Porto", "Lisbon"), 0.0);
  EXPECT_DOUBLE_EQ(Score("Lisbon\nand more text", {"Lisbon"}, Scoring::kF1), 1.0) << "the first line";
}

TEST(EvalScoring, WilsonAndBootstrapIntervals) {
  const Interval none = Wilson(0, 10), all = Wilson(10, 10), half = Wilson(5, 10);
  EXPECT_NEAR(none.lo, 0.0, 1e-12);
  EXPECT_NEAR(none.hi, 0.2775, 1e-4);
  EXPECT_NEAR(all.lo, 0.7225, 1e-4);
  EXPECT_NEAR(all.hi, 1.0, 1e-12);
  EXPECT_NEAR(half.lo, 0.2366, 1e-4);
  EXPECT_NEAR(half.hi, 0.7634, 1e-4);
  const std::vector<double> same(8, 0.25);
  const Interval flat = BootstrapMean(same);
  EXPECT_DOUBLE_EQ(flat.lo, 0.25);
  EXPECT_DOUBLE_EQ(flat.hi, 0.25);
  const std::vector<double> spread = {0.0, 0.25, 0.5, 0.75, 1.0, 0.5, 0.5, 0.25};
  const Interval b = BootstrapMean(spread);
  EXPECT_LT(b.lo, 0.46875);
  EXPECT_GT(b.hi, 0.46875);
  EXPECT_GT(b.lo, 0.0);
  EXPECT_EQ(BootstrapMean(spread).lo, b.lo) << "seeded";
  const std::vector<double> binary = {1, 0, 1, 1, 0, 1, 0, 1, 0, 0};
  EXPECT_DOUBLE_EQ(MeanInterval(binary).lo, half.lo) << "pass/fail scores take Wilson's";
  EXPECT_DOUBLE_EQ(Median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(Median({4, 1, 2, 3}), 2.5);
  EXPECT_TRUE(std::isnan(Median({})));
}

TEST(EvalResults, RowsRoundTripAndResumeByKey) {
  const std::string path = ::testing::TempDir() + "/eval_results_" + std::to_string(::getpid()) + ".csv";
  std::filesystem::remove(path);
  ResultRow r{.model = "m, \"quoted\"",
              .cpu = "AMD EPYC (AVX-512 BF16)",
              .task = "qa",
              .length = 4096,
              .index = 2,
              .strategy = "sliminfer:budgets=4096,2048",
              .phase = "accuracy",
              .prompt_tokens = 4000,
              .completion_tokens = 9,
              .score = 0.5,
              .ttft_s = 1.25,
              .total_s = 2.5,
              .decode_tok_s = 6.4,
              .computed_pct = 87.5,
              .kv_blocks = 100,
              .kv_device_blocks = 80,
              .chosen = "sliminfer",
              .answer = "Lisbon, \"maybe\"\nor Porto"};
  {
    absl::StatusOr<ResultWriter> w = ResultWriter::Open(path);
    ASSERT_TRUE(w.ok());
    w->Append(r);
  }
  {
    absl::StatusOr<ResultWriter> w = ResultWriter::Open(path);  // appends, no second header
    ResultRow t = r;
    t.phase = "timing";
    w->Append(t);
  }
  absl::StatusOr<std::vector<ResultRow>> rows = ReadResults(path);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  const ResultRow& got = (*rows)[0];
  EXPECT_EQ(got.model, r.model);
  EXPECT_EQ(got.strategy, r.strategy);
  EXPECT_EQ(got.answer, r.answer);
  EXPECT_EQ(got.kv_device_blocks, 80);
  EXPECT_DOUBLE_EQ(got.computed_pct, 87.5);
  EXPECT_EQ(got.Key(), r.Key());
  EXPECT_NE((*rows)[1].Key(), r.Key()) << "the phase is part of the key";
  ResultRow elsewhere = r;
  elsewhere.cpu = "Intel Xeon";
  EXPECT_EQ(elsewhere.Key(), r.Key()) << "an accuracy row counts on any CPU";
  elsewhere.phase = "timing";
  EXPECT_NE(elsewhere.Key(), (*rows)[1].Key()) << "a timing row is the CPU's own";
  EXPECT_TRUE(ReadResults(path + ".none")->empty());
  std::filesystem::remove(path);
}

TEST(EvalSummary, CellsSpeedupsAndTheAutoTable) {
  std::vector<ResultRow> rows;
  auto add = [&](const std::string& strategy, const std::string& phase, double score, double ttft, int64_t blocks) {
    rows.push_back({.model = "m",
                    .cpu = "cpu",
                    .task = "niah_single",
                    .length = 4096,
                    .index = static_cast<int>(rows.size()),
                    .strategy = strategy,
                    .phase = phase,
                    .prompt_tokens = 4000 + static_cast<int>(rows.size()),
                    .score = score,
                    .ttft_s = ttft,
                    .total_s = ttft + 1,
                    .decode_tok_s = 10,
                    .computed_pct = 100,
                    .kv_device_blocks = blocks,
                    .chosen = strategy});
  };
  for (int i = 0; i < 4; ++i) add("full", "accuracy", 1, 9, 100);
  for (int i = 0; i < 4; ++i) add("lazyllm", "accuracy", i < 3 ? 1 : 0, 5, 70);
  for (double t : {4.0, 5.0, 9.0}) add("full", "timing", 0, t, 100);
  for (double t : {2.0, 2.5, 3.0}) add("lazyllm", "timing", 0, t, 70);
  const std::vector<LengthSummary> s = Summarize(rows, "m", {"full", "lazyllm", "snapkv"});
  ASSERT_EQ(s.size(), 1u);
  const StrategySummary& full = s[0].strategies[0];
  const StrategySummary& lazy = s[0].strategies[1];
  EXPECT_EQ(full.all.n, 4);
  EXPECT_DOUBLE_EQ(lazy.all.score, 0.75);
  EXPECT_DOUBLE_EQ(lazy.all.interval.lo, Wilson(3, 4).lo);
  EXPECT_DOUBLE_EQ(full.ttft_s, 5.0) << "the median of the timing rows";
  EXPECT_DOUBLE_EQ(lazy.speedup, 2.0);
  EXPECT_EQ(lazy.kv_device_blocks, 70);
  EXPECT_EQ(s[0].strategies[2].all.n, 0) << "a strategy without rows";
  EXPECT_THAT(FormatTable(s, {"niah_single"}), HasSubstr("2.00x"));
  EXPECT_THAT(SummaryCsv("m", s), HasSubstr("\"m\",4096,\"lazyllm\",all,4,0.7500"));
  const std::string json = AutoTableJson("m", s);
  EXPECT_THAT(json, HasSubstr("\"name\": \"lazyllm\""));
  EXPECT_THAT(json, HasSubstr("\"speedup\": 2.0"));
  EXPECT_EQ(s[0].shortest_prompt, 4000) << "the first accuracy row's";
  EXPECT_THAT(json, HasSubstr("\"from_tokens\": 4000"));
  EXPECT_THAT(json, ::testing::Not(HasSubstr("snapkv"))) << "no rows, no entry";
  EXPECT_TRUE(lazy.loses.empty()) << "0.75 is inside full's interval for niah_single (4 of 4: Wilson's lo 0.51)";
  EXPECT_EQ(lazy.timing_cpu, "cpu");
}

// A strategy that loses one task is marked there (the table, the CSV's reader and auto's
// table), even when its pooled score is inside full's interval; timing rows from a second
// CPU give a strategy's speedup only against full's rows on that CPU.
TEST(EvalSummary, LostTasksAndSpeedupsOnOneCpu) {
  std::vector<ResultRow> rows;
  auto add = [&](const std::string& strategy, const std::string& task, const std::string& phase, double score,
                 const std::string& cpu, double ttft) {
    rows.push_back({.model = "m",
                    .cpu = cpu,
                    .task = task,
                    .length = 8192,
                    .index = static_cast<int>(rows.size()),
                    .strategy = strategy,
                    .phase = phase,
                    .prompt_tokens = 8000,
                    .score = score,
                    .ttft_s = ttft,
                    .total_s = ttft + 1,
                    .decode_tok_s = 10,
                    .computed_pct = 100,
                    .chosen = strategy});
  };
  for (int i = 0; i < 10; ++i) {
    add("full", "qa", "accuracy", 0.6, "", 0);
    add("full", "vt", "accuracy", i < 5 ? 1 : 0, "", 0);
    add("gemfilter", "qa", "accuracy", 0.1, "", 0);  // below full's qa interval (a point: 0.6)
    add("gemfilter", "vt", "accuracy", 1, "", 0);    // above full's vt: the pooled score is 0.55
    add("auto", "qa", "accuracy", 0.6, "", 0);
    add("auto", "vt", "accuracy", i < 5 ? 1 : 0, "", 0);
  }
  for (double t : {10.0, 12.0}) add("full", "niah_single", "timing", 0, "xeon", t);
  for (double t : {5.0, 5.0, 5.5, 5.5, 6.0, 6.0}) add("gemfilter", "niah_single", "timing", 0, "xeon", t);
  for (double t : {20.0, 21.0, 22.0}) add("full", "niah_single", "timing", 0, "zen4", t);
  for (double t : {8.0, 11.0, 12.0}) add("auto", "niah_single", "timing", 0, "zen4", t);
  add("auto", "niah_single", "timing", 0, "zen5", 1.0);  // no full there: never compared
  const std::vector<LengthSummary> s = Summarize(rows, "m", {"full", "gemfilter", "auto"});
  ASSERT_EQ(s.size(), 1u);
  const StrategySummary& full = s[0].strategies[0];
  const StrategySummary& gem = s[0].strategies[1];
  const StrategySummary& aut = s[0].strategies[2];
  EXPECT_GE(gem.all.score, full.all.interval.lo) << "pooled, gemfilter looks as good as full";
  EXPECT_THAT(gem.loses, ::testing::ElementsAre("qa"));
  EXPECT_TRUE(aut.loses.empty());
  EXPECT_TRUE(full.loses.empty());
  EXPECT_EQ(full.timing_cpu, "xeon") << "where most strategies were timed, though full has more rows on zen4";
  EXPECT_DOUBLE_EQ(full.ttft_s, 11.0);
  EXPECT_DOUBLE_EQ(gem.speedup, 2.0) << "11 / 5.5 on the xeon";
  EXPECT_EQ(aut.timing_cpu, "zen4");
  EXPECT_EQ(aut.timed, 3);
  EXPECT_DOUBLE_EQ(aut.ttft_s, 11.0);
  EXPECT_DOUBLE_EQ(aut.speedup, 21.0 / 11.0) << "against full's zen4 median, not its xeon one";
  EXPECT_EQ(gem.timed, 6);
  EXPECT_THAT(s[0].cpus, ::testing::ElementsAre("xeon", "zen4", "zen5"));
  const std::string table = FormatTable(s, {"qa", "vt"});
  EXPECT_THAT(table, HasSubstr("qa 0.10!, vt 1.00"));
  EXPECT_THAT(table, HasSubstr("timed on zen4"));
  const absl::StatusOr<AutoTable> parsed = AutoTableFromJson(AutoTableJson("m", s));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->lengths.size(), 1u);
  const std::vector<AutoTable::Entry>& entries = parsed->lengths[0].strategies;
  ASSERT_EQ(entries.size(), 2u) << "full and gemfilter; never auto itself";
  EXPECT_THAT(entries[1].loses, ::testing::ElementsAre("qa"));
  EXPECT_EQ(AutoChoice(*parsed, 8192, 1.1f, [](const std::string&) { return true; }), "full")
      << "gemfilter is twice as fast but lost qa";
  EXPECT_TRUE(AutoCanPick(rows, "m", 8192));
  EXPECT_FALSE(AutoCanPick(rows, "m", 4096)) << "no rows at all there";
  std::erase_if(rows, [](const ResultRow& r) { return r.phase == "timing" && r.strategy == "gemfilter"; });
  EXPECT_FALSE(AutoCanPick(rows, "m", 8192)) << "full and auto timed, nothing else: auto's table has no speedups";
}

}  // namespace
}  // namespace ps::eval
