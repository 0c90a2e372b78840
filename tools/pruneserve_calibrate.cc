// pruneserve-calibrate: measures a model's per-model strategy settings
// (engine/pruning/calibration.h) and writes them as JSON next to the model. It runs
// the model over haystack texts (Paul Graham's essays) with the San Francisco needle
// planted at depths from 10% to 90% and a question at the end, one prompt per sample,
// and from each layer's attention:
//  - PoD: the attention distributions of the last `queries` query rows per layer and
//    KV head (mean over the group's query heads), similarity of two layers = 1 - the
//    mean Jensen-Shannon divergence (log 2) over samples and queries, and the greedy
//    grouping of consecutive layers at `delta` (PoD's Algorithm 1: a layer joins
//    while its divergence from each layer of the group is below delta);
//  - GemFilter / LazyLLM: the first layer whose last-query scores (summed over heads,
//    average-pooled as GemFilter does) keep most of the needle's tokens among their
//    top `locate-top` (1/16 of the prompt: chance keeps 1 in 16), in most samples
//    (GemFilter Fig. 5): GemFilter's filter layer, and LazyLLM prunes after it.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/flags.h"
#include "base/mapped_file.h"
#include "base/status.h"
#include "engine/forward.h"
#include "engine/generator.h"
#include "engine/pruning/calibration.h"
#include "engine/pruning/selection.h"
#include "engine/pruning/strategy.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/vec.h"

namespace {

using namespace ps;

int Fail(const std::string& msg) {
  std::fprintf(stderr, "pruneserve-calibrate: %s\n", msg.c_str());
  return 1;
}

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

// The haystack: a file, or a folder's files in name order.
absl::StatusOr<std::string> ReadHaystack(const std::string& path) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::string text;
  for (const auto& f : files) {
    PS_ASSIGN_OR_RETURN(std::string t, ReadFileToString(f.string()));
    absl::StrAppend(&text, t, "\n");
  }
  if (text.size() < 1000) return absl::InvalidArgumentError(absl::StrCat(path, ": too little haystack text"));
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, haystack = "../shared/testdata/haystack/paul_graham_essays", out;
  int64_t length = 4096, samples = 3, queries = 16, threads = 0, locate_top = 0;
  double delta = 0.5;
  FlagParser flags("pruneserve-calibrate",
                   "Measures a model's strategy calibration (PoD's layer groups, GemFilter's filter layer, "
                   "LazyLLM's schedule) over needle-in-a-haystack prompts and writes it as JSON next to the model "
                   "(the server reads it with --pod-groups).");
  flags.AddString("model", &model_path, "GGUF file or Hugging Face folder (required)");
  flags.AddString("haystack", &haystack, "text file, or folder whose files (in name order) make the haystack");
  flags.AddInt("length", &length, "prompt tokens per sample");
  flags.AddInt("samples", &samples, "prompts, the needle at depths spread over 10%..90%");
  flags.AddInt("queries", &queries, "last query rows whose attention distributions are compared");
  flags.AddInt("locate-top", &locate_top,
               "a layer locates the needle when most of its tokens are among this many best-scored (0: length/16)");
  flags.AddFloat("delta", &delta,
                 "PoD's grouping threshold in [0, 1]: a layer joins a group while its divergence (1 - similarity) "
                 "from each of its layers is below delta (0: no sharing)");
  flags.AddString("out", &out, "output file (default: the model's path + .calibration.json)");
  flags.AddInt("threads", &threads, "compute threads (0 = number of cores)");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) return Fail(std::string(s.message()));
  if (flags.help_requested()) {
    std::cout << flags.Help();
    return 0;
  }
  if (model_path.empty()) return Fail("--model is required (see --help)");
  if (samples < 1 || queries < 1 || length < 256) return Fail("--samples and --queries >= 1, --length >= 256");
  if (!(delta >= 0 && delta <= 1)) return Fail("--delta must be in [0, 1]");
  if (out.empty()) out = model_path + ".calibration.json";
  if (locate_top <= 0) locate_top = length / 16;

  auto model = Model::Load(model_path);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  const ModelConfig& c = (*model)->config();
  const Tokenizer* tok = (*model)->tokenizer();
  if (tok == nullptr) return Fail("the model has no tokenizer");
  if (c.n_ctx > 0 && length > c.n_ctx) return Fail(absl::StrCat("--length above the model's context (", c.n_ctx, ")"));
  auto text = ReadHaystack(haystack);
  if (!text.ok()) return Fail(std::string(text.status().message()));
  const std::vector<int32_t> essays = tok->Encode(*text, false, false);
  const std::vector<int32_t> needle = tok->Encode(kNeedle, false, false);
  const std::vector<int32_t> question = tok->Encode(kQuestion, false, false);
  const std::vector<int32_t> bos = tok->Encode("", true, false);
  const int64_t filler = length - static_cast<int64_t>(bos.size() + needle.size() + question.size());
  if (filler < 64 || static_cast<int64_t>(essays.size()) < filler) return Fail("too little haystack for --length");

  ThreadPool pool(static_cast<int>(threads));
  CpuBackend backend(pool);
  Transformer transformer(**model, backend);
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
    // Each sample reads a different stretch of the essays.
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
    auto kv = OfflineKvCache(**model, backend, static_cast<int64_t>(prompt.size()));
    if (!kv.ok()) return Fail(std::string(kv.status().message()));
    const SeqInput in{.seq_id = 1, .tokens = prompt, .positions = positions, .no_logits = true, .strategy = &probe};
    ForwardOutput fo;
    absl::Status st = transformer.Forward(std::span<const SeqInput>(&in, 1), **kv, &fo);
    if (st.ok()) st = fo.status[0];
    if (!st.ok()) return Fail(std::string(st.message()));

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
    std::fprintf(stderr, "[%lld/%lld] %zu tokens, needle at %.0f%%: located at layers {%s}\n",
                 static_cast<long long>(s + 1), static_cast<long long>(samples), prompt.size(), 100 * depth,
                 where.c_str());
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
  std::printf("%s: %d layers, %d KV heads, %lld samples of %lld tokens, last %lld queries\n", c.name.c_str(),
              c.n_layers, c.n_kv_heads, static_cast<long long>(samples), static_cast<long long>(length),
              static_cast<long long>(queries));
  std::vector<double> deltas = {0.3, 0.5, 0.7};
  std::erase(deltas, delta);
  deltas.push_back(delta);  // last: the groups written
  for (double d : deltas) {
    cal.Regroup(d);
    int64_t groups = 0;
    for (const auto& g : cal.groups) groups += static_cast<int64_t>(g.size());
    std::printf("PoD delta %.2f: %lld groups over %d KV heads (distant keys stored %.0f%% less)\n", d,
                static_cast<long long>(groups), c.n_kv_heads,
                100.0 * (1.0 - static_cast<double>(groups) / (static_cast<double>(c.n_layers) * c.n_kv_heads)));
  }
  for (int h = 0; h < c.n_kv_heads; ++h) {
    std::vector<std::string> parts;
    for (const auto& g : cal.groups[h]) {
      parts.push_back(g.size() == 1 ? absl::StrCat(g[0]) : absl::StrCat(g.front(), "-", g.back()));
    }
    std::printf("  KV head %d: %s\n", h, absl::StrJoin(parts, " ").c_str());
  }
  if (cal.needle_layer >= 0) {
    std::printf("needle located from layer %d: gemfilter.filter_layer=%d, lazyllm.layers=%s\n", cal.needle_layer,
                cal.needle_layer, absl::StrJoin(cal.lazyllm_layers, ",").c_str());
  } else {
    std::printf("no layer located the needle in most samples: GemFilter and LazyLLM keep their defaults\n");
  }
  std::ofstream f(out);
  f << CalibrationToJson(cal) << "\n";
  if (!f) return Fail("cannot write " + out);
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
