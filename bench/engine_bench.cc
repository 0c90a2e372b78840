// Engine benchmark: prefill tokens/s at given prompt lengths, decode tokens/s and
// peak memory, for one model and thread count. With --llamacpp it also runs
// bench/llamacpp_bench.py (llama-cpp-python) on the same file and prints ratios.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>

#include "absl/strings/str_join.h"
#include "base/flags.h"
#include "base/mapped_file.h"
#include "engine/generator.h"
#include "kernels/cpu/cpu_backend.h"

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double PeakRssMiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

int Fail(const std::string& m) {
  std::fprintf(stderr, "ps_bench_engine: %s\n", m.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ps;
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string text_path = "../shared/testdata/haystack/paul_graham_essays";
  std::vector<int64_t> prefill_list = {512, 2048};
  int64_t threads = 2, decode = 128, repeats = 2, block_tokens = 16;
  bool llamacpp = false, int8 = false;
  FlagParser flags("ps_bench_engine", "Prefill and decode throughput of the engine (one sequence).");
  flags.AddString("model", &model_path, "model file");
  flags.AddString("text", &text_path, "folder or file of text used as the prompt");
  flags.AddIntList("prefill", &prefill_list, "prompt lengths");
  flags.AddInt("decode", &decode, "decode steps");
  flags.AddInt("threads", &threads, "compute threads");
  flags.AddInt("repeats", &repeats, "best of this many runs");
  flags.AddInt("kv-block-size", &block_tokens, "tokens per KV block (the server's default: 16)");
  flags.AddBool("int8-activations", &int8, "int8 activations for quantised weights");
  flags.AddBool("llamacpp", &llamacpp, "also run llama-cpp-python on the same file and print ratios");
  if (auto s = flags.Parse(argc, argv); !s.ok()) return Fail(std::string(s.message()));
  if (flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  auto model = Model::Load(model_path);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  const ModelConfig& c = (*model)->config();

  const absl::StatusOr<std::string> text = ReadTextCorpus(text_path);
  if (!text.ok()) return Fail(std::string(text.status().message()));
  const std::vector<int32_t> all_ids = (*model)->tokenizer()->Encode(*text, true, false);

  ThreadPool pool(static_cast<int>(threads));
  CpuBackend backend(pool, CpuBackendOptions{.int8_activations = int8});
  Transformer tf(**model, backend);
  std::map<std::string, double> ours;
  std::printf("model %s (%s), %lld threads, %s activations\n", c.name.c_str(), model_path.c_str(),
              static_cast<long long>(threads), int8 ? "int8" : "F32");
  for (int64_t prefill : prefill_list) {
    const int n = static_cast<int>(prefill);
    if (static_cast<int>(all_ids.size()) < n || n > c.n_ctx)
      return Fail("text too short or prompt longer than the context");
    std::vector<int32_t> ids(all_ids.begin(), all_ids.begin() + n), pos(n);
    for (int i = 0; i < n; ++i) pos[i] = i;
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
      auto kv = OfflineKvCache(**model, backend, n, static_cast<int>(block_tokens));
      if (!kv.ok()) return Fail(std::string(kv.status().message()));
      SeqInput in{.seq_id = 1, .tokens = ids, .positions = pos};
      ForwardOutput out;
      const auto t0 = Clock::now();
      if (auto st = tf.Forward({&in, 1}, **kv, &out); !st.ok() || !out.status[0].ok()) {
        return Fail(std::string((st.ok() ? out.status[0] : st).message()));
      }
      best = std::min(best, Seconds(t0, Clock::now()));
    }
    const std::string key = "prefill_" + std::to_string(n) + "_tok_per_s";
    ours[key] = n / best;
    std::printf("ours prefill_%d_tok_per_s %.1f\n", n, n / best);
  }
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto kv = OfflineKvCache(**model, backend, 4 + decode, static_cast<int>(block_tokens));
    if (!kv.ok()) return Fail(std::string(kv.status().message()));
    ForwardOutput out;
    std::vector<int32_t> ids = {1, 2, 3, 4}, pos = {0, 1, 2, 3};
    SeqInput in{.seq_id = 1, .tokens = ids, .positions = pos};
    if (auto st = tf.Forward({&in, 1}, **kv, &out); !st.ok()) return Fail(std::string(st.message()));
    const auto t0 = Clock::now();
    for (int i = 0; i < decode; ++i) {
      const int32_t tok = (i * 31) % 1000 + 500, p = 4 + i;
      SeqInput step{.seq_id = 1, .tokens = {&tok, 1}, .positions = {&p, 1}};
      if (auto st = tf.Forward({&step, 1}, **kv, &out); !st.ok()) return Fail(std::string(st.message()));
    }
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  ours["decode_tok_per_s"] = decode / best;
  std::printf("ours decode_tok_per_s %.1f\n", decode / best);
  std::printf("ours peak_rss_mib %.1f\n", PeakRssMiB());

  if (llamacpp) {
    std::ostringstream cmd;
    cmd << "python3 bench/llamacpp_bench.py --model " << model_path << " --threads " << threads << " --decode "
        << decode << " --repeats " << repeats << " --prefill " << absl::StrJoin(prefill_list, " ");
    FILE* p = popen(cmd.str().c_str(), "r");
    char line[512];
    while (p != nullptr && fgets(line, sizeof(line), p) != nullptr) {
      char name[128];
      double v = 0;
      if (std::sscanf(line, "llamacpp %127s %lf", name, &v) == 2) {
        const double o = ours.count(name) ? ours[name] : 0;
        std::printf("llamacpp %s %.1f   ours/llamacpp %.2fx\n", name, v, o / v);
      } else {
        std::printf("%s", line);
      }
    }
    if (p == nullptr || pclose(p) != 0) std::printf("llama-cpp-python not available (pip install llama-cpp-python)\n");
  }
  return 0;
}
