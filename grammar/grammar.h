// A context-free grammar over bytes, for constrained decoding: rules of
// alternatives, each a sequence of byte sets and references to rules. Read from
// llama.cpp's GBNF text (`root ::= "yes" | "no"`; literals with \n \t \r \" \\ \xHH
// \uHHHH \UHHHHHHHH escapes, character classes `[a-z]` `[^"\\]`, `.`, groups, `*` `+`
// `?` `{m}` `{m,}` `{m,n}`, `#` comments). Characters are Unicode code points matched
// as their UTF-8 bytes: a class becomes alternatives of byte-range sequences, so
// matching runs on bytes and a token may end inside a character. Repetitions become
// right-recursive helper rules. A reference to an undefined rule and left recursion
// are errors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ps::grammar {

struct ByteSet {
  uint64_t bits[4] = {0, 0, 0, 0};
  bool Has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void Add(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) bits[b >> 6] |= uint64_t{1} << (b & 63);
  }
  bool operator==(const ByteSet&) const = default;
};

struct Element {
  enum class Kind : uint8_t { kBytes, kRule };
  Kind kind = Kind::kBytes;
  int32_t index = 0;  // into Grammar::byte_sets or Grammar::rules
};

struct Grammar {
  using Sequence = std::vector<Element>;
  struct Rule {
    std::string name;
    std::vector<Sequence> alternatives;  // an empty sequence matches the empty string
  };
  std::vector<ByteSet> byte_sets;
  std::vector<Rule> rules;
  int32_t root = 0;

  // InvalidArgument naming the line and column for a syntax error, or the rule for
  // an undefined reference or left recursion. `root` names the start rule.
  static absl::StatusOr<Grammar> FromGbnf(std::string_view text, std::string_view root = "root");
};

// Limits that keep a hostile grammar from exhausting memory or stack.
inline constexpr size_t kMaxGrammarBytes = 1 << 20;
inline constexpr int kMaxGrammarNesting = 128;
inline constexpr int kMaxRepetition = 1000;  // {m,n}: m and n at most this
inline constexpr size_t kMaxGrammarElements = 1 << 20;

}  // namespace ps::grammar
