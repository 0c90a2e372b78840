// The scheduler under memory pressure and churn: outputs do not depend on batching,
// chunking or preemption (swap or recompute); a cancellation storm and failing
// swaps leave every block free; chunked prefill lets decodes advance.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_join.h"
#include "tests/scheduler/scheduler_test_util.h"

namespace ps {
namespace {

// Records what the engine thread reports, for assertions after the fact.
class StepLog : public SchedulerObserver {
 public:
  void OnStep(const LoadSnapshot&, int batch_tokens) override {
    std::lock_guard<std::mutex> lock(mu_);
    batch_tokens_.push_back(batch_tokens);
  }
  void OnPreemption(PreemptionMode mode) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++preemptions_[static_cast<int>(mode)];
  }
  void OnSwap(Tier to, uint64_t bytes, double) override {
    std::lock_guard<std::mutex> lock(mu_);
    swap_bytes_[static_cast<int>(to)] += bytes;
  }
  std::vector<int> batch_tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    return batch_tokens_;
  }
  int64_t preemptions(PreemptionMode m) {
    std::lock_guard<std::mutex> lock(mu_);
    return preemptions_[static_cast<int>(m)];
  }
  uint64_t swap_bytes(Tier to) {
    std::lock_guard<std::mutex> lock(mu_);
    return swap_bytes_[static_cast<int>(to)];
  }

 private:
  std::mutex mu_;
  std::vector<int> batch_tokens_;
  int64_t preemptions_[2] = {0, 0};
  uint64_t swap_bytes_[2] = {0, 0};
};

// Prompts of 3 to 162 tokens.
std::vector<int32_t> MixedPrompt(int i) {
  std::vector<int32_t> p = {1};
  for (int k = 0; k < 2 + (i * 53) % 160; ++k) p.push_back(260 + (i * 29 + k * 11) % 250);
  return p;
}
int NewTokens(int i) { return 8 + (i * 7) % 25; }

void ExpectEverythingFree(const Served& s) {
  const LoadSnapshot load = s.Load();
  EXPECT_EQ(load.running, 0);
  EXPECT_EQ(load.waiting, 0);
  EXPECT_EQ(load.in_flight, 0);
  EXPECT_EQ(load.swapped, 0);
  EXPECT_EQ(load.kv[static_cast<int>(Tier::kDevice)].used, 0);
  EXPECT_EQ(load.kv[static_cast<int>(Tier::kHost)].used, 0);
}

// Sized so that requests fit one by one but far from all at once: a request of up
// to 162 + 32 tokens takes at most 13 pages x 5 layers = 65 of the 120 pages (8
// blocks each: K and V of 4 KV heads).
const server::ServingOptions kTight{
    .engine = {.kv_block_tokens = 16, .kv_device_blocks = 120 * 8, .kv_host_blocks = 2000 * 8},
    .scheduler = {.max_batch_tokens = 256, .prefill_chunk = 64}};

TEST_F(SchedulerTest, TokensIndependentOfBatchingAndMemoryPressure) {
  constexpr int kRequests = 24;
  std::vector<std::string> want(kRequests);
  for (int i = 0; i < kRequests; ++i) want[i] = absl::StrJoin(Offline(MixedPrompt(i), NewTokens(i)), " ");

  struct Case {
    std::string name;
    server::ServingOptions options;
    bool one_at_a_time = false;
  };
  server::ServingOptions recompute = kTight;
  recompute.scheduler.preemption = PreemptionMode::kRecompute;
  const Case cases[] = {
      {"a_one_at_a_time", server::ServingOptions{}, true},
      {"b_all_at_once", server::ServingOptions{.scheduler = {.prefill_chunk = 64}}},
      {"c_swap", kTight},
      {"d_recompute", recompute},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ThreadPool engine_pool(2);
    StepLog log;
    server::ServingOptions options = c.options;
    if (!c.one_at_a_time) options.scheduler.gather_first = kRequests;  // all meet in the engine, on any machine
    Served s(*model_, engine_pool, options, &log);
    auto id = [&](int i) { return c.name + "/" + std::to_string(i); };
    for (int i = 0; i < kRequests; ++i) {
      ASSERT_TRUE(s.Submit(Make(id(i), MixedPrompt(i), NewTokens(i))).ok());
      if (c.one_at_a_time) {
        ASSERT_TRUE(sinks_[id(i)]->Wait());
      }
    }
    for (int i = 0; i < kRequests; ++i) {
      CollectingSink& sink = *sinks_[id(i)];
      ASSERT_TRUE(sink.Wait());
      EXPECT_EQ(sink.finished.reason, FinishReason::kLength) << sink.finished.error;
      EXPECT_EQ(absl::StrJoin(sink.tokens, " "), want[i]) << "request " << i;
    }
    ExpectEverythingFree(s);
    const LoadSnapshot load = s.Load();
    const int64_t swaps = load.preemptions[static_cast<int>(PreemptionMode::kSwap)];
    const int64_t recomputes = load.preemptions[static_cast<int>(PreemptionMode::kRecompute)];
    EXPECT_EQ(swaps, log.preemptions(PreemptionMode::kSwap));
    EXPECT_EQ(recomputes, log.preemptions(PreemptionMode::kRecompute));
    if (c.name == "c_swap") {
      EXPECT_GT(swaps, 0) << "the test meant to force swapping";
      EXPECT_EQ(recomputes, 0);
      EXPECT_GT(load.swap_bytes_to_host, 0u);
      EXPECT_EQ(load.swap_bytes_to_host, load.swap_bytes_to_device);  // everything swapped out came back
      EXPECT_EQ(log.swap_bytes(Tier::kHost), load.swap_bytes_to_host);
    } else if (c.name == "d_recompute") {
      EXPECT_GT(recomputes, 0) << "the test meant to force recomputation";
      EXPECT_EQ(swaps, 0);
      EXPECT_EQ(load.swap_bytes_to_host, 0u);
    } else {
      EXPECT_EQ(swaps + recomputes, 0);
    }
  }
}

// Under recompute preemption, GemFilter and CritiPrefill requests keep the tokens they
// get alone: the recomputation replays the prompt step by itself (what the fresh
// strategy scores), then the generated tokens. (LazyLLM's per-step decode selections
// are not replayed: its tokens may change, as the README says.)
TEST_F(SchedulerTest, RecomputedWholePromptStrategiesKeepTheirTokens) {
  constexpr int kRequests = 16;
  const PruningParams strategies[] = {
      Pruning("gemfilter", {"top_k=24", "filter_layer=1"}),
      Pruning("critiprefill", {"segment_size=16", "block_size=4", "budget=8", "dense_prefix=0"})};
  std::vector<std::string> want(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    want[i] = absl::StrJoin(Offline(MixedPrompt(i), NewTokens(i), strategies[i % 2]), " ");
  }
  server::ServingOptions options = kTight;
  options.scheduler.preemption = PreemptionMode::kRecompute;
  options.engine.kv_device_blocks = 72 * 8;  // the pruned sequences need less than kTight's 120 pages
  options.scheduler.gather_first = kRequests;
  ThreadPool engine_pool(2);
  Served s(*model_, engine_pool, options);
  for (int i = 0; i < kRequests; ++i) {
    auto r = Make("replay/" + std::to_string(i), MixedPrompt(i), NewTokens(i));
    r->spec.pruning = strategies[i % 2];
    ASSERT_TRUE(s.Submit(r).ok());
  }
  for (int i = 0; i < kRequests; ++i) {
    CollectingSink& sink = *sinks_["replay/" + std::to_string(i)];
    ASSERT_TRUE(sink.Wait());
    EXPECT_EQ(sink.finished.reason, FinishReason::kLength) << sink.finished.error;
    EXPECT_EQ(absl::StrJoin(sink.tokens, " "), want[i]) << "request " << i << " (" << strategies[i % 2].name() << ")";
  }
  ExpectEverythingFree(s);
  EXPECT_GT(s.Load().preemptions[static_cast<int>(PreemptionMode::kRecompute)], 0)
      << "the test meant to force recomputation";
}

// Half of 64 concurrent requests (all six strategies mixed) are cancelled
// at random engine steps (so they are waiting, running, or swapped out when it
// happens), half of those through Abort(). Afterwards nothing is left anywhere.
TEST_F(SchedulerTest, CancellationStormLeavesEveryBlockFree) {
  constexpr int kRequests = 64, kLastStep = 150;
  // Cancels the requests due at each step, on the engine thread; steps count from
  // the moment every request is submitted (an Abort before its Submit would find nothing).
  struct Canceller : SchedulerObserver {
    void OnStep(const LoadSnapshot&, int) override {
      if (!counting.load()) return;
      for (const auto& cancel : at_step[std::min(step++, kLastStep + 1)]) cancel();
    }
    void OnPreemption(PreemptionMode) override {}
    void OnSwap(Tier, uint64_t, double) override {}
    std::vector<std::vector<std::function<void()>>> at_step =
        std::vector<std::vector<std::function<void()>>>(kLastStep + 2);
    int step = 0;
    std::atomic<bool> counting{false};
    std::atomic<Served*> scheduler{nullptr};
  } canceller;
  ThreadPool engine_pool(2);
  server::ServingOptions options = kTight;
  options.engine.kv_host_blocks = 20 * 8;    // smaller than some sequences: those preemptions recompute
  options.engine.kv_device_blocks = 80 * 8;  // pruned sequences need less: more pressure than kTight
  options.scheduler.gather_first = kRequests;
  Served s(*model_, engine_pool, options, &canceller);
  canceller.scheduler = &s;
  std::mt19937 rng(7);
  auto id = [](int i) { return "storm/" + std::to_string(i); };
  // Even requests run to the end; odd ones ask for more tokens than there are steps
  // before their cancellation, so every one of them is cancelled.
  std::vector<std::shared_ptr<Request>> requests;
  std::vector<int> cancel_step(kRequests, -1);
  // Strategies mixed: pruned KV, Aux Caches and GemFilter's scratch prefix passes go too.
  // LazyLLM's revivals capped: its reservations then fall short at times, which the
  // storm should meet too (uncapped, this mix hardly preempts at all).
  const PruningParams strategies[] = {
      Pruning("full"),
      Pruning("lazyllm", {"layers=1,2,3,4", "keep=0.5,0.3,0.2,0.1", "max_revivals=2"}),
      Pruning("gemfilter", {"top_k=24", "filter_layer=1"}),
      Pruning("critiprefill", {"segment_size=16", "block_size=4", "budget=8", "dense_prefix=0"}),
      Pruning("sliminfer", {"layers=1,3", "budgets=48,24", "block_size=8", "unit_size=4", "gamma=1"}),
      Pruning("pod", {"sinks=4", "recent=16"})};
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back(Make(id(i), MixedPrompt(i), i % 2 == 0 ? 30 : kLastStep + 10));
    requests.back()->spec.pruning = strategies[(i / 2) % std::size(strategies)];
    if (i % 2 == 0) continue;
    cancel_step[i] = static_cast<int>(rng() % (kLastStep + 1));
    if (cancel_step[i] == 0) continue;  // cancelled by this thread right after submission
    canceller.at_step[cancel_step[i]].push_back(
        i % 4 == 1 ? std::function<void()>([r = requests[i]] { r->Cancel(CancelReason::kClient); })
                   : std::function<void()>(
                         [&canceller, name = id(i)] { EXPECT_TRUE(canceller.scheduler.load()->Abort(name)); }));
  }
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(s.Submit(requests[i]).ok());
    if (cancel_step[i] == 0) {
      if (i % 4 == 1) {
        requests[i]->Cancel(CancelReason::kClient);
      } else {
        EXPECT_TRUE(s.Abort(id(i)));
      }
    }
  }
  canceller.counting = true;
  for (int i = 0; i < kRequests; ++i) {
    CollectingSink& sink = *sinks_[id(i)];
    ASSERT_TRUE(sink.Wait());
    if (i % 2 == 0) {
      EXPECT_EQ(sink.finished.reason, FinishReason::kLength) << i << " " << sink.finished.error;
      EXPECT_EQ(sink.tokens.size(), 30u);
    } else {
      EXPECT_EQ(sink.finished.reason, FinishReason::kCancelled) << i << " " << sink.finished.error;
      EXPECT_EQ(sink.finished.cancel, i % 4 == 1 ? CancelReason::kClient : CancelReason::kAbort) << i;
    }
  }
  ExpectEverythingFree(s);
  const LoadSnapshot load = s.Load();
  EXPECT_GT(load.preemptions[static_cast<int>(PreemptionMode::kSwap)], 0);
  EXPECT_GT(load.preemptions[static_cast<int>(PreemptionMode::kRecompute)], 0);
  std::printf("steps %d, preemptions: swap %ld, recompute %ld\n", canceller.step, load.preemptions[0],
              load.preemptions[1]);
}

// Every third block copy fails: the scheduler drops that sequence's KV and
// recomputes it, so tokens are unchanged and no block is lost.
TEST_F(SchedulerTest, FailingSwapsFallBackToRecompute) {
  if (testing::TestDevice() != "cpu") {
    GTEST_SKIP() << "the copy hook replaces the CPU swap engine's copies; the CUDA swap engine has none";
  }
  constexpr int kRequests = 12;
  ThreadPool engine_pool(2);
  std::atomic<int> copies{0}, failures{0};
  server::ServingOptions options = kTight;
  options.scheduler.gather_first = kRequests;
  options.engine.swap_copy = [&](uint8_t* dst, const uint8_t* src, size_t bytes) {
    if (copies.fetch_add(1) % 3 == 2) {
      failures.fetch_add(1);
      return absl::DataLossError("injected copy failure");
    }
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  };
  Served s(*model_, engine_pool, options);
  for (int i = 0; i < kRequests; ++i)
    ASSERT_TRUE(s.Submit(Make("f" + std::to_string(i), MixedPrompt(i), NewTokens(i))).ok());
  for (int i = 0; i < kRequests; ++i) {
    CollectingSink& sink = *sinks_["f" + std::to_string(i)];
    ASSERT_TRUE(sink.Wait());
    EXPECT_EQ(sink.finished.reason, FinishReason::kLength) << sink.finished.error;
    EXPECT_EQ(absl::StrJoin(sink.tokens, " "), absl::StrJoin(Offline(MixedPrompt(i), NewTokens(i)), " ")) << i;
  }
  EXPECT_GT(failures.load(), 0) << "the test meant to make swaps fail";
  ExpectEverythingFree(s);
}

// With gather_first, the first step waits for every request however slowly they are
// submitted (here with the test thread yielding between them): it carries all their prompts.
TEST_F(SchedulerTest, GatherFirstStepsOnceTheRequestsHaveArrived) {
  constexpr int kRequests = 4;
  ThreadPool engine_pool(2);
  StepLog log;
  Served s(*model_, engine_pool, {.scheduler = {.gather_first = kRequests}}, &log);
  int prompt_tokens = 0;
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(s.Submit(Make("g" + std::to_string(i), Prompt(i), 3)).ok());
    prompt_tokens += static_cast<int>(Prompt(i).size());
    std::this_thread::yield();
  }
  for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(sinks_["g" + std::to_string(i)]->Wait());
  const std::vector<int> steps = log.batch_tokens();
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps[0], prompt_tokens) << absl::StrJoin(steps, ",");
  EXPECT_EQ(steps.size(), 3u) << "the prompts' step, then two decodes of all four: " << absl::StrJoin(steps, ",");
}

// A 300-token prompt prefilled in chunks of 64 next to three decoding requests:
// steps carry a chunk and the three decodes together, the decoders have several
// tokens before the long prompt's first one, and its tokens are those of one pass.
TEST_F(SchedulerTest, ChunkedPrefillLetsDecodesAdvance) {
  ThreadPool engine_pool(2);
  StepLog log;
  Served s(*model_, engine_pool, {.scheduler = {.prefill_chunk = 64}}, &log);
  std::vector<int32_t> long_prompt = {1};
  for (int i = 1; i < 300; ++i) long_prompt.push_back(260 + (i * 37) % 250);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.Submit(Make("d" + std::to_string(i), Prompt(i), 60)).ok());
  std::vector<size_t> decoded_before_first(3, 0);
  auto lp = Make("long", long_prompt, 10);
  sinks_["long"]->on_token = [&](size_t n) {  // engine thread: the decoders' sinks are written only there
    if (n != 1) return;
    for (int i = 0; i < 3; ++i) decoded_before_first[i] = sinks_["d" + std::to_string(i)]->tokens.size();
  };
  ASSERT_TRUE(s.Submit(lp).ok());
  for (const char* id : {"d0", "d1", "d2", "long"}) ASSERT_TRUE(sinks_[id]->Wait());
  EXPECT_EQ(absl::StrJoin(sinks_["long"]->tokens, " "), absl::StrJoin(Offline(long_prompt, 10), " "));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(absl::StrJoin(sinks_["d" + std::to_string(i)]->tokens, " "), absl::StrJoin(Offline(Prompt(i), 60), " "));
    EXPECT_GE(decoded_before_first[i], 4u) << "decoder " << i << " did not advance during the chunked prefill";
  }
  const std::vector<int> steps = log.batch_tokens();
  EXPECT_GE(std::count(steps.begin(), steps.end(), 64 + 3), 3) << absl::StrJoin(steps, ",");
}

}  // namespace
}  // namespace ps
