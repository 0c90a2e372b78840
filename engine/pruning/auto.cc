#include "engine/pruning/auto.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps {
namespace {

class Params final : public BoundParams<Params, AutoParams> {
 public:
  static constexpr StructField<AutoParams> kFields[] = {{"min_speedup", &AutoParams::min_speedup}};
  using BoundParams::BoundParams;

  absl::Status Validate(const ModelConfig& config, std::string_view field) const override {
    (void)config;
    if (p_.calibration == nullptr || p_.calibration->auto_table == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(std::string(field),
                       ": auto needs the evaluation's table for this model; write it with pruneserve-eval "
                       "--auto-table FILE and start the server with --auto-table FILE"));
    }
    if (!(p_.min_speedup >= 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(field), ".min_speedup: ", p_.min_speedup, " must be at least 1"));
    }
    return absl::OkStatus();
  }

  bool WholePrompt() const override { return true; }
  void UseDefaults(std::shared_ptr<const DefaultParams> others) override { p_.others = std::move(others); }
  std::unique_ptr<PruningStrategy> Make(const ModelConfig& config) const override {
    return std::make_unique<Auto>(p_, config);
  }
};

}  // namespace

std::unique_ptr<StrategyParams> AutoDefaults(const ModelConfig& config, const CalibrationPtr& calibration) {
  (void)config;
  return std::make_unique<Params>(AutoParams{.calibration = calibration});
}

std::string AutoChoice(const AutoTable& table, int64_t prompt_tokens, float min_speedup,
                       const std::function<bool(const std::string&)>& usable) {
  const AutoTable::Length* at = nullptr;
  for (const AutoTable::Length& l : table.lengths) {
    if (l.from_tokens <= prompt_tokens) at = &l;
  }
  if (at == nullptr) return "full";
  const auto full = std::find_if(at->strategies.begin(), at->strategies.end(),
                                 [](const AutoTable::Entry& e) { return e.name == "full"; });
  if (full == at->strategies.end()) return "full";  // nothing to compare with
  std::string best = "full";
  double best_speedup = min_speedup;
  for (const AutoTable::Entry& e : at->strategies) {
    if (e.name == "full" || e.name == "auto" || e.score < full->lo || !e.loses.empty() || e.speedup < best_speedup) {
      continue;
    }
    if (!usable(e.name)) continue;
    best = e.name;
    best_speedup = e.speedup;
  }
  return best;
}

std::unique_ptr<PruningStrategy> Auto::Fork() const {
  std::unique_ptr<PruningStrategy> inner;
  if (inner_ != nullptr && (inner = inner_->Fork()) == nullptr) return nullptr;
  auto fork = std::make_unique<Auto>(params_, config_);
  fork->chosen_ = chosen_;
  fork->inner_ = std::move(inner);
  return fork;
}

absl::Status Auto::BeginStep(StepRows* rows, SeqContext& ctx) {
  if (chosen_ == "auto") {  // the first step holds the whole prompt
    const AutoTable& table = *params_.calibration->auto_table;
    auto make = [&](const std::string& name) -> std::unique_ptr<PruningStrategy> {
      std::shared_ptr<const StrategyParams> p;
      if (params_.others != nullptr) {
        if (auto it = params_.others->find(name); it != params_.others->end()) p = it->second;
      } else if (absl::StatusOr<const StrategyInfo*> info = FindStrategy(name); info.ok() && (*info)->defaults) {
        p = (*info)->defaults(config_, params_.calibration);
      }
      if (p == nullptr || !p->Validate(config_, name).ok()) return nullptr;
      return p->Make(config_);
    };
    chosen_ = AutoChoice(table, static_cast<int64_t>(rows->positions.size()), params_.min_speedup,
                         [&](const std::string& name) { return make(name) != nullptr; });
    if (chosen_ != "full") inner_ = make(chosen_);
  }
  return inner_ != nullptr ? inner_->BeginStep(rows, ctx) : absl::OkStatus();
}

}  // namespace ps
