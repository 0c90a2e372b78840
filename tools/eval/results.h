// The evaluation's results file: one CSV row per request, appended as each request
// finishes, so that a run resumes where an earlier one stopped (rows are keyed by
// model, task, length, prompt index, strategy, phase and repeat) and a table can be
// built from several runs.
#pragma once

#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ps::eval {

struct ResultRow {
  std::string model, cpu, task;
  int length = 0, index = 0;
  std::string strategy;  // the label: NAME or NAME:key=value[:key=value]
  std::string phase;     // "accuracy" (every prompt once) or "timing" (repeats, 64 tokens always)
  int repeat = 0;
  int prompt_tokens = 0, completion_tokens = 0;
  double score = 0, ttft_s = 0, total_s = 0, decode_tok_s = 0, computed_pct = 0;
  int64_t kv_blocks = 0, kv_device_blocks = 0;
  std::string chosen;  // the strategy that ran (differs from `strategy` for auto)
  std::string answer;

  // What a rerun skips: a prompt under a strategy in a phase and repeat; timing rows on
  // each CPU apart (a speedup compares one machine's times, so another machine times
  // its own), accuracy rows on any (scores agree bit for bit across the CPU levels).
  std::string Key() const;
};

// The header line; FormatRow writes one row (with its newline).
std::string CsvHeader();
std::string FormatRow(const ResultRow& r);
// Every row of a results file; an empty list when it does not exist. Errors name
// the line.
absl::StatusOr<std::vector<ResultRow>> ReadResults(const std::string& path);

// Appends rows to a results file (writing the header to a new one), flushed per row.
class ResultWriter {
 public:
  static absl::StatusOr<ResultWriter> Open(const std::string& path);
  void Append(const ResultRow& r);

 private:
  explicit ResultWriter(std::ofstream out) : out_(std::move(out)) {}
  std::ofstream out_;
};

}  // namespace ps::eval
