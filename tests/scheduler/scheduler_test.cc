// The scheduler without gRPC: batched requests give their sequential tokens,
// cancellation and aborts finish requests and free them, priorities order
// admission, Stop finishes everything.
#include <condition_variable>
#include <mutex>

#include "absl/strings/str_join.h"
#include "engine/generator.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"

namespace ps {
namespace {

const std::string kStories = std::string(PS_TESTDATA) + "/stories260K/stories260K.gguf";

// Collects a request's events; Wait() blocks until Finished arrives.
class CollectingSink : public RequestSink {
 public:
  void OnEvent(RequestEvent ev) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (ev.kind == RequestEvent::Kind::kTokens) {
      for (const auto& t : ev.tokens) tokens.push_back(t.token);
      text += ev.text;
      if (on_token) on_token(tokens.size());
    } else {
      finished = ev;
      done = true;
      cv_.notify_all();
    }
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return done; });
  }
  std::vector<int32_t> tokens;
  std::string text;
  RequestEvent finished;
  bool done = false;
  std::function<void(size_t)> on_token;  // called on the engine thread

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = Model::Load(kStories)->release(); }
  static void TearDownTestSuite() { delete model_; }

  std::shared_ptr<Request> Make(const std::string& id, std::vector<int32_t> prompt, int n, int priority = 0) {
    auto r = std::make_shared<Request>();
    r->id = id;
    r->prompt = std::move(prompt);
    r->sampling.temperature = 0;
    r->stop.max_new_tokens = n;
    r->stop.ignore_eos = true;
    r->priority = priority;
    auto sink = std::make_shared<CollectingSink>();
    r->sink = sink;
    sinks_[id] = sink;
    return r;
  }
  std::vector<int32_t> Offline(const std::vector<int32_t>& prompt, int n) {
    Generator gen(*model_, pool_);
    return gen.Generate(prompt, SamplingParams{.temperature = 0}, StopCriteria{.max_new_tokens = n, .ignore_eos = true})
        ->tokens;
  }

  static Model* model_;
  ThreadPool pool_{2};
  std::map<std::string, std::shared_ptr<CollectingSink>> sinks_;
};
Model* SchedulerTest::model_ = nullptr;

std::vector<int32_t> Prompt(int i) {
  std::vector<int32_t> p = {1};
  for (int k = 0; k < 3 + (i * 7) % 20; ++k) p.push_back(300 + (i * 31 + k * 13) % 200);
  return p;
}

TEST_F(SchedulerTest, BatchedRequestsEqualSequentialTokens) {
  ThreadPool engine_pool(2);
  Scheduler s(*model_, engine_pool, SchedulerOptions{.max_running = 8, .max_batch_tokens = 40});
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(s.Submit(Make("r" + std::to_string(i), Prompt(i), 20 + i)).ok());
  for (int i = 0; i < 12; ++i) {
    CollectingSink& sink = *sinks_["r" + std::to_string(i)];
    ASSERT_TRUE(sink.Wait());
    EXPECT_EQ(sink.finished.reason, FinishReason::kLength);
    EXPECT_EQ(sink.finished.usage.completion_tokens, 20 + i);
    EXPECT_EQ(absl::StrJoin(sink.tokens, " "), absl::StrJoin(Offline(Prompt(i), 20 + i), " ")) << i;
  }
  EXPECT_TRUE(s.Load().in_flight == 0);
}

// A device tier far too small for every request at once: admission waits for
// blocks and running requests are evicted and recomputed, yet every request gets
// exactly its sequential tokens and every block comes back.
TEST_F(SchedulerTest, TinyKvCacheForcesPreemptionWithoutChangingTokens) {
  ThreadPool engine_pool(2);
  // stories260K: 5 layers; a request of ~12 prompt + 40 new tokens needs 5 x 4 = 20 blocks.
  Scheduler s(*model_, engine_pool, SchedulerOptions{.max_running = 8, .kv_block_tokens = 16, .kv_device_blocks = 50});
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(s.Submit(Make("p" + std::to_string(i), Prompt(i), 40)).ok());
  for (int i = 0; i < 10; ++i) {
    CollectingSink& sink = *sinks_["p" + std::to_string(i)];
    ASSERT_TRUE(sink.Wait());
    EXPECT_EQ(sink.finished.reason, FinishReason::kLength) << sink.finished.error;
    EXPECT_EQ(absl::StrJoin(sink.tokens, " "), absl::StrJoin(Offline(Prompt(i), 40), " ")) << i;
  }
  const LoadSnapshot load = s.Load();
  EXPECT_GT(load.preemptions, 0) << "the test meant to force evictions";
  EXPECT_EQ(load.kv_blocks_used, 0);
  EXPECT_EQ(load.kv_blocks_total, 50);
}

TEST_F(SchedulerTest, RequestLargerThanTheKvCacheFailsAlone) {
  ThreadPool engine_pool(1);
  Scheduler s(*model_, engine_pool, SchedulerOptions{.kv_block_tokens = 16, .kv_device_blocks = 10});
  ASSERT_TRUE(s.Submit(Make("big", Prompt(3), 100)).ok());  // 5 layers x 7 blocks > 10
  ASSERT_TRUE(s.Submit(Make("small", {1, 300}, 4)).ok());
  ASSERT_TRUE(sinks_["big"]->Wait());
  EXPECT_EQ(sinks_["big"]->finished.reason, FinishReason::kError);
  EXPECT_NE(sinks_["big"]->finished.error.find("cannot hold"), std::string::npos);
  ASSERT_TRUE(sinks_["small"]->Wait());
  EXPECT_EQ(sinks_["small"]->finished.reason, FinishReason::kLength);
}

TEST_F(SchedulerTest, DuplicateIdsAndFullQueueAreRefused) {
  ThreadPool engine_pool(1);
  Scheduler s(*model_, engine_pool, SchedulerOptions{.max_running = 1, .max_queue = 2});
  auto a = Make("a", Prompt(0), 1500);
  auto a_sink = sinks_["a"];
  ASSERT_TRUE(s.Submit(a).ok());
  EXPECT_EQ(s.Submit(Make("a", Prompt(1), 4)).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(s.Submit(Make("b", Prompt(1), 4)).ok());
  // a running (or about to), b waiting: the queue has room for one more at most
  absl::Status third = s.Submit(Make("c", Prompt(2), 4));
  absl::Status fourth = s.Submit(Make("d", Prompt(3), 4));
  EXPECT_EQ(fourth.code(), absl::StatusCode::kResourceExhausted) << third << " / " << fourth;
  EXPECT_TRUE(s.Abort("a"));
  ASSERT_TRUE(a_sink->Wait());
  EXPECT_EQ(a_sink->finished.cancel, CancelReason::kAbort);
  EXPECT_FALSE(s.Abort("nonexistent"));
  ASSERT_TRUE(sinks_["b"]->Wait());
  EXPECT_EQ(sinks_["b"]->tokens.size(), 4u);
}

TEST_F(SchedulerTest, PriorityOrdersAdmission) {
  ThreadPool engine_pool(1);
  Scheduler s(*model_, engine_pool, SchedulerOptions{.max_running = 1});
  // A blocker keeps the single slot busy until the others are queued.
  std::mutex order_mu;
  std::vector<std::string> order;
  auto blocker = Make("blocker", Prompt(0), 1800);
  ASSERT_TRUE(s.Submit(blocker).ok());
  for (auto [id, prio] : {std::pair{"low", 0}, std::pair{"high", 5}, std::pair{"mid", 2}}) {
    auto r = Make(id, Prompt(1), 2, prio);
    sinks_[id]->on_token = [&, id = std::string(id)](size_t n) {
      if (n == 1) {
        std::lock_guard<std::mutex> lock(order_mu);
        order.push_back(id);
      }
    };
    ASSERT_TRUE(s.Submit(r).ok());
  }
  blocker->Cancel(CancelReason::kClient);
  for (const char* id : {"low", "high", "mid"}) ASSERT_TRUE(sinks_[id]->Wait());
  EXPECT_EQ(absl::StrJoin(order, ","), "high,mid,low");
  EXPECT_EQ(sinks_["blocker"]->finished.reason, FinishReason::kCancelled);
}

TEST_F(SchedulerTest, DeadlineAndStopFinishEverything) {
  ThreadPool engine_pool(1);
  auto s = std::make_unique<Scheduler>(*model_, engine_pool, SchedulerOptions{.max_running = 2});
  auto late = Make("late", Prompt(0), 1800);
  late->deadline = Clock::now() + std::chrono::milliseconds(20);
  ASSERT_TRUE(s->Submit(late).ok());
  ASSERT_TRUE(sinks_["late"]->Wait());
  EXPECT_EQ(sinks_["late"]->finished.cancel, CancelReason::kDeadline);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s->Submit(Make("s" + std::to_string(i), Prompt(i), 1800)).ok());
  s->Stop();
  for (int i = 0; i < 4; ++i) {
    CollectingSink& sink = *sinks_["s" + std::to_string(i)];
    ASSERT_TRUE(sink.done);
    EXPECT_EQ(sink.finished.reason, FinishReason::kCancelled);
    EXPECT_EQ(sink.finished.cancel, CancelReason::kShutdown);
  }
  EXPECT_EQ(s->Submit(Make("after", Prompt(0), 2)).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ps
