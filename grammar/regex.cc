#include "grammar/regex.h"

#include <algorithm>
#include <cctype>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grammar/grammar.h"
#include "grammar/utf8.h"

namespace ps::grammar {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code points, inclusive

// What a JSON string writes escaped: control characters, the quote and the backslash.
const Ranges& JsonEscaped() {
  static const Ranges r = {{0x00, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0x7F, 0x7F}};
  return r;
}

Ranges Normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

// `r` less the code points of `minus` (both normalized).
Ranges Without(const Ranges& r, const Ranges& minus) {
  Ranges out;
  for (auto [lo, hi] : r) {
    for (const auto& [mlo, mhi] : minus) {
      if (mhi < lo || mlo > hi) continue;
      if (mlo > lo) out.emplace_back(lo, mlo - 1);
      if (mhi >= hi) {
        lo = hi + 1;
        break;
      }
      lo = mhi + 1;
    }
    if (lo <= hi) out.emplace_back(lo, hi);
  }
  return out;
}

// A code point inside a GBNF class or literal: letters and digits as they are, anything
// else escaped.
std::string Esc(uint32_t c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return std::string(1, char(c));
  constexpr char kHex[] = "0123456789ABCDEF";
  const int digits = c < 0x100 ? 2 : c < 0x10000 ? 4 : 8;
  std::string out = digits == 2 ? "\\x" : digits == 4 ? "\\u" : "\\U";
  for (int k = digits - 1; k >= 0; --k) out += kHex[(c >> (4 * k)) & 15];
  return out;
}

class Parser {
 public:
  Parser(std::string_view re, RegexMode mode) : re_(re), json_(mode == RegexMode::kJsonString) {}

  absl::StatusOr<std::string> Parse() {
    if (re_.size() > kMaxGrammarBytes) return Error("a shorter pattern");
    const bool from_start = i_ < re_.size() && re_[i_] == '^';
    if (from_start) ++i_;
    absl::StatusOr<std::string> body = Alternation(0);
    if (!body.ok()) return body;
    if (i_ < re_.size()) return Error("no unbalanced ')'");
    if (!json_) return body;
    // Unanchored ends match any plain string characters.
    const std::string any = absl::StrCat(Class(Without({{0, kMaxCodePoint}}, JsonEscaped()), false), "*");
    return absl::StrCat(from_start ? "" : any + " ", "(", *body, ")", to_end_ ? "" : " " + any);
  }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat("at offset ", i_, ": expected ", what));
  }
  absl::Status Unsupported(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat("at offset ", i_, ": ", what, " is not supported"));
  }
  bool Eof() const { return i_ >= re_.size(); }
  char Peek() const { return Eof() ? '\0' : re_[i_]; }

  absl::StatusOr<std::string> Alternation(int depth) {
    if (depth > kMaxGrammarNesting) return Unsupported("nesting this deep");
    std::string out;
    for (bool first = true;; first = false) {
      absl::StatusOr<std::string> seq = Sequence(depth);
      if (!seq.ok()) return seq;
      absl::StrAppend(&out, first ? "" : " | ", *seq);
      if (Peek() != '|') return out;
      ++i_;
    }
  }

  absl::StatusOr<std::string> Sequence(int depth) {
    std::string out;
    while (!Eof() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '$') {
        ++i_;
        if (!Eof() || depth > 0) return Unsupported("'$' before the pattern's end");
        to_end_ = true;
        break;
      }
      absl::StatusOr<std::string> atom = Atom(depth);
      if (!atom.ok()) return atom;
      absl::StatusOr<std::string> item = Quantified(*std::move(atom));
      if (!item.ok()) return item;
      absl::StrAppend(&out, out.empty() ? "" : " ", *item);
    }
    return out.empty() ? std::string("\"\"") : out;
  }

  absl::StatusOr<std::string> Quantified(std::string atom) {
    std::string q;
    const char c = Peek();
    if (c == '*' || c == '+' || c == '?') {
      q = std::string(1, c);
      ++i_;
    } else if (c == '{') {
      // {m}, {m,}, {m,n}; a '{' that starts none of them is a literal (as most engines read it).
      size_t j = i_ + 1;
      auto number = [&](int* v) {
        const size_t from = j;
        *v = 0;
        while (j < re_.size() && re_[j] >= '0' && re_[j] <= '9' && j - from < 5) *v = *v * 10 + (re_[j++] - '0');
        return j > from;
      };
      int lo = 0, hi = -1;
      if (!number(&lo)) return atom;
      if (j < re_.size() && re_[j] == ',') {
        ++j;
        if (!number(&hi)) hi = -1;
      } else {
        hi = lo;
      }
      if (j >= re_.size() || re_[j] != '}') return atom;
      if (lo > kMaxRepetition || hi > kMaxRepetition) return Unsupported("a repetition count above 1000");
      if (hi >= 0 && hi < lo) return Error("{m,n} with m <= n");
      q = absl::StrCat("{", lo, ",", hi < 0 ? "" : std::to_string(hi), "}");
      i_ = j + 1;
    } else {
      return atom;
    }
    if (Peek() == '?') ++i_;  // lazy: the same strings
    if (Peek() == '+') return Unsupported("a possessive quantifier");
    if (Peek() == '*' || Peek() == '{' || Peek() == '?') return Error("one quantifier per item");
    return absl::StrCat("(", atom, ")", q);
  }

  absl::StatusOr<std::string> Atom(int depth) {
    const char c = Peek();
    switch (c) {
      case '(': {
        ++i_;
        if (Peek() == '?') {
          if (i_ + 1 < re_.size() && re_[i_ + 1] == ':') {
            i_ += 2;
          } else {
            --i_;  // at the group
            return Unsupported("'(?' (lookaround, named groups, flags)");
          }
        }
        absl::StatusOr<std::string> inner = Alternation(depth + 1);
        if (!inner.ok()) return inner;
        if (Peek() != ')') return Error("')'");
        ++i_;
        return absl::StrCat("(", *inner, ")");
      }
      case '[': return ClassAtom();
      case '.': {
        ++i_;
        return Set({{0, kMaxCodePoint}}, /*negated=*/false, {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});
      }
      case '*':
      case '+':
      case '?': return Error("something to repeat before a quantifier");
      case '^': return Unsupported("'^' after the pattern's start");
      case '\\': {
        ++i_;
        bool negated = false;
        absl::StatusOr<Ranges> r = Escape(/*in_class=*/false, &negated);
        if (!r.ok()) return r.status();
        return Set(*r, negated, {});
      }
      default: {
        absl::StatusOr<uint32_t> cp = Char();
        if (!cp.ok()) return cp.status();
        return Set({{*cp, *cp}}, false, {});
      }
    }
  }

  // One UTF-8 character of the pattern.
  absl::StatusOr<uint32_t> Char() {
    const std::optional<uint32_t> cp = DecodeUtf8(re_, &i_);
    if (!cp) return Error("valid UTF-8");
    return *cp;
  }

  // After a backslash: the code points it stands for; *negated for \D \W \S.
  absl::StatusOr<Ranges> Escape(bool in_class, bool* negated) {
    if (Eof()) return Error("an escape after '\\'");
    const char e = re_[i_++];
    static const Ranges kDigit = {{'0', '9'}}, kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}},
                        kSpace = {{'\t', '\r'}, {' ', ' '}};
    switch (e) {
      case 'd': return kDigit;
      case 'w': return kWord;
      case 's': return kSpace;
      case 'D': *negated = true; return kDigit;
      case 'W': *negated = true; return kWord;
      case 'S': *negated = true; return kSpace;
      case 'n': return Ranges{{'\n', '\n'}};
      case 't': return Ranges{{'\t', '\t'}};
      case 'r': return Ranges{{'\r', '\r'}};
      case 'f': return Ranges{{'\f', '\f'}};
      case 'v': return Ranges{{'\v', '\v'}};
      case '0': return Ranges{{0, 0}};
      case 'x':
      case 'u': {
        absl::StatusOr<uint32_t> v = Hex(e == 'x' ? 2 : 4);
        if (!v.ok()) return v.status();
        return Ranges{{*v, *v}};
      }
      default: break;
    }
    const auto u = static_cast<unsigned char>(e);
    if (u >= 0x80 || std::isalnum(u)) {
      --i_;
      return Unsupported(absl::StrCat("the escape '\\", std::string(1, e), "'",
                                      in_class ? "" : " (backreferences, \\b and the like)"));
    }
    return Ranges{{u, u}};  // an escaped metacharacter or punctuation
  }

  absl::StatusOr<uint32_t> Hex(int digits) {
    const std::optional<uint32_t> v = DecodeHex(re_, &i_, digits);
    if (!v) return Error(absl::StrCat(digits, " hexadecimal digits"));
    return *v;
  }

  absl::StatusOr<std::string> ClassAtom() {
    ++i_;  // '['
    const bool negated = Peek() == '^';
    if (negated) ++i_;
    Ranges set;
    for (bool first = true; first || Peek() != ']'; first = false) {
      if (Eof()) return Error("']'");
      absl::StatusOr<uint32_t> lo = ClassChar(&set);
      if (!lo.ok()) return lo.status();
      if (*lo > kMaxCodePoint) continue;  // an escape that added a set
      if (Peek() == '-' && i_ + 1 < re_.size() && re_[i_ + 1] != ']') {
        ++i_;
        absl::StatusOr<uint32_t> hi = ClassChar(&set);
        if (!hi.ok()) return hi.status();
        if (*hi > kMaxCodePoint || *hi < *lo) return Error("a range from a lower to a higher character");
        set.emplace_back(*lo, *hi);
      } else {
        set.emplace_back(*lo, *lo);
      }
    }
    ++i_;  // ']'
    return Set(set, negated, {});
  }

  // A class member: its code point, or kMaxCodePoint + 1 for a set escape (\d, \W, ...),
  // whose code points it adds to *set.
  absl::StatusOr<uint32_t> ClassChar(Ranges* set) {
    if (Peek() != '\\') return Char();
    ++i_;
    bool negated = false;
    absl::StatusOr<Ranges> r = Escape(/*in_class=*/true, &negated);
    if (!r.ok()) return r.status();
    if (r->size() == 1 && (*r)[0].first == (*r)[0].second && !negated) return (*r)[0].first;
    const Ranges add = negated ? Without({{0, kMaxCodePoint}}, Normalized(*r)) : *r;
    set->insert(set->end(), add.begin(), add.end());
    return kMaxCodePoint + 1;
  }

  // The GBNF for code points `r` (their complement when negated, less `except`); a JSON
  // string's leave out what JSON escapes.
  absl::StatusOr<std::string> Set(const Ranges& r, bool negated, const Ranges& except) {
    Ranges set = Normalized(r);
    if (negated) set = Without({{0, kMaxCodePoint}}, set);
    set = Without(set, Normalized(except));
    set = Without(set, {{0xD800, 0xDFFF}});  // surrogates are no characters of UTF-8 text
    if (json_) set = Without(set, JsonEscaped());
    if (set.empty()) {
      return Unsupported(json_ ? "a character JSON writes escaped (a quote, a backslash, a control character)"
                               : "an empty class");
    }
    if (set.size() == 1 && set[0].first == set[0].second) return absl::StrCat("\"", Esc(set[0].first), "\"");
    // A class mostly of everything reads better negated.
    const Ranges rest = Without({{0, kMaxCodePoint}}, set);
    return rest.size() < set.size() ? Class(rest, true) : Class(set, false);
  }

  static std::string Class(const Ranges& r, bool negated) {
    std::string out = negated ? "[^" : "[";
    for (const auto& [lo, hi] : r) absl::StrAppend(&out, Esc(lo), hi > lo ? "-" + Esc(hi) : "");
    return out + "]";
  }

  std::string_view re_;
  bool json_;
  size_t i_ = 0;
  bool to_end_ = false;
};

}  // namespace

absl::StatusOr<std::string> RegexToGbnf(std::string_view regex, RegexMode mode) { return Parser(regex, mode).Parse(); }

}  // namespace ps::grammar
