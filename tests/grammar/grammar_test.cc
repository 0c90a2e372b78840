// The GBNF reader (grammar/grammar.h) and the matcher (grammar/matcher.h): what a
// grammar accepts byte by byte, UTF-8 classes against every code point, errors that
// name the place, and token masks equal to trying each token on its own.
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grammar/matcher.h"
#include "gtest/gtest.h"
#include "tests/grammar/byte_vocabulary.h"

namespace ps::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> Compile(std::string_view gbnf) {
  absl::StatusOr<Grammar> g = Grammar::FromGbnf(gbnf);
  EXPECT_TRUE(g.ok()) << g.status();
  return std::make_shared<const CompiledGrammar>(*std::move(g));
}

using testing::ByteVocabulary;

// Whether the whole of `text` is a sentence of the grammar.
bool Matches(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  static const auto* vocab = new std::shared_ptr<const Vocabulary>(ByteVocabulary());
  Matcher m(g, *vocab);
  return m.AcceptBytes(text) && m.CanEnd();
}

TEST(Grammar, AcceptsItsSentencesByteByByte) {
  auto g = Compile(R"(root ::= answer ("," answer)*   # comments are ignored
                      answer ::= "yes" | "no" | [0-9]{2,3} | "maybe"?)");
  for (const char* ok : {"yes", "no,yes", "12", "123,no", "", "maybe", "yes,,no"}) EXPECT_TRUE(Matches(g, ok)) << ok;
  for (const char* bad : {"ye", "1", "1234", "yes no", "nope", "yes,x"}) {
    Matcher m(g, ByteVocabulary());
    EXPECT_FALSE(m.AcceptBytes(bad) && m.CanEnd()) << bad;
  }
  Matcher m(g, ByteVocabulary());
  EXPECT_TRUE(m.AcceptBytes("ye"));  // a prefix is accepted,
  EXPECT_FALSE(m.CanEnd());          // not a sentence,
  EXPECT_FALSE(m.AcceptBytes("x"));  // and what cannot follow is refused
  EXPECT_TRUE(m.AcceptBytes("s"));   // without changing the state
  EXPECT_TRUE(m.CanEnd());
}

TEST(Grammar, EscapesGroupsAndNullableRepetitions) {
  auto g = Compile("root ::= (\"a\"? \"b\"?)* \"\\x41\\u00e9\\n\\\"\" [\\]\\-]+ .");
  EXPECT_TRUE(Matches(g, "abbaAé\n\"]-]z"));
  EXPECT_TRUE(Matches(g, "Aé\n\"-🙂"));
  EXPECT_FALSE(Matches(g, "Aé\n\"z"));
}

// Every code point (surrogates aside) against classes with ranges in each UTF-8
// length, negated and not: the byte-level rules accept exactly the members.
TEST(Grammar, Utf8ClassesMatchExactlyTheirCodePoints) {
  struct Case {
    const char* cls;
    std::function<bool(uint32_t)> member;
  };
  const Case cases[] = {
      {"[a-z\\u00e0-\\u00ff\\u0400-\\u052f\\u4e00-\\u9fff\\U0001F600-\\U0001F64F]",
       [](uint32_t c) {
         return (c >= 'a' && c <= 'z') || (c >= 0xE0 && c <= 0xFF) || (c >= 0x400 && c <= 0x52F) ||
                (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x1F600 && c <= 0x1F64F);
       }},
      {"[^\"\\\\\\x00-\\x1f]", [](uint32_t c) { return c != '"' && c != '\\' && c >= 0x20; }},
      {"[\\u07ff-\\u0800\\uffff\\U00010000\\U0010ffff]",
       [](uint32_t c) { return c == 0x7FF || c == 0x800 || c == 0xFFFF || c == 0x10000 || c == 0x10FFFF; }},
  };
  for (const Case& c : cases) {
    auto g = Compile(absl::StrCat("root ::= ", c.cls));
    int wrong = 0;
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp += (cp < 0x20000 ? 1 : 97)) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      std::string utf8;
      if (cp < 0x80) {
        utf8 = std::string(1, static_cast<char>(cp));
      } else if (cp < 0x800) {
        utf8 = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
      } else if (cp < 0x10000) {
        utf8 = {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
                static_cast<char>(0x80 | (cp & 0x3F))};
      } else {
        utf8 = {static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
                static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
      }
      if (Matches(g, utf8) != c.member(cp) && ++wrong <= 5) ADD_FAILURE() << c.cls << " at U+" << std::hex << cp;
    }
    EXPECT_EQ(wrong, 0) << c.cls;
    // Bytes that are not UTF-8 never match.
    EXPECT_FALSE(Matches(g, "\xC0\x80"));
    EXPECT_FALSE(Matches(g, "\xED\xA0\x80"));  // a surrogate
    EXPECT_FALSE(Matches(g, "\xFF"));
  }
}

TEST(Grammar, ErrorsNameThePlace) {
  auto error = [](std::string_view gbnf) {
    absl::StatusOr<Grammar> g = Grammar::FromGbnf(gbnf);
    EXPECT_FALSE(g.ok()) << gbnf;
    return std::string(g.status().message());
  };
  EXPECT_THAT(error("root ::= \"a\"\nx ::= [a-"), ::testing::HasSubstr("line 2 column 10"));
  EXPECT_THAT(error("root ::= item"), ::testing::HasSubstr("rule 'item' is used but not defined"));
  EXPECT_THAT(error("root ::= root \"a\" | \"b\""), ::testing::HasSubstr("'root' is left-recursive"));
  EXPECT_THAT(error("root ::= x\nx ::= y? root \"a\"\ny ::= \"b\""), ::testing::HasSubstr("left-recursive"));
  EXPECT_THAT(error("start ::= \"a\""), ::testing::HasSubstr("no rule 'root'"));
  EXPECT_THAT(error("root ::= \"a\"{3,2}"), ::testing::HasSubstr("m <= n"));
  EXPECT_THAT(error("root ::= \"a\"{1001}"), ::testing::HasSubstr("above 1000"));
  EXPECT_THAT(error("root ::= \"a\"\nroot ::= \"b\""), ::testing::HasSubstr("one definition of rule 'root'"));
  EXPECT_THAT(error("root ::= \"\\q\""), ::testing::HasSubstr("an escape"));
  EXPECT_THAT(error(std::string(200, '(')), ::testing::HasSubstr("rule name"));
  EXPECT_THAT(error("root ::= " + std::string(200, '(')), ::testing::HasSubstr("less nesting"));
  // Right recursion (a tail reference) is fine, and its stack does not grow.
  EXPECT_TRUE(Matches(Compile("root ::= \"a\" root | \"b\""), std::string(10000, 'a') + "b"));
}

constexpr std::string_view kJson = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)";

// The mask equals trying every token on its own, along random walks through a JSON
// grammar with multi-byte tokens (prefixes of each other, UTF-8 pieces, a stop).
TEST(Matcher, MaskEqualsEachTokenTriedAlone) {
  auto g = Compile(kJson);
  auto vocab = ByteVocabulary({"{\"",  "\":",  "\": \"", "\"}",  "true",         "tr",       "null,", "12",
                               "1.5e", "é",    "\xC3",   "\xA9", "数字",         "\xE6\x95", "\\u00", "\\n",
                               "  ",   "\n  ", "}",      "]",    "[{\"a\": 1}]", "\"\"",     "-0"});
  std::mt19937 rng(7);
  const int words = (vocab->size() + 63) / 64;
  for (int walk = 0; walk < 40; ++walk) {
    Matcher m(g, vocab);
    for (int step = 0; step < 60 && !m.Done(); ++step) {
      std::vector<uint64_t> mask(words);
      m.FillMask(mask);
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < vocab->size(); ++t) {
        Matcher alone = m;
        const bool want = alone.AcceptToken(t);
        const bool got = (mask[t >> 6] >> (t & 63)) & 1;
        ASSERT_EQ(got, want) << "walk " << walk << " step " << step << " token " << t;
        if (want) allowed.push_back(t);
      }
      ASSERT_FALSE(allowed.empty()) << "a state with no way on";
      ASSERT_TRUE(m.AcceptToken(allowed[rng() % allowed.size()]));
    }
  }
}

TEST(Matcher, StopsOnlyWhereTheGrammarMayEnd) {
  auto g = Compile("root ::= \"ab\" | \"abc\"");
  Matcher m(g, ByteVocabulary());
  EXPECT_FALSE(m.AcceptToken(0));  // not yet
  EXPECT_TRUE(m.AcceptBytes("ab"));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.Done());  // "c" may follow
  std::vector<uint64_t> mask(4);
  m.FillMask(mask);
  EXPECT_EQ(mask[0], uint64_t{1});                // the stop (token 0)
  EXPECT_EQ(mask[1], uint64_t{1} << ('c' - 64));  // and "c" (token 99)
  EXPECT_EQ(mask[2] | mask[3], uint64_t{0});
  EXPECT_TRUE(m.AcceptBytes("c"));
  EXPECT_TRUE(m.Done());
  EXPECT_TRUE(m.AcceptToken(0));
  EXPECT_FALSE(m.AcceptToken(0));  // nothing after the stop
}

}  // namespace
}  // namespace ps::grammar
