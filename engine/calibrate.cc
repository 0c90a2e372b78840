#include "engine/calibrate.h"

#include <algorithm>
#include <numeric>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/forward.h"
#include "engine/generator.h"
#include "engine/pruning/selection.h"
#include "engine/pruning/strategy.h"
#include "kernels/cpu/vec.h"

namespace ps {
namespace {

constexpr char kNeedle[] =
    "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.";
constexpr char kQuestion[] = "\n\nQuestion: What is the best thing to do in San Francisco?\nAnswer:";

// Reads the attention of one prompt pass through the strategy hook (SelectKv sees
// every query and key of a one-step prompt) and leaves the attention itself alone.
class AttentionProbe final : public PruningStrategy {
 public:
  AttentionProbe(int n_layers, int queries) : queries_(queries), dist_(n_layers), last_(n_layers) {}
  std::string_view name() const override { return "calibration-probe"; }

  void SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) override {
    (void)ctx, (void)selection;
    const AttentionShape& s = att.shape;
    const auto n = static_cast<int64_t>(att.new_positions.size());
    PS_CHECK(static_cast<int64_t>(att.q_positions.size()) == n) << "the probe needs the prompt in one step";
    const int group = s.n_heads / s.n_kv_heads, hd = s.head_dim;
    const int64_t first = std::max<int64_t>(0, n - queries_);
    dist_[layer].assign(static_cast<size_t>(s.n_kv_heads) * (n - first) * n, 0.0f);
    last_[layer].assign(n, 0.0f);
    std::vector<float> row(n);
    const float* queries = att.q->Host(first, n - first);  // [n - first][q_dim]
    const float* keys = att.k->Host(0, n);
    const int64_t q_dim = att.q->width(), kv_dim = att.k->width();
    for (int64_t i = first; i < n; ++i) {
      const int64_t visible = i + 1;  // causal: the prompt's rows are positions 0..n-1 in order
      for (int h = 0; h < s.n_heads; ++h) {
        const int g = h / group;
        const float* q = queries + (i - first) * q_dim + static_cast<int64_t>(h) * hd;
        for (int64_t j = 0; j < visible; ++j) {
          const float* k = keys + j * kv_dim + static_cast<int64_t>(g) * hd;
          float dot = 0;
          for (int c = 0; c < hd; ++c) dot += q[c] * k[c];
          row[j] = dot * s.scale;
        }
        if (i == n - 1) {
          for (int64_t j = 0; j < visible; ++j) last_[layer][j] += row[j];
        }
        SoftmaxInPlace(row.data(), visible);
        float* d = dist_[layer].data() + (static_cast<int64_t>(g) * (n - first) + (i - first)) * n;
        for (int64_t j = 0; j < visible; ++j) d[j] += row[j] / static_cast<float>(group);
      }
    }
    n_ = n;
    rows_ = n - first;
  }

  // The distribution of query row r (of the last ones) at (layer, kv_head).
  std::span<const float> Dist(int layer, int kv_head, int64_t r) const {
    return {dist_[layer].data() + (kv_head * rows_ + r) * n_, static_cast<size_t>(n_)};
  }
  int64_t rows() const { return rows_; }
  // The last query's scores q·k summed over heads at `layer`.
  const std::vector<float>& Last(int layer) const { return last_[layer]; }

 private:
  int queries_;
  int64_t n_ = 0, rows_ = 0;
  std::vector<std::vector<float>> dist_;  // [layer][kv_head][row][n]
  std::vector<std::vector<float>> last_;  // [layer][n]
};

}  // namespace

absl::StatusOr<Calibration> Calibrate(const Model& model, Backend& backend, const std::string& text,
                                      const CalibrateOptions& o) {
  const ModelConfig& c = model.config();
  const Tokenizer* tok = model.tokenizer();
  if (tok == nullptr) return absl::FailedPreconditionError("the model has no tokenizer");
  const int64_t length = c.n_ctx > 0 ? std::min<int64_t>(o.length, c.n_ctx) : o.length;
  const int64_t samples = o.samples, queries = o.queries;
  const int64_t locate_top = o.locate_top > 0 ? o.locate_top : length / 16;
  if (samples < 1 || queries < 1 || length < 256) {
    return absl::InvalidArgumentError("calibration needs samples and queries >= 1 and prompts of 256 tokens or more");
  }
  if (!(o.delta >= 0 && o.delta <= 1)) return absl::InvalidArgumentError("delta must be in [0, 1]");
  const std::vector<int32_t> essays = tok->Encode(text, false, false);
  const std::vector<int32_t> needle = tok->Encode(kNeedle, false, false);
  const std::vector<int32_t> question = tok->Encode(kQuestion, false, false);
  const std::vector<int32_t> bos = tok->Encode("", true, false);
  const int64_t filler = length - static_cast<int64_t>(bos.size() + needle.size() + question.size());
  if (filler < 64 || static_cast<int64_t>(essays.size()) < filler) {
    return absl::InvalidArgumentError(absl::StrCat("too little text for prompts of ", length, " tokens"));
  }
  Transformer transformer(model, backend);
  Calibration cal{.model = c.name,
                  .n_layers = c.n_layers,
                  .n_kv_heads = c.n_kv_heads,
                  .samples = static_cast<int>(samples),
                  .queries = static_cast<int>(queries)};
  std::vector<std::vector<std::vector<double>>> js_sum(
      c.n_kv_heads, std::vector<std::vector<double>>(c.n_layers, std::vector<double>(c.n_layers, 0.0)));
  std::vector<int> located(c.n_layers, 0);
  int64_t compared = 0;
  for (int64_t s = 0; s < samples; ++s) {
    const double depth = samples == 1 ? 0.5 : 0.1 + 0.8 * static_cast<double>(s) / static_cast<double>(samples - 1);
    // Each sample reads a different stretch of the text.
    const int64_t start = (s * filler) % std::max<int64_t>(1, static_cast<int64_t>(essays.size()) - filler + 1);
    const auto at = static_cast<int64_t>(depth * static_cast<double>(filler));
    std::vector<int32_t> prompt = bos;
    prompt.insert(prompt.end(), essays.begin() + start, essays.begin() + start + at);
    const auto needle_begin = static_cast<int64_t>(prompt.size());
    prompt.insert(prompt.end(), needle.begin(), needle.end());
    prompt.insert(prompt.end(), essays.begin() + start + at, essays.begin() + start + filler);
    prompt.insert(prompt.end(), question.begin(), question.end());
    std::vector<int32_t> positions(prompt.size());
    std::iota(positions.begin(), positions.end(), 0);

    AttentionProbe probe(c.n_layers, static_cast<int>(queries));
    PS_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv,
                        OfflineKvCache(model, backend, static_cast<int64_t>(prompt.size())));
    const SeqInput in{.seq_id = 1, .tokens = prompt, .positions = positions, .no_logits = true, .strategy = &probe};
    ForwardOutput fo;
    absl::Status st = transformer.Forward(std::span<const SeqInput>(&in, 1), *kv, &fo);
    if (st.ok()) st = fo.status[0];
    PS_RETURN_IF_ERROR(st);

    for (int h = 0; h < c.n_kv_heads; ++h) {
      for (int a = 0; a < c.n_layers; ++a) {
        for (int b = a + 1; b < c.n_layers; ++b) {
          double sum = 0;
          for (int64_t r = 0; r < probe.rows(); ++r) sum += JsDivergence(probe.Dist(a, h, r), probe.Dist(b, h, r));
          js_sum[h][a][b] += sum;
          js_sum[h][b][a] += sum;
        }
      }
    }
    compared += probe.rows();
    std::string where;
    for (int l = 0; l < c.n_layers; ++l) {
      // GemFilter's view of the layer: pooled last-query scores, the best locate_top.
      const std::vector<float> pooled = AvgPool1d(probe.Last(l), 5);
      int on_needle = 0;
      for (int32_t j : TopKInOrder(pooled, locate_top)) {
        on_needle += j >= needle_begin && j < needle_begin + static_cast<int64_t>(needle.size());
      }
      const bool found = 2 * on_needle > static_cast<int>(needle.size());
      located[l] += found;
      if (found) absl::StrAppend(&where, where.empty() ? "" : ",", l);
    }
    if (o.progress) {
      o.progress(absl::StrCat("[", s + 1, "/", samples, "] ", prompt.size(), " tokens, needle at ",
                              static_cast<int>(100 * depth), "%: located at layers {", where, "}"));
    }
  }

  cal.similarity.assign(c.n_kv_heads, std::vector<std::vector<double>>(c.n_layers, std::vector<double>(c.n_layers, 1)));
  for (int h = 0; h < c.n_kv_heads; ++h) {
    for (int a = 0; a < c.n_layers; ++a) {
      for (int b = 0; b < c.n_layers; ++b) {
        if (a != b) cal.similarity[h][a][b] = 1.0 - js_sum[h][a][b] / static_cast<double>(compared);
      }
    }
  }
  for (int l = 0; l < c.n_layers && cal.needle_layer < 0; ++l) {
    if (2 * located[l] > samples) cal.needle_layer = l;
  }
  if (cal.needle_layer >= 0 && cal.needle_layer + 1 < c.n_layers) {
    // LazyLLM prunes only after the layer that finds the needle, then again halfway to the end.
    const int first = cal.needle_layer + 1, second = (first + c.n_layers) / 2;
    cal.lazyllm_layers = {first};
    if (second > first && second < c.n_layers) cal.lazyllm_layers.push_back(second);
  }
  cal.Regroup(o.delta);
  return cal;
}

}  // namespace ps
