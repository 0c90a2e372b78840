#include "engine/pruning/snapkv.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/pruning/selection.h"
#include "kernels/cpu/vec.h"

namespace ps {
namespace {

class Params final : public BoundParams<Params, SnapKvParams> {
 public:
  static constexpr StructField<SnapKvParams> kFields[] = {
      {"window", &SnapKvParams::window}, {"budget", &SnapKvParams::budget}, {"kernel", &SnapKvParams::kernel}};
  using BoundParams::BoundParams;

  absl::Status Validate(const ModelConfig& config, std::string_view field) const override {
    (void)config;
    auto bad = [&](std::string_view key, auto&&... what) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(field), ".", std::string(key), ": ", what...));
    };
    if (p_.window < 1) return bad("window", p_.window, " must be at least 1");
    if (p_.budget < p_.window) return bad("budget", p_.budget, " must hold the window (", p_.window, ")");
    if (p_.kernel < 1 || p_.kernel % 2 == 0) return bad("kernel", p_.kernel, " must be odd");
    return absl::OkStatus();
  }

  bool WholePrompt() const override { return true; }
  std::unique_ptr<PruningStrategy> Make(const ModelConfig& config) const override {
    return std::make_unique<SnapKv>(p_, config);
  }
};

}  // namespace

std::unique_ptr<StrategyParams> SnapKvDefaults(const ModelConfig& config, const CalibrationPtr& calibration) {
  (void)config, (void)calibration;
  return std::make_unique<Params>(SnapKvParams{});
}

void SnapKv::ObservePrompt(int layer, const LayerAttention& att, SeqContext& ctx) {
  std::vector<std::vector<float>>& scores = scores_[layer];
  scores.assign(n_kv_heads(), {});
  const int bt = ctx.KvBlockTokens();
  const int32_t full_pages = prompt_tokens() / bt;
  if (static_cast<int64_t>(full_pages) * bt <= params_.budget) return;  // every page stays
  const auto n = static_cast<int64_t>(att.new_positions.size());
  PS_CHECK(n == prompt_tokens() && static_cast<int64_t>(att.q_positions.size()) == n)
      << "SnapKV scores a prompt computed in one step";
  const AttentionShape& s = att.shape;
  const int group = s.n_heads / s.n_kv_heads, hd = s.head_dim;
  const int64_t w = std::min<int64_t>(params_.window, n), before = n - w;
  const float* q = att.q->Host(before, w);   // [w][q_dim]
  const float* k = att.k->Host(0, n);        // [n][kv_dim]
  if (q == nullptr || k == nullptr) return;  // the engine fails the sequence
  const int64_t q_dim = att.q->width(), kv_dim = att.k->width();
  votes_.assign(static_cast<size_t>(s.n_kv_heads) * before, 0.0f);
  logits_.resize(n);
  for (int64_t i = 0; i < w; ++i) {
    const int64_t visible = before + i + 1;  // causal: row r is position r
    for (int h = 0; h < s.n_heads; ++h) {
      const int g = h / group;
      DotRows(q + i * q_dim + static_cast<int64_t>(h) * hd, k + static_cast<int64_t>(g) * hd, kv_dim, visible, hd,
              logits_.data());
      Scale(s.scale, logits_.data(), visible);
      SoftmaxInPlace(logits_.data(), visible);
      AddInPlace(logits_.data(), votes_.data() + g * before, before);
    }
  }
  for (int g = 0; g < s.n_kv_heads; ++g) {
    const std::vector<float> pooled =
        AvgPool1d(std::span<const float>(votes_.data() + g * before, before), params_.kernel);
    std::vector<float>& page = scores[g];
    page.assign(full_pages, 0.0f);
    for (int64_t j = 0; j < before; ++j) {
      if (j / bt < full_pages) page[j / bt] += pooled[j];
    }
  }
}

void SnapKv::KeepPages(int layer, int32_t full_pages, int block_tokens, std::vector<std::vector<int32_t>>* keep) {
  const std::vector<std::vector<float>>& scores = scores_[layer];
  const int64_t window_start = prompt_tokens() - std::min(params_.window, prompt_tokens());
  for (int g = 0; g < n_kv_heads(); ++g) {
    if (scores[g].empty()) {  // the budget holds every page
      (*keep)[g].resize(full_pages);
      std::iota((*keep)[g].begin(), (*keep)[g].end(), 0);
      continue;
    }
    std::vector<float> page = scores[g];
    for (int32_t p = 0; p < full_pages; ++p) {
      if ((static_cast<int64_t>(p) + 1) * block_tokens > window_start) page[p] = std::numeric_limits<float>::infinity();
    }
    (*keep)[g] = TopKInOrder(page, std::max<int64_t>(1, params_.budget / block_tokens));
  }
}

}  // namespace ps
