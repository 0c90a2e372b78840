#include "engine/pruning/lazyllm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "engine/pruning/selection.h"
#include "engine/pruning/sliminfer.h"
#include "pruneserve/v1/generation.pb.h"

namespace ps {
namespace {

// A named schedule: layers and keep fractions.
struct Preset {
  std::string name;
  std::vector<int> layers;
  std::vector<float> keep;
};

constexpr char kUncalibrated[] =
    "uncalibrated: its layers follow the depth rule, which may miss what the model attends to; start the server "
    "with --calibrate-text (or run pruneserve-calibrate) to measure them";

class Params final : public BoundParams<Params, LazyLlmParams> {
 public:
  static constexpr StructField<LazyLlmParams> kFields[] = {{"layers", &LazyLlmParams::layers},
                                                           {"keep", &LazyLlmParams::keep},
                                                           {"max_revivals", &LazyLlmParams::max_revivals}};
  // calibrated: the schedule comes from the model's calibration.
  Params(LazyLlmParams p, std::vector<Preset> presets, bool calibrated)
      : BoundParams(std::move(p)), presets_(std::move(presets)), calibrated_(calibrated) {}

  absl::Status Merge(const google::protobuf::Message& msg, std::string_view field) override {
    const auto& m = static_cast<const pruneserve::v1::LazyLLM&>(msg);
    if (m.has_preset()) {  // a named schedule, under the lists if they are given too
      auto it = std::ranges::find(presets_, m.preset(), &Preset::name);
      if (it == presets_.end()) {
        std::vector<std::string> names;
        for (const Preset& p : presets_) names.push_back(p.name);
        return absl::InvalidArgumentError(absl::StrCat(std::string(field), ".preset: unknown '", m.preset(),
                                                       "' (known: ", absl::StrJoin(names, ", "), ")"));
      }
      p_.layers = it->layers;
      p_.keep = it->keep;
      calibrated_ = calibrated_ || it->name != "default";  // a schedule chosen by name
    }
    if (m.layers_size() != 0 || m.keep_size() != 0) {
      // The schedule is given whole: both lists (Validate checks they match).
      if (m.layers_size() == 0)
        return absl::InvalidArgumentError(absl::StrCat(std::string(field), ".layers: required with keep"));
      calibrated_ = true;  // a schedule given whole
      p_.layers.clear();
      p_.keep.clear();
    }
    return BoundParams::Merge(msg, field);
  }

  absl::Status Validate(const ModelConfig& config, std::string_view field) const override {
    auto bad = [&](std::string_view key, auto&&... what) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(field), ".", std::string(key), ": ", what...));
    };
    const int n = config.n_layers;
    if (p_.max_revivals < 0) return bad("max_revivals", p_.max_revivals, " is negative");
    if (p_.layers.size() != p_.keep.size()) {
      return bad("keep", "has ", p_.keep.size(), " entries for ", p_.layers.size(),
                 " layers (one keep fraction per layer)");
    }
    for (size_t i = 0; i < p_.layers.size(); ++i) {
      const std::string li = absl::StrCat("layers[", i, "]"), ki = absl::StrCat("keep[", i, "]");
      if (p_.layers[i] < 1 || p_.layers[i] >= n) {
        return bad(li, p_.layers[i], " is outside [1, ", n - 1, "] (the model has ", n, " layers)");
      }
      if (i > 0 && p_.layers[i] <= p_.layers[i - 1]) return bad(li, "layers must be ascending");
      if (!(p_.keep[i] > 0.0f && p_.keep[i] <= 1.0f)) return bad(ki, p_.keep[i], " is outside (0, 1]");
      if (i > 0 && p_.keep[i] > p_.keep[i - 1])
        return bad(ki, "keep fractions must not increase (progressive pruning)");
    }
    return absl::OkStatus();
  }

  std::string Caveat() const override { return calibrated_ ? std::string() : kUncalibrated; }
  bool WholePrompt() const override { return !p_.layers.empty(); }
  std::unique_ptr<PruningStrategy> Make(const ModelConfig& config) const override {
    return std::make_unique<LazyLlm>(p_, config);
  }

 private:
  std::vector<Preset> presets_;  // for this model
  bool calibrated_;
};

}  // namespace

std::unique_ptr<StrategyParams> LazyLlmDefaults(const ModelConfig& config, const CalibrationPtr& calibration) {
  // Chosen on SmolLM2-135M with pruneserve-eval (README "Pruning strategies"):
  // pruning before ~60% of the depth cost that model its retrieval.
  // A calibrated model prunes from the layer after the one that locates a planted
  // needle (tools/pruneserve-calibrate), with the same keep fractions.
  // Revival is unbounded, as the paper's (max_revivals caps it: a revived token is
  // computed from its layer to the end, which slows decoding after a long prompt).
  const int n = config.n_layers;
  LazyLlmParams p;
  const std::vector<float> keep = {0.3f, 0.1f};
  if (calibration != nullptr && !calibration->lazyllm_layers.empty()) {
    for (size_t i = 0; i < calibration->lazyllm_layers.size() && i < keep.size(); ++i) {
      p.layers.push_back(calibration->lazyllm_layers[i]);
      p.keep.push_back(keep[i]);
    }
  } else {
    for (auto [depth, k] : {std::pair{0.6, keep[0]}, {0.8, keep[1]}}) {
      const int layer = std::clamp(static_cast<int>(std::lround(depth * n)), 1, std::max(1, n - 1));
      if (n < 2 || (!p.layers.empty() && layer <= p.layers.back())) continue;
      p.layers.push_back(layer);
      p.keep.push_back(k);
    }
  }
  // SlimInfer's authors ran LazyLLM pruning at their slim layers (scores from the
  // slim layer, rows pruned from the next) keeping 50% at each.
  Preset slim{.name = "sliminfer"};
  for (int l : SlimInferSchedule(config).layers) {
    slim.layers.push_back(l + 1);
    slim.keep.push_back(0.5f);
  }
  std::vector<Preset> presets = {{.name = "default", .layers = p.layers, .keep = p.keep}, std::move(slim)};
  const bool calibrated = calibration != nullptr && !calibration->lazyllm_layers.empty();
  return std::make_unique<Params>(std::move(p), std::move(presets), calibrated);
}

LazyLlm::LazyLlm(const LazyLlmParams& params, const ModelConfig& config)
    : rows_(params.layers, config.n_layers, config.n_embd), keep_(params.keep), max_revivals_(params.max_revivals) {
  PS_CHECK(params.layers.size() == keep_.size()) << "bad LazyLLM schedule";
}

int64_t LazyLlm::MaxAddedRows() const {
  int64_t most = 0;  // revivals at L_j: Aux Cache entries there, and at most the selection
  for (size_t j = 0; j < keep_.size(); ++j) {
    int64_t at_j = std::min(rows_.aux_at(static_cast<int>(j)), KeepCount(keep_[j], rows_.context() + 1));
    if (max_revivals_ > 0) at_j = std::min<int64_t>(at_j, max_revivals_);
    most = std::max(most, at_j);
  }
  return most;
}

absl::Status LazyLlm::BeginStep(StepRows* rows, SeqContext& ctx) {
  (void)ctx;
  rows_.Feed(rows->positions);
  selected_.assign(rows_.context(), 1);  // the selection before the first pruning layer: everything
  scores_.assign(rows_.context(), -1.0f);
  return absl::OkStatus();
}

LastQueryStat LazyLlm::WantsLastQuery(int layer) const {
  return rows_.PruneIndex(layer + 1) >= 0 ? LastQueryStat::kProbs : LastQueryStat::kNone;
}

void LazyLlm::AfterAttention(int layer, std::span<const float> probs, std::span<const int32_t> kv_positions,
                             SeqContext& ctx) {
  (void)ctx;
  Score(layer + 1, probs, kv_positions);
}

void LazyLlm::Score(int layer, std::span<const float> probs, std::span<const int32_t> kv_positions) {
  (void)layer;
  for (size_t i = 0; i < probs.size(); ++i) scores_[kv_positions[i]] = probs[i];
}

void LazyLlm::RowsForLayer(int layer, LayerRows& rows, SeqContext& ctx) {
  const int j = rows_.PruneIndex(layer);
  if (j < 0) return;
  const int32_t newest = rows.positions.back();
  const int32_t context = rows_.context();
  // Candidates: the previous selection (every one of them has KV at layer-1, so a score).
  cand_.clear();
  score_.clear();
  for (int32_t p = 0; p < context; ++p) {
    if (!selected_[p] || scores_[p] < 0.0f) continue;
    cand_.push_back(p);
    score_.push_back(p == newest ? std::numeric_limits<float>::infinity() : scores_[p]);
  }
  std::fill(selected_.begin(), selected_.end(), 0);
  for (int32_t i : TopKInOrder(score_, KeepCount(keep_[j], context))) selected_[cand_[i]] = 1;
  // Selected tokens waiting in the Aux Cache at this layer come back; beyond
  // max_revivals the best-scored do, and the others stay there, out of the selection.
  revive_.clear();
  for (int32_t p = 0; p < context; ++p) {
    if (selected_[p] && rows_.WaitsAt(p, j)) revive_.push_back(p);
  }
  if (max_revivals_ > 0 && static_cast<int64_t>(revive_.size()) > max_revivals_) {
    score_.clear();
    for (int32_t p : revive_) score_.push_back(scores_[p]);
    std::vector<int32_t> best = TopKInOrder(score_, max_revivals_);
    for (int32_t p : revive_) selected_[p] = 0;
    for (int32_t& i : best) {
      i = revive_[i];
      selected_[i] = 1;
    }
    revive_ = std::move(best);
  }
  std::fill(scores_.begin(), scores_.end(), -1.0f);
  rows_.Apply(j, selected_, revive_, rows, ctx);
}

void LazyLlm::SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) {
  if (rows_.layers().empty() || layer < rows_.layers()[0])
    return;  // everything is selected below the first pruning layer
  // The cached rows of selected tokens, and the rows this step computes here (those
  // include rows kept for want of Aux Cache room, attended as `full` would).
  computed_.assign(rows_.context(), 0);
  for (int32_t p : att.new_positions) computed_[p] = 1;
  const std::vector<int32_t>& positions = ctx.Kv(layer).positions;
  kv_rows_.clear();
  for (size_t r = 0; r < positions.size(); ++r) {
    const int32_t p = positions[r];
    if (selected_[p] || computed_[p]) kv_rows_.push_back(static_cast<int32_t>(r));
  }
  if (kv_rows_.size() < positions.size()) {
    selection->SelectRows(static_cast<int32_t>(att.q_positions.size()), kv_rows_);
  }
}

}  // namespace ps
