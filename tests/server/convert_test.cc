// The RPC edge's structured-output constraints (server/convert.h): each kind becomes
// a grammar's start state, a repeated one is the same compiled constraint, and what
// cannot be honoured is an error naming the field.
#include "server/convert.h"
#include "engine/sequence.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

class ConvertTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = Model::Load(PS_TESTDATA "/stories260K/stories260K.gguf")->release();
    defaults_ = new RequestDefaults();
    defaults_->strategies = std::make_shared<const StrategyDefaults>(*StrategyDefaults::ForModel(model_->config()));
    defaults_->grammar_vocab = GrammarVocabulary(*model_->tokenizer());
  }
  static void TearDownTestSuite() {
    delete defaults_;
    delete model_;
  }
  static absl::StatusOr<std::shared_ptr<Request>> Convert(const std::function<void(pb::GenerateRequest&)>& edit,
                                                          const RequestDefaults& defaults = *defaults_) {
    pb::GenerateRequest in;
    in.set_text("Once upon a time");
    edit(in);
    return RequestFromProto(in, *model_, defaults);
  }
  static Model* model_;
  static RequestDefaults* defaults_;
};
Model* ConvertTest::model_ = nullptr;
RequestDefaults* ConvertTest::defaults_ = nullptr;

TEST_F(ConvertTest, ConstraintsBecomeSharedGrammars) {
  auto schema = [](pb::GenerateRequest& r) { r.set_json_schema(R"({"type": "integer", "minimum": 1})"); };
  const auto a = Convert(schema);
  const auto b = Convert(schema);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_NE((*a)->spec.sampling.grammar, nullptr);
  EXPECT_EQ((*a)->spec.sampling.grammar, (*b)->spec.sampling.grammar);  // compiled once
  grammar::Matcher m = *(*a)->spec.sampling.grammar;
  EXPECT_TRUE(m.AcceptBytes("42") && m.CanEnd());
  EXPECT_FALSE(m.AcceptBytes("-"));
  const auto object = Convert([](pb::GenerateRequest& r) { r.set_json_object(true); });
  ASSERT_TRUE(object.ok());
  grammar::Matcher o = *(*object)->spec.sampling.grammar;
  EXPECT_TRUE(o.AcceptBytes(R"({"a": [1, null]})") && o.CanEnd());
  EXPECT_NE((*object)->spec.sampling.grammar, (*a)->spec.sampling.grammar);
  EXPECT_EQ((*Convert([](pb::GenerateRequest& r) { r.set_json_object(false); }))->spec.sampling.grammar, nullptr);
  EXPECT_EQ((*Convert([](pb::GenerateRequest&) {}))->spec.sampling.grammar, nullptr);
}

TEST_F(ConvertTest, ConstraintErrorsNameTheField) {
  auto error = [](const std::function<void(pb::GenerateRequest&)>& edit, const RequestDefaults& d = *defaults_) {
    const auto r = Convert(edit, d);
    EXPECT_FALSE(r.ok());
    return r.status();
  };
  absl::Status s = error([](auto& r) { r.set_json_schema("{"); });
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), ::testing::StartsWith("json_schema: not valid JSON"));
  s = error([](auto& r) { r.set_json_schema(R"({"type": "object", "minProperties": 2})"); });
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("json_schema: schema at minProperties"));
  s = error([](auto& r) { r.set_grammar("root ::= (\"a\""); });
  EXPECT_THAT(std::string(s.message()), ::testing::StartsWith("grammar: line 1 column 14"));
  RequestDefaults no_vocab = *defaults_;
  no_vocab.grammar_vocab = nullptr;
  s = error([](auto& r) { r.set_grammar("root ::= \"a\""); }, no_vocab);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
}

// Tools are offered through the chat template (their format known); a required or
// named call is a grammar; tools without messages, or with a template whose calls this
// server cannot read, are refused.
TEST_F(ConvertTest, ToolsAreOfferedAndRequiredCallsConstrained) {
  RequestDefaults d = *defaults_;
  d.chat = ChatTemplate::Create(
      "{% if tools %}{% for t in tools %}<tool_call>{{ t.function.name }}{% endfor %}{% endif %}"
      "{% for m in messages %}{{ m.content }}{% endfor %}",
      *model_->tokenizer());
  ASSERT_TRUE(d.chat.ok());
  d.tool_format = ToolFormat::kHermes;
  auto chat = [](pb::GenerateRequest& r) {
    r.mutable_messages()->add_messages()->set_content("Hi");
    pb::Tool* t = r.add_tools();
    t->set_name("now");
    t->set_parameters(R"({"type": "object"})");
  };
  const auto offered = Convert([&](pb::GenerateRequest& r) { chat(r); }, d);
  ASSERT_TRUE(offered.ok()) << offered.status();
  EXPECT_EQ((*offered)->spec.prompt, model_->tokenizer()->Encode("<tool_call>nowHi", false, true));
  EXPECT_EQ((*offered)->spec.sampling.grammar, nullptr);  // auto: the model decides
  const auto hidden = Convert(
      [&](pb::GenerateRequest& r) {
        chat(r);
        r.mutable_tool_choice()->set_mode(pb::ToolChoice::NONE);
      },
      d);
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  EXPECT_EQ((*hidden)->spec.prompt, model_->tokenizer()->Encode("Hi", false, true));
  const auto required = Convert(
      [&](pb::GenerateRequest& r) {
        chat(r);
        r.mutable_tool_choice()->set_mode(pb::ToolChoice::REQUIRED);
      },
      d);
  ASSERT_TRUE(required.ok()) << required.status();
  ASSERT_NE((*required)->spec.sampling.grammar, nullptr);
  grammar::Matcher m = *(*required)->spec.sampling.grammar;
  EXPECT_TRUE(m.AcceptBytes("<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>") && m.CanEnd());
  const auto missing = Convert(
      [&](pb::GenerateRequest& r) {
        chat(r);
        r.mutable_tool_choice()->set_mode(pb::ToolChoice::FUNCTION);
        r.mutable_tool_choice()->set_function("later");
      },
      d);
  EXPECT_THAT(std::string(missing.status().message()), ::testing::HasSubstr("no tool named 'later'"));
  const auto with_text = Convert([&](pb::GenerateRequest& r) { r.add_tools()->set_name("now"); }, d);
  EXPECT_TRUE(absl::IsInvalidArgument(with_text.status())) << with_text.status();
  d.tool_format = ToolFormat::kNone;
  const auto unreadable = Convert([&](pb::GenerateRequest& r) { chat(r); }, d);
  EXPECT_TRUE(absl::IsFailedPrecondition(unreadable.status())) << unreadable.status();
}

}  // namespace
}  // namespace ps::server
