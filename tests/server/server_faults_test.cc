// The real server on loopback with stories260K, started per test with its own
// flags: calibration files and the `auto` table, limits, metrics (swaps included),
// injected faults (each fails or delays only its request) and graceful shutdown.
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/command.h"
#include "tests/engine/test_calibration.h"
#include "tests/server/server_test_util.h"

namespace ps::testing {
namespace {

// With --pod-groups the server loads the calibration: PoD streams the engine's tokens
// for those groups; a file for another model is refused at start-up, naming it.
TEST(ServerCalibration, PodGroupsFileEnablesPod) {
  static auto* model = Model::Load(kStories)->release();
  const std::string file = ::testing::TempDir() + "/pod_groups_" + std::to_string(::getpid()) + ".json";
  std::ofstream(file) << CalibrationToJson(*TestCalibration(model->config()));
  ServerProcess server(StoriesOnF32Kv({"--threads", "2", "--pod-groups", file}));
  auto stub = server.Stub();
  std::vector<int32_t> prompt = {1};
  for (int k = 0; k < 80; ++k) prompt.push_back(300 + (k * 29) % 200);
  pb::GenerateRequest req = GreedyRequest(prompt, 12);
  req.mutable_pruning()->mutable_pod()->set_sinks(4);
  req.mutable_pruning()->mutable_pod()->set_recent(8);
  StreamResult pod = RunStream(*stub, req);
  ASSERT_TRUE(pod.status.ok()) << pod.status.error_message();
  EXPECT_EQ(absl::StrJoin(pod.tokens, " "), absl::StrJoin(Offline(prompt, 12, "pod", {"sinks=4", "recent=8"}), " "));
  req.mutable_pruning()->mutable_pod()->set_delta(1.5f);
  EXPECT_EQ(RunStream(*stub, req).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  Calibration other = *TestCalibration(model->config());
  other.n_layers = 7;
  std::ofstream(file) << CalibrationToJson(other);
  const CommandResult refused = RunCommand(std::string(PS_BINARY_DIR) + "/pruneserve --model " + kStories +
                                           " --pod-groups " + file + " --port 0 --metrics-port -1 2>&1");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.output, ::testing::HasSubstr("calibrated for 7 layers"));
  std::remove(file.c_str());
}

// Without a calibration PoD is listed unavailable with the reason and GemFilter and
// LazyLLM carry a note; --calibrate-text measures one at start-up, caches it in the
// cache folder (never next to the model) and a second start reuses it.
TEST(ServerCalibration, MeasuredAtStartUpCachedAndReused) {
  auto info = [](ServerProcess& s) {
    auto stub = s.Stub();
    grpc::ClientContext ctx;
    pb::ModelInfo i;
    EXPECT_TRUE(stub->GetModelInfo(&ctx, {}, &i).ok());
    std::map<std::string, std::pair<std::string, std::string>> out;  // strategy -> (unavailable, note)
    for (int k = 0; k < i.strategies_size(); ++k) {
      out[i.strategies(k)] = {i.strategy_unavailable(k), i.strategy_notes(k)};
    }
    return out;
  };
  {
    ServerProcess plain({"--model", kStories, "--threads", "2"});
    auto s = info(plain);
    EXPECT_THAT(s["pod"].first, ::testing::HasSubstr("PoD needs the model's layer groups"));
    EXPECT_THAT(s["gemfilter"].second, ::testing::HasSubstr("uncalibrated"));
    EXPECT_THAT(s["lazyllm"].second, ::testing::HasSubstr("uncalibrated"));
    EXPECT_EQ(s["full"], std::make_pair(std::string(), std::string()));
    EXPECT_EQ(s["snapkv"], std::make_pair(std::string(), std::string()));
  }
  const std::string cache = ::testing::TempDir() + "/calibration_cache_" + std::to_string(::getpid());
  std::filesystem::remove_all(cache);
  const std::vector<std::string> args = {"--model",
                                         kStories,
                                         "--threads",
                                         "2",
                                         "--calibrate-text",
                                         std::string(PS_TESTDATA) + "/haystack/paul_graham_essays",
                                         "--calibration-cache",
                                         cache};
  {
    ServerProcess measuring(args);
    EXPECT_THAT(measuring.Log(), ::testing::HasSubstr("calibrating"));
    EXPECT_EQ(info(measuring)["pod"].first, "") << "PoD serves";
    EXPECT_FALSE(std::filesystem::exists(kStories + ".calibration.json")) << "the shared model folder stays as it is";
  }
  std::vector<std::string> cached;
  for (const auto& e : std::filesystem::directory_iterator(cache)) cached.push_back(e.path().string());
  ASSERT_EQ(cached.size(), 1u);
  EXPECT_THAT(cached[0], ::testing::MatchesRegex(".*/stories260K\\.gguf\\.[0-9a-f]+\\.calibration\\.json"));
  ServerProcess reusing(args);
  EXPECT_THAT(reusing.Log(), ::testing::Not(::testing::HasSubstr("calibrating")));
  EXPECT_THAT(reusing.Log(), ::testing::HasSubstr("calibration " + cached[0]));
  EXPECT_EQ(info(reusing)["pod"].first, "");
  std::filesystem::remove_all(cache);
}

// auto over the wire: unavailable without the evaluation's table; with one, a long
// prompt runs the strategy the table picks, at the server's defaults (--strategy-arg
// included: its tokens and rows, its name in Usage.strategy), and a short one runs `full`.
TEST(ServerAuto, PicksByTheTableAndSaysWhich) {
  const std::string table = ::testing::TempDir() + "/auto_table_" + std::to_string(::getpid()) + ".json";
  std::ofstream(table) << R"({"model": "llama", "lengths": [{"length": 64, "strategies": [)"
                          R"({"name": "full", "score": 0.9, "lo": 0.8, "hi": 0.95, "speedup": 1.0, "n": 20},)"
                          R"({"name": "lazyllm", "score": 0.9, "lo": 0.8, "hi": 0.95, "speedup": 1.6, "n": 20},)"
                          R"({"name": "gemfilter", "score": 0.2, "lo": 0.1, "hi": 0.4, "speedup": 3.0, "n": 20}]}]})";
  std::vector<int32_t> long_prompt = {1}, short_prompt = {1, 300, 301, 302};
  for (int k = 0; k < 100; ++k) long_prompt.push_back(300 + (k * 29) % 200);
  auto run = [](ServerProcess& s, const std::vector<int32_t>& prompt, const std::string& strategy) {
    auto stub = s.Stub();
    pb::GenerateRequest req = GreedyRequest(prompt, 8);
    if (strategy == "auto") req.mutable_pruning()->mutable_auto_();
    if (strategy == "lazyllm") req.mutable_pruning()->mutable_lazyllm();
    return RunStream(*stub, req);
  };
  {
    ServerProcess without({"--model", kStories, "--threads", "2"});
    const StreamResult r = run(without, long_prompt, "auto");
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(r.status.error_message(), ::testing::HasSubstr("--auto-table"));
  }
  ServerProcess with({"--model", kStories, "--threads", "2", "--auto-table", table, "--strategy-arg",
                      "lazyllm.layers=1,3", "--strategy-arg", "lazyllm.keep=0.5,0.05"});
  const StreamResult picked = run(with, long_prompt, "auto");
  ASSERT_TRUE(picked.status.ok()) << picked.status.error_message();
  EXPECT_EQ(picked.finished.usage().strategy(), "lazyllm") << "gemfilter is faster but lost the answer";
  const StreamResult lazy = run(with, long_prompt, "lazyllm");
  EXPECT_EQ(lazy.finished.usage().strategy(), "lazyllm");
  EXPECT_EQ(picked.tokens, lazy.tokens);
  EXPECT_DOUBLE_EQ(picked.finished.usage().prompt_tokens_computed(), lazy.finished.usage().prompt_tokens_computed());
  EXPECT_LT(picked.finished.usage().prompt_tokens_computed(), static_cast<double>(long_prompt.size()));
  const StreamResult short_one = run(with, short_prompt, "auto");
  ASSERT_TRUE(short_one.status.ok());
  EXPECT_EQ(short_one.finished.usage().strategy(), "full") << "shorter than every measured length";
  EXPECT_EQ(absl::StrJoin(short_one.tokens, " "), absl::StrJoin(Offline(short_prompt, 8), " "));
  std::remove(table.c_str());
}

TEST(ServerLimits, QueueFullIsResourceExhausted) {
  ServerProcess s({"--model", kDefaultModel, "--max-running", "1", "--max-queue", "1"});
  auto stub = s.Stub();
  bool checked = false;
  // One request runs; a second waits (queue of 1); a third is refused.
  std::thread waiting;
  StreamResult waiting_result;
  StreamResult running =
      RunStream(*stub, GreedyRequest(PromptOf(0), 8000, "runs"), [&](grpc::ClientContext& ctx, int chunk) {
        if (chunk != 0) return;
        waiting = std::thread([&] {
          auto st = s.Stub();
          waiting_result = RunStream(*st, GreedyRequest(PromptOf(1), 4, "waits"));
        });
        ASSERT_TRUE(WaitFor(
            [&] {
              grpc::ClientContext c;
              pb::LoadInfo load;
              return s.Stub()->GetLoad(&c, {}, &load).ok() && load.waiting() == 1;
            },
            std::chrono::seconds(10)));
        auto st = s.Stub();
        StreamResult third = RunStream(*st, GreedyRequest(PromptOf(2), 4, "refused"));
        EXPECT_EQ(third.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << third.status.error_message();
        checked = true;
        ctx.TryCancel();
      });
  waiting.join();
  EXPECT_TRUE(checked);
  EXPECT_TRUE(waiting_result.status.ok()) << waiting_result.status.error_message();
  EXPECT_EQ(waiting_result.tokens.size(), 4u);
}

TEST(ServerMetrics, CountersMatchWhatClientsReceived) {
  ServerProcess s({"--model", kStories});
  auto stub = s.Stub();
  uint64_t tokens = 0, prompt = 0;
  const int n = 5;
  for (int i = 0; i < n; ++i) {
    StreamResult r = RunStream(*stub, GreedyRequest(PromptOf(i), 10 + i));
    ASSERT_TRUE(r.status.ok());
    tokens += r.tokens.size();
    prompt += PromptOf(i).size();
  }
  const std::string page = s.Metrics();
  EXPECT_EQ(MetricValue(page, R"(pruneserve_requests_total{finish_reason="length",strategy="full"})"), n) << page;
  EXPECT_EQ(MetricValue(page, R"(pruneserve_generation_tokens_total{strategy="full"})"), tokens);
  EXPECT_EQ(MetricValue(page, R"(pruneserve_prompt_tokens_total{strategy="full"})"), prompt);
  EXPECT_EQ(MetricValue(page, R"(pruneserve_prompt_tokens_computed_total{strategy="full"})"), prompt);
  EXPECT_EQ(MetricValue(page, R"(pruneserve_time_to_first_token_seconds_count{strategy="full"})"), n);
  EXPECT_EQ(MetricValue(page, R"(pruneserve_e2e_request_latency_seconds_count{strategy="full"})"), n);
  EXPECT_EQ(MetricValue(page, R"(pruneserve_inter_token_latency_seconds_count{strategy="full"})"), tokens - n);
  EXPECT_EQ(MetricValue(page, R"(pruneserve_kv_blocks{state="used",tier="device"})"), 0);
  EXPECT_GT(MetricValue(page, R"(pruneserve_kv_blocks{state="free",tier="device"})"), 0);
  EXPECT_EQ(MetricValue(page, R"(pruneserve_preemptions_total{mode="recompute"})"), 0);
  EXPECT_EQ(MetricValue(page, R"(pruneserve_preemptions_total{mode="swap"})"), 0);
  EXPECT_EQ(MetricValue(page, R"(pruneserve_kv_swap_bytes_total{direction="to_host"})"), 0);
}

// A device tier of 120 pages (stories260K: 8 blocks of 512 bytes each) for 16
// concurrent streams of ~25 pages each (--gather-first: they meet in the engine on any machine):
// requests are swapped to the host tier and back, the streams still carry the engine's tokens,
// and metrics and GetLoad show the swapping. Without the prefix cache: its evictions to the
// host tier would count in the swap bytes too (prefix_cache_scheduler_test.cc has those).
TEST(ServerMetrics, SwapPreemptionIsVisibleAndHarmless) {
  ServerProcess s(StoriesOnF32Kv(
      {"--kv-device-bytes", "491520", "--kv-host-bytes", "16777216", "--gather-first", "16", "--prefix-cache", "off"}));
  constexpr int kStreams = 16;
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      auto stub = s.Stub();
      results[i] = RunStream(*stub, GreedyRequest(PromptOf(i), 60));
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(absl::StrJoin(results[i].tokens, " "), absl::StrJoin(Offline(PromptOf(i), 60), " ")) << i;
  }
  ASSERT_TRUE(Drained(s));
  const std::string page = s.Metrics();
  const double to_host = MetricValue(page, R"(pruneserve_kv_swap_bytes_total{direction="to_host"})");
  EXPECT_GT(MetricValue(page, R"(pruneserve_preemptions_total{mode="swap"})"), 0) << page;
  EXPECT_GT(to_host, 0);
  EXPECT_EQ(MetricValue(page, R"(pruneserve_kv_swap_bytes_total{direction="to_device"})"), to_host);
  EXPECT_GT(MetricValue(page, "pruneserve_kv_swap_seconds_count"), 0);
  EXPECT_EQ(MetricValue(page, R"(pruneserve_kv_blocks{state="used",tier="host"})"), 0);
  constexpr int kBlockBytes = 16 * 8 * 4;  // 16 tokens of one KV head's 8 values in F32
  EXPECT_EQ(MetricValue(page, R"(pruneserve_kv_blocks{state="free",tier="host"})"), 16777216 / kBlockBytes);
  grpc::ClientContext ctx;
  pb::LoadInfo load;
  ASSERT_TRUE(s.Stub()->GetLoad(&ctx, {}, &load).ok());
  ASSERT_EQ(load.kv_size(), 2);
  EXPECT_EQ(load.kv(1).tier(), "host");
  EXPECT_EQ(load.kv(1).capacity_tokens(), 16777216 / kBlockBytes / (5 * 8) * 16u);  // pages of 5 layers x 8 blocks
  EXPECT_EQ(load.kv(1).used_tokens(), 0u);
  EXPECT_GT(load.preemptions_swap(), 0u);
  EXPECT_EQ(load.swap_bytes_to_host(), static_cast<uint64_t>(to_host));
  EXPECT_EQ(load.swapped(), 0u);
}

// Fault injection (--inject-fault POINT=N): each fault fails or delays only the
// request it hits, with the right status, never the server; the next request is served.

// 16 streams over a device tier too small for them, gathered (as above): swaps happen.
std::vector<StreamResult> TightTierStreams(ServerProcess& s) {
  constexpr int kStreams = 16;
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] { results[i] = RunStream(*s.Stub(), GreedyRequest(PromptOf(i), 60)); });
  }
  for (auto& t : clients) t.join();
  return results;
}

void ExpectOfflineTokens(const std::vector<StreamResult>& results) {
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(absl::StrJoin(results[i].tokens, " "), absl::StrJoin(Offline(PromptOf(i), 60), " ")) << i;
  }
}

// A failed swap copy loses that request's KV: it is recomputed, and its tokens are the same.
TEST(ServerFaults, FailedSwapCopyIsRecomputed) {
  ServerProcess s(StoriesOnF32Kv({"--kv-device-bytes", "491520", "--kv-host-bytes", "16777216", "--gather-first", "16",
                                  "--inject-fault", "swap_copy=2"}));
  ExpectOfflineTokens(TightTierStreams(s));
  EXPECT_NE(s.Log().find("injected fault: a swap copy failed; its KV will be recomputed"), std::string::npos)
      << s.Log();
  ASSERT_TRUE(Drained(s));
  const std::string page = s.Metrics();
  EXPECT_GT(MetricValue(page, R"(pruneserve_preemptions_total{mode="swap"})"), 0) << page;
  // Idle: the host blocks in use are the prefix cache's (pages it moved there), if any.
  EXPECT_EQ(MetricValue(page, R"(pruneserve_kv_blocks{state="used",tier="host"})"),
            MetricValue(page, R"(pruneserve_prefix_cache_blocks{tier="host"})"));
  const StreamResult next = RunStream(*s.Stub(), GreedyRequest(PromptOf(3), 20));
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.tokens, Offline(PromptOf(3), 20));
}

// A host tier with no room: preempted requests are recomputed instead of swapped. (The
// fault is the scheduler's: the prefix cache, off here, would still move pages there.)
TEST(ServerFaults, FullHostTierFallsBackToRecompute) {
  ServerProcess s(StoriesOnF32Kv({"--kv-device-bytes", "491520", "--kv-host-bytes", "16777216", "--gather-first", "16",
                                  "--inject-fault", "host_tier_full=1000000", "--prefix-cache", "off"}));
  ExpectOfflineTokens(TightTierStreams(s));
  ASSERT_TRUE(Drained(s));
  const std::string page = s.Metrics();
  EXPECT_EQ(MetricValue(page, R"(pruneserve_preemptions_total{mode="swap"})"), 0) << page;
  EXPECT_GT(MetricValue(page, R"(pruneserve_preemptions_total{mode="recompute"})"), 0) << page;
  EXPECT_EQ(MetricValue(page, R"(pruneserve_kv_swap_bytes_total{direction="to_host"})"), 0);
}

// A strategy's error fails its request alone (INTERNAL); the stream beside it and the
// next request are served.
TEST(ServerFaults, StrategyErrorFailsOnlyItsRequest) {
  ServerProcess s(StoriesOnF32Kv({"--inject-fault", "strategy=1"}));
  const std::vector<int32_t> prompt = PromptOf(9);
  pb::GenerateRequest lazy = GreedyRequest(prompt, 12);
  lazy.mutable_pruning()->mutable_lazyllm();
  StreamResult failed = RunStream(*s.Stub(), lazy);
  EXPECT_EQ(failed.status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_THAT(failed.status.error_message(), ::testing::HasSubstr("strategy lazyllm: injected fault"));
  ASSERT_TRUE(Drained(s));
  const StreamResult next = RunStream(*s.Stub(), lazy);
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.tokens, Offline(prompt, 12, "lazyllm"));
  EXPECT_EQ(MetricValue(s.Metrics(), R"(pruneserve_requests_total{finish_reason="error",strategy="lazyllm"})"), 1);
}

// A KV block allocation that fails mid-step: the request is recomputed with a margin and
// finishes with its tokens; one that keeps failing fails that request alone.
TEST(ServerFaults, FailedKvAllocationMidStep) {
  {
    ServerProcess s(StoriesOnF32Kv({"--inject-fault", "kv_append=1"}));
    const StreamResult r = RunStream(*s.Stub(), GreedyRequest(PromptOf(5), 30));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, Offline(PromptOf(5), 30));
    EXPECT_EQ(MetricValue(s.Metrics(), R"(pruneserve_preemptions_total{mode="recompute"})"), 1);
  }
  ServerProcess s(StoriesOnF32Kv({"--inject-fault", "kv_append=4"}));  // past the scheduler's 3 retries
  const StreamResult failed = RunStream(*s.Stub(), GreedyRequest(PromptOf(5), 30));
  EXPECT_EQ(failed.status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_THAT(failed.status.error_message(), ::testing::HasSubstr("injected fault: a KV block allocation failed"));
  ASSERT_TRUE(Drained(s));
  const StreamResult next = RunStream(*s.Stub(), GreedyRequest(PromptOf(5), 30));
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.tokens, Offline(PromptOf(5), 30));
}

// Tier sizes as fractions of the available memory: the start-up log says what they
// came to, and GetLoad reports the host tier's capacity.
TEST(ServerMetrics, KvTiersFromMemoryFractions) {
  ServerProcess s({"--model", kStories, "--kv-device-fraction", "0.002", "--kv-host-fraction", "0.004"});
  grpc::ClientContext ctx;
  pb::LoadInfo load;
  ASSERT_TRUE(s.Stub()->GetLoad(&ctx, {}, &load).ok());
  ASSERT_EQ(load.kv_size(), 2);
  EXPECT_GT(load.kv(0).capacity_tokens(), 0u);
  // Twice the fraction, twice the blocks (within one block of rounding).
  const double ratio = static_cast<double>(load.kv(1).capacity_tokens()) / load.kv(0).capacity_tokens();
  EXPECT_NEAR(ratio, 2.0, 0.01);
  EXPECT_NE(s.Log().find("KV tiers from fractions of"), std::string::npos) << s.Log();
}

TEST(ServerShutdown, SigtermLetsTheStreamFinishAndExitsZero) {
  // Long enough to outlast the checks below on a loaded machine; the drain
  // timeout is far above what the stream needs.
  ServerProcess s({"--model", kStories, "--drain-timeout", "600"});
  auto stub = s.Stub();
  std::string health_during_drain;
  StreamResult r = RunStream(*stub, GreedyRequest(PromptOf(6), 1500), [&](grpc::ClientContext&, int chunk) {
    if (chunk != 0) return;
    s.Signal(SIGTERM);
    ASSERT_TRUE(WaitFor([&] { return s.Health() == "NOT_SERVING"; }, std::chrono::seconds(10)));
    auto st = s.Stub();
    StreamResult late = RunStream(*st, GreedyRequest(PromptOf(7), 4));
    EXPECT_EQ(late.status.error_code(), grpc::StatusCode::UNAVAILABLE) << late.status.error_message();
  });
  EXPECT_TRUE(r.status.ok()) << r.status.error_code() << " " << r.status.error_message() << "\n" << s.Log();
  EXPECT_EQ(r.tokens.size(), 1500u);
  EXPECT_EQ(s.WaitExit(std::chrono::seconds(30)), 0) << s.Log();
}

TEST(ServerShutdown, DrainTimeoutCutsTheStreamWithUnavailable) {
  ServerProcess s({"--model", kDefaultModel, "--drain-timeout", "0.1"});
  auto stub = s.Stub();
  StreamResult r = RunStream(*stub, GreedyRequest(PromptOf(6), 8000), [&](grpc::ClientContext&, int chunk) {
    if (chunk == 0) s.Signal(SIGTERM);
  });
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_LT(r.tokens.size(), 8000u);
  EXPECT_EQ(s.WaitExit(std::chrono::seconds(30)), 0) << s.Log();
}

}  // namespace
}  // namespace ps::testing
