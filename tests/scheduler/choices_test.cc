// n > 1: one prompt step, then forks that share its KV. Greedy choices each equal
// the request alone under every strategy; the prompt is computed once where the
// strategy forks (twice more where it cannot: LazyLLM and SlimInfer keep rows
// outside the KV); sampled choices follow seed streams of their own; forks come
// through preemption (swap and recompute) unchanged and leave no block behind.
#include "absl/strings/str_join.h"
#include "tests/scheduler/scheduler_test_util.h"

namespace ps {
namespace {

// Records every choice's tokens and Finished event; Wait() blocks until the last.
class ChoicesSink : public RequestSink {
 public:
  void OnEvent(RequestEvent ev) override {
    std::lock_guard<std::mutex> lock(mu_);
    ASSERT_FALSE(done) << "an event after the last Finished";
    ASSERT_GE(ev.index, 0);
    if (ev.index >= static_cast<int>(tokens.size())) {
      tokens.resize(ev.index + 1);
      finished.resize(ev.index + 1);
    }
    if (ev.kind == RequestEvent::Kind::kTokens) {
      ASSERT_FALSE(finished[ev.index].has_value()) << "tokens of choice " << ev.index << " after its Finished";
      for (const auto& t : ev.tokens) tokens[ev.index].push_back(t.token);
      if (on_token) on_token(ev.index, tokens[ev.index].size());
      return;
    }
    ASSERT_FALSE(finished[ev.index].has_value()) << "choice " << ev.index << " finished twice";
    finished[ev.index] = ev;
    if (ev.last) {
      done = true;
      cv_.notify_all();
    }
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(300), [&] { return done; });
  }
  std::string Tokens(int i) const { return absl::StrJoin(tokens.at(i), " "); }
  const RequestEvent& Last() const {
    for (const auto& f : finished) {
      if (f && f->last) return *f;
    }
    ADD_FAILURE() << "no last Finished";
    return *finished.at(0);
  }

  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::optional<RequestEvent>> finished;
  bool done = false;
  std::function<void(int index, size_t tokens)> on_token;  // called on the engine thread

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

std::vector<int32_t> LongPrompt(int i) {
  std::vector<int32_t> p = {1};
  for (int k = 0; k < 90 + (i * 37) % 80; ++k) p.push_back(260 + (i * 23 + k * 17) % 250);
  return p;
}

class ChoicesTest : public SchedulerTest {
 protected:
  std::shared_ptr<Request> MakeN(const std::string& id, std::vector<int32_t> prompt, int tokens, int n) {
    auto r = Make(id, std::move(prompt), tokens);
    r->spec.n = n;
    auto sink = std::make_shared<ChoicesSink>();
    r->sink = sink;
    choices_[id] = sink;
    return r;
  }
  // Every choice finished once, for `reason`; only the last event says so.
  void ExpectAllFinished(const ChoicesSink& sink, int n, FinishReason reason) {
    ASSERT_EQ(static_cast<int>(sink.finished.size()), n);
    int last = 0;
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(sink.finished[i].has_value()) << "choice " << i;
      EXPECT_EQ(sink.finished[i]->reason, reason) << "choice " << i << ": " << sink.finished[i]->error;
      EXPECT_EQ(sink.finished[i]->index, i);
      last += sink.finished[i]->last;
    }
    EXPECT_EQ(last, 1);
  }
  std::map<std::string, std::shared_ptr<ChoicesSink>> choices_;
};

TEST_F(ChoicesTest, GreedyChoicesEachEqualTheRequestAloneUnderEveryStrategy) {
  struct Case {
    PruningParams pruning;
    bool forks;  // its state forks: the prompt is computed once
  };
  const Case cases[] = {
      {Pruning("full"), true},
      {Pruning("lazyllm", {"layers=2", "keep=0.3"}), false},
      {Pruning("gemfilter", {"top_k=40", "filter_layer=2"}), true},
      {Pruning("critiprefill", {"segment_size=16", "block_size=4", "budget=8", "dense_prefix=0"}), true},
      {Pruning("sliminfer", {"layers=1,3", "budgets=48,24", "block_size=8", "unit_size=4", "gamma=1"}), false},
      {Pruning("pod", {"sinks=4", "recent=16"}), true},
      {Pruning("streamingllm", {"sinks=4", "recent=32"}), true},
      {Pruning("snapkv", {"window=16", "budget=48"}), true}};
  constexpr int kN = 3, kTokens = 20;
  ThreadPool engine_pool(2);
  Served s(*model_, engine_pool, {.engine = {.kv_host_blocks = 256 * 8}, .scheduler = {.prefill_chunk = 64}});
  for (size_t c = 0; c < std::size(cases); ++c) {
    const PruningParams& pruning = cases[c].pruning;
    SCOPED_TRACE(pruning.name());
    const std::vector<int32_t> prompt = LongPrompt(static_cast<int>(c));
    const std::string offline = absl::StrJoin(Offline(prompt, kTokens, pruning), " ");
    auto one = Make("one/" + std::to_string(c), prompt, kTokens);
    one->spec.pruning = pruning;
    auto many = MakeN("many/" + std::to_string(c), prompt, kTokens, kN);
    many->spec.pruning = pruning;
    ASSERT_TRUE(s.Submit(one).ok());
    ASSERT_TRUE(sinks_[one->id]->Wait());
    ASSERT_TRUE(s.Submit(many).ok());
    ChoicesSink& sink = *choices_[many->id];
    ASSERT_TRUE(sink.Wait());
    ExpectAllFinished(sink, kN, FinishReason::kLength);
    for (int i = 0; i < kN; ++i) EXPECT_EQ(sink.Tokens(i), offline) << "choice " << i;
    // The last Finished covers the request: the prompt once, every choice's tokens.
    const Usage& single = sinks_[one->id]->finished.usage;
    const Usage& total = sink.Last().usage;
    EXPECT_EQ(total.prompt_tokens, static_cast<int>(prompt.size()));
    EXPECT_EQ(total.completion_tokens, kN * kTokens);
    // A fork that cannot share computes the prompt and its first token in its own first pass.
    const double again = cases[c].forks ? 0 : (kN - 1) * (single.prompt_tokens_computed + 1);
    EXPECT_DOUBLE_EQ(total.prompt_tokens_computed, single.prompt_tokens_computed + again);
    EXPECT_EQ(total.kept_per_layer, single.kept_per_layer);
    EXPECT_EQ(total.strategy, single.strategy);
    if (pruning.name() == "full") {
      EXPECT_EQ(total.prompt_tokens_computed, static_cast<double>(prompt.size()));
    }
  }
  const LoadSnapshot load = s.Load();
  EXPECT_EQ(load.kv[static_cast<int>(Tier::kDevice)].used, 0);
  EXPECT_EQ(load.in_flight, 0);
}

TEST_F(ChoicesTest, SampledChoicesFollowSeedStreamsOfTheirOwn) {
  constexpr int kN = 4, kTokens = 24;
  ThreadPool engine_pool(2);
  Served s(*model_, engine_pool, {});
  auto sampled = [&](std::shared_ptr<Request> r) {
    r->spec.sampling.temperature = 1.0f;
    r->spec.sampling.seed = 7;
    EXPECT_TRUE(s.Submit(r).ok());
    return r;
  };
  auto one = sampled(Make("one", Prompt(2), kTokens));
  ASSERT_TRUE(sinks_["one"]->Wait());
  std::vector<std::string> runs[2];
  for (int run = 0; run < 2; ++run) {
    const std::string id = "many" + std::to_string(run);
    sampled(MakeN(id, Prompt(2), kTokens, kN));
    ChoicesSink& sink = *choices_[id];
    ASSERT_TRUE(sink.Wait());
    ExpectAllFinished(sink, kN, FinishReason::kLength);
    for (int i = 0; i < kN; ++i) runs[run].push_back(sink.Tokens(i));
  }
  EXPECT_EQ(runs[0], runs[1]) << "the same seed gives the same choices";
  EXPECT_EQ(runs[0][0], absl::StrJoin(sinks_["one"]->tokens, " ")) << "choice 0 keeps the seed's stream";
  std::set<std::string> distinct(runs[0].begin(), runs[0].end());
  EXPECT_EQ(static_cast<int>(distinct.size()), kN) << "each choice samples on its own";
}

// A device tier too small for every fork's tokens: forks are preempted, swapped or
// recomputed, and still give the greedy tokens; nothing stays behind.
TEST_F(ChoicesTest, ForksComeThroughPreemptionUnchanged) {
  constexpr int kN = 4, kTokens = 40;
  for (PreemptionMode mode : {PreemptionMode::kSwap, PreemptionMode::kRecompute}) {
    SCOPED_TRACE(PreemptionModeName(mode));
    ThreadPool engine_pool(2);
    // Pages of 8 blocks: 24 pages per layer in all, for 3 requests of 4 choices.
    Served s(*model_, engine_pool,
             {.engine = {.kv_block_tokens = 16, .kv_device_blocks = 5 * 8 * 24, .kv_host_blocks = 4096},
              .scheduler = {.preemption = mode, .gather_first = 3}});
    const std::string prefix = std::string(PreemptionModeName(mode)) + "/";
    for (int r = 0; r < 3; ++r) ASSERT_TRUE(s.Submit(MakeN(prefix + std::to_string(r), Prompt(r), kTokens, kN)).ok());
    for (int r = 0; r < 3; ++r) {
      ChoicesSink& sink = *choices_[prefix + std::to_string(r)];
      ASSERT_TRUE(sink.Wait());
      ExpectAllFinished(sink, kN, FinishReason::kLength);
      const std::string offline = absl::StrJoin(Offline(Prompt(r), kTokens), " ");
      for (int i = 0; i < kN; ++i) EXPECT_EQ(sink.Tokens(i), offline) << "request " << r << " choice " << i;
    }
    const LoadSnapshot load = s.Load();
    EXPECT_GT(load.preemptions[static_cast<int>(mode)], 0) << "the cache was not short: this proves nothing";
    EXPECT_EQ(load.kv[static_cast<int>(Tier::kDevice)].used, 0);
    EXPECT_EQ(load.kv[static_cast<int>(Tier::kHost)].used, 0);
  }
}

// Forks that end with their first token (max_new_tokens 1) finish in the step that made
// them; a request cancelled before its prompt step ends once, for every choice; one
// cancelled while its choices decode ends each of them. Nothing stays behind.
TEST_F(ChoicesTest, ChoicesEndAtTheirFirstTokenOrWhenCancelled) {
  ThreadPool engine_pool(2);
  Served s(*model_, engine_pool, {});
  ASSERT_TRUE(s.Submit(MakeN("one-token", Prompt(3), 1, 3)).ok());
  ASSERT_TRUE(choices_["one-token"]->Wait());
  ExpectAllFinished(*choices_["one-token"], 3, FinishReason::kLength);
  EXPECT_EQ(choices_["one-token"]->Last().usage.completion_tokens, 3);

  auto before = MakeN("before", Prompt(4), 8, 3);
  before->Cancel(CancelReason::kClient);
  ASSERT_TRUE(s.Submit(before).ok());
  ASSERT_TRUE(choices_["before"]->Wait());
  ASSERT_EQ(choices_["before"]->finished.size(), 1u);  // the forks were never made
  EXPECT_EQ(choices_["before"]->finished[0]->reason, FinishReason::kCancelled);
  EXPECT_TRUE(choices_["before"]->finished[0]->last);

  auto during = MakeN("during", Prompt(5), 200, 3);
  choices_["during"]->on_token = [w = std::weak_ptr<Request>(during)](int index, size_t n) {
    if (auto r = w.lock(); r && index == 2 && n == 3) r->Cancel(CancelReason::kClient);
  };
  ASSERT_TRUE(s.Submit(during).ok());
  ASSERT_TRUE(choices_["during"]->Wait());
  ExpectAllFinished(*choices_["during"], 3, FinishReason::kCancelled);
  EXPECT_LT(choices_["during"]->Last().usage.completion_tokens, 3 * 200);
  const LoadSnapshot load = s.Load();
  EXPECT_EQ(load.kv[static_cast<int>(Tier::kDevice)].used, 0);
  EXPECT_EQ(load.in_flight, 0);
}

TEST_F(ChoicesTest, MoreChoicesThanTheRunningSetAreRefused) {
  ThreadPool engine_pool(1);
  Served s(*model_, engine_pool, {.scheduler = {.max_running = 4}});
  const absl::Status refused = s.Submit(MakeN("five", Prompt(1), 4, 5));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("n: must be in [1, 4]"), std::string::npos) << refused;
  ASSERT_TRUE(s.Submit(MakeN("four", Prompt(1), 4, 4)).ok());
  ASSERT_TRUE(choices_["four"]->Wait());
  ExpectAllFinished(*choices_["four"], 4, FinishReason::kLength);
}

}  // namespace
}  // namespace ps
