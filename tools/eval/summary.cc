#include "tools/eval/summary.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ps::eval {
namespace {

Cell Pool(const std::vector<double>& scores) {
  Cell c{.n = static_cast<int>(scores.size())};
  if (scores.empty()) return c;
  double sum = 0;
  for (double s : scores) sum += s;
  c.score = sum / static_cast<double>(scores.size());
  c.interval = MeanInterval(scores);
  return c;
}

// One strategy's timing rows at a length, by CPU.
struct Timing {
  std::vector<double> ttft, e2e, rate;
};

}  // namespace

std::vector<LengthSummary> Summarize(const std::vector<ResultRow>& rows, const std::string& model,
                                     const std::vector<std::string>& strategies) {
  std::set<int> lengths;
  for (const ResultRow& r : rows) {
    if (r.model == model) lengths.insert(r.length);
  }
  std::vector<LengthSummary> out;
  for (int length : lengths) {
    LengthSummary ls{.length = length};
    std::map<std::string, int> rows_on;                  // timing rows by CPU
    std::vector<std::map<std::string, Timing>> timings;  // per strategy, by CPU
    for (const std::string& label : strategies) {
      StrategySummary s{.strategy = label};
      std::map<std::string, std::vector<double>> by_task;
      std::vector<double> all;
      std::map<std::string, Timing>& timing = timings.emplace_back();
      double computed = 0;
      int accuracy_rows = 0;
      for (const ResultRow& r : rows) {
        if (r.model != model || r.length != length || r.strategy != label) continue;
        if (r.phase == "accuracy") {
          by_task[r.task].push_back(r.score);
          all.push_back(r.score);
          computed += r.computed_pct;
          ++accuracy_rows;
          s.kv_device_blocks = std::max(s.kv_device_blocks, r.kv_device_blocks);
          ++s.chosen[r.chosen];
          if (ls.shortest_prompt == 0 || r.prompt_tokens < ls.shortest_prompt) ls.shortest_prompt = r.prompt_tokens;
        } else if (r.phase == "timing") {
          Timing& t = timing[r.cpu];
          t.ttft.push_back(r.ttft_s);
          t.e2e.push_back(r.total_s);
          t.rate.push_back(r.decode_tok_s);
          ++rows_on[r.cpu];
        }
      }
      for (const auto& [task, scores] : by_task) s.tasks[task] = Pool(scores);
      s.all = Pool(all);
      s.computed_pct = accuracy_rows > 0 ? computed / accuracy_rows : std::nan("");
      ls.strategies.push_back(std::move(s));
    }
    const auto full_at = std::find(strategies.begin(), strategies.end(), "full");
    const std::map<std::string, Timing>* full_timing =
        full_at != strategies.end() && !timings[full_at - strategies.begin()].empty()
            ? &timings[full_at - strategies.begin()]
            : nullptr;
    const StrategySummary* full = full_at != strategies.end() ? &ls.strategies[full_at - strategies.begin()] : nullptr;
    for (size_t i = 0; i < ls.strategies.size(); ++i) {
      StrategySummary& s = ls.strategies[i];
      if (full != nullptr && &s != full) {
        for (const auto& [task, c] : s.tasks) {
          const auto f = full->tasks.find(task);
          if (f != full->tasks.end() && c.score < f->second.interval.lo) s.loses.push_back(task);
        }
      }
      // The CPU with the most of this strategy's timing rows where full has some too (any
      // CPU where full has none at all); full's own: the CPU with the most timing rows of
      // all strategies, the one the others were mostly timed on. Ties: the first by name.
      const Timing* mine = nullptr;
      std::pair<size_t, int> best;
      for (const auto& [cpu, t] : timings[i]) {
        if (full_timing != nullptr && !full_timing->contains(cpu)) continue;
        const std::pair<size_t, int> rank =
            &s == full ? std::pair<size_t, int>(rows_on[cpu], 0) : std::pair<size_t, int>(t.ttft.size(), rows_on[cpu]);
        if (mine == nullptr || rank > best) {
          mine = &t;
          best = rank;
          s.timing_cpu = cpu;
        }
      }
      s.timed = mine != nullptr ? static_cast<int>(mine->ttft.size()) : 0;
      s.ttft_s = mine != nullptr ? Median(mine->ttft) : std::nan("");
      s.e2e_s = mine != nullptr ? Median(mine->e2e) : std::nan("");
      s.decode_tok_s = mine != nullptr ? Median(mine->rate) : std::nan("");
      const double full_ttft =
          full_timing != nullptr && mine != nullptr ? Median(full_timing->at(s.timing_cpu).ttft) : std::nan("");
      s.speedup = s.ttft_s > 0 ? full_ttft / s.ttft_s : std::nan("");
    }
    for (const auto& [cpu, n] : rows_on) ls.cpus.push_back(cpu);
    out.push_back(std::move(ls));
  }
  return out;
}

bool AutoCanPick(const std::vector<ResultRow>& rows, const std::string& model, int length) {
  bool full = false, other = false;
  for (const ResultRow& r : rows) {
    if (r.model != model || r.length != length || r.phase != "timing") continue;
    full = full || r.strategy == "full";
    other = other || (r.strategy != "full" && r.strategy != "auto" && r.strategy.find(':') == std::string::npos);
  }
  return full && other;
}

std::string FormatTable(const std::vector<LengthSummary>& summary, const std::vector<std::string>& tasks) {
  std::string out;
  auto score = [](const Cell& c) {
    return c.n == 0 ? std::string("-")
                    : absl::StrFormat("%.2f [%.2f,%.2f] n=%d", c.score, c.interval.lo, c.interval.hi, c.n);
  };
  for (const LengthSummary& ls : summary) {
    absl::StrAppend(&out, "\nlength ", ls.length, " (timing on: ", ls.cpus.empty() ? "-" : absl::StrJoin(ls.cpus, "; "),
                    "; a task score marked ! is below full's interval for that task)\n");
    absl::StrAppend(&out,
                    absl::StrFormat("%-22s %-28s %8s %8s %8s %8s %9s %10s  %s\n", "strategy", "all tasks", "ttft_s",
                                    "speedup", "e2e64_s", "tok/s", "computed", "kv_device", "per task"));
    for (const StrategySummary& s : ls.strategies) {
      std::vector<std::string> per_task;
      for (const std::string& t : tasks) {
        if (auto it = s.tasks.find(t); it != s.tasks.end()) {
          const bool lost = std::find(s.loses.begin(), s.loses.end(), t) != s.loses.end();
          per_task.push_back(absl::StrFormat("%s %.2f%s", t, it->second.score, lost ? "!" : ""));
        }
      }
      auto num = [](double v, int decimals) {
        return std::isnan(v) ? std::string("-") : absl::StrFormat("%.*f", decimals, v);
      };
      absl::StrAppend(&out, absl::StrFormat("%-22s %-28s %8s %8s %8s %8s %8s%% %10d  %s\n", s.strategy, score(s.all),
                                            num(s.ttft_s, 2), std::isnan(s.speedup) ? "-" : num(s.speedup, 2) + "x",
                                            num(s.e2e_s, 2), num(s.decode_tok_s, 1), num(s.computed_pct, 1),
                                            s.kv_device_blocks, absl::StrJoin(per_task, ", ")));
      if (ls.cpus.size() > 1 && !s.timing_cpu.empty()) absl::StrAppend(&out, "    timed on ", s.timing_cpu, "\n");
    }
  }
  return out;
}

std::string SummaryCsv(const std::string& model, const std::vector<LengthSummary>& summary) {
  std::string out =
      "model,length,strategy,task,n,score,lo,hi,ttft_s,speedup,e2e64_s,decode_tok_s,prompt_computed_pct,"
      "kv_device_blocks\n";
  for (const LengthSummary& ls : summary) {
    for (const StrategySummary& s : ls.strategies) {
      auto row = [&](const std::string& task, const Cell& c) {
        absl::StrAppend(
            &out, absl::StrFormat("\"%s\",%d,\"%s\",%s,%d,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.3f,%.2f,%d\n", model,
                                  ls.length, s.strategy, task, c.n, c.score, c.interval.lo, c.interval.hi, s.ttft_s,
                                  s.speedup, s.e2e_s, s.decode_tok_s, s.computed_pct, s.kv_device_blocks));
      };
      row("all", s.all);
      for (const auto& [task, c] : s.tasks) row(task, c);
    }
  }
  return out;
}

std::string AutoTableJson(const std::string& model, const std::vector<LengthSummary>& summary) {
  nlohmann::json j{{"model", model}, {"lengths", nlohmann::json::array()}};
  for (const LengthSummary& ls : summary) {
    nlohmann::json l{{"length", ls.length},
                     {"from_tokens", ls.shortest_prompt > 0 ? ls.shortest_prompt : ls.length},
                     {"strategies", nlohmann::json::array()}};
    for (const StrategySummary& s : ls.strategies) {
      if (s.strategy.find(':') != std::string::npos || s.strategy == "auto" || s.all.n == 0) continue;
      l["strategies"].push_back({{"name", s.strategy},
                                 {"score", s.all.score},
                                 {"lo", s.all.interval.lo},
                                 {"hi", s.all.interval.hi},
                                 {"n", s.all.n},
                                 {"speedup", std::isnan(s.speedup) ? 0.0 : s.speedup},
                                 {"loses", s.loses}});
    }
    j["lengths"].push_back(std::move(l));
  }
  return j.dump(2) + "\n";
}

}  // namespace ps::eval
