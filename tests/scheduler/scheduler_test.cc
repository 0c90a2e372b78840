// The scheduler without gRPC: batched requests give their sequential tokens,
// cancellation and aborts finish requests and free them, priorities order
// admission, Stop finishes everything.
#include "absl/strings/str_join.h"
#include "tests/scheduler/scheduler_test_util.h"

namespace ps {
namespace {

TEST_F(SchedulerTest, BatchedRequestsEqualSequentialTokens) {
  ThreadPool engine_pool(2);
  Served s(*model_, engine_pool, {.scheduler = {.max_running = 8, .max_batch_tokens = 40}});
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

TEST_F(SchedulerTest, RequestLargerThanTheKvCacheFailsAlone) {
  ThreadPool engine_pool(1);
  // Pages of 8 blocks (K and V of 4 KV heads): 10 pages.
  Served s(*model_, engine_pool, {.engine = {.kv_block_tokens = 16, .kv_device_blocks = 80}});
  ASSERT_TRUE(s.Submit(Make("big", Prompt(3), 100)).ok());  // 5 layers x 7 pages > 10
  ASSERT_TRUE(s.Submit(Make("small", {1, 300}, 4)).ok());
  ASSERT_TRUE(sinks_["big"]->Wait());
  EXPECT_EQ(sinks_["big"]->finished.reason, FinishReason::kError);
  EXPECT_NE(sinks_["big"]->finished.error.find("cannot hold"), std::string::npos);
  ASSERT_TRUE(sinks_["small"]->Wait());
  EXPECT_EQ(sinks_["small"]->finished.reason, FinishReason::kLength);
}

// A prompt that can never fit is refused at submission (RESOURCE_EXHAUSTED, with
// the numbers), and the queue goes on.
TEST_F(SchedulerTest, PromptLargerThanTheKvCacheIsRefusedAtSubmission) {
  ThreadPool engine_pool(1);
  Served s(*model_, engine_pool, {.engine = {.kv_block_tokens = 16, .kv_device_blocks = 80}});
  std::vector<int32_t> long_prompt(40, 300);  // 3 pages x 5 layers > 10
  const absl::Status refused = s.Submit(Make("long", long_prompt, 4));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(
      refused.message().find("cannot hold this request's prompt: 40 tokens need 120 blocks (3 pages of 16 tokens per "
                             "layer x 5 layers x 8 blocks per page), but the device tier has 80 blocks in all (2 "
                             "pages per layer: 32 tokens)"),
      std::string::npos)
      << refused;
  EXPECT_EQ(s.Load().in_flight, 0);
  ASSERT_TRUE(s.Submit(Make("short", {1, 300}, 4)).ok());
  ASSERT_TRUE(sinks_["short"]->Wait());
  EXPECT_EQ(sinks_["short"]->finished.reason, FinishReason::kLength);
}

TEST_F(SchedulerTest, DuplicateIdsAndFullQueueAreRefused) {
  ThreadPool engine_pool(1);
  Served s(*model_, engine_pool, {.scheduler = {.max_running = 1, .max_queue = 2}});
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
  Served s(*model_, engine_pool, {.scheduler = {.max_running = 1}});
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
  auto s = std::make_unique<Served>(*model_, engine_pool, server::ServingOptions{.scheduler = {.max_running = 2}});
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
