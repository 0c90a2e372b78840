// Function calling (server/tool_calls.h): the format told from a template, calls read
// back from answers (and text that is not a call left as text), the streamed answer's
// sure content, and required calls' grammars whose sentences are calls that validate.
#include "server/tool_calls.h"

#include <set>

#include "gmock/gmock.h"
#include "grammar/matcher.h"
#include "gtest/gtest.h"
#include "tests/grammar/byte_vocabulary.h"

namespace ps::server {
namespace {

namespace pb = ::pruneserve::v1;

TEST(ToolCalls, FormatsAreToldFromTheTemplate) {
  EXPECT_EQ(DetectToolFormat("{% for tool in tools %}...<tool_call>\n{{ tool_call | tojson }}</tool_call>"),
            ToolFormat::kHermes);
  EXPECT_EQ(DetectToolFormat("<|start_header_id|>ipython ... {% if tools %} \"parameters\": ..."),
            ToolFormat::kLlama3Json);
  EXPECT_EQ(DetectToolFormat("{%- elif message.tool_calls %}{{- \"[TOOL_CALLS][\" }}"), ToolFormat::kMistral);
  EXPECT_EQ(DetectToolFormat("<|im_start|>{{ m.content }}"), ToolFormat::kNone);
}

TEST(ToolCalls, MistralCallsAreReadInBothOfItsFormats) {
  // v3 (7B v0.3, Nemo): a JSON list after the control token.
  ParsedAnswer a = ParseToolCalls(ToolFormat::kMistral,
                                  "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
                                  "{\"name\": \"now\", \"arguments\": {}}]");
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_EQ(a.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(a.calls[1].name, "now");
  EXPECT_EQ(a.content, "");
  // v11 and later (Small 3.x, Devstral): name[ARGS]{...}, an id perhaps, [TOOL_CALLS] before each.
  a = ParseToolCalls(
      ToolFormat::kMistral,
      "Checking.[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{\"city\": \"Oslo\"}[TOOL_CALLS]now[ARGS]{}");
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.content, "Checking.");
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_EQ(a.calls[0].arguments, R"({"city":"Oslo"})");
  EXPECT_EQ(a.calls[1].name, "now");
  EXPECT_EQ(a.calls[1].arguments, "{}");
  // A required call's constrained answer: the bare list.
  a = ParseToolCalls(ToolFormat::kMistral, "[{\"name\": \"now\", \"arguments\": {}}]");
  ASSERT_EQ(a.calls.size(), 1u);
  for (const char* not_a_call : {"Just text.", "[1, 2]", "[TOOL_CALLS][{\"name\": 3}]", "[TOOL_CALLS]f[ARGS]{broken",
                                 "[TOOL_CALLS]f{}", "[TOOL_CALLS][ARGS]{}"}) {
    a = ParseToolCalls(ToolFormat::kMistral, not_a_call);
    EXPECT_TRUE(a.calls.empty()) << not_a_call;
    EXPECT_EQ(a.content, not_a_call);
  }
}

TEST(ToolCalls, CallIdsAreUniqueAndMistralsAreNineLettersOrDigits) {
  EXPECT_EQ(ToolCallId(ToolFormat::kHermes, "req-1", 0, 2), "call_2_req-1");
  EXPECT_EQ(ToolCallId(ToolFormat::kHermes, "req-1", 3, 2), "call_2_req-1_3");
  std::set<std::string> ids;
  for (int choice = 0; choice < 4; ++choice) {
    for (size_t i = 0; i < 4; ++i) {
      const std::string id = ToolCallId(ToolFormat::kMistral, "req-1", choice, i);
      EXPECT_THAT(id, ::testing::MatchesRegex("[0-9a-zA-Z]{9}"));
      EXPECT_EQ(id, ToolCallId(ToolFormat::kMistral, "req-1", choice, i));  // the same call, the same id
      ids.insert(id);
    }
  }
  EXPECT_EQ(ids.size(), 16u);
}

TEST(ToolCalls, HermesCallsAreReadAndOtherTextIsLeft) {
  ParsedAnswer a =
      ParseToolCalls(ToolFormat::kHermes,
                     "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                     "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": "
                     "1}\"}\n</tool_call>");
  EXPECT_EQ(a.content, "Let me check.");
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_EQ(a.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(a.calls[1].arguments, R"({"a":1})");  // arguments given as JSON text are read too
  for (const char* not_a_call : {"Just text.", "<tool_call>\n{\"name\": 3}\n</tool_call>", "<tool_call>{broken",
                                 "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> and more text"}) {
    a = ParseToolCalls(ToolFormat::kHermes, not_a_call);
    EXPECT_TRUE(a.calls.empty()) << not_a_call;
    EXPECT_EQ(a.content, not_a_call);
  }
  // An answer that is nothing but an untagged call object is a call.
  a = ParseToolCalls(ToolFormat::kHermes, " {\"name\": \"f\", \"arguments\": {\"x\": 1}}\n");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].arguments, R"({"x":1})");
  EXPECT_TRUE(ParseToolCalls(ToolFormat::kHermes, R"({"name": "f", "arguments": {}} and text)").calls.empty());
  // An answer cut at max_tokens after a whole call still has it.
  a = ParseToolCalls(ToolFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}");
  ASSERT_EQ(a.calls.size(), 1u);
}

TEST(ToolCalls, Llama3JsonCallsAreRead) {
  ParsedAnswer a =
      ParseToolCalls(ToolFormat::kLlama3Json,
                     " {\"name\": \"f\", \"parameters\": {\"x\": \"a;b\"}}; {\"name\": \"g\", \"parameters\": {}}");
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.calls[0].arguments, R"({"x":"a;b"})");
  EXPECT_EQ(a.calls[1].name, "g");
  EXPECT_EQ(a.content, "");
  a = ParseToolCalls(ToolFormat::kLlama3Json, "The answer is {not JSON}");
  EXPECT_TRUE(a.calls.empty());
}

TEST(ToolCalls, StreamsHoldBackOnlyWhatMayBeACall) {
  EXPECT_EQ(SureContent(ToolFormat::kHermes, "Hello"), 5u);
  EXPECT_EQ(SureContent(ToolFormat::kHermes, "Hello <tool"), 6u);
  EXPECT_EQ(SureContent(ToolFormat::kHermes, "Hi <tool_call>\n{\"na"), 3u);
  EXPECT_EQ(SureContent(ToolFormat::kHermes, "a < b"), 5u);
  EXPECT_EQ(SureContent(ToolFormat::kHermes, " {\"name"), 0u);
  EXPECT_EQ(SureContent(ToolFormat::kLlama3Json, "  {\"name\""), 0u);
  EXPECT_EQ(SureContent(ToolFormat::kLlama3Json, "<|py"), 0u);
  EXPECT_EQ(SureContent(ToolFormat::kLlama3Json, "Paris is"), 8u);
  EXPECT_EQ(SureContent(ToolFormat::kMistral, "Sure.[TOOL_CALLS]f[ARGS]"), 5u);
  EXPECT_EQ(SureContent(ToolFormat::kMistral, "Sure.[TOOL_"), 5u);
  EXPECT_EQ(SureContent(ToolFormat::kMistral, " [{\"name"), 0u);
  EXPECT_EQ(SureContent(ToolFormat::kMistral, "a [b] c"), 7u);
  EXPECT_EQ(SureContent(ToolFormat::kNone, "<tool_call>"), 11u);
}

TEST(ToolCalls, ARequiredCallsGrammarAcceptsOnlyValidCalls) {
  google::protobuf::RepeatedPtrField<pb::Tool> tools;
  pb::Tool* weather = tools.Add();
  weather->set_name("get_weather");
  weather->set_parameters(R"({"type": "object", "properties": {"city": {"type": "string"},
      "unit": {"enum": ["c", "f"]}}, "required": ["city"]})");
  tools.Add()->set_name("now");
  auto matcher = [&](ToolFormat f, const std::string& only, bool parallel) {
    absl::StatusOr<std::string> gbnf = ToolCallGbnf(f, tools, only, parallel);
    EXPECT_TRUE(gbnf.ok()) << gbnf.status();
    absl::StatusOr<grammar::Grammar> g = grammar::Grammar::FromGbnf(*gbnf);
    EXPECT_TRUE(g.ok()) << g.status() << "\n" << *gbnf;
    return grammar::Matcher(std::make_shared<const grammar::CompiledGrammar>(*std::move(g)),
                            grammar::testing::ByteVocabulary());
  };
  auto accepts = [](grammar::Matcher m, std::string_view text) { return m.AcceptBytes(text) && m.CanEnd(); };
  const grammar::Matcher any = matcher(ToolFormat::kHermes, "", true);
  const std::string call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
  EXPECT_TRUE(accepts(any, call));
  EXPECT_TRUE(accepts(any, call + "\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(accepts(any, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));  // city
  EXPECT_FALSE(accepts(any, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(accepts(any, "Sure! " + call));
  EXPECT_FALSE(accepts(matcher(ToolFormat::kHermes, "", false), call + "\n" + call));  // not parallel
  EXPECT_FALSE(accepts(matcher(ToolFormat::kHermes, "now", true), call));              // only `now`
  EXPECT_TRUE(accepts(matcher(ToolFormat::kLlama3Json, "", true),
                      "{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": "
                      "{\"city\": \"x\", \"unit\": \"c\"}}"));
  const grammar::Matcher mistral = matcher(ToolFormat::kMistral, "", true);
  EXPECT_TRUE(accepts(mistral,
                      "[{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": "
                      "{\"city\": \"x\"}}]"));
  EXPECT_FALSE(accepts(mistral, "[{\"name\": \"get_weather\", \"arguments\": {}}]"));  // city
  EXPECT_FALSE(accepts(matcher(ToolFormat::kMistral, "", false),
                       "[{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"now\", \"arguments\": {}}]"));
  EXPECT_FALSE(ToolCallGbnf(ToolFormat::kHermes, tools, "missing", true).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(ToolCallGbnf(ToolFormat::kNone, tools, "", true).status()));
}

}  // namespace
}  // namespace ps::server
