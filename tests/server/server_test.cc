// The real server on loopback with stories260K: streamed greedy tokens equal the
// engine's offline output, concurrency, cancellation (client, deadline, Abort),
// the validation table, metrics and graceful shutdown.
#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/str_join.h"
#include "engine/generator.h"
#include "engine/pruning/registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/command.h"
#include "tests/engine/test_calibration.h"
#include "tests/server/server_process.h"

namespace ps::testing {
namespace {

const std::string kStories = std::string(PS_TESTDATA) + "/stories260K/stories260K.gguf";
// For tests that need a request to outlast a few round trips even on a slow
// (sanitised) build: SmolLM2 decodes ~30x slower than stories260K and has an 8k context.
const std::string kDefaultModel = std::string(PS_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

// Offline greedy tokens of the engine for the same prompt (and strategy: "name", key=value args).
std::vector<int32_t> Offline(const std::vector<int32_t>& prompt, int n, const std::string& strategy = "full",
                             const std::vector<std::string>& args = {}) {
  static auto* model = Model::Load(kStories)->release();
  const absl::StatusOr<PruningParams> params =
      StrategyDefaults::ForModel(model->config(), {}, TestCalibration(model->config()))
          ->WithArgs(strategy, args, "pruning");
  EXPECT_TRUE(params.ok()) << params.status();
  const std::unique_ptr<PruningStrategy> pruner = params->Make(model->config());
  ThreadPool pool(1);
  CpuBackend backend(pool);
  Generator gen(*model, backend, DType::kF32);
  auto r = gen.Generate(prompt, SamplingParams{.temperature = 0}, StopCriteria{.max_new_tokens = n, .ignore_eos = true},
                        nullptr, pruner.get());
  EXPECT_TRUE(r.ok()) << r.status();
  return r->tokens;
}

// Flags of a stories260K server on an F32 KV cache, for the tests of tokens. These tests compare streamed tokens
// with Offline's, computed in batches of another make-up: products of one row and of
// many take different paths (a dot product, an sgemm) that may differ in the last bit,
// and a 16-bit KV rounds such a difference up to 2^-8, enough to flip a near-tie of
// this tiny model (as BF16 did in a CI run of the scheduler's mixed-strategy test).
std::vector<std::string> StoriesOnF32Kv(std::vector<std::string> flags) {
  flags.insert(flags.begin(), {"--model", kStories, "--kv-dtype", "f32"});
  return flags;
}

std::vector<int32_t> PromptOf(int i) {  // 16 different prompts of 5..20 tokens
  std::vector<int32_t> p = {1};
  for (int k = 0; k < 4 + i; ++k) p.push_back(300 + (i * 37 + k * 11) % 180);
  return p;
}

// Polls GetLoad until nothing runs or waits and the KV cache is empty.
bool Drained(ServerProcess& s) {
  auto stub = s.Stub();
  return WaitFor(
      [&] {
        grpc::ClientContext ctx;
        pb::LoadInfo load;
        if (!stub->GetLoad(&ctx, {}, &load).ok()) return false;
        return load.running() == 0 && load.waiting() == 0 && load.kv(0).used_tokens() == 0;
      },
      std::chrono::seconds(20));
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new ServerProcess(StoriesOnF32Kv({"--threads", "2"})); }
  static void TearDownTestSuite() { delete server_; }
  static ServerProcess* server_;
};
ServerProcess* ServerTest::server_ = nullptr;

TEST_F(ServerTest, StreamsTheEnginesGreedyTokens) {
  auto stub = server_->Stub();
  for (int i = 0; i < 3; ++i) {
    const auto prompt = PromptOf(i);
    StreamResult r = RunStream(*stub, GreedyRequest(prompt, 48));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_TRUE(r.saw_prompt_info);
    EXPECT_EQ(r.finished_events, 1);
    EXPECT_EQ(r.finished.reason(), pb::FINISH_REASON_LENGTH);
    EXPECT_EQ(r.finished.usage().completion_tokens(), 48u);
    EXPECT_EQ(r.finished.usage().prompt_tokens(), prompt.size());
    EXPECT_DOUBLE_EQ(r.finished.usage().prompt_tokens_computed(), static_cast<double>(prompt.size()));
    EXPECT_EQ(absl::StrJoin(r.tokens, " "), absl::StrJoin(Offline(prompt, 48), " "));
  }
  // Text input and the text stream: "Once upon a time" -> llama.cpp's continuation.
  pb::GenerateRequest req;
  req.set_text("Once upon a time");
  req.mutable_sampling()->set_temperature(0);
  req.mutable_stopping()->set_max_new_tokens(8);
  StreamResult r = RunStream(*stub, req);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(absl::StrJoin(r.tokens, " "), "432 383 286 261 376 298 315 421");
  EXPECT_EQ(r.text, ", there was a little girl");
}

TEST_F(ServerTest, SixteenConcurrentStreamsAndHealthChecks) {
  std::vector<StreamResult> results(16);
  std::vector<std::thread> threads;
  std::atomic<bool> done{false};
  std::atomic<int> health_ok{0}, health_bad{0};
  std::thread health([&] {
    while (!done.load()) {
      (server_->Health(std::chrono::milliseconds(1000)) == "SERVING" ? health_ok : health_bad)++;
    }
  });
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      auto stub = server_->Stub();
      results[i] = RunStream(*stub, GreedyRequest(PromptOf(i), 200));
    });
  }
  for (auto& t : threads) t.join();
  done = true;
  health.join();
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(absl::StrJoin(results[i].tokens, " "), absl::StrJoin(Offline(PromptOf(i), 200), " ")) << "stream " << i;
  }
  EXPECT_GT(health_ok.load(), 0);
  EXPECT_EQ(health_bad.load(), 0) << "a health check failed or took over 1 s while streams ran";
  EXPECT_TRUE(Drained(*server_));
}

TEST_F(ServerTest, ClientCancelStopsAndFrees) {
  auto stub = server_->Stub();
  const double before =
      MetricValue(server_->Metrics(), R"(pruneserve_requests_total{finish_reason="cancelled",strategy="full"})");
  StreamResult r = RunStream(*stub, GreedyRequest(PromptOf(1), 2000), [](grpc::ClientContext& ctx, int chunk) {
    if (chunk == 2) ctx.TryCancel();
  });
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_LT(r.tokens.size(), 2000u);
  EXPECT_TRUE(Drained(*server_));
  EXPECT_TRUE(WaitFor(
      [&] {
        return MetricValue(server_->Metrics(),
                           R"(pruneserve_requests_total{finish_reason="cancelled",strategy="full"})") == before + 1;
      },
      std::chrono::seconds(10)));
  EXPECT_EQ(MetricValue(server_->Metrics(), "pruneserve_num_requests_running"), 0);
}

TEST_F(ServerTest, DeadlineExceeded) {
  auto stub = server_->Stub();
  StreamResult r = RunStream(*stub, GreedyRequest(PromptOf(2), 2000), nullptr, std::chrono::milliseconds(200));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(Drained(*server_));
}

TEST_F(ServerTest, AbortByRequestId) {
  auto stub = server_->Stub();
  auto abort_stub = server_->Stub();
  bool found = false;
  StreamResult r = RunStream(*stub, GreedyRequest(PromptOf(3), 2000, "abort-me"), [&](grpc::ClientContext&, int chunk) {
    if (chunk != 1) return;
    grpc::ClientContext ctx;
    pb::AbortRequest a;
    a.set_request_id("abort-me");
    pb::AbortResponse resp;
    ASSERT_TRUE(abort_stub->Abort(&ctx, a, &resp).ok());
    found = resp.found();
  });
  EXPECT_TRUE(found);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(r.finished_events, 1);
  EXPECT_EQ(r.finished.reason(), pb::FINISH_REASON_CANCELLED);
  EXPECT_EQ(r.finished.usage().completion_tokens(), r.tokens.size());
  EXPECT_TRUE(Drained(*server_));
  grpc::ClientContext ctx;
  pb::AbortRequest a;
  a.set_request_id("abort-me");
  pb::AbortResponse resp;
  ASSERT_TRUE(abort_stub->Abort(&ctx, a, &resp).ok());
  EXPECT_FALSE(resp.found());
}

// Every invalid request gets its documented code; a valid stream running at the
// same time is not disturbed.
TEST_F(ServerTest, ValidationTable) {
  auto stub = server_->Stub();
  StreamResult good;
  std::thread bystander([&] {
    auto s = server_->Stub();
    good = RunStream(*s, GreedyRequest(PromptOf(4), 300));
  });
  struct Case {
    std::string what;
    pb::GenerateRequest req;
    grpc::StatusCode code;
  };
  std::vector<Case> cases;
  auto base = [] { return GreedyRequest({1, 403, 407}, 8); };
  {
    pb::GenerateRequest r = base();
    r.clear_token_ids();
    cases.push_back({"no input", r, grpc::StatusCode::INVALID_ARGUMENT});
    r.set_text("");
    cases.push_back({"empty text", r, grpc::StatusCode::INVALID_ARGUMENT});
  }
  {
    pb::GenerateRequest r = base();
    r.mutable_token_ids()->clear_ids();
    cases.push_back({"empty token ids", r, grpc::StatusCode::INVALID_ARGUMENT});
  }
  auto with = [&](const std::string& what, const std::function<void(pb::GenerateRequest&)>& edit) {
    pb::GenerateRequest r = base();
    edit(r);
    cases.push_back({what, r, grpc::StatusCode::INVALID_ARGUMENT});
  };
  with("temperature < 0", [](auto& r) { r.mutable_sampling()->set_temperature(-0.5f); });
  with("top_p = 0", [](auto& r) { r.mutable_sampling()->set_top_p(0.0f); });
  with("top_p > 1", [](auto& r) { r.mutable_sampling()->set_top_p(1.5f); });
  with("top_k < 0", [](auto& r) { r.mutable_sampling()->set_top_k(-1); });
  with("max_new_tokens = 0", [](auto& r) { r.mutable_stopping()->set_max_new_tokens(0); });
  with("max_new_tokens above the context", [](auto& r) { r.mutable_stopping()->set_max_new_tokens(100000); });
  with("prompt + max_new_tokens above the context", [](auto& r) { r.mutable_stopping()->set_max_new_tokens(2047); });
  with("prompt longer than the context", [](auto& r) {
    for (int i = 0; i < 2100; ++i) r.mutable_token_ids()->add_ids(300);
  });
  with("token id outside the vocabulary", [](auto& r) { r.mutable_token_ids()->add_ids(512); });
  with("top_logprobs > 20", [](auto& r) { r.set_top_logprobs(21); });
  {
    pb::GenerateRequest r = base();
    auto* m = r.mutable_messages()->add_messages();
    m->set_role("user");
    m->set_content("hi");
    cases.push_back({"chat with a model without a chat template", r, grpc::StatusCode::FAILED_PRECONDITION});
  }
  for (const Case& c : cases) {
    StreamResult r = RunStream(*stub, c.req);
    EXPECT_EQ(r.status.error_code(), c.code) << c.what << ": " << r.status.error_message();
    EXPECT_FALSE(r.status.error_message().empty()) << c.what;
    EXPECT_FALSE(r.saw_prompt_info) << c.what;
  }
  // duplicate active request id
  std::atomic<bool> dup_checked{false};
  StreamResult first =
      RunStream(*stub, GreedyRequest(PromptOf(5), 2000, "dup"), [&](grpc::ClientContext& ctx, int chunk) {
        if (chunk != 0) return;
        auto s = server_->Stub();
        StreamResult second = RunStream(*s, GreedyRequest(PromptOf(5), 4, "dup"));
        EXPECT_EQ(second.status.error_code(), grpc::StatusCode::ALREADY_EXISTS) << second.status.error_message();
        dup_checked = true;
        ctx.TryCancel();
      });
  EXPECT_TRUE(dup_checked.load());
  bystander.join();
  ASSERT_TRUE(good.status.ok());
  EXPECT_EQ(absl::StrJoin(good.tokens, " "), absl::StrJoin(Offline(PromptOf(4), 300), " "));
  EXPECT_TRUE(Drained(*server_));
}

TEST_F(ServerTest, TokenizeDetokenizeModelInfo) {
  auto stub = server_->Stub();
  grpc::ClientContext c1;
  pb::TokenizeRequest tr;
  tr.set_text("Once upon a time");
  pb::TokenizeResponse tresp;
  ASSERT_TRUE(stub->Tokenize(&c1, tr, &tresp).ok());
  EXPECT_EQ(absl::StrJoin(tresp.token_ids(), " "), "1 403 407 261 378");
  // Characters outside the vocabulary become byte tokens; their pieces stay valid UTF-8 strings.
  grpc::ClientContext c0;
  tr.set_text("a ☃");
  ASSERT_TRUE(stub->Tokenize(&c0, tr, &tresp).ok());
  EXPECT_EQ(absl::StrJoin(tresp.pieces(), "|"), "<s>|▁a|▁|<0xE2>|<0x98>|<0x83>");
  grpc::ClientContext c2;
  pb::DetokenizeRequest dr;
  for (int id : {403, 407, 261, 378}) dr.add_token_ids(id);
  pb::DetokenizeResponse dresp;
  ASSERT_TRUE(stub->Detokenize(&c2, dr, &dresp).ok());
  EXPECT_EQ(dresp.text(), "Once upon a time");
  grpc::ClientContext c3;
  pb::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&c3, {}, &info).ok());
  EXPECT_EQ(info.architecture(), "llama");
  EXPECT_EQ(info.vocab_size(), 512u);
  EXPECT_EQ(info.num_layers(), 5u);
  EXPECT_EQ(absl::StrJoin(info.strategies(), " "),
            "full lazyllm gemfilter critiprefill sliminfer pod streamingllm snapkv auto");
  ASSERT_EQ(info.strategy_summaries_size(), info.strategies_size());
  EXPECT_THAT(info.strategy_summaries(5), ::testing::HasSubstr("stock weights"));
  ASSERT_EQ(info.strategy_defaults_size(), 9);
  EXPECT_TRUE(info.strategy_defaults(0).has_full());
  EXPECT_EQ(absl::StrJoin(info.strategy_defaults(1).lazyllm().layers(), ","), "3,4");  // 60% and 80% of 5 layers
  EXPECT_EQ(info.strategy_defaults(2).gemfilter().filter_layer(), 2u);                 // 40% of 5 layers
  EXPECT_EQ(info.strategy_defaults(2).gemfilter().top_k(), 1024u);
  EXPECT_EQ(info.strategy_defaults(3).critiprefill().budget(), 1024u);
  EXPECT_EQ(info.strategy_defaults(3).critiprefill().segment_size(), 512u);
  // 10/32 and 20/32 of 5 layers (30/32 would be the last, which has no layer after it).
  EXPECT_EQ(absl::StrJoin(info.strategy_defaults(4).sliminfer().layers(), ","), "2,3");
  EXPECT_EQ(absl::StrJoin(info.strategy_defaults(4).sliminfer().budgets(), ","),
            "8192,4096");  // absolute, whatever the context
  EXPECT_EQ(info.device(), "cpu");
  EXPECT_EQ(info.cpu_isa(), CpuIsaName(DetectedCpuIsa()));  // the best this CPU has, by default
  EXPECT_EQ(info.activations(), "int8");
}

// --cpu-isa and --activations: a lower level and F32 activations run and are reported;
// a level this CPU lacks and an unknown value are refused at start-up, naming the flag.
TEST(ServerKernels, FlagsChooseTheCpuLevelAndActivations) {
  ServerProcess server({"--model", kDefaultModel, "--threads", "2", "--cpu-isa", "scalar", "--activations", "f32"});
  auto stub = server.Stub();
  grpc::ClientContext ctx;
  pb::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.cpu_isa(), "scalar");
  EXPECT_EQ(info.activations(), "f32");
  StreamResult r = RunStream(*stub, GreedyRequest(PromptOf(0), 8));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 8u);
  auto refused = [](const std::string& flags) {
    return RunCommand(std::string(PS_BINARY_DIR) + "/pruneserve --model " + kStories + " " + flags +
                      " --port 0 --metrics-port -1 2>&1");
  };
  const CommandResult bad_name = refused("--activations int4");
  EXPECT_NE(bad_name.exit_code, 0);
  EXPECT_THAT(bad_name.output, ::testing::HasSubstr("--activations must be int8 or f32"));
  const CommandResult bad_level = refused("--cpu-isa avx1024");
  EXPECT_NE(bad_level.exit_code, 0);
  EXPECT_THAT(bad_level.output, ::testing::HasSubstr("--cpu-isa: unknown CPU level 'avx1024'"));
  // --help names the level in use: the CPU's best, or what $PS_CPU_ISA asks for.
  const std::string help = std::string(PS_BINARY_DIR) + "/pruneserve --help";
  EXPECT_THAT(RunCommand(help).output,
              ::testing::HasSubstr("now " + std::string(CpuIsaName(DetectedCpuIsa())) + " (this CPU: "));
  EXPECT_THAT(RunCommand("PS_CPU_ISA=scalar " + help).output, ::testing::HasSubstr("now scalar (this CPU: "));
  if (DetectedCpuIsa() < CpuIsa::kAvx512Bf16) {
    const CommandResult too_high = refused("--cpu-isa avx512_bf16");
    EXPECT_NE(too_high.exit_code, 0);
    EXPECT_THAT(too_high.output, ::testing::HasSubstr("this CPU cannot run avx512_bf16 kernels"));
  }
}

// --kv-dtype q8_0: the default model (heads of 64) serves on it; stories260K's heads of 8
// are not whole Q8_0 blocks, and the server refuses them at start-up with the reason.
TEST(ServerKvCache, Q8KvServesAndHeadsOfPartBlocksAreRefused) {
  ServerProcess server({"--model", kDefaultModel, "--threads", "2", "--kv-dtype", "q8_0"});
  const StreamResult r = RunStream(*server.Stub(), GreedyRequest(PromptOf(0), 8));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 8u);
  const CommandResult refused = RunCommand(std::string(PS_BINARY_DIR) + "/pruneserve --model " + kStories +
                                           " --kv-dtype q8_0 --port 0 --metrics-port -1 2>&1");
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_THAT(refused.output, ::testing::HasSubstr("--kv-dtype q8_0: a Q8_0 KV cache needs heads of a multiple of 32"));
}

// A strategy per request over the wire: bad parameters are INVALID_ARGUMENT naming
// the field; a pruned stream carries the engine's tokens for that strategy, the
// accounting and the kept spans; the metrics count the pruned prompt tokens.
TEST_F(ServerTest, PruningStrategiesOverTheWire) {
  auto stub = server_->Stub();
  std::vector<int32_t> prompt = {1};
  for (int k = 0; k < 80; ++k) prompt.push_back(300 + (k * 29) % 200);
  struct Bad {
    std::function<void(pb::PruningConfig&)> edit;
    std::string field;
  };
  const Bad bad[] = {
      {[](auto& p) { p.mutable_lazyllm()->add_keep(0.5f); }, "pruning.lazyllm.layers"},
      {[](auto& p) {
         p.mutable_lazyllm()->add_layers(9);
         p.mutable_lazyllm()->add_keep(0.5f);
       },
       "pruning.lazyllm.layers[0]"},
      {[](auto& p) {
         p.mutable_lazyllm()->add_layers(2);
         p.mutable_lazyllm()->add_keep(1.5f);
       },
       "pruning.lazyllm.keep[0]"},
      {[](auto& p) { p.mutable_gemfilter()->set_pool_kernel(4); }, "pruning.gemfilter.pool_kernel"},
      {[](auto& p) { p.mutable_gemfilter()->set_filter_layer(5); }, "pruning.gemfilter.filter_layer"},
      {[](auto& p) { p.mutable_gemfilter()->set_top_k(0); }, "pruning.gemfilter.top_k"},
      {[](auto& p) { p.mutable_critiprefill()->set_segment_size(100); }, "pruning.critiprefill.segment_size"},
  };
  for (const Bad& b : bad) {
    pb::GenerateRequest req = GreedyRequest(prompt, 4);
    b.edit(*req.mutable_pruning());
    StreamResult r = RunStream(*stub, req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << b.field;
    EXPECT_THAT(r.status.error_message(), ::testing::HasSubstr(b.field));
  }

  pb::GenerateRequest criti_req = GreedyRequest(prompt, 12);
  pb::CritiPrefill* criti_params = criti_req.mutable_pruning()->mutable_critiprefill();
  criti_params->set_segment_size(16);
  criti_params->set_block_size(4);
  criti_params->set_budget(8);
  criti_params->set_dense_prefix(0);
  StreamResult criti = RunStream(*stub, criti_req);
  ASSERT_TRUE(criti.status.ok()) << criti.status.error_message();
  EXPECT_EQ(
      absl::StrJoin(criti.tokens, " "),
      absl::StrJoin(
          Offline(prompt, 12, "critiprefill", {"segment_size=16", "block_size=4", "budget=8", "dense_prefix=0"}), " "));

  pb::GenerateRequest req = GreedyRequest(prompt, 12);
  req.mutable_pruning()->mutable_gemfilter()->set_top_k(16);
  req.set_return_pruning_report(true);
  StreamResult gem = RunStream(*stub, req);
  ASSERT_TRUE(gem.status.ok()) << gem.status.error_message();
  EXPECT_EQ(absl::StrJoin(gem.tokens, " "), absl::StrJoin(Offline(prompt, 12, "gemfilter", {"top_k=16"}), " "));
  EXPECT_EQ(gem.finished.pruning_report().kept_tokens(), 16u);
  EXPECT_EQ(gem.finished.pruning_report().kept(gem.finished.pruning_report().kept_size() - 1).end(), prompt.size());
  ASSERT_EQ(gem.finished.usage().kept_per_layer_size(), 1);
  EXPECT_EQ(gem.finished.usage().kept_per_layer(0).tokens(), 16u);
  // Layers 0..2 over the prompt, then 16 tokens through all 5.
  EXPECT_DOUBLE_EQ(gem.finished.usage().prompt_tokens_computed(), (3.0 * prompt.size() + 16 * 5) / 5);

  req = GreedyRequest(prompt, 12);
  req.mutable_pruning()->mutable_lazyllm();  // the server's defaults
  StreamResult lazy = RunStream(*stub, req);
  ASSERT_TRUE(lazy.status.ok()) << lazy.status.error_message();
  EXPECT_EQ(absl::StrJoin(lazy.tokens, " "), absl::StrJoin(Offline(prompt, 12, "lazyllm"), " "));
  EXPECT_FALSE(lazy.finished.has_pruning_report());
  EXPECT_LT(lazy.finished.usage().prompt_tokens_computed(), prompt.size());  // 68% in prefill, revivals after

  const std::string page = server_->Metrics();
  EXPECT_DOUBLE_EQ(MetricValue(page, R"(pruneserve_prompt_tokens_pruned_total{strategy="gemfilter"})"),
                   prompt.size() - gem.finished.usage().prompt_tokens_computed());
  EXPECT_DOUBLE_EQ(MetricValue(page, R"(pruneserve_prompt_tokens_pruned_total{strategy="lazyllm"})"),
                   prompt.size() - lazy.finished.usage().prompt_tokens_computed());
  EXPECT_EQ(MetricValue(page, R"(pruneserve_prompt_tokens_kept_total{layer="0",strategy="gemfilter"})"), 16);

  // PoD needs the model's layer groups, which this server was not given.
  req = GreedyRequest(prompt, 4);
  req.mutable_pruning()->mutable_pod();
  StreamResult pod = RunStream(*stub, req);
  EXPECT_EQ(pod.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(pod.status.error_message(), ::testing::HasSubstr("--pod-groups"));
  EXPECT_TRUE(Drained(*server_));
}

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
// and metrics and GetLoad show the swapping.
TEST(ServerMetrics, SwapPreemptionIsVisibleAndHarmless) {
  ServerProcess s(
      StoriesOnF32Kv({"--kv-device-bytes", "491520", "--kv-host-bytes", "16777216", "--gather-first", "16"}));
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
  EXPECT_EQ(MetricValue(page, R"(pruneserve_kv_blocks{state="used",tier="host"})"), 0);
  const StreamResult next = RunStream(*s.Stub(), GreedyRequest(PromptOf(3), 20));
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.tokens, Offline(PromptOf(3), 20));
}

// A host tier with no room: preempted requests are recomputed instead of swapped.
TEST(ServerFaults, FullHostTierFallsBackToRecompute) {
  ServerProcess s(StoriesOnF32Kv({"--kv-device-bytes", "491520", "--kv-host-bytes", "16777216", "--gather-first", "16",
                                  "--inject-fault", "host_tier_full=1000000"}));
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
