// The evaluation's table from its results rows (results.h): per length and strategy,
// each task's mean score with its 95% interval and all tasks pooled, the tasks where it
// loses the answer (its score below `full`'s interval for the task), the timing medians
// (TTFT, end-to-end time of 64 tokens, decode rate) with the TTFT speedup over `full`,
// the prompt share computed and the most device KV blocks a request held. A length's
// timing rows may come from several CPUs: a strategy's medians and speedup are from the
// CPU where it has the most timing rows among those where `full` has some too, so a
// speedup never divides one machine's time by another's.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tools/eval/results.h"
#include "tools/eval/scoring.h"

namespace ps::eval {

struct Cell {
  int n = 0;  // prompts scored
  double score = 0;
  Interval interval;
};

struct StrategySummary {
  std::string strategy;
  std::map<std::string, Cell> tasks;               // by task
  Cell all;                                        // every prompt of every task
  std::vector<std::string> loses;                  // tasks scored below full's interval for that task
  std::string timing_cpu;                          // the CPU of the timing figures ("": none)
  int timed = 0;                                   // timing requests on that CPU
  double ttft_s = 0, e2e_s = 0, decode_tok_s = 0;  // medians of those timing requests (NaN: none)
  double speedup = 0;                              // full's median TTFT / this one's (NaN: not both timed)
  double computed_pct = 0;                         // mean over the accuracy requests
  int64_t kv_device_blocks = 0;                    // the most over the accuracy requests
  std::map<std::string, int> chosen;               // strategies that ran (auto), by accuracy requests
};

struct LengthSummary {
  int length = 0;
  int shortest_prompt = 0;                  // the fewest prompt tokens of its accuracy rows (0: none)
  std::vector<StrategySummary> strategies;  // in the order given
  std::vector<std::string> cpus;            // CPUs the timing rows came from
};

// The summaries of `model`'s rows, for `strategies` (labels) in that order.
std::vector<LengthSummary> Summarize(const std::vector<ResultRow>& rows, const std::string& model,
                                     const std::vector<std::string>& strategies);

// Whether `auto` has something to pick from at `length`: `full` and another plain strategy
// have timing rows there. The server's auto table is written from these rows before the
// server starts; without them every `auto` request would run `full`.
bool AutoCanPick(const std::vector<ResultRow>& rows, const std::string& model, int length);

// The table as text (one block per length; a task score below full's interval marked "!").
std::string FormatTable(const std::vector<LengthSummary>& summary, const std::vector<std::string>& tasks);
// One CSV row per (length, strategy, task or "all").
std::string SummaryCsv(const std::string& model, const std::vector<LengthSummary>& summary);
// What the `auto` strategy reads: per length, full's pooled score and interval and
// each plain strategy's (no NAME:key=value variants) with its speedup and the tasks it
// loses (`auto` never picks a strategy that loses one).
std::string AutoTableJson(const std::string& model, const std::vector<LengthSummary>& summary);

}  // namespace ps::eval
