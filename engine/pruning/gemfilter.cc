#include "engine/pruning/gemfilter.h"

#include <limits>

#include "base/status.h"
#include "engine/pruning/selection.h"

namespace ps {

absl::Status GemFilter::BeginStep(StepRows* rows, StrategyContext& ctx) {
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
    kept.positions.push_back(params_.original_positions ? rows->positions[r] : rows->positions[0] + static_cast<int32_t>(i));
    kept.origin.push_back(rows->origin[r]);
  }
  *rows = std::move(kept);
  return absl::OkStatus();
}

LastQueryStat GemFilter::WantsLastQuery(int layer) const {
  return scoring_ && layer == params_.filter_layer ? LastQueryStat::kLogits : LastQueryStat::kNone;
}

void GemFilter::AfterAttention(int layer, std::span<const float> logits, std::span<const int32_t> kv_positions) {
  (void)layer, (void)kv_positions;
  // The scratch KV holds exactly the prompt rows, in order.
  scores_.assign(logits.begin(), logits.end());
}

}  // namespace ps
