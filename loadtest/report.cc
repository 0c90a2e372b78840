#include "loadtest/report.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ps::loadtest {
namespace {

using Json = nlohmann::json;

double Tpot(const RequestRecord& r) { return (r.e2e - r.ttft) / (r.output_tokens - 1); }

// mean/median/std/p90/p99 of `values` (seconds) as `<stat>_<name>_ms`.
void AddStats(Json& out, const std::string& name, const std::vector<double>& values) {
  double mean = 0, var = 0;
  for (double v : values) mean += v;
  if (!values.empty()) mean /= values.size();
  for (double v : values) var += (v - mean) * (v - mean);
  if (!values.empty()) var /= values.size();
  out["mean_" + name + "_ms"] = mean * 1e3;
  out["median_" + name + "_ms"] = Percentile(values, 50) * 1e3;
  out["std_" + name + "_ms"] = std::sqrt(var) * 1e3;
  out["p90_" + name + "_ms"] = Percentile(values, 90) * 1e3;
  out["p99_" + name + "_ms"] = Percentile(values, 99) * 1e3;
}

Json SummarizeSome(const std::vector<const RequestRecord*>& records, double duration_s, const Slo& slo) {
  Json out;
  int completed = 0, cancelled = 0, failed = 0, good = 0;
  int64_t input_tokens = 0, cached_tokens = 0, output_tokens = 0;
  std::vector<double> ttft, tpot, itl, e2el;
  std::map<std::string, int> failures;
  for (const RequestRecord* r : records) {
    switch (r->outcome) {
      case Outcome::kCancelled: ++cancelled; continue;
      case Outcome::kFailed:
        ++failed;
        ++failures[std::to_string(r->status_code)];
        continue;
      case Outcome::kCompleted: break;
    }
    ++completed;
    input_tokens += r->prompt_tokens;
    cached_tokens += r->cached_tokens;
    output_tokens += r->output_tokens;
    if (r->ttft >= 0) ttft.push_back(r->ttft);
    if (r->output_tokens > 1) tpot.push_back(Tpot(*r));
    itl.insert(itl.end(), r->itl.begin(), r->itl.end());
    e2el.push_back(r->e2e);
    const bool ok = (slo.ttft_ms <= 0 || (r->ttft >= 0 && r->ttft * 1e3 <= slo.ttft_ms)) &&
                    (slo.tpot_ms <= 0 || r->output_tokens <= 1 || Tpot(*r) * 1e3 <= slo.tpot_ms) &&
                    (slo.e2el_ms <= 0 || r->e2e * 1e3 <= slo.e2el_ms);
    good += ok;
  }
  const double d = duration_s > 0 ? duration_s : 1e-9;
  out["duration"] = duration_s;
  out["sent"] = records.size();
  out["completed"] = completed;
  out["cancelled"] = cancelled;
  out["failed"] = failed;
  out["failures"] = failures;
  out["total_input_tokens"] = input_tokens;
  out["total_cached_tokens"] = cached_tokens;
  out["total_output_tokens"] = output_tokens;
  out["request_throughput"] = completed / d;
  out["output_throughput"] = output_tokens / d;
  out["total_token_throughput"] = (input_tokens + output_tokens) / d;
  if (slo.ttft_ms > 0 || slo.tpot_ms > 0 || slo.e2el_ms > 0) out["request_goodput"] = good / d;
  AddStats(out, "ttft", ttft);
  AddStats(out, "tpot", tpot);
  AddStats(out, "itl", itl);
  AddStats(out, "e2el", e2el);
  out["ttfts"] = ttft;
  return out;
}

}  // namespace

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = q / 100 * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(at));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - lo);
}

Json Summarize(const std::vector<RequestRecord>& records, double duration_s, const Slo& slo) {
  std::vector<const RequestRecord*> all;
  std::map<std::string, std::vector<const RequestRecord*>> by_strategy;
  for (const RequestRecord& r : records) {
    all.push_back(&r);
    by_strategy[r.strategy].push_back(&r);
  }
  Json out = SummarizeSome(all, duration_s, slo);
  out["per_strategy"] = Json::object();
  for (const auto& [name, some] : by_strategy) out["per_strategy"][name] = SummarizeSome(some, duration_s, slo);
  return out;
}

std::string FormatSummary(const Json& s) {
  std::string out;
  auto line = [&](const std::string& label, const std::string& value) {
    absl::StrAppendFormat(&out, "%-40s%12s\n", label, value);
  };
  // A title centred in a rule of `fill`, as vLLM prints them.
  auto rule = [&](const std::string& title, char fill) {
    const std::string t = title.empty() ? "" : absl::StrCat(" ", title, " ");
    const size_t left = (52 - std::min<size_t>(52, t.size())) / 2;
    absl::StrAppend(&out, std::string(left, fill), t, std::string(52 - left - std::min<size_t>(52, t.size()), fill),
                    "\n");
  };
  auto num = [](const Json& v) { return absl::StrFormat("%.2f", v.get<double>()); };
  constexpr std::pair<const char*, const char*> kLatencies[] = {{"ttft", "Time to First Token"},
                                                                {"tpot", "Time per Output Token (excl. 1st token)"},
                                                                {"itl", "Inter-token Latency"},
                                                                {"e2el", "End-to-end Latency"}};
  auto block = [&](const Json& j) {
    line("Requests sent:", absl::StrCat(j["sent"].get<int64_t>()));
    line("Completed / cancelled / failed:",
         absl::StrCat(j["completed"].get<int>(), " / ", j["cancelled"].get<int>(), " / ", j["failed"].get<int>()));
    line("Benchmark duration (s):", num(j["duration"]));
    line("Total input tokens:", absl::StrCat(j["total_input_tokens"].get<int64_t>()));
    line("Cached input tokens:", absl::StrCat(j["total_cached_tokens"].get<int64_t>()));
    line("Total generated tokens:", absl::StrCat(j["total_output_tokens"].get<int64_t>()));
    line("Request throughput (req/s):", num(j["request_throughput"]));
    if (j.contains("request_goodput")) line("Request goodput (req/s):", num(j["request_goodput"]));
    line("Output token throughput (tok/s):", num(j["output_throughput"]));
    line("Total token throughput (tok/s):", num(j["total_token_throughput"]));
    for (const auto& [key, title] : kLatencies) {
      rule(title, '-');
      for (const char* stat : {"mean", "median", "p90", "p99"}) {
        line(absl::StrCat(stat, " ", key, " (ms):"), num(j[absl::StrCat(stat, "_", key, "_ms")]));
      }
    }
  };
  rule("Serving Benchmark Result", '=');
  block(s);
  if (s["per_strategy"].size() > 1) {
    for (const auto& [name, j] : s["per_strategy"].items()) {
      rule(absl::StrCat("strategy ", name), '=');
      block(j);
    }
  }
  rule("", '=');
  return out;
}

}  // namespace ps::loadtest
