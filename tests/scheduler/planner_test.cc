// The scheduler as a pure planner: Schedule/Update driven by hand against a fake
// engine, with tiny pools (a dozen 4-token blocks over 2 layers), a fake clock, no
// model and no thread. Exact plans are asserted: admission order, chunked prefill
// sharing a step with decodes, swap and recompute preemption with their block
// copies, resume order, priority, cancellation in every phase, a request that
// takes more blocks than reserved, and the prompt check at submission.
#include <algorithm>
#include <map>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "tests/scheduler/fake_engine.h"

namespace ps {
namespace {

using testing::FakeEngine;
using testing::FakeToken;

class Recorder : public SchedulerObserver {
 public:
  void OnStep(const LoadSnapshot&, int) override {}
  void OnPreemption(PreemptionMode m) override { ++preemptions[static_cast<int>(m)]; }
  void OnSwap(Tier, uint64_t, double) override {}
  int preemptions[2] = {0, 0};
};

struct Options {
  int device_blocks = 12;
  int host_blocks = 12;
  SchedulerOptions scheduler;
  bool prefix_cache = false;
};

// A scheduler over a fake engine on a two-layer, 4-token-block KV cache.
class Planner {
 public:
  explicit Planner(const Options& o = {})
      : device_(Tier::kDevice, o.device_blocks, 64),
        host_(Tier::kHost, o.host_blocks, 64),
        kv_(device_, host_, {.n_layers = 2, .block_tokens = 4, .metered = true, .prefix_cache = o.prefix_cache}),
        engine_(kv_),
        scheduler_(o.scheduler, kv_, &recorder_) {}

  std::shared_ptr<Request> Add(const std::string& id, int prompt_tokens, int new_tokens, int priority = 0) {
    std::vector<int32_t> prompt(prompt_tokens, 0);
    prompt[0] = 1 + static_cast<int32_t>(requests_.size());  // FakeToken's seed
    return Add(id, std::move(prompt), new_tokens, priority);
  }
  std::shared_ptr<Request> Add(const std::string& id, std::vector<int32_t> prompt, int new_tokens, int priority = 0) {
    auto r = std::make_shared<Request>();
    r->id = id;
    r->spec.prompt = std::move(prompt);
    r->spec.stop.max_new_tokens = new_tokens;
    r->priority = priority;
    r->arrival = now_;
    now_ += std::chrono::microseconds(1);
    requests_[id] = r;
    scheduler_.Add(r);
    return r;
  }

  // One step; returns its plan.
  StepPlan Step() {
    StepPlan plan = scheduler_.Schedule(now_);
    for (const StepPlan::Start& s : plan.start) {
      for (const auto& [id, r] : requests_) {
        if (&r->spec == s.spec) ids_[s.seq_id] = id;
      }
    }
    const StepResult result = engine_.Execute(plan);
    now_ += std::chrono::milliseconds(1);
    scheduler_.Update(result, now_);
    for (Outgoing& o : scheduler_.TakeEvents()) {
      Log& log = logs_[o.request->id];
      EXPECT_FALSE(log.finished) << o.request->id << ": an event after Finished";
      if (o.event.kind == RequestEvent::Kind::kTokens) {
        for (const SampledToken& t : o.event.tokens) log.tokens.push_back(t.token);
      } else {
        log.finished = true;
        log.end = std::move(o.event);
      }
    }
    EXPECT_TRUE(kv_.VerifyIntegrity().ok()) << kv_.VerifyIntegrity();
    EXPECT_EQ(kv_.Available(Tier::kDevice), device_.num_free()) << "the step's reservations lapse";
    return plan;
  }
  // Steps until idle (at most `limit` steps); returns the number of steps.
  int Drain(int limit = 200) {
    int n = 0;
    while (!scheduler_.idle() && n < limit) {
      Step();
      ++n;
    }
    EXPECT_TRUE(scheduler_.idle());
    return n;
  }

  // The request's tokens as the fake engine makes them.
  std::vector<int32_t> Want(const std::string& id) const {
    const auto& r = requests_.at(id);
    std::vector<int32_t> t;
    for (int i = 0; i < r->spec.stop.max_new_tokens; ++i) t.push_back(FakeToken(r->spec.prompt, i));
    return t;
  }
  std::string Id(int64_t seq) const { return ids_.at(seq); }
  std::vector<std::string> Started(const StepPlan& p) const {
    std::vector<std::string> out;
    for (const StepPlan::Start& s : p.start) out.push_back(Id(s.seq_id));
    return out;
  }
  std::string Runs(const StepPlan& p) const {  // "id:begin+count[*]" where * = sample
    std::vector<std::string> out;
    for (const StepPlan::Run& r : p.run)
      out.push_back(Id(r.seq_id) + ":" + std::to_string(r.begin) + "+" + std::to_string(r.count) +
                    (r.sample ? "*" : ""));
    return absl::StrJoin(out, " ");
  }
  int64_t Seq(const std::string& id) const {
    for (const auto& [seq, name] : ids_) {
      if (name == id) return seq;
    }
    return -1;
  }

  struct Log {
    std::vector<int32_t> tokens;
    bool finished = false;
    RequestEvent end;
  };
  const Log& log(const std::string& id) { return logs_[id]; }
  void ExpectEverythingFree() {
    EXPECT_TRUE(scheduler_.idle());
    EXPECT_EQ(kv_.UsedBlocks(Tier::kDevice), 0);
    EXPECT_EQ(kv_.UsedBlocks(Tier::kHost), 0);
  }

  Clock::time_point now_{};  // the fake clock
  BlockPool device_, host_;
  KvCacheManager kv_;
  FakeEngine engine_;
  Recorder recorder_;
  Scheduler scheduler_;
  std::map<std::string, std::shared_ptr<Request>> requests_;
  std::map<int64_t, std::string> ids_;
  std::map<std::string, Log> logs_;
};

// The prefix cache: a request whose prompt starts with the pages a finished one
// computed shares them and runs the rest; when running requests need the room,
// cached pages no one holds go to the host tier (copies before the step), and a
// later hit there comes back like a swapped sequence.
TEST(Planner, CachedPrefixesAreSharedAndGiveWayToRunningRequests) {
  Planner p({.device_blocks = 12, .host_blocks = 8, .prefix_cache = true});
  const std::vector<int32_t> doc = {7, 1, 2, 3, 4, 5, 6, 7, 8};  // 2 whole pages and a token
  p.Add("a", doc, 2);
  EXPECT_EQ(p.Runs(p.Step()), "a:0+9*");
  p.Drain();
  EXPECT_EQ(p.kv_.UsedBlocks(Tier::kDevice), 4);  // 2 pages x 2 layers, the cache's
  EXPECT_EQ(p.kv_.CachedBlocks(Tier::kDevice), 4);

  std::vector<int32_t> longer = doc;
  longer.insert(longer.end(), {9, 9});
  p.Add("b", longer, 2);
  StepPlan plan = p.Step();
  ASSERT_EQ(plan.start.size(), 1u);
  EXPECT_EQ(plan.start[0].cached, 8);
  EXPECT_EQ(p.Runs(plan), "b:8+3*");
  p.Drain();
  EXPECT_EQ(p.log("b").end.usage.cached_tokens, 8);
  EXPECT_EQ(p.log("b").tokens, p.Want("b"));
  EXPECT_EQ(p.kv_.CachedBlocks(Tier::kDevice), 4);  // b's prompt had no further whole page

  // 11 blocks for a 21-token prompt with 8 free: the cached pages go to the host tier.
  p.Add("big", std::vector<int32_t>(21, 3), 1);
  plan = p.Step();
  ASSERT_EQ(plan.evict.size(), 1u);
  EXPECT_EQ(plan.evict[0].copies.size(), 4u);
  EXPECT_EQ(p.Runs(plan), "big:0+21*");
  EXPECT_EQ(p.kv_.CachedBlocks(Tier::kHost), 4);
  p.Drain();

  // Found in the host tier: swapped in, then the rest runs.
  p.Add("c", longer, 2);
  plan = p.Step();
  EXPECT_EQ(plan.start[0].cached, 8);
  ASSERT_EQ(plan.swap_in.size(), 1u);
  EXPECT_EQ(p.Runs(plan), "c:8+3*");
  p.Drain();
  EXPECT_EQ(p.log("c").tokens, p.Want("c"));
  EXPECT_EQ(p.log("c").end.usage.cached_tokens, 8);
  const int64_t cached = p.kv_.CachedBlocks(Tier::kDevice) + p.kv_.CachedBlocks(Tier::kHost);
  EXPECT_EQ(p.kv_.UsedBlocks(Tier::kDevice) + p.kv_.UsedBlocks(Tier::kHost), cached);  // idle: only the cache's
  EXPECT_EQ(p.kv_.FlushPrefixCache(), cached);
  p.ExpectEverythingFree();
}

// FCFS within a priority: a request that does not fit stops admission (the ones
// behind it wait even when they would fit); a higher priority goes first.
TEST(Planner, AdmissionByPriorityThenArrivalWithoutOvertaking) {
  Planner p;
  p.Add("a", 12, 2);  // 6 blocks
  p.Add("b", 16, 2);  // 8 blocks: not next to a
  p.Add("c", 4, 2);   // 2 blocks: would fit, must not pass b
  StepPlan s1 = p.Step();
  EXPECT_EQ(p.Started(s1), std::vector<std::string>{"a"});
  EXPECT_EQ(p.Runs(s1), "a:0+12*");
  p.Add("d", 4, 2, /*priority=*/5);
  StepPlan s2 = p.Step();  // a decodes (2 blocks); d first by priority; b still does not fit
  EXPECT_EQ(p.Started(s2), std::vector<std::string>{"d"});
  EXPECT_EQ(p.Runs(s2), "d:0+4* a:12+1*");
  StepPlan s3 = p.Step();  // a is done, d decodes its second token: b fits, c not next to it
  EXPECT_EQ(p.Started(s3), std::vector<std::string>{"b"});
  EXPECT_EQ(p.Runs(s3), "d:4+1* b:0+16*");
  StepPlan s4 = p.Step();  // b decodes (8 blocks held, 2 more): c's 2 blocks fit beside it
  EXPECT_EQ(p.Started(s4), std::vector<std::string>{"c"});
  p.Drain();
  for (const char* id : {"a", "b", "c", "d"}) {
    EXPECT_EQ(p.log(id).tokens, p.Want(id)) << id;
    EXPECT_EQ(p.log(id).end.reason, FinishReason::kLength) << id;
  }
  p.ExpectEverythingFree();
}

// A long prompt is prefilled in chunks next to the decodes of a running request:
// every step carries the decode and a chunk, within max_batch_tokens.
TEST(Planner, ChunkedPrefillSharesStepsWithDecodes) {
  Planner p({.device_blocks = 64, .scheduler = {.max_batch_tokens = 6, .prefill_chunk = 4}});
  p.Add("a", 3, 10);
  EXPECT_EQ(p.Runs(p.Step()), "a:0+3*");
  p.Add("b", 14, 2);
  EXPECT_EQ(p.Runs(p.Step()), "a:3+1* b:0+4");
  EXPECT_EQ(p.Runs(p.Step()), "a:4+1* b:4+4");
  EXPECT_EQ(p.Runs(p.Step()), "a:5+1* b:8+4");
  EXPECT_EQ(p.Runs(p.Step()), "a:6+1* b:12+2*");
  EXPECT_EQ(p.log("a").tokens.size(), 5u) << "a decoded all along";
  EXPECT_EQ(p.log("b").tokens.size(), 1u);
  p.Drain();
  EXPECT_EQ(p.log("a").tokens, p.Want("a"));
  EXPECT_EQ(p.log("b").tokens, p.Want("b"));
  p.ExpectEverythingFree();
}

// Two sequences outgrow the device tier: the later one is swapped to the host tier
// (its six blocks to host blocks 0-5), a request arriving meanwhile does not pass
// it, and it comes back (swap-in) when the first one finishes.
TEST(Planner, SwapPreemptionAndResumeOrder) {
  Planner p;
  p.Add("a", 8, 10);
  p.Add("b", 8, 10);
  EXPECT_EQ(p.Runs(p.Step()), "a:0+8* b:0+8*");
  StepPlan plan;
  int steps = 1;
  while (plan.swap_out.empty() && steps < 20) {
    plan = p.Step();
    ++steps;
  }
  ASSERT_EQ(plan.swap_out.size(), 1u);
  EXPECT_EQ(p.Id(plan.swap_out[0].seq_id), "b") << "the latest arrival is the victim";
  std::vector<int32_t> dst;
  for (const BlockCopy& c : plan.swap_out[0].plan.copies) {
    EXPECT_EQ(c.src_tier, Tier::kDevice);
    EXPECT_EQ(c.dst_tier, Tier::kHost);
    dst.push_back(c.dst);
  }
  EXPECT_EQ(dst, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(p.Runs(plan), "a:12+1*");
  EXPECT_EQ(p.kv_.BlocksIn(p.Seq("b"), Tier::kHost), 6);
  EXPECT_EQ(p.scheduler_.swapped(), 1);
  p.Add("c", 4, 2);  // would fit next to a, but b (earlier, same priority) resumes first
  bool b_back = false;
  while (!p.scheduler_.idle() && steps < 100) {
    const StepPlan s = p.Step();
    ++steps;
    if (!s.swap_in.empty()) {
      EXPECT_EQ(p.Id(s.swap_in[0]), "b");
      b_back = true;
    }
    if (!s.start.empty()) {
      EXPECT_TRUE(b_back) << "c admitted before b came back";
    }
  }
  EXPECT_TRUE(b_back);
  for (const char* id : {"a", "b", "c"}) EXPECT_EQ(p.log(id).tokens, p.Want(id)) << id;
  EXPECT_EQ(p.recorder_.preemptions[static_cast<int>(PreemptionMode::kSwap)], 1);
  EXPECT_EQ(p.recorder_.preemptions[static_cast<int>(PreemptionMode::kRecompute)], 0);
  EXPECT_EQ(p.scheduler_.preemptions(PreemptionMode::kSwap), 1);
  p.ExpectEverythingFree();
}

// Recompute preemption (chosen, or forced by a host tier too small): the victim's
// KV is dropped, and it later runs its whole history (prompt and tokens so far) in
// one step and goes on with the same tokens.
TEST(Planner, RecomputePreemptionRerunsTheHistory) {
  for (const Options& o :
       {Options{.scheduler = {.preemption = PreemptionMode::kRecompute}}, Options{.host_blocks = 4}}) {
    Planner p(o);
    p.Add("a", 8, 10);
    p.Add("b", 8, 10);
    StepPlan plan;
    for (int i = 0; i < 20 && plan.drop.empty(); ++i) plan = p.Step();
    ASSERT_EQ(plan.drop.size(), 1u);
    EXPECT_EQ(p.Id(plan.drop[0]), "b");
    EXPECT_TRUE(plan.swap_out.empty());
    const size_t b_tokens = p.log("b").tokens.size();
    bool rerun = false;
    for (int i = 0; i < 100 && !p.scheduler_.idle(); ++i) {
      const StepPlan s = p.Step();
      const std::string want = "b:0+" + std::to_string(8 + b_tokens) + "*";
      rerun = rerun || p.Runs(s).find(want) != std::string::npos;
    }
    EXPECT_TRUE(rerun) << "b reruns its " << 8 + b_tokens << "-token history in one step";
    EXPECT_EQ(p.log("a").tokens, p.Want("a"));
    EXPECT_EQ(p.log("b").tokens, p.Want("b"));
    EXPECT_EQ(p.recorder_.preemptions[static_cast<int>(PreemptionMode::kRecompute)], 1);
    EXPECT_EQ(p.recorder_.preemptions[static_cast<int>(PreemptionMode::kSwap)], 0);
    p.ExpectEverythingFree();
  }
}

// Across priorities the lower one is the victim, though it arrived first.
TEST(Planner, PriorityDecidesTheVictim) {
  Planner p;
  p.Add("low", 8, 10, 0);
  p.Add("high", 8, 10, 5);
  StepPlan plan;
  for (int i = 0; i < 20 && plan.swap_out.empty(); ++i) plan = p.Step();
  ASSERT_EQ(plan.swap_out.size(), 1u);
  EXPECT_EQ(p.Id(plan.swap_out[0].seq_id), "low");
  p.Drain();
  EXPECT_EQ(p.log("low").tokens, p.Want("low"));
  EXPECT_EQ(p.log("high").tokens, p.Want("high"));
  p.ExpectEverythingFree();
}

// Cancelled while waiting, while decoding, while swapped out and in the middle of
// a chunked prefill: each ends once (CANCELLED with its reason), its blocks in both
// tiers come back in the plan that ends it, and the others are unaffected.
TEST(Planner, CancellationInEveryPhase) {
  Planner p({.device_blocks = 16, .scheduler = {.max_batch_tokens = 8, .prefill_chunk = 4}});
  p.Add("keeps", 4, 6, /*priority=*/9);
  auto dec = p.Add("decoding", 8, 30);
  auto vic = p.Add("swapped", 8, 30);
  auto wait = p.Add("waiting", 20, 2);  // 10 blocks: no room next to the others
  for (int i = 0; i < 40 && p.scheduler_.swapped() == 0; ++i) p.Step();
  ASSERT_EQ(p.scheduler_.swapped(), 1);
  ASSERT_EQ(p.kv_.BlocksIn(p.Seq("swapped"), Tier::kDevice), 0);
  ASSERT_GT(p.kv_.BlocksIn(p.Seq("swapped"), Tier::kHost), 0);
  ASSERT_FALSE(p.log("decoding").finished);
  ASSERT_EQ(p.Seq("waiting"), -1) << "never started";
  EXPECT_EQ(p.log("keeps").tokens, p.Want("keeps"));
  wait->Cancel(CancelReason::kClient);
  vic->Cancel(CancelReason::kAbort);
  dec->Cancel(CancelReason::kClient);
  const StepPlan s = p.Step();
  EXPECT_EQ(s.finish, (std::vector<int64_t>{p.Seq("decoding"), p.Seq("swapped")}));
  EXPECT_EQ(p.kv_.UsedBlocks(Tier::kHost), 0);
  EXPECT_EQ(p.kv_.UsedBlocks(Tier::kDevice), 0);
  EXPECT_EQ(p.log("waiting").end.cancel, CancelReason::kClient);
  EXPECT_TRUE(p.log("waiting").tokens.empty());
  EXPECT_EQ(p.log("swapped").end.cancel, CancelReason::kAbort);
  EXPECT_EQ(p.log("decoding").end.cancel, CancelReason::kClient);
  EXPECT_EQ(p.log("decoding").end.reason, FinishReason::kCancelled);
  EXPECT_EQ(p.log("decoding").end.usage.completion_tokens, static_cast<int>(p.log("decoding").tokens.size()));
  EXPECT_GT(p.log("decoding").tokens.size(), 0u);
  // A prompt cancelled between two of its chunks.
  auto pre = p.Add("prefill", 12, 4);
  EXPECT_EQ(p.Runs(p.Step()), "prefill:0+4");
  pre->Cancel(CancelReason::kDeadline);
  EXPECT_EQ(p.Step().finish, std::vector<int64_t>{p.Seq("prefill")});
  EXPECT_EQ(p.log("prefill").end.reason, FinishReason::kCancelled);
  EXPECT_EQ(p.log("prefill").end.cancel, CancelReason::kDeadline);
  EXPECT_TRUE(p.log("prefill").tokens.empty());
  EXPECT_EQ(p.log("prefill").end.usage.prompt_tokens, 12);
  for (const char* id : {"keeps", "decoding", "swapped", "prefill", "waiting"}) EXPECT_TRUE(p.log(id).finished) << id;
  p.ExpectEverythingFree();
}

// A deadline passes on the fake clock: the request ends with DEADLINE while the
// other goes on.
TEST(Planner, DeadlineOnTheInjectedClock) {
  Planner p;
  auto late = p.Add("late", 4, 100);
  p.Add("other", 4, 20);
  late->deadline = p.now_ + std::chrono::milliseconds(5);
  p.Drain();
  EXPECT_EQ(p.log("late").end.cancel, CancelReason::kDeadline);
  EXPECT_EQ(p.log("late").tokens.size(), 5u) << "one token per 1 ms step until the deadline";
  EXPECT_EQ(p.log("other").tokens, p.Want("other"));
}

// A request whose strategy takes more blocks than the scheduler reserved is
// preempted (its KV recomputed with a margin), not failed, and its tokens and the
// others' are unchanged; one that keeps doing it fails alone.
TEST(Planner, AMisestimatedRequestIsPreemptedNotFailed) {
  {
    Planner p;
    p.Add("a", 4, 6);
    auto r = p.Add("rogue", 4, 6);
    p.Add("b", 4, 6);
    p.Step();
    p.engine_.AddRogueRows(&r->spec, 6, 1);  // its next run appends 6 rows per layer it did not ask for
    p.Drain();
    for (const char* id : {"a", "rogue", "b"}) {
      EXPECT_EQ(p.log(id).tokens, p.Want(id)) << id;
      EXPECT_EQ(p.log(id).end.reason, FinishReason::kLength) << id << " " << p.log(id).end.error;
    }
    EXPECT_EQ(p.scheduler_.preemptions(PreemptionMode::kRecompute), 1);
    p.ExpectEverythingFree();
  }
  {
    Planner p;
    p.Add("a", 4, 6);
    auto r = p.Add("rogue", 4, 6);
    p.Add("b", 4, 6);
    p.engine_.AddRogueRows(&r->spec, 40, 1000);  // every run: far more than any reservation
    p.Drain();
    EXPECT_EQ(p.log("rogue").end.reason, FinishReason::kError);
    EXPECT_NE(p.log("rogue").end.error.find("more KV blocks than reserved"), std::string::npos)
        << p.log("rogue").end.error;
    EXPECT_EQ(p.scheduler_.preemptions(PreemptionMode::kRecompute), Scheduler::kMaxShortfalls + 1);
    for (const char* id : {"a", "b"}) {
      EXPECT_EQ(p.log(id).tokens, p.Want(id)) << id;
      EXPECT_EQ(p.log(id).end.reason, FinishReason::kLength) << id;
    }
    p.ExpectEverythingFree();
  }
}

// A failed swap loses the sequence's KV: it is recomputed, not failed.
TEST(Planner, AFailedSwapFallsBackToRecompute) {
  Planner p;
  p.Add("a", 8, 10);
  auto b = p.Add("b", 8, 10);
  p.engine_.FailSwaps(&b->spec);
  p.Drain();
  EXPECT_EQ(p.scheduler_.preemptions(PreemptionMode::kSwap), 1);
  EXPECT_EQ(p.log("a").tokens, p.Want("a"));
  EXPECT_EQ(p.log("b").tokens, p.Want("b"));
  EXPECT_EQ(p.log("b").end.reason, FinishReason::kLength);
  p.ExpectEverythingFree();
}

// A prompt that can never fit the device tier is refused with the numbers.
TEST(Planner, CheckFitsGivesTheNumbers) {
  Planner p;
  Request fits, too_big;
  fits.spec.prompt.assign(24, 1);     // 6 blocks per layer x 2 = 12: the whole tier
  too_big.spec.prompt.assign(25, 1);  // 7 x 2 = 14
  EXPECT_TRUE(p.scheduler_.CheckFits(fits).ok());
  const absl::Status s = p.scheduler_.CheckFits(too_big);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(
      s.message(),
      "the KV cache cannot hold this request's prompt: 25 tokens need 14 blocks (7 pages of 4 tokens per layer x 2 "
      "layers x 1 blocks per page), but the device tier has 12 blocks in all (6 pages per layer: 24 tokens)");
}

}  // namespace
}  // namespace ps
