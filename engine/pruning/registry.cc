#include "engine/pruning/registry.h"

#include <deque>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "engine/pruning/auto.h"
#include "engine/pruning/critiprefill.h"
#include "engine/pruning/gemfilter.h"
#include "engine/pruning/lazyllm.h"
#include "engine/pruning/pod.h"
#include "engine/pruning/sliminfer.h"
#include "engine/pruning/snapkv.h"
#include "engine/pruning/streamingllm.h"
#include "proto/field_args.h"
#include "pruneserve/v1/generation.pb.h"

namespace ps {
namespace {

struct Registry {
  std::mutex mu;
  // The table: one line per strategy. A deque keeps entries in place as it grows.
  std::deque<StrategyInfo> entries = {
      {"full", "dense attention over every token (the baseline)", nullptr},
      {"lazyllm", "LazyLLM: progressive pruning by the newest token's attention, revival from the Aux Cache",
       LazyLlmDefaults},
      {"gemfilter", "GemFilter: early layers select the top_k prompt tokens, the whole model runs on them",
       GemFilterDefaults},
      {"critiprefill",
       "CritiPrefill: prompt segments attend to their most critical key blocks (block-sparse prefill), decode dense",
       CritiPrefillDefaults},
      {"sliminfer",
       "SlimInfer: block-wise hidden-state pruning after slim layers, inactive blocks' KV in the host tier",
       SlimInferDefaults},
      {"pod",
       "PoD: per KV head, layers grouped by attention similarity share the distant tokens' scores of the group's "
       "lowest layer (needs --pod-groups; stock weights, which the paper post-trains for it)",
       PodDefaults},
      {"streamingllm",
       "StreamingLLM (KV-cache baseline): after a dense prefill, only the attention sinks' and the recent tokens' KV "
       "stays",
       StreamingLlmDefaults},
      {"snapkv",
       "SnapKV (KV-cache baseline): after a dense prefill, each KV head keeps the KV its last queries attend to most",
       SnapKvDefaults},
      {"auto",
       "auto: per request, the fastest strategy that kept full's accuracy at the prompt's length in the "
       "evaluation's table (needs --auto-table), full otherwise",
       AutoDefaults},
  };
};

Registry& TheRegistry() {
  static Registry r;
  return r;
}

// Fields of `params` from "key=value" items, through the strategy's message.
absl::Status MergeArgs(const StrategyInfo& s, const std::vector<std::string>& args, std::string_view field,
                       StrategyParams* params) {
  if (args.empty()) return absl::OkStatus();
  if (params == nullptr) return absl::InvalidArgumentError(absl::StrCat("strategy ", s.name, " has no parameters"));
  pruneserve::v1::PruningConfig config;
  PS_RETURN_IF_ERROR(SetStrategyArgs(s.name, args, &config));
  std::string name;
  return params->Merge(*SelectedStrategy(config, &name), field);
}

}  // namespace

std::vector<const StrategyInfo*> Strategies() {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<const StrategyInfo*> out;
  for (const StrategyInfo& s : r.entries) out.push_back(&s);
  return out;
}

absl::StatusOr<const StrategyInfo*> FindStrategy(std::string_view name) {
  std::vector<std::string> names;
  for (const StrategyInfo* s : Strategies()) {
    if (s->name == name) return s;
    names.push_back(s->name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown strategy '", std::string(name), "' (known: ", absl::StrJoin(names, ", "), ")"));
}

void RegisterStrategy(StrategyInfo info) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const StrategyInfo& s : r.entries)
    PS_CHECK(s.name != info.name) << "strategy " << info.name << " registered twice";
  r.entries.push_back(std::move(info));
}

absl::StatusOr<StrategyDefaults> StrategyDefaults::ForModel(const ModelConfig& config,
                                                            const std::vector<std::string>& args,
                                                            CalibrationPtr calibration) {
  StrategyDefaults d(config, std::move(calibration));
  std::map<std::string, std::vector<std::string>> by_strategy;
  for (const std::string& a : args) {
    const size_t dot = a.find('.'), eq = a.find('=');
    if (dot == std::string::npos || eq == std::string::npos || eq < dot) {
      return absl::InvalidArgumentError(absl::StrCat("'", a, "' is not STRATEGY.key=value"));
    }
    PS_ASSIGN_OR_RETURN(const StrategyInfo* s, FindStrategy(std::string_view(a).substr(0, dot)));
    by_strategy[s->name].push_back(a.substr(dot + 1));
  }
  std::map<std::string, std::shared_ptr<StrategyParams>> made;
  for (const StrategyInfo* s : Strategies()) {
    std::unique_ptr<StrategyParams> p = s->defaults ? s->defaults(config, d.calibration_) : nullptr;
    const std::string field = absl::StrCat("defaults.", s->name);
    PS_RETURN_IF_ERROR(MergeArgs(*s, by_strategy[s->name], field, p.get()));
    if (p != nullptr) {
      if (absl::Status st = p->Validate(config, field); !st.ok() && !absl::IsFailedPrecondition(st)) return st;
      made[s->name] = std::move(p);
    }
  }
  d.params_.insert(made.begin(), made.end());
  for (auto& [name, p] : made) {
    auto others = std::make_shared<DefaultParams>(d.params_);
    others->erase(name);
    p->UseDefaults(std::move(others));
  }
  return d;
}

absl::StatusOr<PruningParams> StrategyDefaults::Get(std::string_view name) const {
  PS_ASSIGN_OR_RETURN(const StrategyInfo* s, FindStrategy(name));
  auto it = params_.find(name);
  if (it != params_.end()) return PruningParams{.strategy = s, .params = it->second};
  if (s->defaults) {  // registered after these defaults were made
    std::unique_ptr<StrategyParams> p = s->defaults(config_, calibration_);
    PS_RETURN_IF_ERROR(p->Validate(config_, absl::StrCat("defaults.", s->name)));
    return PruningParams{.strategy = s, .params = std::move(p)};
  }
  return PruningParams{.strategy = s};
}

absl::StatusOr<PruningParams> StrategyDefaults::WithArgs(std::string_view name, const std::vector<std::string>& args,
                                                         std::string_view field) const {
  PS_ASSIGN_OR_RETURN(PruningParams base, Get(name));
  const std::string f = absl::StrCat(std::string(field), ".", std::string(base.name()));
  if (args.empty()) {  // the defaults as they are, which may still need a calibration
    if (base.params != nullptr) PS_RETURN_IF_ERROR(base.params->Validate(config_, f));
    return base;
  }
  std::unique_ptr<StrategyParams> p = base.params != nullptr ? base.params->Clone() : nullptr;
  PS_RETURN_IF_ERROR(MergeArgs(*base.strategy, args, f, p.get()));
  PS_RETURN_IF_ERROR(p->Validate(config_, f));
  base.params = std::move(p);
  return base;
}

absl::StatusOr<PruningParams> StrategyDefaults::FromProto(const pruneserve::v1::PruningConfig& in) const {
  std::string name;
  const google::protobuf::Message* msg = SelectedStrategy(in, &name);
  if (msg == nullptr) return Get("full");
  absl::StatusOr<PruningParams> base = Get(name);
  if (!base.ok()) return absl::InvalidArgumentError(absl::StrCat("pruning: ", base.status().message()));
  if (base->params == nullptr) return base;
  std::unique_ptr<StrategyParams> p = base->params->Clone();
  const std::string field = absl::StrCat("pruning.", name);
  PS_RETURN_IF_ERROR(p->Merge(*msg, field));
  PS_RETURN_IF_ERROR(p->Validate(config_, field));
  base->params = std::move(p);
  return base;
}

void PruningToProto(const PruningParams& p, pruneserve::v1::PruningConfig* out) {
  absl::StatusOr<google::protobuf::Message*> msg = SelectStrategy(p.name(), out);
  if (msg.ok() && p.params != nullptr) p.params->ToProto(*msg);
}

std::string PruningArgsText(const PruningParams& p) {
  pruneserve::v1::PruningConfig config;
  PruningToProto(p, &config);
  std::string name;
  const google::protobuf::Message* msg = SelectedStrategy(config, &name);
  if (msg == nullptr) return "";
  std::vector<std::string> items;
  for (const auto& [key, value] : FieldsAsArgs(*msg)) items.push_back(absl::StrCat(key, "=", value));
  return absl::StrJoin(items, " ");
}

}  // namespace ps
