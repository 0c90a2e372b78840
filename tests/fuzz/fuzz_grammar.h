// What the grammar fuzzers check once a grammar is read: a matcher over a byte-level
// vocabulary, stepped along tokens the mask allows; a token the mask allows must be
// accepted on its own, one it refuses refused (checked on a sample of the bytes).
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "grammar/matcher.h"
#include "tests/grammar/byte_vocabulary.h"

namespace ps::fuzz {

inline std::shared_ptr<const grammar::Vocabulary> FuzzVocabulary() {
  static const auto* v = new std::shared_ptr<const grammar::Vocabulary>(grammar::testing::ByteVocabulary(
      {"{\"", "\": ", "\",", "true", "null", "12", "ab", "abc", "\xC3\xA9", "\xE6\x95"}));
  return *v;
}

// Steps along allowed tokens chosen by `choices`, checking the mask against tokens
// tried alone; aborts on a mismatch.
inline void CheckMatcher(grammar::Grammar g, std::string_view choices) {
  const std::shared_ptr<const grammar::Vocabulary> vocab = FuzzVocabulary();
  grammar::Matcher m(std::make_shared<const grammar::CompiledGrammar>(std::move(g)), vocab);
  std::vector<uint64_t> mask((vocab->size() + 63) / 64);
  for (size_t step = 0; step < 4 && !m.Done(); ++step) {
    m.FillMask(mask);
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < vocab->size(); ++t) {
      const bool got = (mask[t >> 6] >> (t & 63)) & 1;
      if (got) allowed.push_back(t);
      // Tried alone: the multi-byte tokens, the stop, and every 16th byte (a different
      // 16th each step), which keeps an execution fast.
      if (t < 256 && t != 0 && (t + static_cast<int32_t>(step)) % 16 != 0) continue;
      grammar::Matcher alone = m;
      if (alone.AcceptToken(t) != got) std::abort();
    }
    if (allowed.empty()) return;
    const unsigned char c = step < choices.size() ? static_cast<unsigned char>(choices[step]) : 0;
    if (!m.AcceptToken(allowed[c % allowed.size()])) std::abort();
  }
}

}  // namespace ps::fuzz
