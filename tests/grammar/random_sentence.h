// Grammar tests' random sentences: what a grammar's matcher lets through, byte by byte.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/matcher.h"
#include "gtest/gtest.h"

namespace ps::grammar::testing {

// A random sentence of `g` over `bytes` (ByteVocabulary): random allowed bytes, leaning
// to the `closing` ones, stopping where the grammar may end about half the time. Empty
// when it runs too long.
inline std::string RandomSentence(const std::shared_ptr<const CompiledGrammar>& g,
                                  const std::shared_ptr<const Vocabulary>& bytes, std::mt19937& rng,
                                  std::string_view closing) {
  Matcher m(g, bytes);
  std::string out;
  std::vector<uint64_t> mask(4);
  while (out.size() < 4000) {
    if (m.Done() || (m.CanEnd() && rng() % 2 == 0)) return out;
    m.FillMask(mask);
    std::vector<int> allowed, closers;
    for (int b = 1; b < 256; ++b) {
      if (!((mask[b >> 6] >> (b & 63)) & 1)) continue;
      allowed.push_back(b);
      if (closing.find(static_cast<char>(b)) != std::string_view::npos) closers.push_back(b);
    }
    if (allowed.empty()) return m.CanEnd() ? out : std::string();
    const int b =
        !closers.empty() && rng() % 3 == 0 ? closers[rng() % closers.size()] : allowed[rng() % allowed.size()];
    EXPECT_TRUE(m.AcceptBytes(std::string(1, static_cast<char>(b))));
    out += static_cast<char>(b);
  }
  return "";
}

}  // namespace ps::grammar::testing
