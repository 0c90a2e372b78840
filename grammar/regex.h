// Regular expressions to a GBNF expression (grammar/grammar.h), for structured
// outputs: vLLM's `guided_regex` (the whole answer matches) and JSON Schema's
// `pattern` (a string's characters; unanchored unless `^` / `$` say so, as the
// standard reads it).
//
// Covered: literal characters (UTF-8), `.` (any but a line end: \n \r U+2028 U+2029,
// as ECMAScript's, which JSON Schema's patterns are), classes `[a-z]`
// `[^...]` with ranges and the escapes below, `\d \w \s \D \W \S`, escaped
// metacharacters and `\n \t \r \f \v \0 \xHH \uHHHH`, groups `(...)` and `(?:...)`,
// alternation `|`, `* + ? {m} {m,} {m,n}` (a lazy `?` after one is accepted: the
// language is the same), `^` first and `$` last. Anything else (backreferences,
// lookaround, `\b`, named groups, flags, possessive quantifiers) is an error naming
// it and its offset.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ps::grammar {

enum class RegexMode {
  kWhole,       // the whole text matches; `^` and `$` change nothing
  kJsonString,  // a JSON string's characters, without the quotes (below)
};

// kJsonString: the expression matches the characters between a JSON string's quotes,
// written plainly: a class or `.` leaves out `"`, `\` and the control characters (which
// JSON writes escaped), and a pattern that needs one of them is an error. Without `^`
// the match may start after any such characters, and without `$` end before any.
// Errors are InvalidArgument: "at offset N: ...".
absl::StatusOr<std::string> RegexToGbnf(std::string_view regex, RegexMode mode);

}  // namespace ps::grammar
