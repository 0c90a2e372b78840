#include "engine/pruning/gemfilter.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/pruning/selection.h"
#include "pruneserve/v1/generation.pb.h"

namespace ps {
namespace {

constexpr char kUncalibrated[] =
    "uncalibrated: its layers follow the depth rule, which may miss what the model attends to; start the server "
    "with --calibrate-text (or run pruneserve-calibrate) to measure them";

class Params final : public BoundParams<Params, GemFilterParams> {
 public:
  static constexpr StructField<GemFilterParams> kFields[] = {
      {"filter_layer", &GemFilterParams::filter_layer},
      {"top_k", &GemFilterParams::top_k},
      {"pool_kernel", &GemFilterParams::pool_kernel},
      {"original_positions", &GemFilterParams::original_positions}};
  // calibrated: filter_layer comes from the model's calibration.
  Params(const GemFilterParams& p, bool calibrated) : BoundParams(p), calibrated_(calibrated) {}

  absl::Status Merge(const google::protobuf::Message& msg, std::string_view field) override {
    calibrated_ = calibrated_ || static_cast<const pruneserve::v1::GemFilter&>(msg).has_filter_layer();  // chosen
    return BoundParams::Merge(msg, field);
  }

  absl::Status Validate(const ModelConfig& config, std::string_view field) const override {
    auto bad = [&](std::string_view key, auto&&... what) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(field), ".", std::string(key), ": ", what...));
    };
    const int n = config.n_layers;
    if (p_.filter_layer < 0 || p_.filter_layer >= n) {
      return bad("filter_layer", p_.filter_layer, " is outside [0, ", n - 1, "] (the model has ", n, " layers)");
    }
    if (p_.top_k < 1) return bad("top_k", p_.top_k, " must be at least 1");
    if (p_.pool_kernel < 1 || p_.pool_kernel % 2 == 0 || p_.pool_kernel > 1025) {
      return bad("pool_kernel", p_.pool_kernel, " must be odd, in [1, 1025]");
    }
    return absl::OkStatus();
  }

  std::string Caveat() const override { return calibrated_ ? std::string() : kUncalibrated; }
  bool WholePrompt() const override { return true; }
  std::unique_ptr<PruningStrategy> Make(const ModelConfig& config) const override {
    (void)config;
    return std::make_unique<GemFilter>(p_);
  }

 private:
  bool calibrated_;
};

}  // namespace

std::unique_ptr<StrategyParams> GemFilterDefaults(const ModelConfig& config, const CalibrationPtr& calibration) {
  // The calibrated layer (the first whose last-query scores locate a planted needle,
  // tools/pruneserve-calibrate), else 40% of the depth (the paper's 13 of 32).
  const int n = config.n_layers;
  const int layer = calibration != nullptr && calibration->needle_layer >= 0
                        ? calibration->needle_layer
                        : std::clamp(static_cast<int>(std::lround(0.4 * n)), 0, std::max(0, n - 1));
  return std::make_unique<Params>(GemFilterParams{.filter_layer = layer},
                                  calibration != nullptr && calibration->needle_layer >= 0);
}

absl::Status GemFilter::BeginStep(StepRows* rows, SeqContext& ctx) {
  if (filtered_) return absl::OkStatus();  // decode steps run as they come
  filtered_ = true;
  const auto n = static_cast<int64_t>(rows->tokens.size());
  if (n <= params_.top_k) return absl::OkStatus();
  scoring_ = true;
  scores_.clear();
  const absl::Status st = ctx.RunPrefix(rows->tokens, rows->positions, params_.filter_layer);
  scoring_ = false;
  PS_RETURN_IF_ERROR(st);
  PS_CHECK(static_cast<int64_t>(scores_.size()) == n) << "gemfilter: no scores from the prefix pass";
  std::vector<float> pooled = AvgPool1d(scores_, params_.pool_kernel);
  pooled.back() = std::numeric_limits<float>::infinity();  // generation continues from the last prompt token
  selected_ = TopKInOrder(pooled, params_.top_k);
  StepRows kept;
  for (size_t i = 0; i < selected_.size(); ++i) {
    const int32_t r = selected_[i];
    kept.tokens.push_back(rows->tokens[r]);
    kept.positions.push_back(params_.original_positions ? rows->positions[r]
                                                        : rows->positions[0] + static_cast<int32_t>(i));
    kept.origin.push_back(rows->origin[r]);
  }
  *rows = std::move(kept);
  return absl::OkStatus();
}

LastQueryStat GemFilter::WantsLastQuery(int layer) const {
  return scoring_ && layer == params_.filter_layer ? LastQueryStat::kLogits : LastQueryStat::kNone;
}

void GemFilter::AfterAttention(int layer, std::span<const float> logits, std::span<const int32_t> kv_positions,
                               SeqContext& ctx) {
  (void)layer, (void)kv_positions, (void)ctx;
  // The scratch KV holds exactly the prompt rows, in order.
  scores_.assign(logits.begin(), logits.end());
}

}  // namespace ps
