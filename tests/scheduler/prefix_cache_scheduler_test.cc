// The prefix cache through the serving core: a later request over the same
// document computes only what follows the cached pages and gets the tokens it
// would get alone; salts and uncacheable strategies keep apart; a prefix evicted
// to the host tier is found there; many requests over a few documents under a
// tight device tier, with cancellations and deadlines, lose nothing and leave only
// the cache's blocks, which a flush frees; event subscribers see pages come and go.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_join.h"
#include "tests/scheduler/scheduler_test_util.h"

namespace ps {
namespace {

// A document of n tokens (after BOS) and a question about it.
std::vector<int32_t> Document(int doc, int n) {
  std::vector<int32_t> p = {1};
  for (int k = 0; k < n; ++k) p.push_back(260 + (doc * 37 + k * 11) % 250);
  return p;
}
std::vector<int32_t> Ask(std::vector<int32_t> doc, int question) {
  for (int k = 0; k < 5; ++k) doc.push_back(270 + (question * 17 + k * 7) % 200);
  return doc;
}

const LoadSnapshot& Idle(const Served& s, LoadSnapshot* load) {
  *load = s.Load();
  EXPECT_EQ(load->in_flight, 0);
  EXPECT_EQ(load->running, 0);
  return *load;
}

// 16-token pages; stories260K has 5 layers and 8 blocks a page (K and V of 4 KV heads).
constexpr int kPage = 16, kPageBlocks = 5 * 8;

TEST_F(SchedulerTest, QuestionsOverOneDocumentComputeOnlyWhatFollowsItsCachedPages) {
  ThreadPool engine_pool(2);
  Served s(*model_, engine_pool, {.engine = {.kv_block_tokens = kPage, .prefix_cache = true}});
  const std::vector<int32_t> doc = Document(0, 100);  // 101 tokens: 6 whole pages
  auto run = [&](const std::string& id, const std::vector<int32_t>& prompt, const std::string& salt = "",
                 const PruningParams& pruning = {}) -> const RequestEvent& {
    std::shared_ptr<Request> r = Make(id, prompt, 8);
    r->spec.cache_salt = salt;
    r->spec.pruning = pruning;
    r->spec.report_pruning = true;
    EXPECT_TRUE(s.Submit(r).ok());
    EXPECT_TRUE(sinks_[id]->Wait());
    EXPECT_EQ(sinks_[id]->finished.reason, FinishReason::kLength) << sinks_[id]->finished.error;
    return sinks_[id]->finished;
  };
  const RequestEvent& first = run("q0", Ask(doc, 0));
  EXPECT_EQ(first.usage.cached_tokens, 0);
  EXPECT_DOUBLE_EQ(first.usage.prompt_tokens_computed, 106);
  for (int q = 1; q <= 3; ++q) {
    const std::string id = "q" + std::to_string(q);
    const RequestEvent& ev = run(id, Ask(doc, q));
    EXPECT_EQ(ev.usage.cached_tokens, 6 * kPage) << id;
    EXPECT_EQ(ev.usage.prompt_tokens, 106) << id;
    EXPECT_DOUBLE_EQ(ev.usage.prompt_tokens_computed, 106 - 6 * kPage) << id;
    EXPECT_EQ(sinks_[id]->tokens, Offline(Ask(doc, q), 8)) << id;
    ASSERT_EQ(ev.kept_spans.size(), 1u) << id;  // the cached tokens reached the last layer too
    EXPECT_EQ(ev.kept_spans[0].begin, 0);
    EXPECT_EQ(ev.kept_spans[0].end, 106);
  }
  // Another tenant's salt, and a strategy whose KV depends on the whole prompt: no reuse.
  EXPECT_EQ(run("salted", Ask(doc, 4), "tenant-b").usage.cached_tokens, 0);
  EXPECT_EQ(run("salted-again", Ask(doc, 5), "tenant-b").usage.cached_tokens, 6 * kPage);
  // Every strategy but full and streamingllm neither reads cached pages nor leaves its own
  // (the next `full` request still hits full's pages only: 6 of them).
  int q = 6;
  for (const char* name : {"lazyllm", "gemfilter", "sliminfer", "critiprefill", "pod", "snapkv"}) {
    EXPECT_EQ(run(name, Ask(doc, q++), "", Pruning(name)).usage.cached_tokens, 0) << name;
  }
  EXPECT_EQ(run("streamingllm", Ask(doc, q++), "", Pruning("streamingllm")).usage.cached_tokens, 6 * kPage);
  LoadSnapshot load;
  Idle(s, &load);
  // The document's pages under two salts, and each question's last whole page
  // (prompt 106 = 6 pages + 10 tokens: none).
  EXPECT_EQ(load.kv[static_cast<int>(Tier::kDevice)].cached, 2 * 6 * kPageBlocks);
  EXPECT_EQ(load.kv[static_cast<int>(Tier::kDevice)].used, load.kv[static_cast<int>(Tier::kDevice)].cached);
}

// Pages are cached as a chunked prefill computes them: a request over the same
// document that arrives mid-prefill starts from the pages computed so far.
TEST_F(SchedulerTest, ARequestArrivingMidPrefillSharesThePagesComputedSoFar) {
  ThreadPool engine_pool(2);
  struct Submitter : SchedulerObserver {  // submits the second request after the first's second step
    void OnStep(const LoadSnapshot&, int batch_tokens) override {
      if (batch_tokens > 0 && ++steps == 2) submitted = serving->Submit(second).ok();
    }
    void OnPreemption(PreemptionMode) override {}
    void OnSwap(Tier, uint64_t, double) override {}
    int steps = 0;
    bool submitted = false;
    Served* serving = nullptr;
    std::shared_ptr<Request> second;
  } submitter;
  Served s(*model_, engine_pool,
           {.engine = {.kv_block_tokens = kPage, .prefix_cache = true}, .scheduler = {.prefill_chunk = 32}},
           &submitter);
  const std::vector<int32_t> doc = Document(4, 150);
  submitter.serving = &s;
  submitter.second = Make("second", Ask(doc, 1), 6);
  ASSERT_TRUE(s.Submit(Make("first", Ask(doc, 0), 6)).ok());
  for (const char* id : {"first", "second"}) {
    ASSERT_TRUE(sinks_[id]->Wait()) << id;
    EXPECT_EQ(sinks_[id]->finished.reason, FinishReason::kLength) << sinks_[id]->finished.error;
  }
  EXPECT_TRUE(submitter.submitted);
  // Two 32-token chunks were computed when it arrived (4 whole pages), maybe a third.
  EXPECT_GE(sinks_["second"]->finished.usage.cached_tokens, 4 * kPage);
  EXPECT_LT(sinks_["second"]->finished.usage.cached_tokens, 9 * kPage) << "the first was still in prefill";
  EXPECT_EQ(sinks_["second"]->tokens, Offline(Ask(doc, 1), 6));
  EXPECT_EQ(sinks_["first"]->tokens, Offline(Ask(doc, 0), 6));
}

// What SubscribeKvEvents streams: the pages a request leaves, keyed by the hash
// chain; a late subscriber's snapshot; the end when the loop stops.
TEST_F(SchedulerTest, SubscribersSeeThePagesStoredAndRemoved) {
  ThreadPool engine_pool(2);
  Served s(*model_, engine_pool, {.engine = {.kv_block_tokens = kPage, .prefix_cache = true}});
  struct Log {
    std::mutex mu;
    std::vector<std::vector<PrefixEvent>> batches;
    bool ended = false;
  };
  auto follow = [&](Log* log) {
    return s.loop().SubscribeKvEvents([log](const std::vector<PrefixEvent>* events) {
      std::lock_guard<std::mutex> lock(log->mu);
      if (events == nullptr) {
        log->ended = true;
      } else {
        log->batches.push_back(*events);
      }
    });
  };
  Log first, late;
  follow(&first);
  const std::vector<int32_t> doc = Document(3, 40);  // 41 tokens + 5: 2 whole pages
  ASSERT_TRUE(s.Submit(Make("d", Ask(doc, 0), 4)).ok());
  ASSERT_TRUE(sinks_["d"]->Wait());
  std::vector<uint64_t> keys;  // the chain of the document's two pages
  uint64_t parent = PrefixIndex::RootKey(absl::StrCat(0, ":", "", ""));
  for (int p = 0; p < 2; ++p) {
    parent = PrefixIndex::PageKey(parent, std::span(doc).subspan(p * kPage, kPage));
    keys.push_back(parent);
  }
  auto stored = [](Log& log) {
    std::lock_guard<std::mutex> lock(log.mu);
    std::vector<uint64_t> out;
    for (const auto& batch : log.batches) {
      for (const PrefixEvent& e : batch) {
        if (e.stored) out.push_back(e.key);
      }
    }
    return out;
  };
  {
    std::lock_guard<std::mutex> lock(first.mu);
    ASSERT_FALSE(first.batches.empty());
    EXPECT_TRUE(first.batches[0].empty()) << "the snapshot of an empty cache";
  }
  EXPECT_EQ(stored(first), keys) << "stored when the request's first token came";
  const int64_t late_id = follow(&late);
  ASSERT_TRUE(s.FlushPrefixCache().ok());  // a step of the loop: the late subscriber's snapshot comes first
  EXPECT_EQ(stored(late), keys);
  {
    std::lock_guard<std::mutex> lock(first.mu);
    const std::vector<PrefixEvent>& removed = first.batches.back();
    ASSERT_EQ(removed.size(), 2u);
    EXPECT_FALSE(removed[0].stored || removed[1].stored);
  }
  s.loop().UnsubscribeKvEvents(late_id);
  s.Stop();
  std::lock_guard<std::mutex> lock(first.mu);
  EXPECT_TRUE(first.ended);
  EXPECT_FALSE(late.ended) << "unsubscribed before the stop";
}

TEST_F(SchedulerTest, APrefixEvictedToTheHostTierIsFoundThere) {
  ThreadPool engine_pool(2);
  // Room for 12 pages per layer: one request of 113 tokens (8 pages) and little else.
  Served s(*model_, engine_pool,
           {.engine = {.kv_block_tokens = kPage,
                       .kv_device_blocks = 12 * kPageBlocks,
                       .kv_host_blocks = 40 * kPageBlocks,
                       .prefix_cache = true}});
  auto run = [&](const std::string& id, const std::vector<int32_t>& prompt) -> const RequestEvent& {
    EXPECT_TRUE(s.Submit(Make(id, prompt, 8)).ok());
    EXPECT_TRUE(sinks_[id]->Wait());
    EXPECT_EQ(sinks_[id]->finished.reason, FinishReason::kLength) << sinks_[id]->finished.error;
    return sinks_[id]->finished;
  };
  const std::vector<int32_t> a = Document(1, 100), b = Document(2, 100);
  run("a0", Ask(a, 0));
  LoadSnapshot load;
  EXPECT_EQ(Idle(s, &load).kv[static_cast<int>(Tier::kDevice)].cached, 6 * kPageBlocks);
  run("b0", Ask(b, 0));  // needs 8 pages with 6 free: a's tail goes to the host tier
  Idle(s, &load);
  EXPECT_GT(load.kv[static_cast<int>(Tier::kHost)].cached, 0);
  EXPECT_GT(load.swap_bytes_to_host, 0u);
  const uint64_t to_device = load.swap_bytes_to_device;
  const RequestEvent& again = run("a1", Ask(a, 1));
  EXPECT_EQ(again.usage.cached_tokens, 6 * kPage);
  EXPECT_EQ(sinks_["a1"]->tokens, Offline(Ask(a, 1), 8));
  EXPECT_GT(Idle(s, &load).swap_bytes_to_device, to_device);  // brought back from the host tier
  EXPECT_GT(load.prefix.hit_tokens[static_cast<int>(Tier::kHost)], 0);
  EXPECT_EQ(
      load.prefix.hit_tokens[static_cast<int>(Tier::kDevice)] + load.prefix.hit_tokens[static_cast<int>(Tier::kHost)],
      6 * kPage);
  EXPECT_GT(load.prefix.evicted_to_host, 0);
  EXPECT_EQ(load.prefix.queried_tokens, 3 * 106);
}

// The copies a slow copy engine has made, as the probe below sees them at its first
// step: at layer 1 and at the last layer (-1: not reached). With g_fail_from_layer1
// the first copy after the probe's first layer 1 fails.
std::atomic<int64_t> g_copies{0}, g_copies_at_layer1{-1}, g_copies_at_last_layer{-1};
std::atomic<bool> g_fail_from_layer1{false}, g_fail_next{false};

// `full` with a probe at each layer of its first step; its KV is full's, and so is
// its prefix cache key.
class LayerProbe final : public PruningStrategy {
 public:
  explicit LayerProbe(int n_layers) : n_layers_(n_layers) {}
  std::string_view name() const override { return "test_layer_probe"; }
  absl::Status BeginStep(StepRows*, SeqContext&) override {
    ++step_;
    return absl::OkStatus();
  }
  void RowsForLayer(int layer, LayerRows&, SeqContext&) override {
    if (step_ != 1) return;
    if (layer == 1) {
      g_copies_at_layer1 = g_copies.load();
      if (g_fail_from_layer1.exchange(false)) g_fail_next = true;  // once: not again in its recomputation
    }
    if (layer == n_layers_ - 1) g_copies_at_last_layer = g_copies.load();
  }

 private:
  int n_layers_;
  int step_ = 0;
};

class LayerProbeParams final : public StrategyParams {
 public:
  std::unique_ptr<StrategyParams> Clone() const override { return std::make_unique<LayerProbeParams>(); }
  absl::Status Merge(const google::protobuf::Message&, std::string_view) override { return absl::OkStatus(); }
  void ToProto(google::protobuf::Message*) const override {}
  absl::Status Validate(const ModelConfig&, std::string_view) const override { return absl::OkStatus(); }
  std::optional<std::string> PrefixCacheKey() const override { return std::string(); }
  std::unique_ptr<PruningStrategy> Make(const ModelConfig& config) const override {
    return std::make_unique<LayerProbe>(config.n_layers);
  }
};

// Document a's pages are cached, then partly moved to the host tier by document b
// (through a copy engine of 2 ms a block); then a probed question over a.
class HostHitTest : public SchedulerTest {
 protected:
  struct HostHit {
    RequestEvent event;
    std::vector<int32_t> tokens, prompt;
  };
  HostHit AskAfterEviction(bool fail_a_copy) {
    static std::once_flag registered;
    std::call_once(registered, [] {
      RegisterStrategy(
          {.name = "test_layer_probe",
           .summary = "test: full, noting the copies done at its layers",
           .defaults = [](const ModelConfig&, const CalibrationPtr&) { return std::make_unique<LayerProbeParams>(); }});
    });
    g_copies = 0;
    g_copies_at_layer1 = g_copies_at_last_layer = -1;
    g_fail_from_layer1 = fail_a_copy;
    g_fail_next = false;
    ThreadPool engine_pool(2);
    server::ServingOptions options{.engine = {.kv_block_tokens = kPage,
                                              .kv_device_blocks = 12 * kPageBlocks,
                                              .kv_host_blocks = 40 * kPageBlocks,
                                              .prefix_cache = true}};
    options.engine.swap_copy = [](uint8_t* dst, const uint8_t* src, size_t bytes) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a slow copy engine, not a synchronisation
      if (g_fail_next.exchange(false)) return absl::DataLossError("test: a copy failed");
      std::memcpy(dst, src, bytes);
      ++g_copies;
      return absl::OkStatus();
    };
    Served s(*model_, engine_pool, options);
    auto run = [&](const std::string& id, const std::vector<int32_t>& prompt, const PruningParams& pruning = {}) {
      std::shared_ptr<Request> r = Make(id, prompt, 8);
      r->spec.pruning = pruning;
      EXPECT_TRUE(s.Submit(r).ok());
      EXPECT_TRUE(sinks_[id]->Wait());
      EXPECT_EQ(sinks_[id]->finished.reason, FinishReason::kLength) << sinks_[id]->finished.error;
    };
    const std::vector<int32_t> a = Document(1, 100);
    run("a0", Ask(a, 0));
    run("b0", Ask(Document(2, 100), 0));
    LoadSnapshot load;
    EXPECT_GT(Idle(s, &load).kv[static_cast<int>(Tier::kHost)].cached, 0);
    HostHit hit{.prompt = Ask(a, 1)};
    run("a1", hit.prompt,
        PruningParams{.strategy = *FindStrategy("test_layer_probe"), .params = std::make_shared<LayerProbeParams>()});
    hit.event = sinks_["a1"]->finished;
    hit.tokens = sinks_["a1"]->tokens;
    // Idle: nothing leaked on either path.
    for (Tier tier : {Tier::kDevice, Tier::kHost}) {
      EXPECT_EQ(Idle(s, &load).kv[static_cast<int>(tier)].used, load.kv[static_cast<int>(tier)].cached);
    }
    return hit;
  }
};

// The host-tier pages of a hit come back layer by layer: the prefill computes layer 0
// while the later layers' pages are still being copied.
TEST_F(HostHitTest, AHostTierHitOverlapsItsCopiesWithThePrefill) {
  const HostHit hit = AskAfterEviction(false);
  EXPECT_EQ(hit.event.usage.cached_tokens, 6 * kPage);
  EXPECT_EQ(hit.tokens, Offline(hit.prompt, 8));
  ASSERT_GE(g_copies_at_layer1, 0);
  std::printf("block copies done: %ld at layer 1, %ld at the last layer, %ld in all\n",
              static_cast<long>(g_copies_at_layer1.load()), static_cast<long>(g_copies_at_last_layer.load()),
              static_cast<long>(g_copies.load()));
  EXPECT_LT(g_copies_at_layer1, g_copies_at_last_layer)
      << "the later layers' pages were copied before the prefill started";
}

// A failed copy of a hit's pages loses that KV: the request is recomputed from its
// first token and gives the same tokens.
TEST_F(HostHitTest, AFailedCopyOfAHostTierHitIsRecomputed) {
  const HostHit hit = AskAfterEviction(true);
  EXPECT_FALSE(g_fail_next) << "no copy was left to fail after layer 1";
  EXPECT_EQ(hit.event.usage.cached_tokens, 0);
  EXPECT_DOUBLE_EQ(hit.event.usage.prompt_tokens_computed, static_cast<double>(hit.prompt.size()));
  EXPECT_EQ(hit.tokens, Offline(hit.prompt, 8));
}

TEST_F(SchedulerTest, ManyRequestsOverFewDocumentsUnderPressureLoseNothing) {
  constexpr int kRequests = 30;
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> lengths;
  for (int i = 0; i < kRequests; ++i) {
    prompts.push_back(Ask(Document(static_cast<int>(rng() % 3), 60 + static_cast<int>(rng() % 3) * 20), i));
    lengths.push_back(4 + static_cast<int>(rng() % 12));
  }
  ThreadPool engine_pool(2);
  // Tight: requests fit one by one (at most 9 pages) but far from all at once.
  server::ServingOptions options{
      .engine = {.kv_block_tokens = kPage,
                 .kv_device_blocks = 30 * kPageBlocks,
                 .kv_host_blocks = 200 * kPageBlocks,
                 .prefix_cache = true},
      .scheduler = {.max_batch_tokens = 128, .prefill_chunk = 32, .gather_first = kRequests / 2}};
  Served s(*model_, engine_pool, options);
  for (int i = 0; i < kRequests; ++i) {
    std::shared_ptr<Request> r = Make("r" + std::to_string(i), prompts[i], lengths[i]);
    if (i % 7 == 3) r->Cancel(CancelReason::kClient);                                // cancelled before it starts
    if (i % 7 == 6) r->deadline = Clock::now() + std::chrono::milliseconds(20 * i);  // ends when it ends
    if (i % 7 == 5) {                                                                // cancelled after its second token
      sinks_[r->id]->on_token = [w = std::weak_ptr<Request>(r)](size_t n) {          // not a cycle through the sink
        if (auto req = w.lock(); req && n == 2) req->Cancel(CancelReason::kClient);
      };
    }
    ASSERT_TRUE(s.Submit(r).ok());
  }
  int hits = 0;
  for (int i = 0; i < kRequests; ++i) {
    CollectingSink& sink = *sinks_["r" + std::to_string(i)];
    ASSERT_TRUE(sink.Wait()) << i;
    if (i % 7 == 3 || i % 7 == 5) {
      EXPECT_EQ(sink.finished.reason, FinishReason::kCancelled) << i;
      continue;
    }
    if (i % 7 == 6 && sink.finished.reason == FinishReason::kCancelled) {
      EXPECT_EQ(sink.finished.cancel, CancelReason::kDeadline) << i;
      continue;
    }
    EXPECT_EQ(sink.finished.reason, FinishReason::kLength) << i << ": " << sink.finished.error;
    EXPECT_EQ(sink.tokens, Offline(prompts[i], lengths[i])) << "request " << i;
    hits += sink.finished.usage.cached_tokens > 0;
  }
  EXPECT_GT(hits, kRequests / 4) << "the test meant to share prefixes";
  LoadSnapshot load;
  Idle(s, &load);
  EXPECT_GT(static_cast<uint64_t>(load.preemptions[static_cast<int>(PreemptionMode::kSwap)]) + load.swap_bytes_to_host,
            0u)
      << "the test meant to put the device tier under pressure";
  // Idle: every block in use is the cache's, and a flush frees them all.
  int64_t cached = 0;
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    EXPECT_EQ(load.kv[static_cast<int>(t)].used, load.kv[static_cast<int>(t)].cached) << TierName(t);
    cached += load.kv[static_cast<int>(t)].cached;
  }
  EXPECT_GT(cached, 0);
  EXPECT_EQ(s.FlushPrefixCache().value_or(-1), cached);
  Idle(s, &load);
  for (Tier t : {Tier::kDevice, Tier::kHost}) EXPECT_EQ(load.kv[static_cast<int>(t)].used, 0) << TierName(t);
  s.Stop();
  EXPECT_EQ(s.FlushPrefixCache().status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ps
