// Scheduler and KV-tier benchmark.
//  1. Aggregate decode throughput with N concurrent streams (continuous batching
//     turns the per-stream GEMVs into GEMMs): decode-only steps, tokens/s.
//  2. Swap bandwidth of the CPU swap engine (device -> host -> device).
//  3. The cost of a swap-preemption cycle (out and back in) against recomputing
//     the sequence's KV (a prefill), for given sequence lengths.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <numeric>

#include "base/flags.h"
#include "engine/generator.h"
#include "kernels/cpu/cpu_backend.h"
#include "server/serving.h"

namespace {

using namespace ps;
using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

int Fail(const std::string& m) {
  std::fprintf(stderr, "ps_bench_scheduler: %s\n", m.c_str());
  return 1;
}

// Step durations of steps that ran only decodes of all `streams` sequences.
class DecodeSteps : public SchedulerObserver {
 public:
  explicit DecodeSteps(int streams) : streams_(streams) {}
  void OnStep(const LoadSnapshot& load, int batch_tokens) override {
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    if (have_last_ && batch_tokens == streams_ && load.running == streams_) seconds_.push_back(Seconds(last_, now));
    last_ = now;
    have_last_ = true;
  }
  void OnPreemption(PreemptionMode) override {}
  void OnSwap(Tier, uint64_t, double) override {}
  std::vector<double> seconds() {
    std::lock_guard<std::mutex> lock(mu_);
    return seconds_;
  }

 private:
  int streams_;
  std::mutex mu_;
  Clock::time_point last_;
  bool have_last_ = false;
  std::vector<double> seconds_;
};

class Done : public RequestSink {
 public:
  void OnEvent(RequestEvent ev) override {
    if (ev.kind != RequestEvent::Kind::kFinished) return;
    std::lock_guard<std::mutex> lock(mu_);
    ++finished_;
    cv_.notify_all();
  }
  void WaitFor(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return finished_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int finished_ = 0;
};

double DecodeThroughput(const Model& model, int threads, int streams, int prompt_tokens, int new_tokens) {
  ThreadPool pool(threads);
  CpuBackend backend(pool);
  DecodeSteps steps(streams);
  auto serving = server::Serving::Create(model, backend, {.scheduler = {.max_running = streams}}, &steps);
  if (!serving.ok()) return 0;
  EngineLoop& s = (*serving)->loop();
  auto done = std::make_shared<Done>();
  for (int i = 0; i < streams; ++i) {
    auto r = std::make_shared<Request>();
    r->id = std::to_string(i);
    r->spec.prompt.push_back(1);
    for (int k = 1; k < prompt_tokens; ++k) r->spec.prompt.push_back(100 + (i * 131 + k * 17) % 5000);
    r->spec.sampling.temperature = 0;
    r->spec.stop.max_new_tokens = new_tokens;
    r->spec.stop.ignore_eos = true;
    r->sink = done;
    if (!s.Submit(r).ok()) return 0;
  }
  done->WaitFor(streams);
  const std::vector<double> t = steps.seconds();
  if (t.empty()) return 0;
  return streams * static_cast<double>(t.size()) / std::accumulate(t.begin(), t.end(), 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::vector<int64_t> streams_list = {1, 4, 16, 64}, seq_list = {1024, 4096};
  int64_t threads = 2, prompt = 32, decode = 64, block_tokens = 16, repeats = 3;
  FlagParser flags("ps_bench_scheduler", "Batched decode throughput, swap bandwidth, swap vs recompute cost.");
  flags.AddString("model", &model_path, "model file");
  flags.AddInt("threads", &threads, "compute threads");
  flags.AddIntList("streams", &streams_list, "numbers of concurrent streams");
  flags.AddInt("prompt", &prompt, "prompt tokens per stream");
  flags.AddInt("decode", &decode, "new tokens per stream");
  flags.AddIntList("seq", &seq_list, "sequence lengths for swap vs recompute");
  flags.AddInt("kv-block-size", &block_tokens, "tokens per KV block");
  flags.AddInt("repeats", &repeats, "best of this many runs (this machine's speed varies between runs)");
  if (auto st = flags.Parse(argc, argv); !st.ok()) return Fail(std::string(st.message()));
  if (flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  auto model = Model::Load(model_path);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  const ModelConfig& c = (*model)->config();
  std::printf("model %s, %lld threads\n", model_path.c_str(), static_cast<long long>(threads));

  // 1. Decode throughput against the number of streams.
  double one = 0;
  for (int64_t n : streams_list) {
    double tps = 0;
    for (int64_t r = 0; r < repeats; ++r) {
      tps = std::max(tps, DecodeThroughput(**model, static_cast<int>(threads), static_cast<int>(n),
                                           static_cast<int>(prompt), static_cast<int>(decode)));
    }
    if (one == 0) one = tps;
    std::printf("decode streams %3lld: %8.1f tok/s aggregate (%.2fx one stream)\n", static_cast<long long>(n), tps,
                one > 0 ? tps / one : 0);
  }

  // 2 and 3. Swap bandwidth and a preemption cycle vs recompute, per sequence length.
  ThreadPool pool(static_cast<int>(threads));
  CpuBackend backend(pool);
  Transformer tf(**model, backend);
  for (int64_t seq_len : seq_list) {
    const int len = static_cast<int>(seq_len);
    const KvGeometry g{.n_layers = c.n_layers,
                       .block_tokens = static_cast<int>(block_tokens),
                       .kv_dim = c.kv_dim(),
                       .n_kv_heads = c.n_kv_heads};
    const int64_t blocks = g.BlocksForTokens(len);
    const size_t block_bytes = g.block_bytes();
    auto cache = KvCache::Create({.geometry = g, .device_blocks = blocks, .host_blocks = blocks}, backend);
    if (!cache.ok()) return Fail(std::string(cache.status().message()));
    KvCache& kv = **cache;
    KvCacheManager& manager = kv.manager();
    std::vector<int32_t> tokens(len), positions(len);
    for (int i = 0; i < len; ++i) {
      tokens[i] = i == 0 ? 1 : 100 + (i * 37) % 5000;
      positions[i] = i;
    }
    // Recompute: the prefill that rebuilds the KV.
    ForwardOutput out;
    SeqInput in{.seq_id = 1, .tokens = tokens, .positions = positions, .no_logits = true};
    const auto t0 = Clock::now();
    if (auto st = tf.Forward({&in, 1}, kv, &out); !st.ok() || !out.status[0].ok()) return Fail("the prefill failed");
    const double recompute = Seconds(t0, Clock::now());
    // Swap out and back in (the CPU engine: a copy thread), best of 3.
    double out_s = 1e30, in_s = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      auto t1 = Clock::now();
      std::optional<SwapPlan> plan = manager.PlanSwapOut(1);
      if (!plan || !kv.Finish(kv.Submit(*plan), *plan).ok()) return Fail("swap out failed");
      auto t2 = Clock::now();
      plan = manager.PlanSwapIn(1);
      if (!plan || !kv.Finish(kv.Submit(*plan), *plan).ok()) return Fail("swap in failed");
      auto t3 = Clock::now();
      out_s = std::min(out_s, Seconds(t1, t2));
      in_s = std::min(in_s, Seconds(t2, t3));
    }
    const double mib = blocks * static_cast<double>(block_bytes) / (1 << 20);
    std::printf(
        "seq %5d tokens: KV %.1f MiB in %lld blocks; swap out %.2f ms (%.1f GB/s), in %.2f ms (%.1f GB/s); "
        "swap cycle %.2f ms vs recompute %.1f ms (%.0fx)\n",
        len, mib, static_cast<long long>(blocks), out_s * 1e3, mib / 1024 * 1.073741824 / out_s, in_s * 1e3,
        mib / 1024 * 1.073741824 / in_s, (out_s + in_s) * 1e3, recompute * 1e3, recompute / (out_s + in_s));
  }
  return 0;
}
