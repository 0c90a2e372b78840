#include "engine/pruning/pod.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps {
namespace {

class Params final : public BoundParams<Params, PodParams> {
 public:
  static constexpr StructField<PodParams> kFields[] = {{"delta", &PodParams::delta},
                                                       {"sinks", &PodParams::sinks},
                                                       {"recent", &PodParams::recent},
                                                       {"gate_skip", &PodParams::gate_skip}};
  using BoundParams::BoundParams;

  absl::Status Validate(const ModelConfig& config, std::string_view field) const override {
    (void)config;  // the calibration was checked against the model when it was loaded
    auto bad = [&](std::string_view key, auto&&... what) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(field), ".", std::string(key), ": ", what...));
    };
    if (p_.calibration == nullptr || p_.calibration->groups.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(std::string(field),
                                                        ": PoD needs the model's layer groups; start the server "
                                                        "with --calibrate-text TEXT to measure them, or give it "
                                                        "--pod-groups MODEL.calibration.json from "
                                                        "pruneserve-calibrate --model MODEL"));
    }
    if (!(p_.delta >= 0.0 && p_.delta <= 1.0)) return bad("delta", p_.delta, " must be in [0, 1]");
    if (p_.calibration->similarity.empty() && std::abs(p_.delta - p_.calibration->delta) > 1e-6) {
      return bad("delta", p_.delta, ": the calibration file has groups for delta ", p_.calibration->delta,
                 " only (no similarities to regroup)");
    }
    if (p_.sinks < 0) return bad("sinks", p_.sinks, " is negative");
    if (p_.recent < 1) return bad("recent", p_.recent, " must be at least 1 (the query itself)");
    if (!(p_.gate_skip >= 0.0f && p_.gate_skip <= 1.0f)) return bad("gate_skip", p_.gate_skip, " must be in [0, 1]");
    return absl::OkStatus();
  }

  std::unique_ptr<PruningStrategy> Make(const ModelConfig& config) const override {
    return std::make_unique<Pod>(p_, config);
  }
};

}  // namespace

std::unique_ptr<StrategyParams> PodDefaults(const ModelConfig& config, const CalibrationPtr& calibration) {
  PodParams p{.calibration = calibration};
  if (calibration != nullptr) p.delta = calibration->delta;
  p.recent = std::max(1, std::max(config.n_ctx, 1024) / 8 - p.sinks);
  return std::make_unique<Params>(std::move(p));
}

Pod::Pod(const PodParams& params, const ModelConfig& config)
    : params_(params),
      n_layers_(config.n_layers),
      n_kv_heads_(config.n_kv_heads),
      q_dim_(config.q_dim()),
      shares_(config.n_layers, 0),
      feeds_(config.n_layers, 0),
      last_reader_(config.n_layers, -1),
      q_(config.n_layers),
      distant_lse_(static_cast<size_t>(config.n_heads), 0.0f),
      distant_lse_valid_(config.n_kv_heads, 0) {
  PS_CHECK(params.calibration != nullptr) << "pod without a calibration";
  Calibration c = *params.calibration;
  if (!c.similarity.empty()) c.Regroup(params.delta);
  base_ = c.BaseLayers();
  for (const std::vector<int>& head : base_) {
    for (int l = 0; l < n_layers_; ++l) {
      if (head[l] == l) continue;
      shares_[l] = feeds_[head[l]] = 1;
      last_reader_[head[l]] = std::max(last_reader_[head[l]], l);
    }
  }
  plan_.base.resize(n_kv_heads_);
  plan_.base_q.resize(n_kv_heads_);
  plan_.q_stride = q_dim_;
  plan_.sinks = params.sinks;
  plan_.recent = params.recent;
  plan_.gate_skip = params.gate_skip;
  plan_.distant_lse = distant_lse_.data();
  plan_.distant_lse_valid = distant_lse_valid_.data();
  plan_.distant_skipped = &distant_skipped_;
}

std::unique_ptr<PruningStrategy> Pod::Fork() const {
  auto fork = std::make_unique<Pod>(*this);
  fork->plan_.distant_lse = fork->distant_lse_.data();  // the plan points into its own strategy
  fork->plan_.distant_lse_valid = fork->distant_lse_valid_.data();
  fork->plan_.distant_skipped = &fork->distant_skipped_;
  return fork;
}

double Pod::KeySaving() const {
  int64_t shared = 0;
  for (const std::vector<int>& head : base_) {
    for (int l = 0; l < n_layers_; ++l) shared += head[l] != l;
  }
  return static_cast<double>(shared) / (static_cast<double>(n_layers_) * n_kv_heads_);
}

absl::Status Pod::BeginStep(StepRows* rows, SeqContext& ctx) {
  (void)rows, (void)ctx;
  std::fill(distant_lse_valid_.begin(), distant_lse_valid_.end(), 0);
  return absl::OkStatus();
}

void Pod::SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) {
  (void)ctx, (void)selection;
  for (int h = 0; h < n_kv_heads_; ++h) {
    if (base_[h][layer] == layer) distant_lse_valid_[h] = 0;  // a new group: its own distant scores
  }
  for (int b = 0; b < layer; ++b) {
    if (feeds_[b] && last_reader_[b] < layer) std::vector<float>().swap(q_[b]);  // read by no layer from here
  }
  if (!feeds_[layer]) return;
  // The layers above in the group score distant tokens with these queries.
  const auto n = static_cast<int64_t>(att.q_positions.size());
  const float* rows = att.q->Host(0, n);
  q_[layer].assign(rows, rows + n * q_dim_);
}

const SharedScores* Pod::ShareScores(int layer) {
  if (!shares_[layer]) return nullptr;
  for (int h = 0; h < n_kv_heads_; ++h) {
    const int b = base_[h][layer];
    plan_.base[h] = b;
    plan_.base_q[h] = b != layer ? q_[b].data() : nullptr;
  }
  return &plan_;
}

}  // namespace ps
