// pruneserve-eval: long-context accuracy and speed of every strategy through a
// running pruneserve (gRPC), so the figures include scheduling. RULER-style tasks
// (tools/eval/tasks.h) at each length, generated from a seed and the shared essays;
// every strategy, `full` included, gets the same prompts in the same order, one
// request at a time (the server decides how a prompt is stepped: scripts/eval.sh
// starts it so that every prompt takes one step). Two phases:
//   accuracy  every prompt once per strategy, greedy, up to --max-new-tokens;
//   timing    the first --timing-prompts prompts of niah_single per length,
//             --repeats times per strategy (interleaved), 64 tokens always (EOS
//             ignored): TTFT, end-to-end time and decode rate, medians.
// One warm-up request first. Each request appends a row to --csv as it finishes and
// a rerun skips the rows there (resume); the table (stdout), --summary CSV and
// --auto-table JSON come from every row of the file.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <span>

#include <grpcpp/grpcpp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/flags.h"
#include "base/mapped_file.h"
#include "proto/field_args.h"
#include "pruneserve/v1/generation.grpc.pb.h"
#include "tools/eval/results.h"
#include "tools/eval/summary.h"
#include "tools/eval/tasks.h"

namespace {

namespace pb = ::pruneserve::v1;
using namespace ps::eval;

int Fail(const std::string& msg) {
  std::fprintf(stderr, "pruneserve-eval: %s\n", msg.c_str());
  return 1;
}

class Client final : public TextCodec {
 public:
  explicit Client(const std::string& addr)
      : stub_(pb::Generation::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()))) {}

  grpc::Status Info(pb::ModelInfo* info) {
    grpc::ClientContext ctx;
    return stub_->GetModelInfo(&ctx, {}, info);
  }
  absl::StatusOr<Tokens> Tokenize(const std::string& text) override {
    grpc::ClientContext ctx;
    pb::TokenizeRequest req;
    req.set_text(text);
    req.set_add_special_tokens(false);
    pb::TokenizeResponse resp;
    if (grpc::Status s = stub_->Tokenize(&ctx, req, &resp); !s.ok()) {
      return absl::UnavailableError("Tokenize: " + s.error_message());
    }
    return Tokens{.ids = {resp.token_ids().begin(), resp.token_ids().end()},
                  .pieces = {resp.pieces().begin(), resp.pieces().end()}};
  }
  absl::StatusOr<std::string> Detokenize(std::span<const int32_t> ids) override {
    grpc::ClientContext ctx;
    pb::DetokenizeRequest req;
    req.mutable_token_ids()->Add(ids.begin(), ids.end());
    pb::DetokenizeResponse resp;
    if (grpc::Status s = stub_->Detokenize(&ctx, req, &resp); !s.ok()) {
      return absl::UnavailableError("Detokenize: " + s.error_message());
    }
    return resp.text();
  }
  // One greedy request; the answer text and the Finished event.
  grpc::Status Generate(const pb::GenerateRequest& req, std::string* answer, pb::Finished* finished) {
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, req);
    pb::GenerateResponse resp;
    while (reader->Read(&resp)) {
      if (resp.has_chunk()) *answer += resp.chunk().text();
      if (resp.has_finished()) *finished = resp.finished();
    }
    return reader->Finish();
  }

 private:
  std::unique_ptr<pb::Generation::Stub> stub_;
};

// The CPU this runs on (the server is on the same machine in scripts/eval.sh).
std::string CpuName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, name, family, model;
  bool avx512 = false, bf16 = false;
  auto value = [&] { return std::string(absl::StripAsciiWhitespace(line.substr(line.find(':') + 1))); };
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "model name") && name.empty()) name = value();
    if (absl::StartsWith(line, "cpu family") && family.empty()) family = value();
    if (absl::StartsWith(line, "model\t") && model.empty()) model = value();
    if (absl::StartsWith(line, "flags")) {
      avx512 = avx512 || absl::StrContains(line, "avx512f");
      bf16 = bf16 || absl::StrContains(line, "avx512_bf16");
    }
  }
  return absl::StrCat(name.empty() ? "unknown" : name, " family ", family, " model ", model,
                      bf16     ? ", AVX-512 BF16"
                      : avx512 ? ", AVX-512"
                               : ", AVX2");
}

// --prompts "4096:20,8192:10": prompts per length; lengths not named take the default.
int DefaultPrompts(int length) { return length <= 4096 ? 20 : length <= 8192 ? 10 : length <= 16384 ? 3 : 2; }

}  // namespace

int main(int argc, char** argv) {
  std::string addr = "127.0.0.1:50051", haystack_dir = "../shared/testdata/haystack/paul_graham_essays",
              csv_path = "build/eval.csv", summary_path, auto_path, prompts_flag, phases_flag = "accuracy,timing",
              tasks_flag = absl::StrJoin(TaskNames(), ","),
              strategies_flag = "full,lazyllm,gemfilter,critiprefill,sliminfer,pod,streamingllm,snapkv,auto";
  std::vector<int64_t> lengths;
  std::vector<std::string> strategy_args;
  int64_t max_new = 64, seed = 1, timing_prompts = 2, repeats = 3, limit = 0;
  ps::FlagParser flags("pruneserve-eval",
                       "RULER-style long-context tasks through a running pruneserve, every prompt under every "
                       "strategy; appends one CSV row per request (a rerun resumes), prints the table.");
  flags.AddString("addr", &addr, "server address");
  flags.AddString("haystack", &haystack_dir, "text file, or folder whose files (in name order) make the filler");
  flags.AddIntList("lengths", &lengths,
                   "prompt lengths in tokens (default: 4096, doubling, up to 32768 and the context)");
  flags.AddString("prompts", &prompts_flag,
                  "prompts per task and length as LENGTH:N,...; others: 20 up to 4k, 10 up to 8k, 3 up to 16k, 2");
  flags.AddString("tasks", &tasks_flag, "comma-separated tasks: " + absl::StrJoin(TaskNames(), ", "));
  flags.AddString("strategies", &strategies_flag,
                  "comma-separated strategies; full is the speedup baseline; NAME:key=value[:key=value] is a "
                  "variant with its own parameters, e.g. pod:delta=0.3,sliminfer:budgets=4096,2048");
  flags.AddStringList("strategy-arg", &strategy_args,
                      "STRATEGY.key=value for a strategy's parameters (else server defaults)");
  flags.AddString("phases", &phases_flag, "accuracy, timing, or both (comma-separated)");
  flags.AddInt("max-new-tokens", &max_new, "answer length at most (accuracy phase)");
  flags.AddInt("timing-prompts", &timing_prompts, "niah_single prompts per length in the timing phase");
  flags.AddInt("repeats", &repeats, "timing requests per prompt and strategy");
  flags.AddInt("seed", &seed, "seed of the prompts");
  flags.AddInt("limit", &limit, "stop after this many new requests (0: none); the table covers what is there");
  flags.AddString("csv", &csv_path, "results file: rows are appended, and rows already there are not rerun");
  flags.AddString("summary", &summary_path, "write the table as CSV here");
  flags.AddString("auto-table", &auto_path, "write the `auto` strategy's table (JSON) here");
  std::string show;
  flags.AddString("show", &show, "TASK:LENGTH:INDEX: print that prompt and its expected answers, run nothing");
  bool table_only = false;
  flags.AddBool("table-only", &table_only,
                "no server: print the table (and write --summary, --auto-table) from the rows in --csv");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) return Fail(std::string(s.message()));
  if (flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  const std::vector<std::string> tasks = absl::StrSplit(tasks_flag, ',', absl::SkipEmpty());
  for (const std::string& t : tasks) {
    if (std::find(TaskNames().begin(), TaskNames().end(), t) == TaskNames().end()) {
      return Fail(absl::StrCat("unknown task ", t, " (known: ", absl::StrJoin(TaskNames(), ", "), ")"));
    }
  }
  const std::vector<std::string> phases = absl::StrSplit(phases_flag, ',', absl::SkipEmpty());
  for (const std::string& p : phases) {
    if (p != "accuracy" && p != "timing") return Fail("--phases: accuracy or timing, not " + p);
  }
  std::map<int, int> prompts_at;
  for (absl::string_view item : absl::StrSplit(prompts_flag, ',', absl::SkipEmpty())) {
    const std::vector<std::string> kv = absl::StrSplit(item, ':');
    int l = 0, n = 0;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[0], &l) || !absl::SimpleAtoi(kv[1], &n) || n < 0) {
      return Fail(absl::StrCat("--prompts: '", item, "' is not LENGTH:N"));
    }
    prompts_at[l] = n;
  }
  // Split at commas, but a piece that starts with a digit continues a variant's list value (budgets=512,256).
  std::vector<std::string> strategies;
  for (absl::string_view piece : absl::StrSplit(strategies_flag, ',', absl::SkipEmpty())) {
    if (!strategies.empty() && absl::ascii_isdigit(piece.front())) {
      absl::StrAppend(&strategies.back(), ",", piece);
    } else {
      strategies.emplace_back(piece);
    }
  }
  if (strategies.empty() || max_new < 1 || repeats < 1 || timing_prompts < 0) {
    return Fail("--strategies must name one at least; --max-new-tokens, --repeats >= 1");
  }
  std::map<std::string, std::vector<std::string>> args_of;
  for (const std::string& a : strategy_args) {
    const size_t dot = a.find('.');
    if (dot == std::string::npos) return Fail("--strategy-arg " + a + " is not STRATEGY.key=value");
    args_of[a.substr(0, dot)].push_back(a.substr(dot + 1));
  }
  std::map<std::string, pb::PruningConfig> configs;  // by label: NAME or NAME:key=value[:key=value]
  for (const std::string& label : strategies) {
    const std::vector<std::string> parts = absl::StrSplit(label, ':');
    std::vector<std::string> args = args_of[parts[0]];
    args.insert(args.end(), parts.begin() + 1, parts.end());
    if (absl::Status st = ps::SetStrategyArgs(parts[0], args, &configs[label]); !st.ok())
      return Fail(absl::StrCat(label, ": ", st.message()));
  }

  // The table from every row of the results file (printed, and written where asked): the
  // strategies asked for, then every other one the file has rows of, so that a run of a few
  // strategies does not leave the others out of the summary and of auto's table.
  auto report = [&](const std::vector<ResultRow>& all, const std::string& model, const std::string& where) {
    std::vector<std::string> labels = strategies;
    for (const ResultRow& r : all) {
      if (r.model == model && std::find(labels.begin(), labels.end(), r.strategy) == labels.end()) {
        labels.push_back(r.strategy);
      }
    }
    const std::vector<LengthSummary> summary = Summarize(all, model, labels);
    std::printf("%s%s; results: %s\n%s", model.c_str(), where.c_str(), csv_path.c_str(),
                FormatTable(summary, tasks).c_str());
    auto write = [](const std::string& path, const std::string& text) {
      std::ofstream out(path);
      out << text;
      return static_cast<bool>(out);
    };
    if (!summary_path.empty() && !write(summary_path, SummaryCsv(model, summary)))
      return Fail("cannot write " + summary_path);
    if (!auto_path.empty() && !write(auto_path, AutoTableJson(model, summary)))
      return Fail("cannot write " + auto_path);
    return 0;
  };
  if (table_only) {
    absl::StatusOr<std::vector<ResultRow>> all = ReadResults(csv_path);
    if (!all.ok()) return Fail(std::string(all.status().message()));
    if (all->empty()) return Fail(csv_path + " has no rows");
    std::map<std::string, int> models;
    for (const ResultRow& r : *all) ++models[r.model];
    const auto most = std::max_element(models.begin(), models.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
    return report(*all, most->first, "");
  }

  Client client(addr);
  pb::ModelInfo info;
  if (grpc::Status s = client.Info(&info); !s.ok())
    return Fail(absl::StrCat("GetModelInfo at ", addr, ": ", s.error_message()));
  // A strategy the server cannot serve (PoD without a calibration) is left out, saying why.
  std::erase_if(strategies, [&](const std::string& label) {
    const std::string name = label.substr(0, label.find(':'));
    for (int k = 0; k < info.strategies_size() && k < info.strategy_unavailable_size(); ++k) {
      if (info.strategies(k) == name && !info.strategy_unavailable(k).empty()) {
        std::fprintf(stderr, "pruneserve-eval: leaving out %s: %s\n", label.c_str(),
                     info.strategy_unavailable(k).c_str());
        return true;
      }
    }
    return false;
  });
  if (strategies.empty()) return Fail("no strategy to run");
  const bool chat = !info.chat_template().empty();
  const int context = static_cast<int>(info.context_length());
  if (lengths.empty()) {
    for (int l = 4096; l <= std::min(context, 32768); l *= 2) lengths.push_back(l);
  }
  const std::string model = info.name(), cpu = CpuName();

  const absl::StatusOr<std::string> essays = ps::ReadTextCorpus(haystack_dir);
  if (!essays.ok()) return Fail(absl::StrCat("--haystack: ", essays.status().message()));
  const absl::StatusOr<TextCodec::Tokens> filler = client.Tokenize(*essays);
  if (!filler.ok()) return Fail(std::string(filler.status().message()));

  if (!show.empty()) {
    const std::vector<std::string> parts = absl::StrSplit(show, ':');
    int length = 0, index = 0;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &length) || !absl::SimpleAtoi(parts[2], &index)) {
      return Fail("--show: TASK:LENGTH:INDEX, not " + show);
    }
    absl::StatusOr<EvalPrompt> p =
        MakePrompt(client, *filler, parts[0],
                   {.length = length, .index = index, .seed = static_cast<uint64_t>(seed), .chat = chat});
    if (!p.ok()) return Fail(std::string(p.status().message()));
    std::printf("%s\n\nexpected: %s\n", p->text.c_str(), absl::StrJoin(p->answers, " | ").c_str());
    return 0;
  }
  absl::StatusOr<std::vector<ResultRow>> rows = ReadResults(csv_path);
  if (!rows.ok()) return Fail(std::string(rows.status().message()));
  std::set<std::string> done;
  for (const ResultRow& r : *rows) done.insert(r.Key());
  absl::StatusOr<ResultWriter> writer = ResultWriter::Open(csv_path);
  if (!writer.ok()) return Fail(std::string(writer.status().message()));

  int64_t requests = 0;
  bool warmed = false;
  // One request, recorded unless it is the warm-up. False: the run stops (--limit).
  auto run = [&](const EvalPrompt& p, const std::string& label, const std::string& phase, int repeat,
                 bool* failed) -> bool {
    ResultRow r{.model = model,
                .cpu = cpu,
                .task = p.task,
                .length = p.length,
                .index = p.index,
                .strategy = label,
                .phase = phase,
                .repeat = repeat};
    if (done.contains(r.Key())) return true;
    if (limit > 0 && requests >= limit) return false;
    pb::GenerateRequest req;
    if (chat) {
      pb::ChatMessage* m = req.mutable_messages()->add_messages();
      m->set_role("user");
      m->set_content(p.text);
    } else {
      req.set_text(p.text);
    }
    req.mutable_sampling()->set_temperature(0);
    const bool timing = phase == "timing";
    req.mutable_stopping()->set_max_new_tokens(static_cast<uint32_t>(timing ? 64 : max_new));
    req.mutable_stopping()->set_ignore_eos(timing);
    *req.mutable_pruning() = configs[label];
    for (bool warm_up = !warmed;; warm_up = false) {
      std::string answer;
      pb::Finished fin;
      const grpc::Status s = client.Generate(req, &answer, &fin);
      if (!s.ok()) {
        std::fprintf(stderr, "pruneserve-eval: %s %d tokens #%d, %s: %s\n", p.task.c_str(), p.length, p.index,
                     label.c_str(), s.error_message().c_str());
        *failed = true;
        return false;
      }
      if (warm_up) {
        warmed = true;
        continue;
      }
      const pb::Usage& u = fin.usage();
      r.prompt_tokens = static_cast<int>(u.prompt_tokens());
      r.completion_tokens = static_cast<int>(u.completion_tokens());
      r.score = Score(answer, p.answers, p.scoring);
      r.ttft_s = u.time_to_first_token_seconds();
      r.total_s = u.total_time_seconds();
      const double decode_s = u.total_time_seconds() - u.time_to_first_token_seconds();
      r.decode_tok_s = r.completion_tokens > 1 && decode_s > 0 ? (r.completion_tokens - 1) / decode_s : 0;
      r.computed_pct = u.prompt_tokens() > 0 ? 100.0 * u.prompt_tokens_computed() / u.prompt_tokens() : 0;
      r.kv_blocks = static_cast<int64_t>(u.kv_blocks());
      r.kv_device_blocks = static_cast<int64_t>(u.kv_device_blocks());
      r.chosen = u.strategy();
      r.answer = answer;
      writer->Append(r);
      done.insert(r.Key());
      rows->push_back(r);
      ++requests;
      std::fprintf(stderr, "[%s] %-15s %6d tok #%-2d %-18s score %.2f ttft %6.2f s e2e %6.2f s computed %3.0f%%\n",
                   phase.c_str(), p.task.c_str(), r.prompt_tokens, p.index, label.c_str(), r.score, r.ttft_s, r.total_s,
                   r.computed_pct);
      return true;
    }
  };

  bool failed = false, go_on = true;
  std::map<std::pair<std::string, int>, EvalPrompt> made;  // (task, index) at the current length
  auto prompt = [&](const std::string& task, int length, int index) -> const EvalPrompt* {
    auto it = made.find({task, index});
    if (it != made.end()) return &it->second;
    absl::StatusOr<EvalPrompt> p = MakePrompt(
        client, *filler, task, {.length = length, .index = index, .seed = static_cast<uint64_t>(seed), .chat = chat});
    if (!p.ok()) {
      std::fprintf(stderr, "pruneserve-eval: %s at %d tokens: %s\n", task.c_str(), length,
                   std::string(p.status().message()).c_str());
      failed = true;
      return nullptr;
    }
    return &made.emplace(std::make_pair(task, index), std::move(*p)).first->second;
  };
  for (int64_t length64 : lengths) {
    const int length = static_cast<int>(length64);
    made.clear();
    // auto's table (written from these rows when the server started) has to have timed
    // strategies at this length, or every auto request would run full.
    const bool skip_auto = std::find(strategies.begin(), strategies.end(), "auto") != strategies.end() &&
                           !AutoCanPick(*rows, model, length);
    if (skip_auto) {
      std::fprintf(stderr,
                   "pruneserve-eval: leaving out auto at %d tokens: the results have no timing of full and another "
                   "strategy there yet, so the server's auto table cannot pick; run the timing phase first, then "
                   "again with auto (scripts/eval.sh gives the server the new table)\n",
                   length);
    }
    auto run_label = [&](const EvalPrompt* p, const std::string& label, const std::string& phase, int repeat) {
      return p != nullptr && ((skip_auto && label == "auto") || run(*p, label, phase, repeat, &failed));
    };
    const int n = prompts_at.contains(length) ? prompts_at[length] : DefaultPrompts(length);
    if (std::find(phases.begin(), phases.end(), "accuracy") != phases.end()) {
      for (int i = 0; i < n && go_on; ++i) {
        for (const std::string& task : tasks) {
          const EvalPrompt* p = go_on ? prompt(task, length, i) : nullptr;
          for (const std::string& label : strategies) go_on = go_on && run_label(p, label, "accuracy", 0);
        }
      }
    }
    if (std::find(phases.begin(), phases.end(), "timing") != phases.end()) {
      for (int i = 0; i < timing_prompts && go_on; ++i) {
        const EvalPrompt* p = prompt("niah_single", length, i);
        for (int rep = 0; rep < repeats && go_on; ++rep) {
          for (const std::string& label : strategies) go_on = go_on && run_label(p, label, "timing", rep);
        }
      }
    }
  }

  if (const int rc = report(*rows, model, " on " + addr); rc != 0) return rc;
  return failed ? 1 : 0;
}
