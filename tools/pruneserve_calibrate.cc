// pruneserve-calibrate: measures a model's per-model strategy settings (PoD's layer
// groups, GemFilter's filter layer, LazyLLM's schedule: engine/calibrate.h) over
// needle-in-a-haystack prompts cut from a text (Paul Graham's essays by default) and
// writes them as JSON next to the model, where the server finds them.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/flags.h"
#include "base/mapped_file.h"
#include "engine/calibrate.h"
#include "kernels/cpu/cpu_backend.h"

namespace {

using namespace ps;

int Fail(const std::string& msg) {
  std::fprintf(stderr, "pruneserve-calibrate: %s\n", msg.c_str());
  return 1;
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
  if (out.empty()) out = model_path + ".calibration.json";

  auto model = Model::Load(model_path);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  const ModelConfig& c = (*model)->config();
  if (c.n_ctx > 0 && length > c.n_ctx) return Fail(absl::StrCat("--length above the model's context (", c.n_ctx, ")"));
  auto text = ReadTextCorpus(haystack);
  if (!text.ok()) return Fail(std::string(text.status().message()));
  ThreadPool pool(static_cast<int>(threads));
  CpuBackend backend(pool);
  absl::StatusOr<Calibration> measured =
      Calibrate(**model, backend, *text,
                {.length = length,
                 .samples = samples,
                 .queries = queries,
                 .locate_top = locate_top,
                 .delta = delta,
                 .progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }});
  if (!measured.ok()) return Fail(std::string(measured.status().message()));
  Calibration& cal = *measured;
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
