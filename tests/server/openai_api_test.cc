// The OpenAI API's messages without a server: bodies into GenerateRequests (and the
// errors, with the parameter they name), and engine events into responses and SSE.
#include "server/openai_api.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace ps::server::openai {
namespace {

const std::vector<std::string> kModels = {"m"};

absl::StatusOr<ApiRequest> Parse(Api api, const Json& body) { return ParseRequest(api, body.dump(), kModels); }

TEST(OpenAiApi, CompletionFieldsBecomeTheGenerateRequest) {
  absl::StatusOr<ApiRequest> r =
      Parse(Api::kCompletions,
            {{"model", "m"},
             {"prompt", {"hello"}},
             {"temperature", 0.5},
             {"top_p", 0.9},
             {"seed", 7},
             {"stop", "\n"},
             {"logprobs", 2},
             {"stream", true},
             {"stream_options", {{"include_usage", true}}},
             {"user", nullptr},
             {"ignore_eos", true},
             {"priority", 3},
             {"cache_salt", "tenant-a"},
             {"pruning", {{"strategy", "lazyllm"}, {"layers", {10, 20}}, {"keep", {0.5, 0.25}}, {"max_revivals", 4}}}});
  ASSERT_TRUE(r.ok()) << r.status();
  const pb::GenerateRequest& g = r->request;
  EXPECT_EQ(g.text(), "hello");
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.sampling().seed(), 7u);
  ASSERT_EQ(g.stopping().stop_size(), 1);
  EXPECT_EQ(g.stopping().stop(0), "\n");
  EXPECT_EQ(g.stopping().max_new_tokens(), 16u);  // OpenAI's default for completions
  EXPECT_TRUE(g.stopping().ignore_eos());
  EXPECT_EQ(g.priority(), 3);
  EXPECT_EQ(g.cache_salt(), "tenant-a");
  EXPECT_TRUE(g.logprobs());
  EXPECT_EQ(g.top_logprobs(), 2u);
  EXPECT_TRUE(r->stream && r->include_usage);
  ASSERT_TRUE(g.pruning().has_lazyllm());
  EXPECT_EQ(g.pruning().lazyllm().layers_size(), 2);
  EXPECT_FLOAT_EQ(g.pruning().lazyllm().keep(1), 0.25f);
  EXPECT_EQ(g.pruning().lazyllm().max_revivals(), 4u);

  r = Parse(Api::kCompletions, {{"model", "m"}, {"prompt", {1, 2, 3}}, {"max_tokens", 5}, {"stop", {"a", "b"}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request.token_ids().ids_size(), 3);
  EXPECT_EQ(r->request.stopping().max_new_tokens(), 5u);
  EXPECT_EQ(r->request.stopping().stop_size(), 2);
  EXPECT_FALSE(r->request.logprobs());
  EXPECT_FALSE(r->request.has_pruning());
}

TEST(OpenAiApi, ChatMessagesAndLimits) {
  absl::StatusOr<ApiRequest> r = Parse(
      Api::kChat,
      {{"model", "m"},
       {"messages",
        {{{"role", "developer"}, {"content", "be brief"}},
         {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}},
       {"max_completion_tokens", 9},
       {"logprobs", true},
       {"top_logprobs", 3},
       {"response_format", {{"type", "text"}}},
       {"n", 1}});
  ASSERT_TRUE(r.ok()) << r.status();
  const pb::ChatMessages& m = r->request.messages();
  ASSERT_EQ(m.messages_size(), 2);
  EXPECT_EQ(m.messages(0).role(), "system");
  EXPECT_EQ(m.messages(1).content(), "ab");
  EXPECT_EQ(r->request.stopping().max_new_tokens(), 9u);
  EXPECT_EQ(r->request.top_logprobs(), 3u);
  r = Parse(Api::kChat, {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->request.stopping().has_max_new_tokens());  // chat: the server's default
}

// Structured outputs: the response formats and vLLM's extensions become the request's
// constraint; a schema keeps its properties' order (the output follows it).
TEST(OpenAiApi, ResponseFormatsBecomeConstraints) {
  const Json msgs = {{{"role", "user"}, {"content", "x"}}};
  absl::StatusOr<ApiRequest> r =
      Parse(Api::kChat, {{"model", "m"}, {"messages", msgs}, {"response_format", {{"type", "json_object"}}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->request.json_object());
  const Json schema = Json::parse(R"({"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {}}})");
  r = Parse(Api::kChat,
            {{"model", "m"},
             {"messages", msgs},
             {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"schema", schema}}}}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request.json_schema(), schema.dump());
  EXPECT_LT(r->request.json_schema().find("zeta"), r->request.json_schema().find("alpha"));
  r = Parse(Api::kCompletions, {{"model", "m"}, {"prompt", "a"}, {"guided_grammar", "root ::= \"y\""}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request.grammar(), "root ::= \"y\"");
  r = Parse(Api::kCompletions, {{"model", "m"}, {"prompt", "a"}, {"guided_regex", "(yes|no)\\."}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request.regex(), "(yes|no)\\.");
  r = Parse(Api::kCompletions, {{"model", "m"}, {"prompt", "a"}, {"guided_json", "{\"type\": \"null\"}"}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request.json_schema(), "{\"type\": \"null\"}");
  r = Parse(Api::kChat, {{"model", "m"}, {"messages", msgs}, {"response_format", {{"type", "text"}}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request.constraint_case(), pb::GenerateRequest::CONSTRAINT_NOT_SET);
}

// Tools, tool choices and the messages of a tool conversation become the request's.
TEST(OpenAiApi, ToolsAndToolMessagesBecomeTheRequests) {
  const Json body = Json::parse(R"({"model": "m", "messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "cold"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": false})");
  absl::StatusOr<ApiRequest> r = Parse(Api::kChat, body);
  ASSERT_TRUE(r.ok()) << r.status();
  const pb::GenerateRequest& g = r->request;
  ASSERT_EQ(g.messages().messages_size(), 3);
  const pb::ChatMessage& call = g.messages().messages(1);
  EXPECT_EQ(call.content(), "");
  ASSERT_EQ(call.tool_calls_size(), 1);
  EXPECT_EQ(call.tool_calls(0).id(), "c1");
  EXPECT_EQ(call.tool_calls(0).arguments(), "{\"city\": \"Oslo\"}");
  EXPECT_EQ(g.messages().messages(2).tool_call_id(), "c1");
  EXPECT_EQ(g.messages().messages(2).name(), "get_weather");
  ASSERT_EQ(g.tools_size(), 1);
  EXPECT_EQ(g.tools(0).parameters(), R"({"type":"object","properties":{"city":{"type":"string"}}})");
  EXPECT_EQ(g.tool_choice().mode(), pb::ToolChoice::FUNCTION);
  EXPECT_EQ(g.tool_choice().function(), "get_weather");
  EXPECT_FALSE(g.tool_choice().parallel());
}

// With tools offered, an answer that is calls comes back as tool_calls, whole and
// streamed (what precedes a call streams as content; the call once whole).
TEST(OpenAiApi, CallsInTheAnswerBecomeToolCalls) {
  ApiRequest request{.api = Api::kChat, .model = "m"};
  const std::string answer = "Checking.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
  auto text = [](int32_t) { return std::string("t"); };
  ResponseWriter whole(request, "id", 0, text, ToolFormat::kHermes);
  whole.Collect({.kind = RequestEvent::Kind::kTokens, .text = answer});
  whole.Collect({.kind = RequestEvent::Kind::kFinished, .reason = FinishReason::kStop});
  const Json w = whole.Final();
  EXPECT_EQ(w["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(w["choices"][0]["message"]["content"], "Checking.");
  EXPECT_EQ(w["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(w["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], R"({"x":1})");
  ResponseWriter streamed(request, "id", 0, text, ToolFormat::kHermes);
  std::string sse;
  for (size_t at = 0; at < answer.size(); at += 7) {
    sse += streamed.StreamEvent({.kind = RequestEvent::Kind::kTokens, .text = answer.substr(at, 7)});
  }
  sse += streamed.StreamEvent({.kind = RequestEvent::Kind::kFinished, .reason = FinishReason::kStop});
  std::string content;
  Json calls;
  std::string finish;
  for (const absl::string_view line : absl::StrSplit(sse, "\n\n")) {
    if (!absl::StartsWith(line, "data: {")) continue;
    const Json chunk = Json::parse(std::string(line.substr(6)));
    const Json& choice = chunk["choices"][0];
    if (choice["delta"].contains("content")) content += choice["delta"]["content"].get<std::string>();
    if (choice["delta"].contains("tool_calls")) calls = choice["delta"]["tool_calls"];
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  EXPECT_EQ(content, "Checking.\n");
  EXPECT_EQ(calls, w["choices"][0]["message"]["tool_calls"]);
  EXPECT_EQ(finish, "tool_calls");
  // Without tools the same text is content.
  ResponseWriter plain(request, "id", 0, text);
  plain.Collect({.kind = RequestEvent::Kind::kTokens, .text = answer});
  plain.Collect({.kind = RequestEvent::Kind::kFinished, .reason = FinishReason::kStop});
  EXPECT_EQ(plain.Final()["choices"][0]["message"]["content"], answer);
}

TEST(OpenAiApi, BadRequestsNameTheParameter) {
  struct Case {
    Api api;
    Json body;
    absl::StatusCode code;
    std::string param;
  };
  const Json msgs = {{{"role", "user"}, {"content", "x"}}};
  const std::vector<Case> cases = {
      {Api::kCompletions, {{"prompt", "a"}}, absl::StatusCode::kInvalidArgument, "model"},
      {Api::kCompletions, {{"model", "x"}, {"prompt", "a"}}, absl::StatusCode::kNotFound, "model"},
      {Api::kCompletions, {{"model", "m"}}, absl::StatusCode::kInvalidArgument, "prompt"},
      {Api::kCompletions, {{"model", "m"}, {"prompt", {"a", "b"}}}, absl::StatusCode::kInvalidArgument, "prompt"},
      {Api::kCompletions, {{"model", "m"}, {"prompt", {1, -2}}}, absl::StatusCode::kInvalidArgument, "prompt"},
      {Api::kCompletions,
       {{"model", "m"}, {"prompt", "a"}, {"temperature", "hot"}},
       absl::StatusCode::kInvalidArgument,
       "temperature"},
      {Api::kCompletions,
       {{"model", "m"}, {"prompt", "a"}, {"max_tokens", 0}},
       absl::StatusCode::kInvalidArgument,
       "max_tokens"},
      {Api::kCompletions,
       {{"model", "m"}, {"prompt", "a"}, {"max_tokens", 2.5}},
       absl::StatusCode::kInvalidArgument,
       "max_tokens"},
      {Api::kCompletions, {{"model", "m"}, {"prompt", "a"}, {"n", 0}}, absl::StatusCode::kInvalidArgument, "n"},
      {Api::kCompletions, {{"model", "m"}, {"prompt", "a"}, {"n", 129}}, absl::StatusCode::kInvalidArgument, "n"},
      {Api::kCompletions,
       {{"model", "m"}, {"prompt", "a"}, {"n", 3}, {"best_of", 2}},
       absl::StatusCode::kInvalidArgument,
       "best_of"},
      {Api::kCompletions,
       {{"model", "m"}, {"prompt", "a"}, {"best_of", 2}, {"stream", true}},
       absl::StatusCode::kInvalidArgument,
       "best_of"},
      {Api::kChat,
       {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"best_of", 2}},
       absl::StatusCode::kInvalidArgument,
       "best_of"},
      {Api::kCompletions,
       {{"model", "m"}, {"prompt", "a"}, {"echo", true}},
       absl::StatusCode::kInvalidArgument,
       "echo"},
      {Api::kCompletions,
       {{"model", "m"}, {"prompt", "a"}, {"logit_bias", {{"5", 1}}}},
       absl::StatusCode::kInvalidArgument,
       "logit_bias"},
      {Api::kCompletions,
       {{"model", "m"}, {"prompt", "a"}, {"logprobs", 21}},
       absl::StatusCode::kInvalidArgument,
       "logprobs"},
      {Api::kCompletions, {{"model", "m"}, {"prompt", "a"}, {"stop", {1}}}, absl::StatusCode::kInvalidArgument, "stop"},
      {Api::kCompletions,
       {{"model", "m"}, {"prompt", "a"}, {"stream_options", {{"include_usage", true}}}},
       absl::StatusCode::kInvalidArgument,
       "stream_options"},
      {Api::kCompletions,
       {{"model", "m"}, {"prompt", "a"}, {"frobnicate", 1}},
       absl::StatusCode::kInvalidArgument,
       "frobnicate"},
      {Api::kCompletions,
       {{"model", "m"}, {"prompt", "a"}, {"pruning", {{"strategy", "nope"}}}},
       absl::StatusCode::kInvalidArgument,
       "pruning"},
      {Api::kCompletions,
       {{"model", "m"}, {"prompt", "a"}, {"pruning", {{"strategy", "gemfilter"}, {"topk", 5}}}},
       absl::StatusCode::kInvalidArgument,
       "pruning"},
      {Api::kCompletions,
       {{"model", "m"}, {"prompt", "a"}, {"pruning", {{"strategy", "lazyllm"}, {"keep", {{1}}}}}},
       absl::StatusCode::kInvalidArgument,
       "pruning"},
      {Api::kChat, {{"model", "m"}, {"messages", Json::array()}}, absl::StatusCode::kInvalidArgument, "messages"},
      {Api::kChat,
       {{"model", "m"}, {"messages", {{{"role", "robot"}, {"content", "x"}}}}},
       absl::StatusCode::kInvalidArgument,
       "messages[0].role"},
      {Api::kChat,
       {{"model", "m"}, {"messages", {{{"role", "tool"}, {"content", "x"}}}}},
       absl::StatusCode::kInvalidArgument,
       "messages[0].tool_call_id"},
      {Api::kChat,
       {{"model", "m"}, {"messages", {{{"role", "assistant"}, {"tool_calls", {{{"id", "c"}}}}}}}},
       absl::StatusCode::kInvalidArgument,
       "messages[0].tool_calls[0]"},
      {Api::kChat,
       {{"model", "m"}, {"messages", msgs}, {"tool_choice", "sometimes"}},
       absl::StatusCode::kInvalidArgument,
       "tool_choice"},
      {Api::kChat,
       {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}},
       absl::StatusCode::kInvalidArgument,
       "messages[0].content"},
      {Api::kChat,
       {{"model", "m"}, {"messages", msgs}, {"top_logprobs", 2}},
       absl::StatusCode::kInvalidArgument,
       "top_logprobs"},
      {Api::kChat,
       {{"model", "m"}, {"messages", msgs}, {"tools", {{{"type", "function"}}}}},
       absl::StatusCode::kInvalidArgument,
       "tools[0]"},
      {Api::kChat,
       {{"model", "m"}, {"messages", msgs}, {"response_format", {{"type", "xml"}}}},
       absl::StatusCode::kInvalidArgument,
       "response_format"},
      {Api::kChat,
       {{"model", "m"},
        {"messages", msgs},
        {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}},
       absl::StatusCode::kInvalidArgument,
       "response_format.json_schema.schema"},
      {Api::kCompletions,
       {{"model", "m"}, {"prompt", "a"}, {"guided_json", {{"type", "integer"}}}, {"guided_grammar", "root ::= \"a\""}},
       absl::StatusCode::kInvalidArgument,
       "response_format"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ApiRequest> r = Parse(c.api, c.body);
    ASSERT_FALSE(r.ok()) << c.body.dump();
    EXPECT_EQ(r.status().code(), c.code) << c.body.dump() << ": " << r.status();
    auto [http, error] = ErrorResponse(c.api, r.status());
    EXPECT_EQ(http, c.code == absl::StatusCode::kNotFound ? 404 : 400);
    EXPECT_EQ(error["error"]["param"], c.param) << r.status();
    EXPECT_EQ(error["error"]["message"], std::string(r.status().message()));
  }
  EXPECT_FALSE(ParseRequest(Api::kChat, "{\"model\": ", kModels).ok());
  EXPECT_FALSE(ParseRequest(Api::kChat, "[1]", kModels).ok());
}

TEST(OpenAiApi, ServerErrorsMapToHttpAndParameters) {
  EXPECT_EQ(ErrorParam(Api::kCompletions, "max_new_tokens: 5 prompt tokens + 9 exceed the context"), "max_tokens");
  EXPECT_EQ(ErrorParam(Api::kChat, "max_new_tokens must be > 0"), "max_completion_tokens");
  EXPECT_EQ(ErrorParam(Api::kChat, "input: the prompt has 9 tokens"), "messages");
  EXPECT_EQ(ErrorParam(Api::kCompletions, "top_logprobs must be <= 20"), "logprobs");
  EXPECT_EQ(ErrorParam(Api::kCompletions, "pruning.lazyllm.keep[1]: must be in (0, 1]"), "pruning");
  EXPECT_EQ(ErrorParam(Api::kCompletions, "temperature must be >= 0"), "temperature");
  EXPECT_EQ(ErrorParam(Api::kChat, "json_schema: schema at pattern: this keyword is not supported"), "response_format");
  EXPECT_EQ(ErrorParam(Api::kCompletions, "json_schema: not valid JSON"), "guided_json");
  EXPECT_EQ(ErrorParam(Api::kCompletions, "grammar: line 1 column 3: expected '::='"), "guided_grammar");
  EXPECT_EQ(ErrorParam(Api::kChat, "regex: at offset 2: expected ')'"), "guided_regex");
  EXPECT_EQ(ErrorParam(Api::kCompletions, "the body is not valid JSON"), "");
  EXPECT_EQ(ErrorResponse(Api::kChat, absl::ResourceExhaustedError("the queue is full")).first, 429);
  EXPECT_EQ(ErrorResponse(Api::kChat, absl::ResourceExhaustedError("client 10.0.0.7 has 4 streams open")).first, 429);
  EXPECT_EQ(ErrorResponse(Api::kChat, absl::UnauthenticatedError("the API key is not valid")).first, 401);
  {  // a field beyond a server limit: the request's fault, naming the OpenAI parameter
    auto [code, error] = ErrorResponse(Api::kChat, absl::ResourceExhaustedError("max_new_tokens: 9 exceeds 8"));
    EXPECT_EQ(code, 400);
    EXPECT_EQ(error["error"]["param"], "max_completion_tokens");
  }
  EXPECT_EQ(ErrorResponse(Api::kChat, absl::UnavailableError("draining")).first, 503);
  EXPECT_EQ(ErrorResponse(Api::kChat, absl::DeadlineExceededError("late")).first, 504);
  auto [http, body] = ErrorResponse(Api::kChat, absl::InternalError("boom"));
  EXPECT_EQ(http, 500);
  EXPECT_TRUE(body["error"]["param"].is_null());
  EXPECT_EQ(body["error"]["type"], "server_error");
}

RequestEvent Tokens(std::vector<int32_t> ids, std::string text) {
  RequestEvent ev;
  for (int32_t id : ids) ev.tokens.push_back({.token = id, .logprob = -0.5f, .top = {{id, -0.5f}, {id + 1, -1.5f}}});
  ev.text = std::move(text);
  return ev;
}

RequestEvent Finish(std::string tail, FinishReason reason) {
  RequestEvent ev{.kind = RequestEvent::Kind::kFinished, .text = std::move(tail), .reason = reason};
  ev.usage.prompt_tokens = 4;
  ev.usage.completion_tokens = 3;
  ev.usage.cached_tokens = 2;
  return ev;
}

std::vector<Json> SseData(const std::string& sse, bool* done) {
  std::vector<Json> out;
  size_t at = 0;
  *done = false;
  while ((at = sse.find("data: ", at)) != std::string::npos) {
    const size_t end = sse.find("\n\n", at);
    const std::string data = sse.substr(at + 6, end - at - 6);
    if (data == "[DONE]") {
      *done = true;
    } else {
      out.push_back(Json::parse(data));
    }
    at = end;
  }
  return out;
}

TEST(OpenAiApi, ChatStreamsRoleThenDeltasThenFinishUsageAndDone) {
  ApiRequest req = *Parse(Api::kChat, {{"model", "m"},
                                       {"messages", {{{"role", "user"}, {"content", "x"}}}},
                                       {"stream", true},
                                       {"stream_options", {{"include_usage", true}}},
                                       {"logprobs", true},
                                       {"top_logprobs", 2}});
  ResponseWriter w(req, "chatcmpl-1", 100, [](int32_t id) { return "t" + std::to_string(id); });
  bool done = false;
  std::vector<Json> a = SseData(w.StreamEvent(Tokens({5, 6}, "Hel")), &done);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_FALSE(done);
  EXPECT_EQ(a[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(a[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(a[1]["choices"][0]["delta"]["content"], "Hel");
  ASSERT_EQ(a[1]["choices"][0]["logprobs"]["content"].size(), 2u);
  EXPECT_EQ(a[1]["choices"][0]["logprobs"]["content"][1]["token"], "t6");
  EXPECT_EQ(a[1]["choices"][0]["logprobs"]["content"][1]["top_logprobs"][1]["token"], "t7");
  EXPECT_EQ(a[1]["choices"][0]["logprobs"]["content"][0]["bytes"], Json({'t', '5'}));
  std::vector<Json> b = SseData(w.StreamEvent(Finish("lo", FinishReason::kStopSequence)), &done);
  EXPECT_TRUE(done);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0]["choices"][0]["delta"]["content"], "lo");  // text held back for stop strings
  EXPECT_EQ(b[1]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(b[2]["choices"].empty());
  EXPECT_EQ(b[2]["usage"]["total_tokens"], 7);
  EXPECT_EQ(b[2]["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  for (const Json& j : b) EXPECT_EQ(j["id"], "chatcmpl-1");
}

TEST(OpenAiApi, ErrorsEndTheStreamAndWholeResponsesCollectEverything) {
  ApiRequest req = *Parse(Api::kCompletions, {{"model", "m"}, {"prompt", "x"}, {"logprobs", 1}});
  ResponseWriter streamed(req, "cmpl-1", 1, [](int32_t id) { return std::string(2, 'a' + id); });
  RequestEvent failed = Finish("", FinishReason::kError);
  failed.error = "the step failed";
  bool done = false;
  std::vector<Json> e = SseData(streamed.StreamEvent(failed), &done);
  EXPECT_TRUE(done);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["error"]["message"], "the step failed");

  ResponseWriter whole(req, "cmpl-2", 1, [](int32_t id) { return std::string(2, 'a' + id); });
  whole.Collect(Tokens({0}, "aa"));
  whole.Collect(Tokens({1, 2}, "bbcc"));
  whole.Collect(Finish("!", FinishReason::kLength));
  const Json f = whole.Final();
  EXPECT_EQ(f["object"], "text_completion");
  EXPECT_EQ(f["choices"][0]["text"], "aabbcc!");
  EXPECT_EQ(f["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(f["choices"][0]["logprobs"]["tokens"], Json({"aa", "bb", "cc"}));
  EXPECT_EQ(f["choices"][0]["logprobs"]["text_offset"], Json({0, 2, 4}));
  EXPECT_EQ(f["choices"][0]["logprobs"]["top_logprobs"][2]["dd"], -1.5);
  EXPECT_EQ(f["usage"]["completion_tokens"], 3);
  EXPECT_EQ(f["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
}

TEST(OpenAiApi, ChoicesAskForOnePromptAndManySamples) {
  absl::StatusOr<ApiRequest> chat =
      Parse(Api::kChat, {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"n", 3}});
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->n, 3);
  EXPECT_EQ(chat->request.n(), 3u);
  absl::StatusOr<ApiRequest> best =
      Parse(Api::kCompletions, {{"model", "m"}, {"prompt", "x"}, {"n", 2}, {"best_of", 5}});
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->n, 2);
  EXPECT_EQ(best->request.n(), 5u);  // generated; the 2 most likely returned
}

RequestEvent Of(int index, RequestEvent ev, bool last = true) {
  ev.index = index;
  ev.last = last;
  return ev;
}

TEST(OpenAiApi, ChoicesStreamUnderTheirIndexAndTheStreamEndsAfterTheLast) {
  ApiRequest req = *Parse(Api::kChat, {{"model", "m"},
                                       {"messages", {{{"role", "user"}, {"content", "x"}}}},
                                       {"n", 2},
                                       {"stream", true},
                                       {"stream_options", {{"include_usage", true}}}});
  ResponseWriter w(req, "chatcmpl-1", 100, [](int32_t id) { return "t" + std::to_string(id); });
  bool done = false;
  std::vector<Json> a = SseData(w.StreamEvent(Of(1, Tokens({5}, "B"))), &done);
  ASSERT_EQ(a.size(), 2u);  // choice 1's role, then its content
  EXPECT_EQ(a[0]["choices"][0]["index"], 1);
  EXPECT_EQ(a[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(a[1]["choices"][0]["index"], 1);
  EXPECT_EQ(a[1]["choices"][0]["delta"]["content"], "B");
  a = SseData(w.StreamEvent(Of(0, Tokens({6}, "A"))), &done);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[1]["choices"][0]["index"], 0);
  EXPECT_EQ(a[1]["choices"][0]["delta"]["content"], "A");
  a = SseData(w.StreamEvent(Of(0, Finish("", FinishReason::kStop), /*last=*/false)), &done);
  EXPECT_FALSE(done);
  ASSERT_EQ(a.size(), 1u);  // no usage yet
  EXPECT_EQ(a[0]["choices"][0]["index"], 0);
  EXPECT_EQ(a[0]["choices"][0]["finish_reason"], "stop");
  a = SseData(w.StreamEvent(Of(1, Finish("b", FinishReason::kLength))), &done);
  EXPECT_TRUE(done);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0]["choices"][0]["delta"]["content"], "b");
  EXPECT_EQ(a[1]["choices"][0]["index"], 1);
  EXPECT_EQ(a[1]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(a[2]["usage"]["completion_tokens"], 3);  // the last event's: the whole request's
  EXPECT_FALSE(w.closed());

  // A failed choice ends the stream: nothing follows its error.
  ResponseWriter f(req, "chatcmpl-2", 100, [](int32_t id) { return "t" + std::to_string(id); });
  RequestEvent failed = Of(1, Finish("", FinishReason::kError), /*last=*/false);
  failed.error = "the step failed";
  a = SseData(f.StreamEvent(failed), &done);
  EXPECT_TRUE(done);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0]["error"]["message"], "the step failed");
  EXPECT_TRUE(f.closed());
  EXPECT_EQ(f.StreamEvent(Of(0, Tokens({1}, "x"))), "");
}

TEST(OpenAiApi, WholeResponsesListTheChoicesAndBestOfKeepsTheMostLikely) {
  ApiRequest req = *Parse(Api::kCompletions, {{"model", "m"}, {"prompt", "x"}, {"n", 2}, {"best_of", 3}});
  ResponseWriter w(req, "cmpl-1", 1, [](int32_t id) { return std::string(1, 'a' + id); });
  auto tokens = [](int index, float logprob, std::string text) {
    RequestEvent ev{.index = index, .text = std::move(text)};
    ev.tokens.push_back({.token = 0, .logprob = logprob});
    return ev;
  };
  w.Collect(tokens(0, -3.0f, "zero"));
  w.Collect(tokens(1, -1.0f, "one"));
  w.Collect(tokens(2, -2.0f, "two"));
  w.Collect(Of(0, Finish("", FinishReason::kLength), false));
  w.Collect(Of(2, Finish("", FinishReason::kStop), false));
  RequestEvent last = Of(1, Finish("", FinishReason::kLength));
  last.usage.completion_tokens = 3;
  w.Collect(last);
  ASSERT_TRUE(w.Status().ok()) << w.Status();
  const Json f = w.Final();
  ASSERT_EQ(f["choices"].size(), 2u);
  EXPECT_EQ(f["choices"][0]["index"], 0);
  EXPECT_EQ(f["choices"][0]["text"], "one");  // -1: the most likely
  EXPECT_EQ(f["choices"][1]["index"], 1);
  EXPECT_EQ(f["choices"][1]["text"], "two");
  EXPECT_EQ(f["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(f["usage"]["completion_tokens"], 3);  // every generated choice's

  ResponseWriter failed(req, "cmpl-2", 1, [](int32_t id) { return std::string(1, 'a' + id); });
  RequestEvent error = Of(2, Finish("", FinishReason::kError), false);
  error.error = "boom";
  failed.Collect(error);
  failed.Collect(Of(0, Finish("", FinishReason::kLength)));
  EXPECT_EQ(failed.Status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(failed.Status().message(), "boom");
}

}  // namespace
}  // namespace ps::server::openai
