// The strategy registry: one table line per strategy (registry.cc), each pointing
// at its file's parameters, which carry the defaults for an L-layer model,
// validation naming the field, the binding of its fields to its PruningConfig
// message (BoundParams: through which `key=value` text is parsed too,
// proto/field_args.h) and the factory.
// Adding a strategy = its file + its proto message + one table line; the server's
// flags and GetModelInfo, the offline runner's help and the metrics read the table.
// Tests may add strategies at run time (RegisterStrategy).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/pruning/calibration.h"
#include "engine/pruning/param_fields.h"
#include "engine/pruning/strategy.h"
#include "model/model.h"

namespace google::protobuf {
class Message;
}
namespace pruneserve::v1 {
class PruningConfig;
}

namespace ps {

class StrategyParams;
// Strategies' parameters by name: the server's defaults (--strategy-arg applied).
using DefaultParams = std::map<std::string, std::shared_ptr<const StrategyParams>, std::less<>>;

// One strategy's parameters. Immutable once validated; shared by the requests
// that use them.
class StrategyParams {
 public:
  virtual ~StrategyParams() = default;
  virtual std::unique_ptr<StrategyParams> Clone() const = 0;
  // Fields set in `msg` (this strategy's message of PruningConfig) replace these;
  // errors name them under `field` (e.g. "pruning.lazyllm").
  virtual absl::Status Merge(const google::protobuf::Message& msg, std::string_view field) = 0;
  // Every parameter into `msg`.
  virtual void ToProto(google::protobuf::Message* msg) const = 0;
  // Checks against the model; errors name the field as `<field>.<key>`.
  virtual absl::Status Validate(const ModelConfig& config, std::string_view field) const = 0;
  // What to know of these parameters on this model (defaults that a calibration
  // would set and did not), or "".
  virtual std::string Caveat() const { return {}; }
  // The prompt must be computed in a single step (the strategy scores tokens from
  // the last prompt token), not in chunks.
  virtual bool WholePrompt() const { return false; }
  // The prefix cache (memory/prefix_index.h): the key under which the KV this
  // strategy leaves for a prompt prefix may be cached and reused, when that KV
  // depends on the prefix alone ("" : the KV `full` leaves); nullopt when it
  // depends on the whole prompt (no reuse either way).
  virtual std::optional<std::string> PrefixCacheKey() const { return std::nullopt; }
  // A fresh strategy for one sequence. The parameters must be valid.
  virtual std::unique_ptr<PruningStrategy> Make(const ModelConfig& config) const = 0;
  // The other strategies' defaults, given once they are all made (StrategyDefaults::
  // ForModel): a strategy that runs another one (auto) runs it with these. They must
  // not hold this strategy's own parameters (a cycle).
  virtual void UseDefaults(std::shared_ptr<const DefaultParams> others) { (void)others; }
};

// StrategyParams over a parameter struct P whose members Derived binds to its
// message's fields (`static constexpr StructField<P> kFields[]`, param_fields.h):
// Clone, Merge and ToProto by reflection, no conversion code per strategy. A
// strategy with rules of its own (presets, lists given together) adds them to Merge.
template <typename Derived, typename P>
class BoundParams : public StrategyParams {
 public:
  explicit BoundParams(P p) : p_(std::move(p)) {}
  std::unique_ptr<StrategyParams> Clone() const override {
    return std::make_unique<Derived>(static_cast<const Derived&>(*this));
  }
  absl::Status Merge(const google::protobuf::Message& msg, std::string_view field) override {
    return ReadFields(Derived::kFields, msg, field, &p_);
  }
  void ToProto(google::protobuf::Message* msg) const override { WriteFields(Derived::kFields, p_, msg); }

 protected:
  P p_;
};

struct StrategyInfo {
  std::string name;     // the request's strategy name, and its PruningConfig message's field name
  std::string summary;  // one line for help texts
  // The defaults for a model, from its calibration where it has one (may be null);
  // null for `full` (no parameters, no strategy object). Parameters that cannot run
  // without a calibration fail Validate with FailedPrecondition, naming what is missing.
  std::function<std::unique_ptr<StrategyParams>(const ModelConfig&, const CalibrationPtr&)> defaults;
};

// The registered strategies, `full` first, in table order.
std::vector<const StrategyInfo*> Strategies();
// InvalidArgument listing the known names when there is none.
absl::StatusOr<const StrategyInfo*> FindStrategy(std::string_view name);
// Adds a strategy (names are unique). Thread-safe; for tests and plug-ins.
void RegisterStrategy(StrategyInfo info);

// A request's strategy with its parameters (null for `full`).
struct PruningParams {
  const StrategyInfo* strategy = nullptr;  // null means `full`
  std::shared_ptr<const StrategyParams> params;

  std::string_view name() const { return strategy != nullptr ? std::string_view(strategy->name) : "full"; }
  bool WholePrompt() const { return params != nullptr && params->WholePrompt(); }
  std::optional<std::string> PrefixCacheKey() const {
    return params != nullptr ? params->PrefixCacheKey() : std::optional<std::string>("");
  }
  // A fresh strategy for one sequence; null for `full`.
  std::unique_ptr<PruningStrategy> Make(const ModelConfig& config) const {
    return params != nullptr ? params->Make(config) : nullptr;
  }
};

// Every strategy's parameters for one model: the defaults, then `--strategy-arg`
// style overrides. What the server fills unset request fields from.
class StrategyDefaults {
 public:
  // The model's defaults (from its calibration, when given) with "STRATEGY.key=value"
  // items on top, each strategy validated (errors name the field as
  // defaults.<strategy>.<key>); a strategy that needs a missing calibration stays
  // unavailable (its requests fail with FailedPrecondition) without failing the rest.
  static absl::StatusOr<StrategyDefaults> ForModel(const ModelConfig& config, const std::vector<std::string>& args = {},
                                                   CalibrationPtr calibration = nullptr);
  // Strategy `name` with its defaults (FindStrategy's error when unknown).
  absl::StatusOr<PruningParams> Get(std::string_view name) const;
  // Strategy `name` with "key=value" items over its defaults, validated; errors
  // name the field under `field` (e.g. "--strategy-arg").
  absl::StatusOr<PruningParams> WithArgs(std::string_view name, const std::vector<std::string>& args,
                                         std::string_view field) const;
  // The request's strategy: its message's set fields over these defaults, validated
  // (errors name the field: pruning.<strategy>.<key>). `full` when none is set.
  absl::StatusOr<PruningParams> FromProto(const pruneserve::v1::PruningConfig& in) const;

 private:
  StrategyDefaults(const ModelConfig& config, CalibrationPtr calibration)
      : config_(config), calibration_(std::move(calibration)) {}
  ModelConfig config_;
  CalibrationPtr calibration_;
  DefaultParams params_;
};

// The strategy with every parameter, as the API's message.
void PruningToProto(const PruningParams& p, pruneserve::v1::PruningConfig* out);
// "key=value key=value" (for logs); "" for `full`.
std::string PruningArgsText(const PruningParams& p);

}  // namespace ps
