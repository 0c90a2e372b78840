// libFuzzer target: a JSON Schema must compile or be refused with a status; what it
// compiles to must be a grammar the reader accepts, whose masks equal trying each token.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "grammar/json_schema.h"
#include "tests/fuzz/fuzz_grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(text, nullptr, false);
  if (schema.is_discarded()) return 0;
  absl::StatusOr<std::string> gbnf = ps::grammar::JsonSchemaToGbnf(schema);
  if (!gbnf.ok()) return 0;
  absl::StatusOr<ps::grammar::Grammar> g = ps::grammar::Grammar::FromGbnf(*gbnf);
  if (!g.ok()) std::abort();  // the compiler wrote a grammar its reader refuses
  ps::fuzz::CheckMatcher(*std::move(g), text);
  return 0;
}
