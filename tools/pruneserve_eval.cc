// pruneserve-eval: long-context retrieval through a running pruneserve (gRPC), so
// the figures include scheduling. Tasks: needle-in-a-haystack on Paul Graham's
// essays with the standard San Francisco needle ("needle") and a numeric magic
// number ("magic"), passkey retrieval in repeated filler ("passkey"), and four
// magic numbers for different keys of which one is asked ("multikey"); needles at
// depths 0-100% of contexts from 1k tokens to the model's limit. Every prompt runs
// under every strategy in the same run (requests one at a time), scored by exact
// match of the key in the greedy answer. Prints one table (strategy x length:
// accuracy, mean TTFT, speedup over full, prompt tokens computed, the most KV
// blocks a request held, both tiers) and writes one CSV row per request.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <span>

#include <grpcpp/grpcpp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "base/flags.h"
#include "base/mapped_file.h"
#include "proto/field_args.h"
#include "pruneserve/v1/generation.grpc.pb.h"

namespace {

namespace pb = ::pruneserve::v1;

int Fail(const std::string& msg) {
  std::fprintf(stderr, "pruneserve-eval: %s\n", msg.c_str());
  return 1;
}

struct Needle {
  double depth;  // 0..1 of the context
  std::string text;
};

struct Prompt {
  std::string task;
  int length = 0;    // target prompt tokens
  int depth = 0;     // percent, of the needle that is asked for
  std::string text;  // context + question (user message, or plain text without a chat template)
  std::string key;   // expected in the answer
};

class Client {
 public:
  explicit Client(const std::string& addr)
      : stub_(pb::Generation::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()))) {}

  grpc::Status Info(pb::ModelInfo* info) {
    grpc::ClientContext ctx;
    return stub_->GetModelInfo(&ctx, {}, info);
  }
  grpc::Status Tokenize(const std::string& text, pb::TokenizeResponse* out) {
    grpc::ClientContext ctx;
    pb::TokenizeRequest req;
    req.set_text(text);
    req.set_add_special_tokens(false);
    return stub_->Tokenize(&ctx, req, out);
  }
  std::string Detokenize(std::span<const int32_t> ids) {
    grpc::ClientContext ctx;
    pb::DetokenizeRequest req;
    req.mutable_token_ids()->Add(ids.begin(), ids.end());
    pb::DetokenizeResponse resp;
    const grpc::Status s = stub_->Detokenize(&ctx, req, &resp);
    return s.ok() ? resp.text() : std::string();
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

// `budget` tokens of `filler` (repeated as needed) with the needles inserted at
// their depths, each after the nearest sentence end before it.
std::string Haystack(Client& client, const pb::TokenizeResponse& filler, int budget, std::vector<Needle> needles) {
  const int n = filler.token_ids_size();
  std::vector<int32_t> ids(budget);
  std::vector<bool> sentence_end(budget);
  for (int i = 0; i < budget; ++i) {
    ids[i] = filler.token_ids(i % n);
    const std::string& piece = filler.pieces(i % n);
    sentence_end[i] = !piece.empty() && (piece.back() == '.' || piece.back() == '\n');
  }
  std::sort(needles.begin(), needles.end(), [](const Needle& a, const Needle& b) { return a.depth < b.depth; });
  std::string out;
  int from = 0;
  for (const Needle& needle : needles) {
    int at = std::clamp(static_cast<int>(needle.depth * budget), 0, budget);
    while (at > from && at < budget && !sentence_end[at - 1]) --at;
    out += client.Detokenize(std::span<const int32_t>(ids.data() + from, at - from));
    absl::StrAppend(&out, at > 0 ? " " : "", needle.text, " ");
    from = at;
  }
  out += client.Detokenize(std::span<const int32_t>(ids.data() + from, budget - from));
  return out;
}

std::string Lower(std::string s) {
  absl::AsciiStrToLower(&s);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string addr = "127.0.0.1:50051", haystack_dir = "../shared/testdata/haystack/paul_graham_essays", csv_path,
              tasks_flag = "needle,magic,passkey,multikey",
              strategies_flag = "full,lazyllm,gemfilter,critiprefill,sliminfer";
  std::vector<int64_t> lengths, depths = {0, 25, 50, 75, 100};
  std::vector<std::string> strategy_args;
  int64_t max_new = 24, seed = 1;
  ps::FlagParser flags(
      "pruneserve-eval",
      "Long-context retrieval (needle, magic number, passkey, multi-key) through a running pruneserve, "
      "every prompt under every strategy; prints a table and writes CSV.");
  flags.AddString("addr", &addr, "server address");
  flags.AddString("haystack", &haystack_dir, "text file, or folder whose files (in name order) make the haystack");
  flags.AddIntList("lengths", &lengths,
                   "prompt lengths in tokens (default: 1024, doubling, up to the model's context)");
  flags.AddIntList("depths", &depths, "needle depths in percent of the context");
  flags.AddString("tasks", &tasks_flag, "comma-separated: needle, magic, passkey, multikey");
  flags.AddString("strategies", &strategies_flag,
                  "comma-separated strategies; full is the speedup baseline; NAME:key=value[:key=value] is a "
                  "variant with its own parameters, e.g. pod:delta=0.3,pod:delta=0.7,sliminfer:budgets=4096,2048");
  flags.AddStringList("strategy-arg", &strategy_args,
                      "STRATEGY.key=value for a strategy's parameters (else server defaults)");
  flags.AddInt("max-new-tokens", &max_new, "answer length");
  flags.AddInt("seed", &seed, "seed of the magic numbers and passkeys");
  flags.AddString("csv", &csv_path, "write one row per request here");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) return Fail(std::string(s.message()));
  if (flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  const std::vector<std::string> tasks = absl::StrSplit(tasks_flag, ',', absl::SkipEmpty());
  // Split at commas, but a piece that starts with a digit continues a variant's list value (budgets=512,256).
  std::vector<std::string> strategies;
  for (absl::string_view piece : absl::StrSplit(strategies_flag, ',', absl::SkipEmpty())) {
    if (!strategies.empty() && absl::ascii_isdigit(piece.front())) {
      absl::StrAppend(&strategies.back(), ",", piece);
    } else {
      strategies.emplace_back(piece);
    }
  }
  for (const std::string& t : tasks) {
    if (t != "needle" && t != "magic" && t != "passkey" && t != "multikey") return Fail("unknown task " + t);
  }
  if (strategies.empty() || max_new < 1) return Fail("--strategies must name one at least; --max-new-tokens >= 1");
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

  Client client(addr);
  pb::ModelInfo info;
  if (grpc::Status s = client.Info(&info); !s.ok())
    return Fail(absl::StrCat("GetModelInfo at ", addr, ": ", s.error_message()));
  const bool chat = info.chat_template() != "unknown";
  const int context = static_cast<int>(info.context_length());
  if (lengths.empty()) {
    for (int l = 1024; l < context; l *= 2) lengths.push_back(l);
    lengths.push_back(context);
  }

  // Fillers: the essays (needle, magic, multikey) and the passkey sentences.
  const absl::StatusOr<std::string> essays = ps::ReadTextCorpus(haystack_dir);
  if (!essays.ok()) return Fail(absl::StrCat("--haystack: ", essays.status().message()));
  pb::TokenizeResponse essay_tokens, passkey_tokens;
  if (grpc::Status s = client.Tokenize(*essays, &essay_tokens); !s.ok()) return Fail("Tokenize: " + s.error_message());
  if (grpc::Status s =
          client.Tokenize("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ",
                          &passkey_tokens);
      !s.ok()) {
    return Fail("Tokenize: " + s.error_message());
  }

  std::mt19937 rng(static_cast<uint32_t>(seed));
  auto number = [&](int digits) {
    std::string s = std::to_string(1 + rng() % 9);
    while (static_cast<int>(s.size()) < digits) s += std::to_string(rng() % 10);
    return s;
  };
  const std::vector<std::string> keys = {"apple", "river", "lantern", "violin"};
  std::vector<Prompt> prompts;
  for (int64_t length : lengths) {
    for (int64_t depth : depths) {
      for (const std::string& task : tasks) {
        Prompt p{.task = task, .length = static_cast<int>(length), .depth = static_cast<int>(depth)};
        std::vector<Needle> needles;
        std::string question;
        const double d = depth / 100.0;
        if (task == "needle") {
          needles = {
              {d, "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."}};
          question = "What is the best thing to do in San Francisco?";
          p.key = "Dolores Park";
        } else if (task == "magic") {
          p.key = number(7);
          needles = {{d, absl::StrCat("The special magic number is: ", p.key, ".")}};
          question = "What is the special magic number mentioned in the text? Answer with the number only.";
        } else if (task == "passkey") {
          p.key = number(5);
          needles = {{d, absl::StrCat("The pass key is ", p.key, ". Remember it. ", p.key, " is the pass key.")}};
          question = "What is the pass key? Answer with the number only.";
        } else {  // multikey: the asked key at the depth, the others spread around it
          for (size_t k = 0; k < keys.size(); ++k) {
            const std::string n = number(7);
            const double at = k == 2 ? d : std::fmod(d + 0.2 * (static_cast<double>(k) + 1.0), 1.0);
            needles.push_back({at, absl::StrCat("The special magic number for ", keys[k], " is: ", n, ".")});
            if (k == 2) p.key = n;
          }
          question = absl::StrCat("What is the special magic number for ", keys[2], "? Answer with the number only.");
        }
        // Room for the question, the needles and the chat template's tokens.
        pb::TokenizeResponse extra;
        std::string extra_text = question;
        for (const Needle& n : needles) absl::StrAppend(&extra_text, " ", n.text);
        if (grpc::Status s = client.Tokenize(extra_text, &extra); !s.ok())
          return Fail("Tokenize: " + s.error_message());
        const int budget = static_cast<int>(length) - extra.token_ids_size() - 48 - static_cast<int>(max_new);
        if (budget < 16) return Fail(absl::StrCat("length ", length, " leaves no room for a haystack"));
        const std::string hay = Haystack(client, task == "passkey" ? passkey_tokens : essay_tokens, budget, needles);
        p.text =
            chat ? absl::StrCat(hay, "\n\n", question) : absl::StrCat(hay, "\n\nQuestion: ", question, "\nAnswer:");
        prompts.push_back(std::move(p));
      }
    }
  }

  std::ofstream csv;
  if (!csv_path.empty()) {
    csv.open(csv_path);
    if (!csv) return Fail("cannot write " + csv_path);
    csv << "model,task,length,depth,strategy,prompt_tokens,correct,ttft_s,prompt_computed_pct,kv_blocks,kv_device_"
           "blocks,answer\n";
  }
  struct Cell {
    int n = 0, correct = 0;
    double ttft = 0, computed = 0;
    uint64_t kv_blocks = 0, kv_device_blocks = 0;
  };
  std::map<std::pair<std::string, int>, Cell> cells;  // (strategy, length)
  std::fprintf(stderr, "%s: %zu prompts x %zu strategies\n", info.name().c_str(), prompts.size(), strategies.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Prompt& p = prompts[i];
    for (const std::string& strategy : strategies) {
      pb::GenerateRequest req;
      if (chat) {
        pb::ChatMessage* m = req.mutable_messages()->add_messages();
        m->set_role("user");
        m->set_content(p.text);
      } else {
        req.set_text(p.text);
      }
      req.mutable_sampling()->set_temperature(0);
      req.mutable_stopping()->set_max_new_tokens(static_cast<uint32_t>(max_new));
      *req.mutable_pruning() = configs[strategy];
      std::string answer;
      pb::Finished fin;
      const grpc::Status s = client.Generate(req, &answer, &fin);
      if (!s.ok()) return Fail(absl::StrCat(p.task, " at ", p.length, " tokens, ", strategy, ": ", s.error_message()));
      const bool correct = Lower(answer).find(Lower(p.key)) != std::string::npos;
      const pb::Usage& u = fin.usage();
      const double computed = u.prompt_tokens() > 0 ? 100.0 * u.prompt_tokens_computed() / u.prompt_tokens() : 0;
      Cell& c = cells[{strategy, p.length}];
      ++c.n;
      c.correct += correct;
      c.ttft += u.time_to_first_token_seconds();
      c.computed += computed;
      c.kv_blocks = std::max<uint64_t>(c.kv_blocks, u.kv_blocks());
      c.kv_device_blocks = std::max<uint64_t>(c.kv_device_blocks, u.kv_device_blocks());
      std::fprintf(stderr, "[%zu/%zu] %-8s %6d tok depth %3d%% %-16s %s ttft %.2f s computed %.0f%%\n", i + 1,
                   prompts.size(), p.task.c_str(), u.prompt_tokens(), p.depth, strategy.c_str(),
                   correct ? "ok  " : "miss", u.time_to_first_token_seconds(), computed);
      if (csv.is_open()) {
        std::string quoted = answer;
        absl::StrReplaceAll({{"\"", "\"\""}, {"\n", "\\n"}, {"\r", "\\r"}}, &quoted);  // one row per line
        const std::string label = absl::StrContains(strategy, ',') ? absl::StrCat("\"", strategy, "\"") : strategy;
        csv << absl::StrFormat("%s,%s,%d,%d,%s,%u,%d,%.4f,%.1f,%u,%u,\"%s\"\n", info.name(), p.task, p.length, p.depth,
                               label, u.prompt_tokens(), correct ? 1 : 0, u.time_to_first_token_seconds(), computed,
                               u.kv_blocks(), u.kv_device_blocks(), quoted);
      }
    }
  }

  std::printf("\n%s (%s), tasks %s, depths %s\n", info.name().c_str(), addr.c_str(), tasks_flag.c_str(),
              absl::StrJoin(depths, ",").c_str());
  std::printf("%-16s %7s %9s %9s %8s %9s %10s %10s\n", "strategy", "length", "accuracy", "ttft_s", "speedup",
              "computed", "kv_blocks", "kv_device");
  for (int64_t length : lengths) {
    const auto base = cells.find({"full", static_cast<int>(length)});
    for (const std::string& strategy : strategies) {
      const Cell& c = cells[{strategy, static_cast<int>(length)}];
      if (c.n == 0) continue;
      const double ttft = c.ttft / c.n;
      const std::string speedup = base != cells.end() && base->second.n > 0 && ttft > 0
                                      ? absl::StrFormat("%.2fx", base->second.ttft / base->second.n / ttft)
                                      : "-";
      std::printf("%-16s %7lld %8.1f%% %9.3f %8s %8.1f%% %10llu %10llu\n", strategy.c_str(),
                  static_cast<long long>(length), 100.0 * c.correct / c.n, ttft, speedup.c_str(), c.computed / c.n,
                  static_cast<unsigned long long>(c.kv_blocks), static_cast<unsigned long long>(c.kv_device_blocks));
    }
  }
  if (csv.is_open()) std::printf("rows: %s\n", csv_path.c_str());
  return 0;
}
