// Jinja's filters and tests (`x | name(...)`, `x is name(...)`) and the access to values
// the renderer shares with them: attributes and items, `in`, comparisons, iteration.
// Python's semantics; internal to jinja/ (template.cc renders with them).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "jinja/value.h"

namespace ps::jinja {

// An InvalidArgument error naming the template line; line <= 0: inside a filter or test,
// whose caller names the line.
absl::Status Error(int line, const std::string& what);
// UTF-8 code points of s, each as its bytes (Python indexes strings by code point).
std::vector<std::string> CodePoints(const std::string& s);
// The items a `for` or a filter iterates: a list's, a dict's keys, a string's code points.
absl::StatusOr<List> Iterate(const Value& v, int line);
// a `op` b for op in <, >, <=, >=.
absl::StatusOr<bool> Compare(std::string_view op, const Value& a, const Value& b, int line);
// item in container.
absl::StatusOr<bool> Contains(const Value& container, const Value& item, int line);
// obj.name: a method, else the item; obj[key]: the item, else the attribute.
absl::StatusOr<Value> Attr(const Value& obj, const std::string& name, int line);
absl::StatusOr<Value> Item(const Value& obj, const Value& key, int line);
// HTML escaping as Jinja's `escape` (&, <, >, ", ').
std::string Escape(const std::string& s);
// v | name(a); v is name(a).
absl::StatusOr<Value> Filter(const std::string& name, const Value& v, const Args& a);
absl::StatusOr<bool> Test(const std::string& name, const Value& v, const Args& a, int line);

}  // namespace ps::jinja
