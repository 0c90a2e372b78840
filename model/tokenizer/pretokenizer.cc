#include "model/tokenizer/pretokenizer.h"

#include "model/tokenizer/unicode.h"

namespace ps {
namespace {

using unicode::IsLetter;
using unicode::IsNumber;
using unicode::IsWhitespace;

bool IsOther(uint32_t c) { return !IsWhitespace(c) && !IsLetter(c) && !IsNumber(c); }
bool IsNewline(uint32_t c) { return c == '\r' || c == '\n'; }
uint32_t Lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// Length of a contraction ('s 't 're 've 'm 'll 'd) at i, or 0.
size_t Contraction(const std::vector<uint32_t>& c, size_t i, bool ignore_case) {
  if (c[i] != '\'' || i + 1 >= c.size()) return 0;
  auto at = [&](size_t k) -> uint32_t { return k < c.size() ? (ignore_case ? Lower(c[k]) : c[k]) : 0; };
  const uint32_t a = at(i + 1), b = at(i + 2);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

template <typename Pred>
size_t RunOf(const std::vector<uint32_t>& c, size_t i, Pred p) {
  size_t j = i;
  while (j < c.size() && p(c[j])) ++j;
  return j;
}

// \s+(?!\S) then \s+ at i (c[i] is whitespace): the end of the match.
size_t WhitespaceRun(const std::vector<uint32_t>& c, size_t i) {
  const size_t j = RunOf(c, i, IsWhitespace);
  if (j < c.size() && j - i > 1) return j - 1;  // leave the last space to the next word
  return j;
}

// End of the match starting at i for GPT-2's pattern over c[begin, end).
size_t MatchGpt2(const std::vector<uint32_t>& c, size_t i) {
  if (size_t n = Contraction(c, i, false)) return i + n;
  const bool sp = c[i] == ' ' && i + 1 < c.size();
  const size_t k = sp ? i + 1 : i;
  if (IsLetter(c[k])) return RunOf(c, k, IsLetter);
  if (IsNumber(c[k])) return RunOf(c, k, IsNumber);
  if (IsOther(c[k])) return RunOf(c, k, IsOther);
  return WhitespaceRun(c, i);
}

size_t MatchLlama3(const std::vector<uint32_t>& c, size_t i, size_t max_digits) {
  if (size_t n = Contraction(c, i, true)) return i + n;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (IsLetter(c[i])) return RunOf(c, i, IsLetter);
  if (!IsNewline(c[i]) && !IsNumber(c[i]) && i + 1 < c.size() && IsLetter(c[i + 1])) {
    return RunOf(c, i + 1, IsLetter);
  }
  // \p{N}{1,max_digits}
  if (IsNumber(c[i])) {
    size_t j = i;
    while (j < c.size() && j - i < max_digits && IsNumber(c[j])) ++j;
    return j;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  const size_t k = (c[i] == ' ' && i + 1 < c.size()) ? i + 1 : i;
  if (IsOther(c[k])) return RunOf(c, RunOf(c, k, IsOther), IsNewline);
  // \s*[\r\n]+ : up to and including the last newline of the whitespace run
  const size_t j = RunOf(c, i, IsWhitespace);
  for (size_t t = j; t > i; --t) {
    if (IsNewline(c[t - 1])) return t;
  }
  return WhitespaceRun(c, i);
}

void Split(const std::vector<uint32_t>& c, size_t begin, size_t end, PreTokenizer kind, std::vector<std::string>* out) {
  // Matching runs on the sub-range as its own text (lookahead stops at `end`).
  std::vector<uint32_t> sub(c.begin() + begin, c.begin() + end);
  size_t i = 0;
  while (i < sub.size()) {
    size_t j;
    switch (kind) {
      case PreTokenizer::kLlama3: j = MatchLlama3(sub, i, 3); break;
      case PreTokenizer::kQwen2: j = MatchLlama3(sub, i, 1); break;
      default: j = MatchGpt2(sub, i); break;
    }
    out->push_back(unicode::EncodeUtf8(sub.data() + i, j - i));
    i = j;
  }
}

}  // namespace

std::vector<std::string> PreTokenize(PreTokenizer kind, std::string_view text) {
  const std::vector<uint32_t> cps = unicode::DecodeUtf8(text);
  std::vector<std::string> out;
  if (kind != PreTokenizer::kSmolLM) {
    Split(cps, 0, cps.size(), kind, &out);
    return out;
  }
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (!IsNumber(cps[i])) continue;
    if (start < i) Split(cps, start, i, PreTokenizer::kGpt2, &out);
    out.push_back(unicode::EncodeUtf8(&cps[i], 1));
    start = i + 1;
  }
  if (start < cps.size()) Split(cps, start, cps.size(), PreTokenizer::kGpt2, &out);
  return out;
}

}  // namespace ps
