// libFuzzer target: a regular expression must convert (as a whole answer and as a JSON
// string's pattern) or be refused with a status; what it converts to must be a grammar
// the reader accepts, whose masks equal trying each token.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "grammar/regex.h"
#include "tests/fuzz/fuzz_grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (ps::grammar::RegexMode mode : {ps::grammar::RegexMode::kWhole, ps::grammar::RegexMode::kJsonString}) {
    absl::StatusOr<std::string> expr = ps::grammar::RegexToGbnf(text, mode);
    if (!expr.ok()) continue;
    absl::StatusOr<ps::grammar::Grammar> g = ps::grammar::Grammar::FromGbnf("root ::= " + *expr);
    if (!g.ok()) std::abort();  // the converter wrote a grammar its reader refuses
    ps::fuzz::CheckMatcher(*std::move(g), text);
  }
  return 0;
}
