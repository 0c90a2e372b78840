// Strategies are plug-ins: one written only in this file, registered at run time,
// prunes rows, selects the KV each layer attends to, and moves a KV block to the
// host tier and back, inside shared batches, with the offline generator's tokens.
// And LazyLLM's Aux Cache lives in the host tier: it shows in the host-tier block
// metric while a long prompt runs and returns to 0. SlimInfer's block moves show in
// the swap metrics, and its prefetches overlap compute: with a slowed copy engine the
// engine waits for far less than the copies take.
#include <prometheus/registry.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "absl/strings/str_join.h"
#include "engine/pruning/sliminfer.h"
#include "server/metrics.h"
#include "tests/scheduler/scheduler_test_util.h"

namespace ps {
namespace {

// Prunes the rows at positions 1, 4, 7, ... before layer 2 (for good: no Aux Cache);
// at layer 3 attends only to the rows at even positions; moves layer 0's first
// block to the host tier before layer 1 and back before layer 4, every step.
class MoverStrategy final : public PruningStrategy {
 public:
  explicit MoverStrategy(std::atomic<int64_t>* counters) : counters_(counters) {}
  std::string_view name() const override { return "test_mover"; }

  void RowsForLayer(int layer, LayerRows& rows, SeqContext& ctx) override {
    if (layer == 2) {
      for (size_t i = 0; i + 1 < rows.positions.size(); ++i) {
        if (rows.positions[i] % 3 == 1) (*rows.keep)[i] = 0;
      }
    }
    const std::vector<Tier>& pages = ctx.Kv(0).tiers;
    if (pages.empty()) return;
    const int32_t first = 0;
    if (layer == 1 && pages[0] == Tier::kDevice) {
      EXPECT_TRUE(ctx.MovePages(0, {&first, 1}, Tier::kHost).ok());
      ++counters_[0];
    } else if (layer == 4 && pages[0] == Tier::kHost) {
      EXPECT_TRUE(ctx.MovePages(0, {&first, 1}, Tier::kDevice).ok());
      ++counters_[1];
    }
  }

  void SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) override {
    if (layer != 3) return;
    std::vector<int32_t> rows;
    const std::vector<int32_t>& positions = ctx.Kv(layer).positions;
    for (size_t j = 0; j < positions.size(); ++j) {
      if (positions[j] % 2 == 0) rows.push_back(static_cast<int32_t>(j));
    }
    selection->SelectRows(static_cast<int32_t>(att.q_positions.size()), rows);
    ++counters_[2];
  }

 private:
  std::atomic<int64_t>* counters_;  // moves out, moves back, selections
};

class MoverParams final : public StrategyParams {
 public:
  explicit MoverParams(std::atomic<int64_t>* counters) : counters_(counters) {}
  std::unique_ptr<StrategyParams> Clone() const override { return std::make_unique<MoverParams>(counters_); }
  absl::Status Merge(const google::protobuf::Message&, std::string_view) override { return absl::OkStatus(); }
  void ToProto(google::protobuf::Message*) const override {}
  absl::Status Validate(const ModelConfig&, std::string_view) const override { return absl::OkStatus(); }
  std::unique_ptr<PruningStrategy> Make(const ModelConfig&) const override {
    return std::make_unique<MoverStrategy>(counters_);
  }

 private:
  std::atomic<int64_t>* counters_;
};

std::atomic<int64_t> g_counters[3];

std::vector<int32_t> LongPrompt(int i) {  // 70 to 150 tokens
  std::vector<int32_t> p = {1};
  for (int k = 0; k < 70 + (i * 29) % 80; ++k) p.push_back(260 + (i * 19 + k * 13) % 250);
  return p;
}

TEST_F(SchedulerTest, AStrategyRegisteredAtRunTimePrunesSelectsAndMovesBlocks) {
  RegisterStrategy({.name = "test_mover",
                    .summary = "test: prunes, selects, moves a block",
                    .defaults = [](const ModelConfig&, const CalibrationPtr&) {
                      return std::make_unique<MoverParams>(g_counters);
                    }});
  const PruningParams mover = Pruning("test_mover");
  ASSERT_EQ(mover.name(), "test_mover");
  EXPECT_FALSE(StrategyDefaults::ForModel(model_->config())->WithArgs("test_mover", {"x=1"}, "pruning").ok());

  constexpr int kRequests = 6, kTokens = 20;
  std::vector<std::string> offline(kRequests);
  for (int i = 0; i < kRequests; ++i) offline[i] = absl::StrJoin(Offline(LongPrompt(i), kTokens, mover), " ");
  const int64_t offline_moves = g_counters[0].load();
  EXPECT_GT(offline_moves, 0);
  EXPECT_EQ(g_counters[1].load(), offline_moves) << "every block moved out came back";
  EXPECT_GT(g_counters[2].load(), 0);
  // The strategy changes the tokens (else this test would prove nothing), and computes fewer rows.
  EXPECT_NE(offline[0], absl::StrJoin(Offline(LongPrompt(0), kTokens), " "));
  Generator gen(*model_, *backend_, kTestKvDType);
  const std::unique_ptr<PruningStrategy> one = mover.Make(model_->config());
  auto r = gen.Generate(LongPrompt(0), SamplingParams{.temperature = 0}, StopCriteria{.max_new_tokens = 1}, nullptr,
                        one.get());
  ASSERT_TRUE(r.ok());
  const int n = static_cast<int>(LongPrompt(0).size()), layers = model_->config().n_layers;
  EXPECT_EQ(r->prompt_rows_computed, 2 * n + (layers - 2) * (n - n / 3)) << "rows at positions 1, 4, ... pruned";

  // Served: mixed with full requests in shared batches, prefilled in chunks.
  ThreadPool engine_pool(2);
  Served s(*model_, engine_pool,
           {.engine = {.kv_host_blocks = 64 * 8}, .scheduler = {.max_batch_tokens = 256, .prefill_chunk = 64}});
  for (int i = 0; i < kRequests; ++i) {
    auto req = Make("mover/" + std::to_string(i), LongPrompt(i), kTokens);
    if (i % 3 != 2) req->spec.pruning = mover;
    ASSERT_TRUE(s.Submit(req).ok());
  }
  for (int i = 0; i < kRequests; ++i) {
    CollectingSink& sink = *sinks_["mover/" + std::to_string(i)];
    ASSERT_TRUE(sink.Wait());
    EXPECT_EQ(sink.finished.reason, FinishReason::kLength) << sink.finished.error;
    const std::string want = i % 3 != 2 ? offline[i] : absl::StrJoin(Offline(LongPrompt(i), kTokens), " ");
    EXPECT_EQ(absl::StrJoin(sink.tokens, " "), want) << "request " << i;
  }
  const LoadSnapshot load = s.Load();
  EXPECT_GT(load.swap_bytes_to_host, 0u) << "blocks went to the host tier";
  EXPECT_LT(load.swap_bytes_to_host, load.swap_bytes_to_device)
      << "all came back, and a block's later offloads released it to its clean host copy, copying nothing";
  EXPECT_EQ(load.kv[static_cast<int>(Tier::kDevice)].used, 0);
  EXPECT_EQ(load.kv[static_cast<int>(Tier::kHost)].used, 0);
}

// Samples the Prometheus gauge pruneserve_kv_blocks{tier="host",state="used"}
// after every step (on the engine loop's thread).
class HostBlocksProbe final : public SchedulerObserver {
 public:
  void OnStep(const LoadSnapshot& load, int batch_tokens) override {
    metrics_.OnStep(load, batch_tokens);
    const double used = Gauge();
    std::lock_guard<std::mutex> lock(mu_);
    most_ = std::max(most_, used);
    last_ = used;
  }
  void OnPreemption(PreemptionMode m) override { metrics_.OnPreemption(m); }
  void OnSwap(Tier to, uint64_t bytes, double seconds) override { metrics_.OnSwap(to, bytes, seconds); }
  double most() {
    std::lock_guard<std::mutex> lock(mu_);
    return most_;
  }
  double last() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

 private:
  double Gauge() {
    for (const prometheus::MetricFamily& f : metrics_.registry()->Collect()) {
      if (f.name != "pruneserve_kv_blocks") continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        bool host = false, used = false;
        for (const prometheus::ClientMetric::Label& l : m.label) {
          host = host || (l.name == "tier" && l.value == "host");
          used = used || (l.name == "state" && l.value == "used");
        }
        if (host && used) return m.gauge.value;
      }
    }
    return -1;
  }
  server::Metrics metrics_;
  std::mutex mu_;
  double most_ = -1, last_ = -1;
};

TEST_F(SchedulerTest, LazyLlmAuxCacheShowsInTheHostTierMetricAndReturnsToZero) {
  HostBlocksProbe probe;
  ThreadPool engine_pool(2);
  Served s(*model_, engine_pool, {.engine = {.kv_host_blocks = 256 * 8}}, &probe);
  std::vector<int32_t> prompt = {1};
  for (int i = 1; i < 400; ++i) prompt.push_back(260 + (i * 37) % 250);
  auto r = Make("aux", prompt, 40);
  r->spec.pruning = Pruning("lazyllm", {"layers=2,4", "keep=0.3,0.1"});
  ASSERT_TRUE(s.Submit(r).ok());
  ASSERT_TRUE(sinks_["aux"]->Wait());
  EXPECT_EQ(sinks_["aux"]->finished.reason, FinishReason::kLength) << sinks_["aux"]->finished.error;
  // 280 rows pruned before layer 2 (and more before 4), 64 floats each: 16 per 4 KiB block.
  EXPECT_GE(probe.most(), 280 / 16) << "the Aux Cache's blocks are host-tier blocks";
  EXPECT_EQ(probe.last(), 0) << "and they all come back when the request ends";
  EXPECT_EQ(s.Load().kv[static_cast<int>(Tier::kHost)].used, 0);
  EXPECT_EQ(absl::StrJoin(sinks_["aux"]->tokens, " "), absl::StrJoin(Offline(prompt, 40, r->spec.pruning), " "));
}

// SlimInfer with one slim layer (0) whose candidates alternate every step between
// blocks {1, 2} and {5, 6} (with the sink 0 and the tail 7), so that every decode
// step switches the active set of layers 1-4: two blocks leave for the host tier and
// two come back, at each of those layers. Decode steps also stand in for a model
// whose layers take time: `layer_time` at each layer from 1 on, while the copies
// queued after layer 0's attention run.
class SeesawSlimInfer final : public SlimInfer {
 public:
  SeesawSlimInfer(const ModelConfig& config, std::chrono::milliseconds layer_time)
      : SlimInfer(SlimInferParams{.layers = {0}, .budgets = {64}, .block_size = 16, .unit_size = 4, .gamma = 1},
                  config),
        layer_time_(layer_time) {}
  absl::Status BeginStep(StepRows* rows, SeqContext& ctx) override {
    ++step_;
    return SlimInfer::BeginStep(rows, ctx);
  }
  void RowsForLayer(int layer, LayerRows& rows, SeqContext& ctx) override {
    SlimInfer::RowsForLayer(layer, rows, ctx);
    if (step_ > 1) std::this_thread::sleep_for(layer_time_);  // the layer's compute, not a synchronisation
  }

 protected:
  void Score(int stage, std::span<const float> q_mean, std::vector<float>* scores) override {
    SlimInfer::Score(stage, q_mean, scores);
    const int32_t a = step_ % 2 == 0 ? 1 : 5;
    for (size_t b = 0; b < scores->size(); ++b) {
      (*scores)[b] = static_cast<int32_t>(b) == a || static_cast<int32_t>(b) == a + 1 ? 1.0f : 0.0f;
    }
  }

 private:
  std::chrono::milliseconds layer_time_;
  int step_ = 0;
};

class SeesawParams final : public StrategyParams {
 public:
  std::unique_ptr<StrategyParams> Clone() const override { return std::make_unique<SeesawParams>(); }
  absl::Status Merge(const google::protobuf::Message&, std::string_view) override { return absl::OkStatus(); }
  void ToProto(google::protobuf::Message*) const override {}
  absl::Status Validate(const ModelConfig&, std::string_view) const override { return absl::OkStatus(); }
  bool WholePrompt() const override { return true; }
  std::unique_ptr<PruningStrategy> Make(const ModelConfig& config) const override {
    return std::make_unique<SeesawSlimInfer>(config, std::chrono::milliseconds(8));
  }
};

// Forwards to the server's metrics (on the engine loop's thread).
class MetricsObserver final : public SchedulerObserver {
 public:
  void OnStep(const LoadSnapshot& load, int batch_tokens) override { metrics_.OnStep(load, batch_tokens); }
  void OnPreemption(PreemptionMode m) override { metrics_.OnPreemption(m); }
  void OnSwap(Tier to, uint64_t bytes, double seconds) override { metrics_.OnSwap(to, bytes, seconds); }
  // The counter `name` with the label value `label` (empty: the unlabelled one).
  double Counter(const std::string& name, const std::string& label = "") {
    for (const prometheus::MetricFamily& f : metrics_.registry()->Collect()) {
      if (f.name != name) continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        if (label.empty() || (!m.label.empty() && m.label[0].value == label)) return m.counter.value;
      }
    }
    return -1;
  }

 private:
  server::Metrics metrics_;
};

TEST_F(SchedulerTest, SlimInferMovesShowInTheSwapMetricsAndItsPrefetchesOverlapASlowCopyEngine) {
  RegisterStrategy(
      {.name = "test_seesaw_sliminfer",
       .summary = "test: SlimInfer switching its active blocks every step",
       .defaults = [](const ModelConfig&, const CalibrationPtr&) { return std::make_unique<SeesawParams>(); }});
  // 2 ms per 4 KiB (a page of stories260K: 8 blocks of 512 bytes), timed as it runs.
  constexpr double kSecondsPerByte = 0.002 / 4096;
  std::atomic<int64_t> copies{0}, copy_ns{0};
  MetricsObserver observer;
  ThreadPool engine_pool(2);
  server::ServingOptions options{.engine = {.kv_host_blocks = 256 * 8}};
  options.engine.swap_copy = [&](uint8_t* dst, const uint8_t* src, size_t bytes) {
    const auto start = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(kSecondsPerByte * bytes));  // a slow copy engine
    std::memcpy(dst, src, bytes);
    ++copies;
    copy_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    return absl::OkStatus();
  };
  Served s(*model_, engine_pool, options, &observer);
  std::vector<int32_t> prompt = {1};
  for (int i = 1; i < 128; ++i) prompt.push_back(260 + (i * 37) % 250);
  auto r = Make("seesaw", prompt, 12);
  r->spec.pruning = Pruning("test_seesaw_sliminfer");
  ASSERT_TRUE(s.Submit(r).ok());
  ASSERT_TRUE(sinks_["seesaw"]->Wait());
  EXPECT_EQ(sinks_["seesaw"]->finished.reason, FinishReason::kLength) << sinks_["seesaw"]->finished.error;
  EXPECT_EQ(absl::StrJoin(sinks_["seesaw"]->tokens, " "), absl::StrJoin(Offline(prompt, 12, r->spec.pruning), " "));
  EXPECT_LT(sinks_["seesaw"]->finished.usage.kv_device_blocks, sinks_["seesaw"]->finished.usage.kv_blocks)
      << "part of its KV sat in the host tier";

  const LoadSnapshot load = s.Load();
  EXPECT_GT(load.swap_bytes_to_host, 0u);
  EXPECT_GT(load.swap_bytes_to_device, 0u) << "offloaded blocks were prefetched back";
  EXPECT_EQ(observer.Counter("pruneserve_kv_swap_bytes_total", "to_host"),
            static_cast<double>(load.swap_bytes_to_host));
  EXPECT_EQ(observer.Counter("pruneserve_kv_swap_bytes_total", "to_device"),
            static_cast<double>(load.swap_bytes_to_device));
  // Every decode step moves pages at 4 layers; the engine waited for a fraction of the
  // time their copies took.
  const double slowdown = static_cast<double>(copy_ns.load()) * 1e-9;
  const double waited = observer.Counter("pruneserve_kv_move_wait_seconds_total");
  std::printf("%ld block copies, %.3f s of copying, %.3f s waited\n", static_cast<long>(copies.load()), slowdown,
              waited);
  EXPECT_GE(copies.load(), 4 * 10);
  // The counter sums each step's increment, the snapshot holds the running total: equal
  // up to the rounding of the sums.
  EXPECT_NEAR(waited, load.move_wait_seconds, 1e-9 * load.move_wait_seconds + 1e-12);
  EXPECT_LT(waited, 0.5 * slowdown) << "waited " << waited << " s for copies that took " << slowdown << " s";
  EXPECT_EQ(load.kv[static_cast<int>(Tier::kDevice)].used, 0);
  EXPECT_EQ(load.kv[static_cast<int>(Tier::kHost)].used, 0);
}

}  // namespace
}  // namespace ps
