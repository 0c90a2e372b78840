// Strategies are plug-ins: one written only in this file, registered at run time,
// prunes rows, selects the KV each layer attends to, and moves a KV block to the
// host tier and back, inside shared batches, with the offline generator's tokens.
// And LazyLLM's Aux Cache lives in the host tier: it shows in the host-tier block
// metric while a long prompt runs and returns to 0.
#include <prometheus/registry.h>

#include <atomic>
#include <mutex>

#include "absl/strings/str_join.h"
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
    const std::vector<BlockLoc>& blocks = ctx.Kv(0).blocks;
    if (blocks.empty()) return;
    const int32_t first = 0;
    if (layer == 1 && blocks[0].tier == Tier::kDevice) {
      EXPECT_TRUE(ctx.MoveBlocks(0, {&first, 1}, Tier::kHost).ok());
      ++counters_[0];
    } else if (layer == 4 && blocks[0].tier == Tier::kHost) {
      EXPECT_TRUE(ctx.MoveBlocks(0, {&first, 1}, Tier::kDevice).ok());
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
                    .defaults = [](const ModelConfig&) { return std::make_unique<MoverParams>(g_counters); }});
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
  Generator gen(*model_, backend_);
  const std::unique_ptr<PruningStrategy> one = mover.Make(model_->config());
  auto r = gen.Generate(LongPrompt(0), SamplingParams{.temperature = 0}, StopCriteria{.max_new_tokens = 1}, nullptr,
                        one.get());
  ASSERT_TRUE(r.ok());
  const int n = static_cast<int>(LongPrompt(0).size()), layers = model_->config().n_layers;
  EXPECT_EQ(r->prompt_rows_computed, 2 * n + (layers - 2) * (n - n / 3)) << "rows at positions 1, 4, ... pruned";

  // Served: mixed with full requests in shared batches, prefilled in chunks.
  ThreadPool engine_pool(2);
  Served s(*model_, engine_pool,
           {.engine = {.kv_host_blocks = 64}, .scheduler = {.max_batch_tokens = 256, .prefill_chunk = 64}});
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
  EXPECT_EQ(load.swap_bytes_to_host, load.swap_bytes_to_device) << "and all came back";
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
  Served s(*model_, engine_pool, {.engine = {.kv_host_blocks = 256}}, &probe);
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

}  // namespace
}  // namespace ps
