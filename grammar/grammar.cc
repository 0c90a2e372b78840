#include "grammar/grammar.h"

#include <algorithm>
#include <array>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grammar/utf8.h"

namespace ps::grammar {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code point ranges, inclusive

int EncodedLength(uint32_t cp) { return cp <= 0x7F ? 1 : cp <= 0x7FF ? 2 : cp <= 0xFFFF ? 3 : 4; }

void Encode(uint32_t cp, uint8_t* out) {
  switch (EncodedLength(cp)) {
    case 1: out[0] = static_cast<uint8_t>(cp); break;
    case 2:
      out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
      out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    case 3:
      out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    default:
      out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  }
}

// The code points [s, e] (surrogates left out) as sequences of byte ranges, each
// matching the UTF-8 encodings of a sub-range: split where the encoded length changes,
// then where a continuation byte would not run over its whole range.
void Utf8Sequences(uint32_t s, uint32_t e, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  if (s > e) return;
  if (s < 0xD800 && e > 0xDFFF) {
    Utf8Sequences(s, 0xD7FF, out);
    Utf8Sequences(0xE000, e, out);
    return;
  }
  if (s >= 0xD800 && s <= 0xDFFF) s = 0xE000;
  if (e >= 0xD800 && e <= 0xDFFF) e = 0xD7FF;
  if (s > e) return;
  for (uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (s <= max && e > max) {
      Utf8Sequences(s, max, out);
      Utf8Sequences(max + 1, e, out);
      return;
    }
  }
  const int n = EncodedLength(s);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((s & ~m) != (e & ~m)) {
      if ((s & m) != 0) {
        Utf8Sequences(s, s | m, out);
        Utf8Sequences((s | m) + 1, e, out);
        return;
      }
      if ((e & m) != m) {
        Utf8Sequences(s, (e & ~m) - 1, out);
        Utf8Sequences(e & ~m, e, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  Encode(s, a);
  Encode(e, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
  out->push_back(std::move(seq));
}

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  absl::StatusOr<Grammar> Run(std::string_view root) {
    if (s_.size() > kMaxGrammarBytes) return absl::InvalidArgumentError("grammar: longer than 1 MiB");
    SkipSpace();
    if (Eof()) return absl::InvalidArgumentError("grammar: empty");
    while (!Eof()) {
      const size_t at = i_;
      std::string name = ParseName();
      if (name.empty()) return Error("a rule name");
      SkipSpace();
      if (s_.substr(i_, 3) != "::=") return Error("'::='");
      i_ += 3;
      const int32_t r = RuleIndex(name);
      if (defined_[r]) {
        i_ = at;
        return Error(absl::StrCat("one definition of rule '", name, "'"));
      }
      defined_[r] = true;
      current_ = name;
      absl::StatusOr<std::vector<Grammar::Sequence>> alts = ParseAlternatives();
      if (!alts.ok()) return alts.status();
      g_.rules[r].alternatives = *std::move(alts);
      SkipSpace();
      if (!Eof() && !AtRuleStart()) return Error("a rule definition (NAME ::= ...)");
    }
    for (size_t r = 0; r < g_.rules.size(); ++r) {
      if (!defined_[r])
        return absl::InvalidArgumentError(
            absl::StrCat("grammar: rule '", g_.rules[r].name, "' is used but not defined"));
    }
    const auto root_it = names_.find(std::string(root));
    if (root_it == names_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("grammar: no rule '", std::string(root), "' (the start rule)"));
    }
    g_.root = root_it->second;
    if (absl::Status s = CheckLeftRecursion(); !s.ok()) return s;
    return std::move(g_);
  }

 private:
  bool Eof() const { return i_ >= s_.size(); }
  char Peek() const { return Eof() ? '\0' : s_[i_]; }

  absl::Status Error(const std::string& expected) const {
    int line = 1, col = 1;
    for (size_t k = 0; k < i_ && k < s_.size(); ++k) {
      if (s_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return absl::InvalidArgumentError(absl::StrCat("grammar: line ", line, " column ", col, ": expected ", expected));
  }

  void SkipSpace() {
    while (!Eof()) {
      if (s_[i_] == '#') {
        while (!Eof() && s_[i_] != '\n') ++i_;
      } else if (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r') {
        ++i_;
      } else {
        break;
      }
    }
  }

  static bool NameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }
  std::string ParseName() {
    const size_t start = i_;
    while (!Eof() && NameChar(s_[i_])) ++i_;
    return std::string(s_.substr(start, i_ - start));
  }
  // At `NAME ::=`: the next rule's start, which ends the current one.
  bool AtRuleStart() const {
    size_t k = i_;
    while (k < s_.size() && NameChar(s_[k])) ++k;
    if (k == i_) return false;
    while (k < s_.size() && (s_[k] == ' ' || s_[k] == '\t' || s_[k] == '\n' || s_[k] == '\r')) ++k;
    return s_.substr(k, 3) == "::=";
  }

  int32_t RuleIndex(const std::string& name) {
    auto [it, fresh] = names_.emplace(name, static_cast<int32_t>(g_.rules.size()));
    if (fresh) {
      g_.rules.push_back({.name = name});
      defined_.push_back(false);
    }
    return it->second;
  }
  int32_t NewRule(std::vector<Grammar::Sequence> alternatives) {
    const int32_t r = static_cast<int32_t>(g_.rules.size());
    g_.rules.push_back({.name = absl::StrCat(current_, "_", ++helpers_), .alternatives = std::move(alternatives)});
    defined_.push_back(true);
    return r;
  }
  Element Bytes(const ByteSet& set) {
    auto [it, fresh] =
        byte_set_index_.emplace(std::array<uint64_t, 4>{set.bits[0], set.bits[1], set.bits[2], set.bits[3]},
                                static_cast<int32_t>(g_.byte_sets.size()));
    if (fresh) g_.byte_sets.push_back(set);
    return {Element::Kind::kBytes, it->second};
  }
  static Element Ref(int32_t rule) { return {Element::Kind::kRule, rule}; }

  absl::StatusOr<std::vector<Grammar::Sequence>> ParseAlternatives() {
    std::vector<Grammar::Sequence> alts;
    while (true) {
      absl::StatusOr<Grammar::Sequence> seq = ParseSequence();
      if (!seq.ok()) return seq.status();
      alts.push_back(*std::move(seq));
      SkipSpace();
      if (Peek() != '|') return alts;
      ++i_;
    }
  }

  absl::StatusOr<Grammar::Sequence> ParseSequence() {
    Grammar::Sequence seq;
    while (true) {
      SkipSpace();
      if (Eof() || Peek() == ')' || Peek() == '|' || AtRuleStart()) return seq;
      absl::StatusOr<Grammar::Sequence> item = ParseItem();
      if (!item.ok()) return item.status();
      SkipSpace();
      int min = 1, max = 1;
      if (Peek() == '*' || Peek() == '+' || Peek() == '?') {
        min = Peek() == '+' ? 1 : 0;
        max = Peek() == '?' ? 1 : -1;
        ++i_;
      } else if (Peek() == '{') {
        ++i_;
        if (absl::Status s = ParseBounds(&min, &max); !s.ok()) return s;
      }
      if (min == 1 && max == 1) {
        seq.insert(seq.end(), item->begin(), item->end());
      } else {
        Repeat(*item, min, max, &seq);
      }
      if (seq.size() > kMaxGrammarElements) return absl::InvalidArgumentError("grammar: too large");
    }
  }

  absl::Status ParseBounds(int* min, int* max) {
    auto number = [&](int* out) {
      const size_t start = i_;
      int64_t v = 0;
      while (!Eof() && s_[i_] >= '0' && s_[i_] <= '9' && v <= kMaxRepetition) v = v * 10 + (s_[i_++] - '0');
      if (i_ == start) return false;
      *out = static_cast<int>(std::min<int64_t>(v, kMaxRepetition + 1));
      return true;
    };
    SkipSpace();
    if (!number(min)) return Error("a repetition count");
    SkipSpace();
    *max = *min;
    if (Peek() == ',') {
      ++i_;
      SkipSpace();
      if (!number(max)) *max = -1;
      SkipSpace();
    }
    if (Peek() != '}') return Error("'}'");
    ++i_;
    if (*min > kMaxRepetition || *max > kMaxRepetition) {
      return absl::InvalidArgumentError(absl::StrCat("grammar: a repetition above ", kMaxRepetition));
    }
    if (*max != -1 && *max < *min) return Error("{m,n} with m <= n");
    return absl::OkStatus();
  }

  // `item` min to max times (max -1: unbounded), as right recursion: X* is
  // S ::= X S | (empty); X{0,k} is O_k ::= X O_(k-1) | (empty).
  void Repeat(const Grammar::Sequence& item, int min, int max, Grammar::Sequence* seq) {
    const Element x = item.size() == 1 ? item[0] : Ref(NewRule({item}));
    for (int k = 0; k < min; ++k) seq->push_back(x);
    if (max == -1) {
      const int32_t star = NewRule({});
      g_.rules[star].alternatives = {{x, Ref(star)}, {}};
      seq->push_back(Ref(star));
      return;
    }
    int32_t optional = -1;
    for (int k = min; k < max; ++k) {
      Grammar::Sequence more = {x};
      if (optional >= 0) more.push_back(Ref(optional));
      optional = NewRule({std::move(more), {}});
    }
    if (optional >= 0) seq->push_back(Ref(optional));
  }

  absl::StatusOr<Grammar::Sequence> ParseItem() {
    const char c = Peek();
    if (c == '"') {
      ++i_;
      Grammar::Sequence seq;
      while (!Eof() && Peek() != '"') {
        absl::StatusOr<uint32_t> cp = ParseChar();
        if (!cp.ok()) return cp.status();
        uint8_t bytes[4];
        Encode(*cp, bytes);
        for (int k = 0; k < EncodedLength(*cp); ++k) {
          ByteSet set;
          set.Add(bytes[k], bytes[k]);
          seq.push_back(Bytes(set));
        }
      }
      if (Eof()) return Error("'\"' closing the string");
      ++i_;
      return seq;
    }
    if (c == '[') {
      ++i_;
      const bool negated = Peek() == '^';
      if (negated) ++i_;
      Ranges ranges;
      while (!Eof() && Peek() != ']') {
        absl::StatusOr<uint32_t> lo = ParseChar();
        if (!lo.ok()) return lo.status();
        uint32_t hi = *lo;
        if (Peek() == '-' && i_ + 1 < s_.size() && s_[i_ + 1] != ']') {
          ++i_;
          absl::StatusOr<uint32_t> h = ParseChar();
          if (!h.ok()) return h.status();
          if (*h < *lo) return Error("a range whose end is not below its start");
          hi = *h;
        }
        ranges.emplace_back(*lo, hi);
      }
      if (Eof()) return Error("']' closing the character class");
      ++i_;
      return Grammar::Sequence{Class(negated ? Complement(ranges) : ranges)};
    }
    if (c == '.') {
      ++i_;
      return Grammar::Sequence{Class({{0, kMaxCodePoint}})};
    }
    if (c == '(') {
      ++i_;
      if (++nesting_ > kMaxGrammarNesting) return Error("less nesting");
      absl::StatusOr<std::vector<Grammar::Sequence>> alts = ParseAlternatives();
      if (!alts.ok()) return alts.status();
      --nesting_;
      SkipSpace();
      if (Peek() != ')') return Error("')'");
      ++i_;
      if (alts->size() == 1) return std::move((*alts)[0]);
      return Grammar::Sequence{Ref(NewRule(*std::move(alts)))};
    }
    if (NameChar(c)) return Grammar::Sequence{Ref(RuleIndex(ParseName()))};
    return Error("a string, a character class, '.', '(' or a rule name");
  }

  static Ranges Complement(Ranges r) {
    std::sort(r.begin(), r.end());
    Ranges out;
    uint32_t next = 0;
    for (auto [lo, hi] : r) {
      if (lo > next) out.emplace_back(next, lo - 1);
      next = std::max(next, hi + 1);
    }
    if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
    return out;
  }

  // A class of code points: one byte set when all are ASCII, else a rule whose
  // alternatives are the UTF-8 byte-range sequences.
  Element Class(const Ranges& ranges) {
    ByteSet ascii;
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    for (auto [lo, hi] : ranges) {
      if (lo <= 0x7F) ascii.Add(static_cast<uint8_t>(lo), static_cast<uint8_t>(std::min<uint32_t>(hi, 0x7F)));
      if (hi > 0x7F) Utf8Sequences(std::max<uint32_t>(lo, 0x80), hi, &seqs);
    }
    if (seqs.empty()) return Bytes(ascii);
    std::vector<Grammar::Sequence> alts;
    if (ascii != ByteSet{}) alts.push_back({Bytes(ascii)});
    for (const auto& s : seqs) {
      Grammar::Sequence seq;
      for (auto [lo, hi] : s) {
        ByteSet set;
        set.Add(lo, hi);
        seq.push_back(Bytes(set));
      }
      alts.push_back(std::move(seq));
    }
    return Ref(NewRule(std::move(alts)));
  }

  absl::StatusOr<uint32_t> ParseChar() {
    if (Eof()) return Error("a character");
    const uint8_t c = static_cast<uint8_t>(s_[i_]);
    if (c == '\\') {
      ++i_;
      if (Eof()) return Error("an escape");
      const char e = s_[i_++];
      switch (e) {
        case 'n': return uint32_t{'\n'};
        case 't': return uint32_t{'\t'};
        case 'r': return uint32_t{'\r'};
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^': return static_cast<uint32_t>(e);
        case 'x': return ParseHex(2);
        case 'u': return ParseHex(4);
        case 'U': return ParseHex(8);
        default: --i_; return Error("an escape (\\n \\t \\r \\\\ \\\" \\[ \\] \\- \\^ \\xHH \\uHHHH \\UHHHHHHHH)");
      }
    }
    // One UTF-8 character of the grammar's text.
    const std::optional<uint32_t> cp = DecodeUtf8(s_, &i_);
    if (!cp) return Error("valid UTF-8");
    return *cp;
  }
  absl::StatusOr<uint32_t> ParseHex(int digits) {
    const std::optional<uint32_t> v = DecodeHex(s_, &i_, digits);
    if (!v) return Error(absl::StrCat(digits, " hexadecimal digits"));
    if (*v > kMaxCodePoint) return Error("a code point up to U+10FFFF");
    return *v;
  }

  // A rule reached again at the left edge of its own expansion, with something
  // left to match after the reference, would grow the stack without consuming a
  // byte. (A reference in tail position, as a repetition's, does not grow it.)
  absl::Status CheckLeftRecursion() const {
    const size_t n = g_.rules.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const auto& alt : g_.rules[r].alternatives) {
          if (std::all_of(alt.begin(), alt.end(),
                          [&](const Element& e) { return e.kind == Element::Kind::kRule && nullable[e.index]; })) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    // Left edges r -> s, with whether they grow the stack.
    std::vector<std::vector<std::pair<int32_t, bool>>> edges(n);
    for (size_t r = 0; r < n; ++r) {
      for (const auto& alt : g_.rules[r].alternatives) {
        for (size_t k = 0; k < alt.size(); ++k) {
          if (alt[k].kind != Element::Kind::kRule) break;
          edges[r].emplace_back(alt[k].index, k + 1 < alt.size());
          if (!nullable[alt[k].index]) break;
        }
      }
    }
    // Strongly connected components (Tarjan's, iterative); a growing edge inside one is
    // left recursion.
    std::vector<int> index(n, -1), low(n, 0), component(n, -1);
    std::vector<bool> on_stack(n, false);
    std::vector<int32_t> stack;
    int counter = 0, components = 0;
    for (size_t start = 0; start < n; ++start) {
      if (index[start] >= 0) continue;
      std::vector<std::pair<int32_t, size_t>> work = {{static_cast<int32_t>(start), 0}};
      while (!work.empty()) {
        auto& [v, next] = work.back();
        if (next == 0 && index[v] < 0) {
          index[v] = low[v] = counter++;
          stack.push_back(v);
          on_stack[v] = true;
        }
        if (next < edges[v].size()) {
          const int32_t w = edges[v][next++].first;
          if (index[w] < 0) {
            work.push_back({w, 0});
          } else if (on_stack[w]) {
            low[v] = std::min(low[v], index[w]);
          }
          continue;
        }
        if (low[v] == index[v]) {
          int32_t w;
          do {
            w = stack.back();
            stack.pop_back();
            on_stack[w] = false;
            component[w] = components;
          } while (w != v);
          ++components;
        }
        const int32_t done = v;
        work.pop_back();
        if (!work.empty()) low[work.back().first] = std::min(low[work.back().first], low[done]);
      }
    }
    for (size_t r = 0; r < n; ++r) {
      for (auto [s, grows] : edges[r]) {
        if (grows && component[r] == component[s]) {
          return absl::InvalidArgumentError(absl::StrCat("grammar: rule '", g_.rules[r].name,
                                                         "' is left-recursive (through '", g_.rules[s].name,
                                                         "'): write the repetition with * or +"));
        }
      }
    }
    return absl::OkStatus();
  }

  std::string_view s_;
  size_t i_ = 0;
  int nesting_ = 0;
  int helpers_ = 0;
  std::string current_;
  Grammar g_;
  std::map<std::string, int32_t> names_;
  std::vector<bool> defined_;
  std::map<std::array<uint64_t, 4>, int32_t> byte_set_index_;
};

}  // namespace

absl::StatusOr<Grammar> Grammar::FromGbnf(std::string_view text, std::string_view root) {
  return Parser(text).Run(root);
}

}  // namespace ps::grammar
