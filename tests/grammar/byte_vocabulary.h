// A vocabulary for grammar tests: token 0 a special stop token, tokens 1-255 the single
// bytes, then `extra` (multi-byte tokens).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "grammar/matcher.h"

namespace ps::grammar::testing {

inline std::shared_ptr<const Vocabulary> ByteVocabulary(std::vector<std::string> extra = {}) {
  std::vector<std::string> tokens = {"<stop>"};
  for (int b = 1; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  for (std::string& t : extra) tokens.push_back(std::move(t));
  std::vector<bool> special(tokens.size(), false);
  special[0] = true;
  return std::make_shared<const Vocabulary>(std::move(tokens), special, std::vector<int32_t>{0});
}

}  // namespace ps::grammar::testing
