#include "loadtest/workload.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "proto/field_args.h"

namespace ps::loadtest {
namespace {

using Json = nlohmann::json;

absl::StatusOr<int> MaxTokens(const Json& j) {
  if (!j.contains("max_tokens")) return 0;
  if (!j["max_tokens"].is_number_integer() || j["max_tokens"].get<int64_t>() <= 0 ||
      j["max_tokens"].get<int64_t>() > (1 << 24)) {
    return absl::InvalidArgumentError("max_tokens must be a positive integer");
  }
  return j["max_tokens"].get<int>();
}

absl::StatusOr<Prompt> ParseEntry(const Json& j, const TokenCounter& count) {
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  Prompt p;
  absl::StatusOr<int> max_tokens = MaxTokens(j);
  if (!max_tokens.ok()) return max_tokens.status();
  p.max_tokens = *max_tokens;
  if (j.contains("prompt")) {
    if (!j["prompt"].is_string() || j["prompt"].get<std::string>().empty())
      return absl::InvalidArgumentError("prompt must be a non-empty string");
    p.text = j["prompt"].get<std::string>();
  } else if (j.contains("messages")) {
    if (!j["messages"].is_array() || j["messages"].empty())
      return absl::InvalidArgumentError("messages must be a non-empty array");
    for (const Json& m : j["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
          !m["content"].is_string()) {
        return absl::InvalidArgumentError("each message needs string fields role and content");
      }
      p.messages.emplace_back(m["role"].get<std::string>(), m["content"].get<std::string>());
    }
  } else if (j.contains("conversations")) {
    if (!j["conversations"].is_array()) return absl::InvalidArgumentError("conversations must be an array");
    const Json* reply = nullptr;
    for (const Json& turn : j["conversations"]) {
      if (!turn.is_object() || !turn.contains("from") || !turn.contains("value") || !turn["value"].is_string())
        return absl::InvalidArgumentError("each conversation turn needs fields from and value");
      if (p.messages.empty() && turn["from"] == "human") {
        p.messages.emplace_back("user", turn["value"].get<std::string>());
      } else if (!p.messages.empty() && turn["from"] == "gpt") {
        reply = &turn;
        break;
      }
    }
    if (p.messages.empty()) return absl::InvalidArgumentError("the conversation has no human turn");
    if (p.max_tokens == 0 && reply != nullptr) {
      absl::StatusOr<int> n = count((*reply)["value"].get<std::string>());
      if (!n.ok()) return n.status();
      p.max_tokens = std::max(1, *n);
    }
  } else {
    return absl::InvalidArgumentError("needs one of prompt, messages or conversations");
  }
  return p;
}

}  // namespace

absl::StatusOr<std::vector<Prompt>> ParseDataset(std::istream& in, const TokenCounter& count) {
  std::vector<Prompt> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat("line ", n, ": not valid JSON"));
    absl::StatusOr<Prompt> p = ParseEntry(j, count);
    if (!p.ok()) return absl::InvalidArgumentError(absl::StrCat("line ", n, ": ", p.status().message()));
    out.push_back(*std::move(p));
  }
  if (out.empty()) return absl::InvalidArgumentError("the dataset has no prompts");
  return out;
}

absl::StatusOr<std::string> ReadTextFiles(const std::string& dir, size_t min_bytes) {
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": ", ec.message()));
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) {
    if (text.size() >= min_bytes) break;
    std::ifstream in(f, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    absl::StrAppend(&text, s.str(), "\n\n");
  }
  if (text.empty()) return absl::NotFoundError(absl::StrCat(dir, ": no text files"));
  return text;
}

Workload Workload::FromDataset(std::vector<Prompt> prompts, uint64_t seed) {
  Workload w(seed);
  w.prompts_ = std::move(prompts);
  std::shuffle(w.prompts_.begin(), w.prompts_.end(), w.rng_);
  return w;
}

Workload Workload::Synthetic(std::vector<int32_t> source, const SyntheticOptions& options, uint64_t seed) {
  Workload w(seed);
  w.source_ = std::move(source);
  w.synthetic_ = options;
  return w;
}

int Workload::Length(int mean) {
  const int lo = std::max(1, static_cast<int>(mean * (1 - synthetic_.range_ratio)));
  const int hi = std::max(lo, static_cast<int>(mean * (1 + synthetic_.range_ratio)));
  return std::uniform_int_distribution<int>(lo, hi)(rng_);
}

Prompt Workload::Next() {
  if (!prompts_.empty()) {
    Prompt p = prompts_[next_];
    next_ = (next_ + 1) % prompts_.size();
    return p;
  }
  Prompt p;
  p.token_ids = Window(source_, Length(synthetic_.input_len));
  p.max_tokens = Length(synthetic_.output_len);
  return p;
}

std::vector<int32_t> Workload::Window(const std::vector<int32_t>& source, int n) {
  std::vector<int32_t> w;
  w.reserve(n);
  size_t at = std::uniform_int_distribution<size_t>(0, source.size() - 1)(rng_);
  for (int i = 0; i < n; ++i, at = (at + 1) % source.size()) w.push_back(source[at]);
  return w;
}

Workload Workload::SharedPrefix(const std::vector<int32_t>& source, const SyntheticOptions& options,
                                const SharedPrefixOptions& shared, uint64_t seed) {
  Workload w(seed);
  w.synthetic_ = options;
  for (int d = 0; d < shared.documents; ++d) {
    const std::vector<int32_t> doc = w.Window(source, w.Length(options.input_len));
    for (int q = 0; q < shared.questions; ++q) {
      Prompt p;
      p.token_ids = doc;
      const std::vector<int32_t> question = w.Window(source, shared.question_len);
      p.token_ids.insert(p.token_ids.end(), question.begin(), question.end());
      p.max_tokens = w.Length(options.output_len);
      w.prompts_.push_back(std::move(p));
    }
  }
  std::shuffle(w.prompts_.begin(), w.prompts_.end(), w.rng_);
  return w;
}

absl::StatusOr<StrategyMix> StrategyMix::Parse(const std::string& spec) {
  StrategyMix mix;
  std::vector<double> weights;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    const std::string name(absl::StripAsciiWhitespace(kv.first));
    double w = 1;
    if (!kv.second.empty() && (!absl::SimpleAtod(kv.second, &w) || !(w >= 0) || std::isinf(w))) {
      return absl::InvalidArgumentError(absl::StrCat("--strategy-mix: '", item, "': the weight is not a number >= 0"));
    }
    pb::PruningConfig check;
    if (absl::StatusOr<google::protobuf::Message*> s = SelectStrategy(name, &check); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--strategy-mix: ", s.status().message()));
    }
    if (std::find(mix.names_.begin(), mix.names_.end(), name) != mix.names_.end())
      return absl::InvalidArgumentError(absl::StrCat("--strategy-mix: ", name, " is listed twice"));
    mix.names_.push_back(name);
    weights.push_back(w);
  }
  double total = 0;
  for (double w : weights) total += w;
  if (mix.names_.empty() || !(total > 0))
    return absl::InvalidArgumentError("--strategy-mix: no strategy with a positive weight");
  mix.pick_ = std::discrete_distribution<int>(weights.begin(), weights.end());
  return mix;
}

absl::StatusOr<pb::GenerateRequest> BuildRequest(const Prompt& prompt, const std::string& strategy,
                                                 const RequestOptions& o) {
  pb::GenerateRequest r;
  if (!prompt.token_ids.empty()) {
    r.mutable_token_ids()->mutable_ids()->Add(prompt.token_ids.begin(), prompt.token_ids.end());
  } else if (!prompt.messages.empty()) {
    for (const auto& [role, content] : prompt.messages) {
      pb::ChatMessage* m = r.mutable_messages()->add_messages();
      m->set_role(role);
      m->set_content(content);
    }
  } else {
    r.set_text(prompt.text);
  }
  r.mutable_stopping()->set_max_new_tokens(
      static_cast<uint32_t>(prompt.max_tokens > 0 ? prompt.max_tokens : o.output_len));
  r.mutable_stopping()->set_ignore_eos(o.ignore_eos);
  r.mutable_sampling()->set_temperature(static_cast<float>(o.temperature));
  if (o.seed >= 0) r.mutable_sampling()->set_seed(static_cast<uint64_t>(o.seed));
  absl::StatusOr<google::protobuf::Message*> s = SelectStrategy(strategy, r.mutable_pruning());
  if (!s.ok()) return s.status();
  return r;
}

}  // namespace ps::loadtest
