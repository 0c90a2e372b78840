#include "tools/eval/results.h"

#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ps::eval {
namespace {

constexpr size_t kFields = 19;

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') {
      out += "\"\"";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out.push_back(c);
    }
  }
  return out + "\"";
}

std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && (s[i + 1] == 'n' || s[i + 1] == 'r')) {
      out.push_back(s[++i] == 'n' ? '\n' : '\r');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// One line's fields: commas outside double quotes split, "" inside them is a quote.
std::vector<std::string> SplitCsv(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        fields.back().push_back('"');
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        fields.back().push_back(c);
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else {
      fields.back().push_back(c);
    }
  }
  return fields;
}

}  // namespace

std::string ResultRow::Key() const {
  return absl::StrCat(model, "|", task, "|", length, "|", index, "|", strategy, "|", phase, "|", repeat,
                      phase == "timing" ? absl::StrCat("|", cpu) : "");
}

std::string CsvHeader() {
  return "model,cpu,task,length,index,strategy,phase,repeat,prompt_tokens,completion_tokens,score,ttft_s,total_s,"
         "decode_tok_s,prompt_computed_pct,kv_blocks,kv_device_blocks,chosen,answer\n";
}

std::string FormatRow(const ResultRow& r) {
  return absl::StrFormat("%s,%s,%s,%d,%d,%s,%s,%d,%d,%d,%.4f,%.4f,%.4f,%.3f,%.1f,%d,%d,%s,%s\n", Quote(r.model),
                         Quote(r.cpu), r.task, r.length, r.index, Quote(r.strategy), r.phase, r.repeat, r.prompt_tokens,
                         r.completion_tokens, r.score, r.ttft_s, r.total_s, r.decode_tok_s, r.computed_pct, r.kv_blocks,
                         r.kv_device_blocks, Quote(r.chosen), Quote(r.answer));
}

absl::StatusOr<std::vector<ResultRow>> ReadResults(const std::string& path) {
  std::vector<ResultRow> rows;
  std::ifstream in(path);
  if (!in) return rows;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    if (++number == 1) {
      if (line + "\n" != CsvHeader()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": not a results file of this version (header: ", line, ")"));
      }
      continue;
    }
    if (line.empty()) continue;
    const std::vector<std::string> f = SplitCsv(line);
    auto bad = [&] { return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": malformed row")); };
    if (f.size() != kFields) return bad();
    ResultRow r{.model = f[0],
                .cpu = f[1],
                .task = f[2],
                .strategy = f[5],
                .phase = f[6],
                .chosen = f[17],
                .answer = Unescape(f[18])};
    if (!absl::SimpleAtoi(f[3], &r.length) || !absl::SimpleAtoi(f[4], &r.index) || !absl::SimpleAtoi(f[7], &r.repeat) ||
        !absl::SimpleAtoi(f[8], &r.prompt_tokens) || !absl::SimpleAtoi(f[9], &r.completion_tokens) ||
        !absl::SimpleAtod(f[10], &r.score) || !absl::SimpleAtod(f[11], &r.ttft_s) ||
        !absl::SimpleAtod(f[12], &r.total_s) || !absl::SimpleAtod(f[13], &r.decode_tok_s) ||
        !absl::SimpleAtod(f[14], &r.computed_pct) || !absl::SimpleAtoi(f[15], &r.kv_blocks) ||
        !absl::SimpleAtoi(f[16], &r.kv_device_blocks)) {
      return bad();
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

absl::StatusOr<ResultWriter> ResultWriter::Open(const std::string& path) {
  const bool fresh = !std::filesystem::exists(path) || std::filesystem::file_size(path) == 0;
  std::ofstream out(path, std::ios::app);
  if (!out) return absl::InvalidArgumentError(absl::StrCat("cannot write ", path));
  if (fresh) out << CsvHeader() << std::flush;
  return ResultWriter(std::move(out));
}

void ResultWriter::Append(const ResultRow& r) { out_ << FormatRow(r) << std::flush; }

}  // namespace ps::eval
