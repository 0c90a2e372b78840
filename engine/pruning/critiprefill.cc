#include "engine/pruning/critiprefill.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/pruning/selection.h"
#include "kernels/cpu/vec.h"

namespace ps {
namespace {

class Params final : public BoundParams<Params, CritiPrefillParams> {
 public:
  static constexpr StructField<CritiPrefillParams> kFields[] = {
      {"segment_size", &CritiPrefillParams::segment_size},
      {"block_size", &CritiPrefillParams::block_size},
      {"budget", &CritiPrefillParams::budget},
      {"dense_prefix", &CritiPrefillParams::dense_prefix},
      {"fusion_prev_weight", &CritiPrefillParams::fusion_prev_weight}};
  using BoundParams::BoundParams;

  absl::Status Validate(const ModelConfig& config, std::string_view field) const override {
    (void)config;
    auto bad = [&](std::string_view key, auto&&... what) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(field), ".", std::string(key), ": ", what...));
    };
    if (p_.block_size < 1) return bad("block_size", p_.block_size, " must be at least 1");
    if (p_.segment_size < p_.block_size || p_.segment_size % p_.block_size != 0) {
      return bad("segment_size", p_.segment_size, " must be a positive multiple of block_size (", p_.block_size, ")");
    }
    if (p_.budget < 1) return bad("budget", p_.budget, " must be at least 1");
    if (!(p_.fusion_prev_weight >= 0.0f && p_.fusion_prev_weight < 1.0f)) {
      return bad("fusion_prev_weight", p_.fusion_prev_weight, " must be in [0, 1)");
    }
    return absl::OkStatus();
  }

  bool WholePrompt() const override { return true; }
  std::unique_ptr<PruningStrategy> Make(const ModelConfig& config) const override {
    (void)config;
    return std::make_unique<CritiPrefill>(p_);
  }
};

}  // namespace

std::unique_ptr<StrategyParams> CritiPrefillDefaults(const ModelConfig& config, const CalibrationPtr& calibration) {
  (void)config, (void)calibration;
  return std::make_unique<Params>(CritiPrefillParams{});
}

std::vector<float> BlockCriticality(std::span<const float> q_rep, std::span<const float> k_rep, int head_dim) {
  PS_CHECK(head_dim > 0 && !q_rep.empty() && q_rep.size() % head_dim == 0 && k_rep.size() % (2 * head_dim) == 0)
      << "criticality: representatives are not whole rows";
  // The mean of the dot products over the query representatives is the dot product
  // with their mean.
  const auto n_q = static_cast<int64_t>(q_rep.size() / head_dim);
  std::vector<float> q_mean(head_dim, 0.0f);
  for (int64_t r = 0; r < n_q; ++r) {
    for (int d = 0; d < head_dim; ++d) q_mean[d] += q_rep[r * head_dim + d];
  }
  for (float& x : q_mean) x /= static_cast<float>(n_q);
  const auto n_blocks = static_cast<int64_t>(k_rep.size() / (2 * head_dim));
  std::vector<float> dots(2 * n_blocks), out(n_blocks);
  DotRows(q_mean.data(), k_rep.data(), head_dim, 2 * n_blocks, head_dim, dots.data());
  for (int64_t b = 0; b < n_blocks; ++b) out[b] = std::max(dots[2 * b], dots[2 * b + 1]);
  return out;
}

void CritiPrefill::ScoreSegment(int layer, const AttentionShape& s, const float* q_reps, int64_t segment, int kv_head) {
  const int hd = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const int64_t begin = segment * params_.segment_size, q_dim = static_cast<int64_t>(s.n_heads) * hd;
  // The group's heads' columns of the segment's max row and min row.
  std::vector<float> q_rep(2 * group * hd);
  for (int g = 0; g < group; ++g) {
    const float* max = q_reps + 2 * segment * q_dim + static_cast<int64_t>(kv_head * group + g) * hd;
    std::copy(max, max + hd, q_rep.begin() + 2 * g * hd);
    std::copy(max + q_dim, max + q_dim + hd, q_rep.begin() + (2 * g + 1) * hd);
  }
  const int64_t n_blocks = begin / params_.block_size;  // strictly before the segment
  const int64_t total_blocks = static_cast<int64_t>(k_rep_.size()) / (s.n_kv_heads * 2 * hd);
  std::vector<float> cur = BlockCriticality(
      q_rep, std::span<const float>(k_rep_.data() + kv_head * total_blocks * 2 * hd, n_blocks * 2 * hd), hd);
  SoftmaxInPlace(cur.data(), n_blocks);
  std::vector<float>& fused = fused_[segment * s.n_kv_heads + kv_head];
  if (layer <= 1 || fused.size() != cur.size()) {
    fused = std::move(cur);
    return;
  }
  const float w = params_.fusion_prev_weight;
  for (int64_t b = 0; b < n_blocks; ++b) fused[b] = w * fused[b] + (1.0f - w) * cur[b];
}

void CritiPrefill::SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) {
  const auto n = static_cast<int64_t>(att.new_positions.size());
  // Only the prompt's step: every cached row is new and queried. Layer 0 is dense.
  if (layer == 0 || static_cast<int64_t>(att.q_positions.size()) != n ||
      static_cast<int64_t>(ctx.Kv(layer).positions.size()) != n) {
    return;
  }
  const int64_t seg = params_.segment_size, bs = params_.block_size;
  const int64_t n_segments = (n + seg - 1) / seg;
  const int64_t chosen = (params_.budget + bs - 1) / bs;
  auto sparse = [&](int64_t i) {
    return i * seg >= params_.dense_prefix && i + 1 < n_segments && i * seg / bs > chosen;
  };
  int64_t last_sparse = -1;
  for (int64_t i = 0; i < n_segments; ++i) {
    if (sparse(i)) last_sparse = i;
  }
  if (last_sparse < 0) return;

  // Representatives, reduced where the queries and keys live: each segment's up to
  // the last sparse one, and every KV head's blocks before that segment.
  const AttentionShape& s = att.shape;
  const int hd = s.head_dim;
  const int64_t n_blocks = last_sparse * seg / bs;
  bounds_.clear();
  for (int64_t i = 0; i <= last_sparse + 1; ++i) bounds_.push_back(static_cast<int32_t>(i * seg));
  // Valid until the next read through att.q (none below; the keys have their own view).
  const float* q_rep = att.q->Reduce(bounds_, RowReduction::kMaxMin);
  if (q_rep == nullptr) return;  // the engine fails the sequence
  bounds_.clear();
  for (int64_t b = 0; b <= n_blocks; ++b) bounds_.push_back(static_cast<int32_t>(b * bs));
  const float* k_rep = att.k->Reduce(bounds_, RowReduction::kMaxMin);  // [block][max, min][kv_dim]
  if (k_rep == nullptr) return;
  const int64_t kv_dim = static_cast<int64_t>(s.n_kv_heads) * hd;
  k_rep_.resize(s.n_kv_heads * n_blocks * 2 * hd);  // [kv head][block][max, min][head_dim]
  for (int h = 0; h < s.n_kv_heads; ++h) {
    for (int64_t r = 0; r < 2 * n_blocks; ++r) {
      const float* from = k_rep + r * kv_dim + h * hd;
      std::copy(from, from + hd, k_rep_.begin() + (h * 2 * n_blocks + r) * hd);
    }
  }
  fused_.resize(n_segments * s.n_kv_heads);

  selection->segments.clear();
  for (int64_t i = 0; i < n_segments; ++i) {
    const auto begin = static_cast<int32_t>(i * seg), end = static_cast<int32_t>(std::min(n, (i + 1) * seg));
    if (!sparse(i)) {  // dense: every row before its end (causal); runs of dense segments merge
      std::vector<KvSelection::Segment>& out = selection->segments;
      if (!out.empty() && out.back().kv_head == -1) {
        out.back().q_end = end;
        out.back().ranges.assign(1, KvRange{0, end});
      } else {
        out.push_back({.q_begin = begin, .q_end = end, .ranges = {{0, end}}});
      }
      continue;
    }
    for (int h = 0; h < s.n_kv_heads; ++h) {
      ScoreSegment(layer, s, q_rep, i, h);
      KvSelection::Segment out{.q_begin = begin, .q_end = end, .kv_head = h};
      for (int32_t b : TopKInOrder(fused_[i * s.n_kv_heads + h], chosen)) {
        AppendRange(out.ranges, static_cast<int32_t>(b * bs), static_cast<int32_t>((b + 1) * bs));
      }
      AppendRange(out.ranges, begin, end);  // its own keys
      selection->segments.push_back(std::move(out));
    }
  }
}

}  // namespace ps
