#include "engine/pruning/sliminfer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/pruning/selection.h"
#include "kernels/cpu/vec.h"
#include "pruneserve/v1/generation.pb.h"

namespace ps {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

class Params final : public BoundParams<Params, SlimInferParams> {
 public:
  static constexpr StructField<SlimInferParams> kFields[] = {
      {"layers", &SlimInferParams::layers},         {"budgets", &SlimInferParams::budgets},
      {"block_size", &SlimInferParams::block_size}, {"unit_size", &SlimInferParams::unit_size},
      {"window", &SlimInferParams::window},         {"gamma", &SlimInferParams::gamma}};
  using BoundParams::BoundParams;

  absl::Status Merge(const google::protobuf::Message& msg, std::string_view field) override {
    const auto& m = static_cast<const pruneserve::v1::SlimInfer&>(msg);
    if (m.layers_size() != 0 || m.budgets_size() != 0) {
      // The schedule is given whole: both lists (Validate checks they match).
      if (m.layers_size() == 0) {
        return absl::InvalidArgumentError(absl::StrCat(std::string(field), ".layers: required with budgets"));
      }
      p_.layers.clear();
      p_.budgets.clear();
    }
    return BoundParams::Merge(msg, field);
  }

  absl::Status Validate(const ModelConfig& config, std::string_view field) const override {
    auto bad = [&](std::string_view key, auto&&... what) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(field), ".", std::string(key), ": ", what...));
    };
    const int n = config.n_layers;
    if (p_.unit_size < 1) return bad("unit_size", p_.unit_size, " must be at least 1");
    if (p_.block_size < p_.unit_size || p_.block_size % p_.unit_size != 0) {
      return bad("block_size", p_.block_size, " must be a positive multiple of unit_size (", p_.unit_size, ")");
    }
    if (p_.window < 1) return bad("window", p_.window, " must be at least 1");
    if (!(p_.gamma >= 0.0f && p_.gamma <= 1.0f)) return bad("gamma", p_.gamma, " must be in [0, 1]");
    if (p_.layers.size() != p_.budgets.size()) {
      return bad("budgets", "has ", p_.budgets.size(), " entries for ", p_.layers.size(),
                 " layers (one token budget per slim layer)");
    }
    for (size_t i = 0; i < p_.layers.size(); ++i) {
      const std::string li = absl::StrCat("layers[", i, "]"), bi = absl::StrCat("budgets[", i, "]");
      if (p_.layers[i] < 0 || p_.layers[i] > n - 2) {
        return bad(li, p_.layers[i], " is outside [0, ", n - 2, "] (the model has ", n,
                   " layers and a slim layer needs one after it)");
      }
      if (i > 0 && p_.layers[i] <= p_.layers[i - 1]) return bad(li, "layers must be ascending");
      if (p_.budgets[i] < 1) return bad(bi, p_.budgets[i], " must be at least 1");
      if (i > 0 && p_.budgets[i] > p_.budgets[i - 1]) return bad(bi, "budgets must not increase");
    }
    return absl::OkStatus();
  }

  bool WholePrompt() const override { return !p_.layers.empty(); }
  std::unique_ptr<PruningStrategy> Make(const ModelConfig& config) const override {
    return std::make_unique<SlimInfer>(p_, config);
  }
};

}  // namespace

SlimInferParams SlimInferSchedule(const ModelConfig& config) {
  // The paper's two schedules: (layer of its model's depth, tokens kept).
  struct Point {
    int layer, tokens;
  };
  constexpr Point kLlama[] = {{10, 8192}, {20, 4096}, {30, 2048}};  // LLaMA-3.1-8B, 32 layers
  constexpr Point kQwen[] = {{9, 12288}, {18, 6144}, {26, 4096}};   // Qwen2.5-7B, 28 layers
  const bool qwen = config.arch == Arch::kQwen2;
  const std::span<const Point> schedule = qwen ? std::span<const Point>(kQwen) : std::span<const Point>(kLlama);
  const double depth = qwen ? 28.0 : 32.0;
  const int n = config.n_layers;
  SlimInferParams p;
  for (const Point& at : schedule) {
    const int layer = std::min(static_cast<int>(std::lround(at.layer * n / depth)), n - 2);
    if (layer < 0 || (!p.layers.empty() && layer <= p.layers.back())) continue;
    p.layers.push_back(layer);
    p.budgets.push_back(at.tokens);
  }
  return p;
}

std::unique_ptr<StrategyParams> SlimInferDefaults(const ModelConfig& config, const CalibrationPtr& calibration) {
  (void)calibration;
  return std::make_unique<Params>(SlimInferSchedule(config));
}

void UnitMeans(std::span<const float> sums, std::span<const int32_t> counts, int width, std::vector<float>* out) {
  PS_CHECK(sums.size() == counts.size() * width) << "unit means: bad shapes";
  out->assign(sums.size(), 0.0f);
  for (size_t u = 0; u < counts.size(); ++u) {
    if (counts[u] == 0) continue;
    const float inv = 1.0f / static_cast<float>(counts[u]);
    for (int c = 0; c < width; ++c) (*out)[u * width + c] = sums[u * width + c] * inv;
  }
}

std::vector<float> BlockScores(std::span<const float> q, std::span<const float> unit_keys, int units_per_block,
                               const AttentionShape& shape) {
  const int hd = shape.head_dim, group = shape.n_heads / shape.n_kv_heads;
  const int64_t kv_dim = static_cast<int64_t>(shape.n_kv_heads) * hd;
  PS_CHECK(q.size() == static_cast<size_t>(shape.n_heads) * hd && unit_keys.size() % kv_dim == 0 && units_per_block > 0)
      << "block scores: bad shapes";
  const auto units = static_cast<int64_t>(unit_keys.size() / kv_dim);
  std::vector<float> out((units + units_per_block - 1) / units_per_block, -kInf);
  for (int64_t u = 0; u < units; ++u) {
    const float* k = unit_keys.data() + u * kv_dim;
    double sum = 0;
    for (int h = 0; h < shape.n_heads; ++h) {
      const float* qh = q.data() + static_cast<int64_t>(h) * hd;
      const float* kh = k + static_cast<int64_t>(h / group) * hd;
      for (int c = 0; c < hd; ++c) sum += static_cast<double>(qh[c]) * kh[c];
    }
    float& best = out[u / units_per_block];
    best = std::max(best, static_cast<float>(sum / shape.n_heads));
  }
  return out;
}

double ActiveOverlap(std::span<const int32_t> candidate, std::span<const char> active) {
  if (candidate.empty()) return 1.0;
  int64_t both = 0;
  for (int32_t b : candidate) both += active[b] != 0;
  return static_cast<double>(both) / static_cast<double>(candidate.size());
}

namespace {
std::vector<int> PruningLayers(const std::vector<int>& slim) {
  std::vector<int> out;
  for (int l : slim) out.push_back(l + 1);  // the decision after ℓ_i holds from ℓ_i + 1
  return out;
}
}  // namespace

SlimInfer::SlimInfer(const SlimInferParams& params, const ModelConfig& config)
    : params_(params),
      rows_(PruningLayers(params.layers), config.n_layers, config.n_embd),
      n_layers_(config.n_layers),
      kv_dim_(config.kv_dim()),
      q_dim_(config.q_dim()),
      shape_{.n_heads = config.n_heads, .n_kv_heads = config.n_kv_heads, .head_dim = config.head_dim, .scale = 1} {
  PS_CHECK(params.layers.size() == params.budgets.size()) << "bad SlimInfer schedule";
}

int SlimInfer::StageOf(int layer) const {
  const std::vector<int>& starts = rows_.layers();
  return static_cast<int>(std::upper_bound(starts.begin(), starts.end(), layer) - starts.begin()) - 1;
}

int64_t SlimInfer::MaxAddedRows() const {
  int64_t most = 0;  // revived rows at a stage's first layer: Aux Cache entries there, at most the budget
  for (size_t i = 0; i < stages_.size(); ++i) {
    most = std::max(most, std::min(rows_.aux_at(static_cast<int>(i)), stages_[i].keep * params_.block_size));
  }
  return most;
}

absl::Status SlimInfer::BeginStep(StepRows* rows, SeqContext& ctx) {
  (void)ctx;
  if (rows_.context() == 0 && !rows->positions.empty()) {
    // The first step holds the prompt (WholePrompt).
    prompt_ = *std::max_element(rows->positions.begin(), rows->positions.end()) + 1;
    const int bs = params_.block_size;
    n_blocks_ = (prompt_ + bs - 1) / bs;
    // Always kept: the first block and those holding the prompt's last `window` tokens.
    tail_block_ = std::max(0, prompt_ - params_.window) / bs;
    const int64_t forced = (n_blocks_ - tail_block_) + (tail_block_ > 0 ? 1 : 0);
    const int64_t units = (prompt_ + params_.unit_size - 1) / params_.unit_size;
    for (size_t i = 0; i < params_.layers.size(); ++i) {
      Stage st{.layer = params_.layers[i],
               .keep = std::max<int64_t>(forced, params_.budgets[i] / bs),
               .unit_sum = std::vector<float>(units * kv_dim_, 0.0f),
               .unit_count = std::vector<int32_t>(units, 0),
               .ring = std::vector<float>(static_cast<size_t>(params_.window) * q_dim_, 0.0f)};
      stages_.push_back(std::move(st));
    }
    active_.assign(stages_.size(), std::vector<char>(n_blocks_, 1));
  }
  rows_.Feed(rows->positions);
  return absl::OkStatus();
}

void SlimInfer::Score(int stage, std::span<const float> q_mean, std::vector<float>* scores) {
  const Stage& st = stages_[stage];
  const int per_block = params_.block_size / params_.unit_size;
  UnitMeans(st.unit_sum, st.unit_count, kv_dim_, &unit_keys_);
  *scores = BlockScores(q_mean, unit_keys_, per_block, shape_);
  for (int32_t b = 0; b < n_blocks_; ++b) {
    if (st.unit_count[static_cast<int64_t>(b) * per_block] == 0) (*scores)[b] = -kInf;  // no keys at this layer
  }
}

void SlimInfer::Decide(int i, const LayerAttention& att, SeqContext& ctx) {
  Stage& st = stages_[i];
  // The unit keys of the prompt rows computed here this step (each row once per layer):
  // the rows as runs of one unit each (-1: rows past the prompt, not summed), each
  // run's keys summed where they live.
  bounds_.clear();
  run_unit_.clear();
  for (size_t r = 0; r < att.new_positions.size(); ++r) {
    const int32_t p = att.new_positions[r];
    const int32_t u = p < prompt_ ? p / params_.unit_size : -1;
    if (run_unit_.empty() || run_unit_.back() != u) {
      bounds_.push_back(static_cast<int32_t>(r));
      run_unit_.push_back(u);
    }
  }
  bounds_.push_back(static_cast<int32_t>(att.new_positions.size()));
  if (std::find_if(run_unit_.begin(), run_unit_.end(), [](int32_t u) { return u >= 0; }) != run_unit_.end()) {
    const float* sums = att.k->Reduce(bounds_, RowReduction::kSum);
    if (sums == nullptr) return;  // the engine fails the sequence
    for (size_t j = 0; j < run_unit_.size(); ++j) {
      if (run_unit_[j] < 0) continue;
      const int64_t u = run_unit_[j];
      AddInPlace(sums + j * kv_dim_, st.unit_sum.data() + u * kv_dim_, kv_dim_);
      st.unit_count[u] += bounds_[j + 1] - bounds_[j];
    }
  }
  // The newest queries: the prompt's tail, then each decoded token's.
  const auto n_q = static_cast<int64_t>(att.q_positions.size());
  int64_t lo = n_q, hi = 0;
  for (int64_t r = 0; r < n_q; ++r) {
    if (att.q_positions[r] >= prompt_ - params_.window) lo = std::min(lo, r), hi = r + 1;
  }
  const float* q = lo < hi ? att.q->Host(lo, hi - lo) : nullptr;
  for (int64_t r = lo; r < hi; ++r) {
    if (att.q_positions[r] < prompt_ - params_.window) continue;
    const float* row = q + (r - lo) * q_dim_;
    std::copy(row, row + q_dim_, st.ring.begin() + (st.ring_pushed++ % params_.window) * q_dim_);
  }
  if (n_blocks_ <= st.keep) return;  // the budget covers the prompt: everything stays active

  const int64_t filled = std::min<int64_t>(st.ring_pushed, params_.window);
  q_mean_.assign(q_dim_, 0.0f);
  for (int64_t w = 0; w < filled; ++w) {
    for (int c = 0; c < q_dim_; ++c) q_mean_[c] += st.ring[w * q_dim_ + c] / static_cast<float>(filled);
  }
  Score(i, q_mean_, &scores_);
  int64_t scored = 0;
  for (int32_t b = 0; b < n_blocks_; ++b) {
    if (b == 0 || b >= tail_block_) scores_[b] = kInf;  // the sink block and the prompt's tail always stay
    scored += scores_[b] > -kInf;
  }
  const std::vector<int32_t> candidate = TopKInOrder(scores_, std::min(st.keep, scored));
  std::vector<char>& active = active_[i];
  if (st.decided && ActiveOverlap(candidate, active) >= params_.gamma) return;  // A(t-1) stays
  std::fill(active.begin(), active.end(), 0);
  for (int32_t b : candidate) active[b] = 1;
  if (!st.decided) {
    st.decided = true;  // prefill: the rows of the other blocks leave at the next layer
    return;
  }
  ++switches_;
  MoveStage(i, ctx);
}

void SlimInfer::MoveStage(int i, SeqContext& ctx) {
  const std::vector<int>& starts = rows_.layers();
  const int end = i + 1 < static_cast<int>(starts.size()) ? starts[i + 1] : n_layers_;
  const int bt = ctx.KvBlockTokens();
  const std::vector<char>& active = active_[i];
  for (int layer = starts[i]; layer < end; ++layer) {
    const LayerTable& t = ctx.Kv(layer);
    const auto n = static_cast<int64_t>(t.positions.size());
    to_device_.clear();
    to_host_.clear();
    for (int64_t c = 0; c < t.pages(); ++c) {
      // A cache page stays in (or comes to) the device tier while one of its rows is
      // attended to; the last one always (appends go there).
      bool needed = c + 1 == t.pages();
      for (int64_t s = c * bt; s < std::min(n, (c + 1) * bt) && !needed; ++s) {
        const int32_t p = t.positions[s];
        needed = p >= prompt_ || active[p / params_.block_size];
      }
      const Tier tier = t.tiers[c];
      if (needed && tier == Tier::kHost) to_device_.push_back(static_cast<int32_t>(c));
      if (!needed && tier == Tier::kDevice) to_host_.push_back(static_cast<int32_t>(c));
    }
    // Offload first: the device blocks it gives back fund the prefetch when the
    // reservation is short. Either may find no room: then pages stay where they are
    // and attention reads only the active rows in the device tier.
    if (!to_host_.empty()) ctx.MovePages(layer, to_host_, Tier::kHost).IgnoreError();
    if (!to_device_.empty()) ctx.MovePages(layer, to_device_, Tier::kDevice).IgnoreError();
  }
}

void SlimInfer::RowsForLayer(int layer, LayerRows& rows, SeqContext& ctx) {
  const int j = rows_.PruneIndex(layer);
  if (j < 0) return;  // (a stage that keeps everything still passes its rows on)
  const std::vector<char>& active = active_[j];
  go_on_.assign(rows_.context(), 1);
  revive_.clear();
  for (int32_t p = 0; p < prompt_; ++p) {
    const bool on = active[p / params_.block_size] != 0;
    go_on_[p] = on;
    if (on && rows_.WaitsAt(p, j)) revive_.push_back(p);
  }
  rows_.Apply(j, go_on_, revive_, rows, ctx);
}

void SlimInfer::SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) {
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (stages_[i].layer == layer) Decide(static_cast<int>(i), att, ctx);
  }
  const int s = StageOf(layer);
  if (s < 0 || n_blocks_ <= stages_[s].keep) return;  // every row is attended to
  const std::vector<char>& active = active_[s];
  const LayerTable& t = ctx.Kv(layer);
  const int bt = ctx.KvBlockTokens();
  kv_rows_.clear();
  for (size_t r = 0; r < t.positions.size(); ++r) {
    const int32_t p = t.positions[r];
    if ((p >= prompt_ || active[p / params_.block_size]) && t.tiers[r / bt] == Tier::kDevice) {
      kv_rows_.push_back(static_cast<int32_t>(r));
    }
  }
  if (kv_rows_.size() < t.positions.size()) {
    selection->SelectRows(static_cast<int32_t>(att.q_positions.size()), kv_rows_);
  }
}

}  // namespace ps
