// Regular expressions to grammars (grammar/regex.h), judged by std::regex (ECMAScript):
// on random strings over each pattern's alphabet the grammar accepts exactly what
// std::regex_match does, and the grammar's random sentences all match; a JSON string's
// pattern leaves out what JSON escapes and is unanchored unless told; what is not
// supported is an error with its offset.
#include "grammar/regex.h"

#include <algorithm>
#include <random>
#include <regex>

#include "gmock/gmock.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "gtest/gtest.h"
#include "tests/grammar/byte_vocabulary.h"
#include "tests/grammar/random_sentence.h"

namespace ps::grammar {
namespace {

std::shared_ptr<const Vocabulary> Bytes() {
  static const auto* v = new std::shared_ptr<const Vocabulary>(testing::ByteVocabulary());
  return *v;
}

std::shared_ptr<const CompiledGrammar> Compile(std::string_view regex, RegexMode mode) {
  absl::StatusOr<std::string> expr = RegexToGbnf(regex, mode);
  EXPECT_TRUE(expr.ok()) << regex << ": " << expr.status();
  absl::StatusOr<Grammar> g = Grammar::FromGbnf("root ::= " + expr.value_or("\"\""));
  EXPECT_TRUE(g.ok()) << regex << ": " << g.status() << "\n" << *expr;
  return std::make_shared<const CompiledGrammar>(*std::move(g));
}

bool Accepts(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  Matcher m(g, Bytes());
  return m.AcceptBytes(text) && m.CanEnd();
}

TEST(Regex, TheGrammarAcceptsWhatStdRegexMatches) {
  struct Case {
    const char* regex;
    const char* alphabet;  // random strings are drawn from it
  };
  const Case cases[] = {
      {"[a-c]+", "abcd"},
      {"\\d{3}-\\d{2}", "019-"},
      {"(ab|cd)*e?", "abcde"},
      {"[^0-9]{2,4}x", "0ax9"},
      {"a.c", "abc\n"},
      {"(?:foo|ba[rz])+", "fobarz"},
      {"\\w+@\\w+\\.com", "a_1@.com"},
      {"colou?r", "colur"},
      {"[A-Fa-f0-9]{1,}", "aFg9"},
      {"x{2,}y{0,1}", "xy"},
      {"[-+]?\\d+(\\.\\d+)?", "-+1.0"},
      {"[\\d\\s]+", "1 a\t"},
      {"[^\\w]|\\W\\D", "a1 -"},
      {"a{0}b|c{1}", "abc"},
      {"^(a|b)*$", "abc"},
      {"[\\]\\-]\\[\\*\\?", "]-[*?a"},
      {"(a|)(b?)+c", "abc"},
  };
  std::mt19937 rng(11);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.regex);
    const std::regex reference(c.regex, std::regex::ECMAScript);
    const auto g = Compile(c.regex, RegexMode::kWhole);
    const std::string alphabet = c.alphabet;
    for (int k = 0; k < 3000; ++k) {
      std::string s(rng() % 7, ' ');
      for (char& ch : s) ch = alphabet[rng() % alphabet.size()];
      EXPECT_EQ(Accepts(g, s), std::regex_match(s, reference)) << "'" << s << "'";
    }
    // std::regex reads bytes: it judges the ASCII sentences.
    int judged = 0;
    for (int k = 0; k < 400; ++k) {
      const std::string s = testing::RandomSentence(g, Bytes(), rng, "");
      if (std::any_of(s.begin(), s.end(), [](char ch) { return static_cast<unsigned char>(ch) >= 0x80; })) continue;
      ++judged;
      EXPECT_TRUE(std::regex_match(s, reference)) << "sentence '" << s << "'";
    }
    EXPECT_GE(judged, 20);
  }
}

TEST(Regex, UnicodeCharactersAndClassesMatchTheirUtf8) {
  const auto g = Compile("[α-ω]+ é\\u00e8", RegexMode::kWhole);
  EXPECT_TRUE(Accepts(g, "αβω éè"));
  EXPECT_FALSE(Accepts(g, "ab éè"));
  EXPECT_FALSE(Accepts(g, "αβ ee"));
  EXPECT_TRUE(Accepts(Compile("[^a]", RegexMode::kWhole), "€"));
  EXPECT_FALSE(Accepts(Compile(".", RegexMode::kWhole), "\n"));
  EXPECT_TRUE(Accepts(Compile("a{,3}", RegexMode::kWhole), "a{,3}"));  // not a repetition: its characters
}

TEST(Regex, AJsonStringsPatternLeavesOutWhatJsonEscapesAndIsUnanchored) {
  // Unanchored: the match may be anywhere in the string.
  const auto anywhere = Compile("\\d{3}", RegexMode::kJsonString);
  EXPECT_TRUE(Accepts(anywhere, "123"));
  EXPECT_TRUE(Accepts(anywhere, "ab123cd"));
  EXPECT_FALSE(Accepts(anywhere, "12"));
  EXPECT_FALSE(Accepts(anywhere, "ab\"123"));  // a quote would end the string
  const auto anchored = Compile("^[A-Z][a-z]*$", RegexMode::kJsonString);
  EXPECT_TRUE(Accepts(anchored, "Paris"));
  EXPECT_FALSE(Accepts(anchored, " Paris"));
  EXPECT_FALSE(Accepts(anchored, "Paris!"));
  // Classes and `.` leave out quotes, backslashes and control characters.
  const auto any = Compile("^.*$", RegexMode::kJsonString);
  EXPECT_TRUE(Accepts(any, "héllo {}"));
  EXPECT_FALSE(Accepts(any, "a\"b"));
  EXPECT_FALSE(Accepts(any, "a\\b"));
  EXPECT_FALSE(Accepts(any, "a\tb"));
  EXPECT_FALSE(Accepts(Compile("^[^a]$", RegexMode::kJsonString), "\""));
  // A pattern that needs one of them cannot be written plainly.
  for (const char* needs_escape : {"a\"b", "\\\\", "\\n", "[\"\\\\]"}) {
    absl::StatusOr<std::string> r = RegexToGbnf(needs_escape, RegexMode::kJsonString);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << needs_escape;
    EXPECT_THAT(r.status().message(), ::testing::HasSubstr("JSON writes escaped")) << needs_escape;
  }
}

TEST(Regex, WhatIsNotSupportedIsAnErrorWithItsOffset) {
  const std::pair<const char*, const char*> bad[] = {
      {"(a)\\1", "at offset 4: the escape '\\1'"},
      {"a(?=b)", "at offset 1: '(?' (lookaround"},
      {"\\bword", "at offset 1: the escape '\\b'"},
      {"a$b", "at offset 2: '$' before the pattern's end"},
      {"a^", "at offset 1: '^' after the pattern's start"},
      {"*a", "at offset 0: expected something to repeat"},
      {"a**", "at offset 2: expected one quantifier per item"},
      {"a++", "at offset 2: a possessive quantifier"},
      {"(ab", "at offset 3: expected ')'"},
      {"ab)", "at offset 2: expected no unbalanced ')'"},
      {"[b-a]", "at offset 4: expected a range from a lower"},
      {"[ab", "at offset 3: expected ']'"},
      {"a{2000}", "a repetition count above 1000"},
      {"a{3,2}", "expected {m,n} with m <= n"},
      {"\xff", "expected valid UTF-8"},
      {"a\xf6\xbf\xa4\xa1", "at offset 1: expected valid UTF-8"},  // beyond U+10FFFF (a fuzzer's find)
  };
  for (const auto& [regex, message] : bad) {
    absl::StatusOr<std::string> r = RegexToGbnf(regex, RegexMode::kWhole);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << regex;
    EXPECT_THAT(r.status().message(), ::testing::HasSubstr(message)) << regex;
  }
}

}  // namespace
}  // namespace ps::grammar
