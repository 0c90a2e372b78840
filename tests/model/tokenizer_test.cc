// Tokenizers against llama.cpp's test vectors and the stories260K references.
#include <fstream>
#include <sstream>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/mapped_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/pretokenizer.h"
#include "model/tokenizer/tokenizer.h"

namespace ps {
namespace {

const std::string kVectors = std::string(PS_TESTDATA) + "/tokenizers/vectors/";
const std::string kTokenizers = std::string(PS_TESTDATA) + "/tokenizers/";

std::unique_ptr<Tokenizer> FromGgufPath(const std::string& path) {
  auto f = GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  auto t = Tokenizer::FromGguf(**f);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

std::unique_ptr<Tokenizer> FromJson(const std::string& name) {
  auto json = ReadFileToString(kTokenizers + name + ".tokenizer.json");
  EXPECT_TRUE(json.ok()) << json.status();
  auto config = ReadFileToString(kTokenizers + name + ".tokenizer_config.json");
  auto t = Tokenizer::FromHfJson(*json, config.value_or(""));
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

struct Vector {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<Vector> LoadVectors(const std::string& stem) {
  auto inp = ReadFileToString(kVectors + stem + ".inp");
  auto out = ReadFileToString(kVectors + stem + ".out");
  EXPECT_TRUE(inp.ok() && out.ok());
  std::vector<std::string> texts = absl::StrSplit(*inp, "\n__ggml_vocab_test__\n");
  if (!texts.empty() && texts.back().empty()) texts.pop_back();
  std::vector<std::string> lines = absl::StrSplit(*out, '\n');
  std::vector<Vector> v;
  for (size_t i = 0; i < texts.size(); ++i) {
    Vector x{texts[i], {}};
    for (absl::string_view s : absl::StrSplit(lines.at(i), ' ', absl::SkipEmpty()))
      x.ids.push_back(std::stoi(std::string(s)));
    v.push_back(std::move(x));
  }
  return v;
}

void CheckVectors(const Tokenizer& tok, const std::string& stem, bool check_decode = true) {
  const auto vectors = LoadVectors(stem);
  ASSERT_GE(vectors.size(), 40u) << stem;
  int failures = 0;
  for (const Vector& v : vectors) {
    const std::vector<int32_t> got = tok.Encode(v.text, /*add_special=*/false, /*parse_special=*/false);
    EXPECT_EQ(absl::StrJoin(got, " "), absl::StrJoin(v.ids, " ")) << stem << " text: '" << v.text << "'";
    failures += got != v.ids;
    if (check_decode) {
      EXPECT_EQ(tok.Decode(got), v.text) << stem << " decode";
    }
  }
  EXPECT_EQ(failures, 0) << stem << ": " << failures << " of " << vectors.size() << " strings differ";
}

TEST(TokenizerVectors, LlamaSpm) {
  CheckVectors(*FromGgufPath(kVectors + "ggml-vocab-llama-spm.gguf"), "ggml-vocab-llama-spm.gguf");
}
TEST(TokenizerVectors, Phi3) {
  CheckVectors(*FromGgufPath(kVectors + "ggml-vocab-phi-3.gguf"), "ggml-vocab-phi-3.gguf");
}
TEST(TokenizerVectors, Gpt2) {
  CheckVectors(*FromGgufPath(kVectors + "ggml-vocab-gpt-2.gguf"), "ggml-vocab-gpt-2.gguf");
}
TEST(TokenizerVectors, Llama3Json) { CheckVectors(*FromJson("llama3"), "ggml-vocab-llama-bpe.gguf"); }
TEST(TokenizerVectors, Qwen2Json) { CheckVectors(*FromJson("qwen2"), "ggml-vocab-qwen2.gguf"); }

std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[++i];
      out.push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c);
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

TEST(TokenizerStories, MatchesLlamaCppTokenization) {
  auto tok = FromGgufPath(std::string(PS_TESTDATA) + "/stories260K/stories260K.gguf");
  auto tsv = ReadFileToString(std::string(PS_TESTDATA) + "/stories260K/tokenization.tsv");
  ASSERT_TRUE(tsv.ok());
  std::vector<std::string> lines = absl::StrSplit(*tsv, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 8u);
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> cols = absl::StrSplit(lines[i], '\t');
    ASSERT_GE(cols.size(), 5u);
    const std::string text = Unescape(cols[1]);
    EXPECT_EQ(absl::StrJoin(tok->Encode(text, true, false), " "), cols[4]) << "prompt " << i - 1;
    const std::string without = cols.size() > 6 ? cols[6] : "";
    EXPECT_EQ(absl::StrJoin(tok->Encode(text, false, false), " "), without) << "prompt " << i - 1;
  }
}

TEST(Tokenizer, StreamDecoderNeverSplitsCharacters) {
  auto tok = FromGgufPath(std::string(PS_TESTDATA) + "/stories260K/stories260K.gguf");
  const std::string text = "unicode: café naïve 日本";
  const auto ids = tok->Encode(text, false, false);
  StreamDecoder dec(*tok);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = dec.Push(id);
    // every emitted piece is valid UTF-8 on its own
    size_t i = 0;
    while (i < piece.size()) {
      const unsigned char c = piece[i];
      const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
      ASSERT_LE(i + len, piece.size()) << "split character in '" << piece << "'";
      i += len;
    }
    streamed += piece;
  }
  streamed += dec.Flush();
  EXPECT_EQ(streamed, " " + text);  // generation continues a text: the dummy-prefix space stays
}

TEST(Tokenizer, SpecialTokensParsedOnlyWhenAsked) {
  auto tok = FromJson("qwen2");
  const auto with = tok->Encode("<|im_start|>user", false, true);
  ASSERT_FALSE(with.empty());
  EXPECT_EQ(with[0], *tok->FindToken("<|im_start|>"));
  const auto without = tok->Encode("<|im_start|>user", false, false);
  EXPECT_NE(without[0], *tok->FindToken("<|im_start|>"));
  EXPECT_TRUE(tok->IsEndOfGeneration(*tok->FindToken("<|im_end|>")));
}

TEST(PreTokenizer, Llama3Splits) {
  const auto pieces = PreTokenize(PreTokenizer::kLlama3, "Hello world's 12345 \n\n  x!!");
  EXPECT_EQ(absl::StrJoin(pieces, "|"), "Hello| world|'s| |123|45| \n\n| | x|!!");
}

TEST(PreTokenizer, SmolLMSplitsDigits) {
  const auto pieces = PreTokenize(PreTokenizer::kSmolLM, "in 2024, yes");
  EXPECT_EQ(absl::StrJoin(pieces, "|"), "in| |2|0|2|4|,| yes");
}

// Qwen2.5's template (the branches of its system turn, as in its GGUF, newlines
// written as Jinja escapes): its default system turn when the conversation has none,
// the caller's otherwise, the generation prompt on request. The special tokens the
// template writes are parsed, and nothing is added (Qwen has no BOS).
TEST(ChatTemplate, RendersQwen25sSystemTurns) {
  const std::unique_ptr<Tokenizer> tok = FromJson("qwen2");
  const absl::StatusOr<ChatTemplatePtr> t = ChatTemplate::Create(
      R"({%- if messages[0]['role'] == 'system' %})"
      R"({{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}{%- else %})"
      R"({{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }})"
      R"({%- endif %}{%- for message in messages %}{%- if message.role != 'system' or not loop.first %})"
      R"({{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}{%- endif %}{%- endfor %})"
      R"({%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %})",
      *tok);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<ChatMessage> msgs = {{"user", "Hi"}};
  const std::string with_default =
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(*(*t)->Apply(msgs), with_default);
  const absl::StatusOr<std::vector<int32_t>> ids = (*t)->Encode(msgs);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, tok->Encode(with_default, false, true));
  EXPECT_EQ((*ids)[0], *tok->FindToken("<|im_start|>"));
  msgs.insert(msgs.begin(), ChatMessage{"system", "Be brief."});
  msgs.push_back({"assistant", "Hello."});
  EXPECT_EQ(*(*t)->Apply(msgs, /*add_generation_prompt=*/false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n");
}

// The tokenizer's own template (tokenizer_config.json's chat_template) is the default.
TEST(ChatTemplate, LoadsTheTokenizersOwnTemplate) {
  const std::unique_ptr<Tokenizer> tok = FromJson("qwen2");
  const absl::StatusOr<ChatTemplatePtr> t = ChatTemplate::Load(*tok, "");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->source(), tok->chat_template());
  const std::vector<ChatMessage> msgs = {{"user", "Hi"}};
  const std::string text = *(*t)->Apply(msgs);
  EXPECT_THAT(text, testing::HasSubstr("<|im_start|>user\nHi<|im_end|>\n"));
  EXPECT_THAT(text, testing::EndsWith("<|im_start|>assistant\n"));
}

// LLaMA 3's template writes bos_token itself: the prompt starts with exactly one BOS.
TEST(ChatTemplate, TheTemplatesBosIsTheOnlyOne) {
  const std::unique_ptr<Tokenizer> tok = FromJson("llama3");
  const absl::StatusOr<ChatTemplatePtr> t = ChatTemplate::Load(*tok, "");
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<ChatMessage> msgs = {{"system", "S"}, {"user", " U "}};
  EXPECT_EQ(*(*t)->Apply(msgs),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user"
            "<|end_header_id|>\n\nU<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  const std::vector<int32_t> ids = *(*t)->Encode(msgs);
  ASSERT_GT(ids.size(), 2u);
  EXPECT_EQ(ids[0], tok->bos_id());
  EXPECT_NE(ids[1], tok->bos_id());
}

// Tools and a tool conversation reach the template as transformers gives them: the
// tools list, a call's arguments as an object (from JSON text, as vLLM passes them),
// a tool message's call id and name.
TEST(ChatTemplate, ToolsAndCallsReachTheTemplate) {
  const std::unique_ptr<Tokenizer> tok = FromJson("qwen2");
  const absl::StatusOr<ChatTemplatePtr> t = ChatTemplate::Create(
      "{% if tools %}{% for t in tools %}{{ t.function.name }};{% endfor %}{% endif %}{% for m in messages %}{{ m.role "
      "}}:{{ m.content }}"
      "{% for c in m.tool_calls %}[{{ c.id }} {{ c.function.name }} {{ c.function.arguments.city }}]{% endfor %}"
      "{% if m.tool_call_id is defined %}({{ m.tool_call_id }} {{ m.name }}){% endif %}|{% endfor %}",
      *tok);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<ChatMessage> msgs = {
      {.role = "user", .content = "Weather?"},
      {.role = "assistant", .tool_calls = {{.id = "c1", .name = "get_weather", .arguments = R"({"city": "Oslo"})"}}},
      {.role = "tool", .content = "cold", .tool_call_id = "c1", .name = "get_weather"}};
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "get_weather"}}, {"type": "function", "function": {"name": "add"}}])");
  EXPECT_EQ(*(*t)->Apply(msgs, true, tools),
            "get_weather;add;user:Weather?|assistant:[c1 get_weather Oslo]|tool:cold(c1 get_weather)|");
  EXPECT_EQ(*(*t)->Apply(msgs), "user:Weather?|assistant:[c1 get_weather Oslo]|tool:cold(c1 get_weather)|");
}

TEST(ChatTemplate, RefusalsAndMissingTemplatesSayWhy) {
  const std::unique_ptr<Tokenizer> tok = FromJson("qwen2");
  // A template's raise_exception is the client's error, with the template's words.
  const absl::StatusOr<ChatTemplatePtr> strict = ChatTemplate::Create(
      "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
      "{{ raise_exception('roles must be user or assistant') }}{% endif %}{{ m.content }}{% endfor %}",
      *tok);
  ASSERT_TRUE(strict.ok()) << strict.status();
  const std::vector<ChatMessage> robot = {{"robot", "x"}};
  const absl::Status refused = (*strict)->Apply(robot).status();
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(std::string(refused.message()), testing::HasSubstr("refused the conversation: roles must be user"));
  EXPECT_TRUE(absl::IsInvalidArgument((*strict)->Apply({}).status()));
  // A template the interpreter cannot parse names its line.
  const absl::Status bad = ChatTemplate::Create("line one\n{% for m in messages %}", *tok).status();
  EXPECT_TRUE(absl::IsInvalidArgument(bad)) << bad;
  EXPECT_THAT(std::string(bad.message()), testing::HasSubstr("line"));
  // No template at all, or a file that is not there.
  const std::unique_ptr<Tokenizer> bare = FromJson("mistral-v0.1");
  ASSERT_TRUE(bare->chat_template().empty());
  const absl::Status none = ChatTemplate::Load(*bare, "").status();
  EXPECT_TRUE(absl::IsFailedPrecondition(none)) << none;
  EXPECT_THAT(std::string(none.message()), testing::HasSubstr("--chat-template"));
  EXPECT_TRUE(absl::IsNotFound(ChatTemplate::Load(*bare, "/nonexistent/t.jinja").status()));
}

}  // namespace
}  // namespace ps

namespace ps {
namespace {

// Found by fuzz_tokenizer_json: a negative added-token id wrote before the vocabulary.
TEST(TokenizerHfJson, AddedTokenIdsOutsideTheVocabularyAreErrors) {
  const std::string json =
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
          "added_tokens": [{"id": -2, "content": "<s>", "special": true}]})";
  const auto tok = Tokenizer::FromHfJson(json, "");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().message(), "tokenizer.json: bad added token id");
}

// Found by fuzz_tokenizer_json: a float id (2.6e26) was converted to int64 (undefined behaviour).
TEST(TokenizerHfJson, FloatTokenIdsAreErrors) {
  for (const char* json : {R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 2.6e26}, "merges": []}})",
                           R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
                               "added_tokens": [{"id": 1.5, "content": "<s>"}]})"}) {
    const auto tok = Tokenizer::FromHfJson(json, "");
    ASSERT_FALSE(tok.ok()) << json;
    EXPECT_THAT(tok.status().message(), ::testing::HasSubstr("token id must be an integer, not number")) << json;
  }
}

}  // namespace
}  // namespace ps
