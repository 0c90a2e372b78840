// libFuzzer target: a GBNF grammar must be read or refused with a status (no crash,
// no runaway recursion); a grammar read must give masks equal to trying each token.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tests/fuzz/fuzz_grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ps::grammar::Grammar> g = ps::grammar::Grammar::FromGbnf(text);
  if (g.ok()) ps::fuzz::CheckMatcher(*std::move(g), text);
  return 0;
}
