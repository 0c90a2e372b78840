// The real server on loopback with stories260K: streamed greedy tokens equal the
// engine's offline output, concurrency, cancellation (client, deadline, Abort),
// the validation table, tokenizer and model info, the CPU and KV flags, pruning
// strategies over the wire (server_faults_test.cc: the servers started per test).
#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/str_join.h"
#include "engine/pruning/registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_isa.h"
#include "server/convert.h"
#include "tests/command.h"
#include "tests/server/server_test_util.h"

namespace ps::testing {
namespace {

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

// n = 3 over the wire: the prompt once (so the metrics count it), then three choices,
// each streamed under its index and finished on its own; the status after the last.
TEST_F(ServerTest, ChoicesShareOnePromptAndStreamUnderTheirIndex) {
  const std::vector<int32_t> prompt = PromptOf(5);
  const std::string before = server_->Metrics();
  auto metric_delta = [&](const std::string& sample) {
    return MetricValue(server_->Metrics(), sample) - MetricValue(before, sample);
  };
  pb::GenerateRequest req = GreedyRequest(prompt, 10);
  req.set_n(3);
  const StreamResult r = RunStream(*server_->Stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finished_events, 3);
  const std::string offline = absl::StrJoin(Offline(prompt, 10), " ");
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(absl::StrJoin(r.choice_tokens.at(i), " "), offline) << "choice " << i;
    ASSERT_EQ(r.choice_finished.at(i).size(), 1u) << "choice " << i;
    EXPECT_EQ(r.choice_finished.at(i)[0].reason(), pb::FINISH_REASON_LENGTH);
  }
  EXPECT_EQ(r.finished.usage().prompt_tokens(), prompt.size());  // the last Finished: the whole request
  EXPECT_EQ(r.finished.usage().completion_tokens(), 30u);
  EXPECT_DOUBLE_EQ(r.finished.usage().prompt_tokens_computed(), static_cast<double>(prompt.size()));
  EXPECT_EQ(metric_delta(R"(pruneserve_prompt_tokens_total{strategy="full"})"), static_cast<double>(prompt.size()));
  EXPECT_EQ(metric_delta(R"(pruneserve_prompt_tokens_computed_total{strategy="full"})"),
            static_cast<double>(prompt.size()));
  EXPECT_EQ(metric_delta(R"(pruneserve_generation_tokens_total{strategy="full"})"), 30);
  EXPECT_EQ(metric_delta(R"(pruneserve_requests_total{finish_reason="length",strategy="full"})"), 1);

  req.set_n(server::kMaxChoices + 1);
  const StreamResult refused = RunStream(*server_->Stub(), req);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(), ::testing::HasSubstr("n: "));
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
  with("a JSON schema that is not JSON", [](auto& r) { r.set_json_schema("{\"type\": "); });
  with("a JSON schema keyword not supported",
       [](auto& r) { r.set_json_schema(R"({"type": "object", "minProperties": 1})"); });
  with("a grammar with an undefined rule", [](auto& r) { r.set_grammar("root ::= item"); });
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

// Structured output over gRPC: stories260K's greedy continuation, held to a grammar,
// is a sentence of it and ends (a stop) when the grammar is complete.
TEST_F(ServerTest, AGrammarConstrainsTheStream) {
  pb::GenerateRequest req;
  req.set_text("Once upon a time");
  req.mutable_sampling()->set_temperature(0);
  req.mutable_stopping()->set_max_new_tokens(32);
  req.set_grammar(R"(root ::= ", there was a " ("cat" | "dog") ".")");
  const StreamResult r = RunStream(*server_->Stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_THAT(r.text, ::testing::AnyOf(", there was a cat.", ", there was a dog."));
  EXPECT_EQ(r.finished.reason(), pb::FINISH_REASON_STOP);
  req.set_regex(", there (was|were) [a-z]+ [a-z]+\\.");  // the regex form
  const StreamResult regex = RunStream(*server_->Stub(), req);
  ASSERT_TRUE(regex.status.ok()) << regex.status.error_message();
  EXPECT_THAT(regex.text, ::testing::MatchesRegex(", there (was|were) [a-z]+ [a-z]+\\."));
  EXPECT_EQ(regex.finished.reason(), pb::FINISH_REASON_STOP);
  req.set_regex("(?<name>a)");
  const StreamResult bad = RunStream(*server_->Stub(), req);
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.status.error_message(), ::testing::HasSubstr("regex: at offset 0: '(?'"));
}

// --chat-template FILE formats a model's messages (stories260K carries no template:
// without the flag GetModelInfo says why chat is refused). The chat stream equals a text
// request of the rendering, tokenised as the template's (no BOS added); a conversation the
// template refuses is INVALID_ARGUMENT with its words; a file that cannot be read or parsed
// stops the start-up, naming the flag.
TEST(ServerChatTemplate, AFileFormatsTheMessagesOfAModelWithout) {
  const std::string path = ::testing::TempDir() + "/server_chat_template_" + std::to_string(::getpid()) + ".jinja";
  const std::string chatml =
      "{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
      "{{ raise_exception('Unknown role ' + m.role) }}{% endif %}"
      "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  std::ofstream(path) << chatml;
  ServerProcess server(StoriesOnF32Kv({"--threads", "2", "--chat-template", path}));
  auto stub = server.Stub();
  grpc::ClientContext ctx;
  pb::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.chat_template(), chatml);
  EXPECT_EQ(info.chat_template_error(), "");
  auto chat = [](const std::string& role) {
    pb::GenerateRequest r;
    auto* m = r.mutable_messages()->add_messages();
    m->set_role(role);
    m->set_content("Once upon a time");
    r.mutable_sampling()->set_temperature(0);
    r.mutable_stopping()->set_max_new_tokens(8);
    return r;
  };
  const StreamResult via_chat = RunStream(*stub, chat("user"));
  ASSERT_TRUE(via_chat.status.ok()) << via_chat.status.error_message();
  pb::GenerateRequest text = chat("user");
  text.set_text("<|im_start|>user\nOnce upon a time<|im_end|>\n<|im_start|>assistant\n");
  text.set_add_special_tokens(false);
  text.set_parse_special_tokens(true);
  const StreamResult via_text = RunStream(*stub, text);
  ASSERT_TRUE(via_text.status.ok()) << via_text.status.error_message();
  EXPECT_EQ(via_chat.tokens, via_text.tokens);
  EXPECT_EQ(via_chat.finished.usage().prompt_tokens(), via_text.finished.usage().prompt_tokens());
  const StreamResult refused = RunStream(*stub, chat("robot"));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(), ::testing::HasSubstr("Unknown role robot"));

  ServerProcess bare(StoriesOnF32Kv({"--threads", "2"}));
  grpc::ClientContext ctx2;
  ASSERT_TRUE(bare.Stub()->GetModelInfo(&ctx2, {}, &info).ok());
  EXPECT_EQ(info.chat_template(), "");
  EXPECT_THAT(info.chat_template_error(), ::testing::HasSubstr("--chat-template"));

  std::ofstream(path) << "{% for m in messages %}";  // never closed
  for (const std::string& file : {path, path + ".missing"}) {
    const CommandResult r = RunCommand(std::string(PS_BINARY_DIR) + "/pruneserve --model " + kStories +
                                       " --chat-template " + file + " --port 0 --metrics-port -1 2>&1");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_THAT(r.output, ::testing::HasSubstr("--chat-template: ")) << file;
  }
  std::remove(path.c_str());
}

// A greedy chat request that must make one call of `count` (an integer n in 1..9).
pb::GenerateRequest RequiredCountCall() {
  pb::GenerateRequest req;
  auto* m = req.mutable_messages()->add_messages();
  m->set_role("user");
  m->set_content("Once upon a time");
  pb::Tool* tool = req.add_tools();
  tool->set_name("count");
  tool->set_parameters(R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
      "required": ["n"]})");
  req.mutable_tool_choice()->set_mode(pb::ToolChoice::REQUIRED);
  req.mutable_tool_choice()->set_parallel(false);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_stopping()->set_max_new_tokens(200);
  return req;
}

// Tools over gRPC with a template in the Hermes format: a required call is held to the
// tool's parameters, and Finished.tool_calls carries it as read from the answer.
TEST(ServerChatTemplate, ARequiredToolCallComesBackInFinished) {
  const std::string path = ::testing::TempDir() + "/server_tools_template_" + std::to_string(::getpid()) + ".jinja";
  std::ofstream(path) << "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools> Answer with "
                         "<tool_call>.{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
  ServerProcess server(StoriesOnF32Kv({"--threads", "2", "--chat-template", path}));
  pb::GenerateRequest req = RequiredCountCall();
  const StreamResult r = RunStream(*server.Stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finished.reason(), pb::FINISH_REASON_STOP) << r.text;
  ASSERT_EQ(r.finished.tool_calls_size(), 1) << r.text;
  EXPECT_EQ(r.finished.tool_calls(0).name(), "count");
  EXPECT_THAT(r.finished.tool_calls(0).arguments(), ::testing::MatchesRegex(R"(\{"n":[1-9]\})"));
  EXPECT_TRUE(r.text.starts_with("<tool_call>\n")) << r.text;
  std::remove(path.c_str());
}

// Mistral's format (a template writing [TOOL_CALLS], which demands call ids of 9
// letters and digits, as Mistral's own do): a required call comes back as the bare JSON
// list, read into Finished.tool_calls with such an id, and the conversation that carries
// it and its result renders on.
TEST(ServerChatTemplate, MistralCallsComeBackWithIdsItsTemplateTakes) {
  const std::string path = ::testing::TempDir() + "/server_mistral_template_" + std::to_string(::getpid()) + ".jinja";
  std::ofstream(path)
      << "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
         "{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
         "{% elif m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}{% if c.id | length != 9 %}"
         "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}"
         "{{ c.function | tojson }}{% endfor %}]</s>{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}"
         "[/TOOL_RESULTS]{% else %}{{ m.content }}</s>{% endif %}{% endfor %}";
  ServerProcess server(StoriesOnF32Kv({"--threads", "2", "--chat-template", path}));
  pb::GenerateRequest req = RequiredCountCall();
  const StreamResult r = RunStream(*server.Stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.finished.tool_calls_size(), 1) << r.text;
  const pb::ToolCall& call = r.finished.tool_calls(0);
  EXPECT_EQ(call.name(), "count");
  EXPECT_THAT(call.arguments(), ::testing::MatchesRegex(R"(\{"n":[1-9]\})"));
  EXPECT_THAT(call.id(), ::testing::MatchesRegex("[0-9a-zA-Z]{9}"));
  EXPECT_TRUE(r.text.starts_with("[{")) << r.text;

  auto* answer = req.mutable_messages()->add_messages();
  answer->set_role("assistant");
  *answer->add_tool_calls() = call;
  auto* result = req.mutable_messages()->add_messages();
  result->set_role("tool");
  result->set_tool_call_id(call.id());
  result->set_content("7");
  req.mutable_tool_choice()->set_mode(pb::ToolChoice::AUTO);
  req.mutable_stopping()->set_max_new_tokens(4);
  const StreamResult next = RunStream(*server.Stub(), req);
  EXPECT_TRUE(next.status.ok()) << next.status.error_message();
  answer->mutable_tool_calls(0)->set_id("call_0_x");  // what other formats' ids look like: refused
  const StreamResult refused = RunStream(*server.Stub(), req);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(), ::testing::HasSubstr("length 9"));
  std::remove(path.c_str());
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

}  // namespace
}  // namespace ps::testing
