// Strategies inside shared batches: each request's tokens are what it gets alone
// (and offline), whatever the others in the batch do; the Finished event carries
// the accounting and, when asked, the kept prompt spans.
#include "absl/strings/str_join.h"
#include "tests/scheduler/scheduler_test_util.h"

namespace ps {
namespace {

// Prompts of 90 to 170 tokens: long enough for every strategy to prune.
std::vector<int32_t> LongPrompt(int i) {
  std::vector<int32_t> p = {1};
  for (int k = 0; k < 90 + (i * 37) % 80; ++k) p.push_back(260 + (i * 23 + k * 17) % 250);
  return p;
}

TEST_F(SchedulerTest, MixedStrategiesInOneBatchGiveEachItsTokensAlone) {
  const PruningParams strategies[] = {
      Pruning("full"),
      Pruning("lazyllm"),
      Pruning("gemfilter", {"top_k=40", "filter_layer=2"}),
      Pruning("gemfilter", {"top_k=40", "original_positions=true"}),
      Pruning("lazyllm", {"layers=2", "keep=0.3"}),
      Pruning("critiprefill", {"segment_size=16", "block_size=4", "budget=8", "dense_prefix=0"}),
      Pruning("sliminfer", {"layers=1,3", "budgets=48,24", "block_size=8", "unit_size=4", "gamma=1"}),
      Pruning("pod", {"sinks=4", "recent=16"})};
  constexpr int kStrategies = std::size(strategies), kRequests = 2 * kStrategies, kTokens = 24;
  auto strategy = [&](int i) { return strategies[i % kStrategies]; };
  std::vector<std::string> offline(kRequests);
  for (int i = 0; i < kRequests; ++i) offline[i] = absl::StrJoin(Offline(LongPrompt(i), kTokens, strategy(i)), " ");
  // The strategies do change the tokens (else this test would prove nothing).
  EXPECT_NE(offline[1], absl::StrJoin(Offline(LongPrompt(1), kTokens), " "));
  EXPECT_NE(offline[2], absl::StrJoin(Offline(LongPrompt(2), kTokens), " "));
  EXPECT_NE(offline[6], absl::StrJoin(Offline(LongPrompt(6), kTokens), " "));
  EXPECT_NE(offline[7], absl::StrJoin(Offline(LongPrompt(7), kTokens), " "));

  // Alone, in a mixed batch, and in a mixed batch on a backend whose activations host
  // code can reach only through copies (as on a GPU).
  for (const auto& [together, guarded] : {std::pair{false, false}, {true, false}, {true, true}}) {
    const std::string run = guarded ? "guarded/" : together ? "mixed/" : "alone/";
    SCOPED_TRACE(run);
    ThreadPool engine_pool(2);
    // A host tier for LazyLLM's Aux Cache (without one, pruned rows have nowhere to wait and stay).
    Served s(*model_, engine_pool,
             {.engine = {.kv_host_blocks = 256 * 8},
              .scheduler = {.prefill_chunk = 64, .gather_first = together ? kRequests : 0}},
             nullptr, guarded);
    auto id = [&](int i) { return run + std::to_string(i); };
    for (int i = 0; i < kRequests; ++i) {
      auto r = Make(id(i), LongPrompt(i), kTokens);
      r->spec.pruning = strategy(i);
      ASSERT_TRUE(s.Submit(r).ok());
      if (!together) {
        ASSERT_TRUE(sinks_[id(i)]->Wait());
      }
    }
    for (int i = 0; i < kRequests; ++i) {
      CollectingSink& sink = *sinks_[id(i)];
      ASSERT_TRUE(sink.Wait());
      EXPECT_EQ(sink.finished.reason, FinishReason::kLength) << sink.finished.error;
      EXPECT_EQ(absl::StrJoin(sink.tokens, " "), offline[i]) << "request " << i << " (" << strategy(i).name() << ")";
    }
    const LoadSnapshot load = s.Load();
    EXPECT_EQ(load.kv[static_cast<int>(Tier::kDevice)].used, 0);
    EXPECT_EQ(s.guarded().guarded_calls() > 0, s.guarding());
    EXPECT_EQ(s.guarding(), guarded && testing::TestDevice() == "cpu");
  }
}

TEST_F(SchedulerTest, FinishedCarriesAccountingAndTheKeptSpans) {
  ThreadPool engine_pool(2);
  Served s(*model_, engine_pool, {.engine = {.kv_host_blocks = 256 * 8}});
  const std::vector<int32_t> prompt = LongPrompt(3);
  const int n = static_cast<int>(prompt.size()), layers = model_->config().n_layers;
  struct Case {
    std::string id;
    PruningParams pruning;
  };
  const Case cases[] = {{"full", Pruning("full")},
                        {"lazy", Pruning("lazyllm", {"layers=1,3", "keep=0.5,0.2"})},
                        {"gem", Pruning("gemfilter", {"top_k=30", "filter_layer=1"})}};
  for (const Case& c : cases) {
    auto r = Make(c.id, prompt, 4);
    r->spec.pruning = c.pruning;
    r->spec.report_pruning = true;
    ASSERT_TRUE(s.Submit(r).ok());
  }
  auto spans_total = [](const RequestEvent& ev) {
    int total = 0;
    for (const auto& span : ev.kept_spans) total += span.end - span.begin;
    return total;
  };
  const RequestEvent& full = (sinks_["full"]->Wait(), sinks_["full"]->finished);
  EXPECT_DOUBLE_EQ(full.usage.prompt_tokens_computed, n);
  ASSERT_EQ(full.kept_spans.size(), 1u);
  EXPECT_EQ(full.kept_spans[0].begin, 0);
  EXPECT_EQ(full.kept_spans[0].end, n);
  EXPECT_EQ(full.kept_spans[0].text, model_->tokenizer()->Decode(prompt));
  EXPECT_EQ(full.usage.kept_per_layer, (std::vector<std::pair<int, int>>{{0, n}}));
  // 16-token pages of 8 blocks (K and V of 4 KV heads).
  auto blocks = [&](int tokens) { return static_cast<int64_t>((tokens + 15) / 16 * layers * 8); };
  EXPECT_EQ(full.usage.kv_blocks, blocks(n + 3));  // the prompt and 3 of the 4 new tokens were fed back

  const RequestEvent& lazy = (sinks_["lazy"]->Wait(), sinks_["lazy"]->finished);
  const int half = (n + 1) / 2, fifth = (n + 4) / 5;
  EXPECT_EQ(lazy.usage.kept_per_layer, (std::vector<std::pair<int, int>>{{0, n}, {1, half}, {3, fifth}}));
  EXPECT_GE(lazy.usage.prompt_tokens_computed, (n + 2.0 * half + 2.0 * fifth) / layers);  // decode revivals may add
  EXPECT_EQ(spans_total(lazy), fifth);
  EXPECT_EQ(lazy.kept_spans.back().end, n) << "the last prompt token is always kept";
  EXPECT_LT(lazy.usage.kv_blocks, full.usage.kv_blocks);

  const RequestEvent& gem = (sinks_["gem"]->Wait(), sinks_["gem"]->finished);
  EXPECT_DOUBLE_EQ(gem.usage.prompt_tokens_computed, (2.0 * n + 30.0 * layers) / layers);
  EXPECT_EQ(gem.usage.kept_per_layer, (std::vector<std::pair<int, int>>{{0, 30}}));
  EXPECT_EQ(spans_total(gem), 30);
  EXPECT_EQ(gem.kept_spans.back().end, n);
  EXPECT_EQ(gem.usage.kv_blocks, blocks(30 + 3));
}

}  // namespace
}  // namespace ps
