// JSON Schema to a grammar (GBNF text for Grammar::FromGbnf), for structured
// outputs: every sentence of the grammar is a JSON document the schema accepts.
//
// Covered: `type` (one or a list), `enum`, `const`; objects (`properties` in their
// order, `required`, `additionalProperties`: absent or false adds none, true or a
// schema allows more after the listed ones); arrays (`items`, `minItems`,
// `maxItems`); strings (`minLength`, `maxLength`, `format` date, time, date-time,
// uuid; or `pattern`, a regular expression as grammar/regex.h reads it); integers (`minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`);
// numbers (unbounded); booleans; null; `anyOf` and `oneOf` (as alternatives);
// `allOf` of one schema; `$ref` to `#/$defs/NAME` or `#/definitions/NAME`
// (recursion included); `{}` or `true` (any JSON value). Annotations (`title`,
// `description`, `default`, `examples`, `$schema`, `$id`, `$comment`) are ignored.
// Any other keyword is an error naming it and where it is: never silently dropped.
// Between tokens the output may have a space, or a newline and some indentation.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ps::grammar {

// InvalidArgument naming the schema path ("properties.age.minimum") for what is
// not supported or not valid.
absl::StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema);

// Any JSON object (`response_format: json_object`).
std::string JsonObjectGbnf();

}  // namespace ps::grammar
