// The methods of values a template calls (`messages[0].get("content")`,
// `s.strip()`, ...) and the stripping the filters share with them: internal to jinja/.
#pragma once

#include <optional>
#include <string>

#include "jinja/value.h"

namespace ps::jinja {

// Python's str.strip / lstrip / rstrip: `chars` (a string; null or not one: whitespace)
// cut from the left and / or the right.
std::string Strip(const std::string& s, const Value* chars, bool left, bool right);

// The method `name` of a dict (items, keys, values, get) or a string (strip, upper,
// split, replace, ...) bound to it; nullopt when it has none of that name.
std::optional<Value> DictMethod(const Value& obj, const std::string& name);
std::optional<Value> StringMethod(const std::string& s, const std::string& name);

}  // namespace ps::jinja
