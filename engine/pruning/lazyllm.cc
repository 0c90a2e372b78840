#include "engine/pruning/lazyllm.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "base/status.h"
#include "engine/pruning/selection.h"

namespace ps {

LazyLlm::LazyLlm(const LazyLlmParams& params, const ModelConfig& config)
    : layers_(params.layers),
      keep_(params.keep),
      n_layers_(config.n_layers),
      n_embd_(config.n_embd),
      aux_at_(params.layers.size(), 0) {
  PS_CHECK(layers_.size() == keep_.size() && n_layers_ < std::numeric_limits<uint16_t>::max()) << "bad LazyLLM schedule";
}

int LazyLlm::PruneIndex(int layer) const {
  auto it = std::lower_bound(layers_.begin(), layers_.end(), layer);
  return it != layers_.end() && *it == layer ? static_cast<int>(it - layers_.begin()) : -1;
}

int LazyLlm::DepthAfter(int j) const {
  return j + 1 < static_cast<int>(layers_.size()) ? layers_[j + 1] : n_layers_;
}

int64_t LazyLlm::MaxAddedRows() const {
  int64_t most = 0;  // revivals at L_j: Aux Cache entries there, and at most the selection
  for (size_t j = 0; j < layers_.size(); ++j) {
    most = std::max(most, std::min(aux_at_[j], KeepCount(keep_[j], context_ + 1)));
  }
  return most;
}

absl::Status LazyLlm::BeginStep(StepRows* rows, StrategyContext& ctx) {
  (void)ctx;
  int32_t end = context_;
  for (int32_t p : rows->positions) end = std::max(end, p + 1);
  if (end > context_) {
    depth_.resize(end, 0);
    in_aux_.resize(end, 0);
    context_ = end;
  }
  for (int32_t p : rows->positions) {
    // A new row starts at layer 0: each token is computed at most once per layer.
    PS_CHECK(depth_[p] == 0 && !in_aux_[p]) << "lazyllm: position " << p << " fed twice";
    depth_[p] = static_cast<uint16_t>(DepthAfter(-1));
  }
  selected_.assign(context_, 1);  // the selection before the first pruning layer: everything
  scores_.assign(context_, -1.0f);
  return absl::OkStatus();
}

LastQueryStat LazyLlm::WantsLastQuery(int layer) const {
  return PruneIndex(layer + 1) >= 0 ? LastQueryStat::kProbs : LastQueryStat::kNone;
}

void LazyLlm::AfterAttention(int layer, std::span<const float> probs, std::span<const int32_t> kv_positions) {
  Score(layer + 1, probs, kv_positions);
}

void LazyLlm::Score(int layer, std::span<const float> probs, std::span<const int32_t> kv_positions) {
  (void)layer;
  for (size_t i = 0; i < probs.size(); ++i) scores_[kv_positions[i]] = probs[i];
}

void LazyLlm::RowsForLayer(int layer, LayerRows& rows) {
  const int j = PruneIndex(layer);
  if (j < 0) return;
  const int32_t newest = rows.positions.back();
  // Candidates: the previous selection (every one of them has KV at layer-1, so a score).
  std::vector<int32_t> cand;
  std::vector<float> score;
  cand.reserve(context_);
  score.reserve(context_);
  for (int32_t p = 0; p < context_; ++p) {
    if (!selected_[p] || scores_[p] < 0.0f) continue;
    cand.push_back(p);
    score.push_back(p == newest ? std::numeric_limits<float>::infinity() : scores_[p]);
  }
  std::fill(selected_.begin(), selected_.end(), 0);
  for (int32_t i : TopKInOrder(score, KeepCount(keep_[j], context_))) selected_[cand[i]] = 1;
  std::fill(scores_.begin(), scores_.end(), -1.0f);

  const int after = DepthAfter(j);
  const size_t d = static_cast<size_t>(n_embd_);
  if (aux_.size() < static_cast<size_t>(context_) * d) aux_.resize(static_cast<size_t>(context_) * d);
  for (size_t i = 0; i < rows.positions.size(); ++i) {
    const int32_t p = rows.positions[i];
    PS_CHECK(depth_[p] == layer && !in_aux_[p]) << "lazyllm: row " << p << " reached layer " << layer << " out of turn";
    if (selected_[p]) {
      depth_[p] = static_cast<uint16_t>(after);
      continue;
    }
    (*rows.keep)[i] = 0;  // pruned here: its hidden state waits in the Aux Cache
    std::memcpy(aux_.data() + p * d, rows.hidden + i * d, d * sizeof(float));
    in_aux_[p] = 1;
    ++aux_at_[j];
    ++aux_count_;
  }
  for (int32_t p = 0; p < context_; ++p) {
    if (!selected_[p] || !in_aux_[p] || depth_[p] != layer) continue;
    // Revived: continues from this layer with its original position.
    rows.add_positions->push_back(p);
    rows.add_hidden->insert(rows.add_hidden->end(), aux_.begin() + p * d, aux_.begin() + (p + 1) * d);
    in_aux_[p] = 0;
    depth_[p] = static_cast<uint16_t>(after);
    --aux_at_[j];
    --aux_count_;
    ++revived_;
  }
}

}  // namespace ps
