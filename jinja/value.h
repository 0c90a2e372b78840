// The values a Jinja template computes with, as Python holds them for Jinja: undefined,
// none, booleans, integers, floats, strings, lists and (insertion-ordered, string-keyed)
// dicts shared by reference, and callables (global functions, macros, bound methods).
// A namespace is a dict whose attributes `set` may assign. Conversions to text follow
// Python: str() for output, repr() inside containers, json.dumps for `tojson`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ps::jinja {

class Value;
using List = std::vector<Value>;

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  const Value* Find(std::string_view key) const;
  void Set(std::string key, Value v);
};

// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // Keyword `name`, else positional `index`, else null.
  const Value* Get(std::string_view name, size_t index) const;
};
using Function = std::function<absl::StatusOr<Value>(const Args&)>;

class Value {
 public:
  struct Undefined {
    std::string name;  // what was looked up, for errors
  };
  struct None {};
  using ListPtr = std::shared_ptr<List>;
  using DictPtr = std::shared_ptr<Dict>;
  using FunctionPtr = std::shared_ptr<const Function>;

  Value() : v_(Undefined{}) {}
  static Value MakeUndefined(std::string name) { return Value(Undefined{std::move(name)}); }
  static Value MakeNone() { return Value(None{}); }
  Value(bool b) : v_(b) {}  // NOLINT: implicit, as Python's literals
  Value(int v) : v_(int64_t{v}) {}
  Value(int64_t v) : v_(v) {}
  Value(double v) : v_(v) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(List l) : v_(std::make_shared<List>(std::move(l))) {}
  Value(Dict d) : v_(std::make_shared<Dict>(std::move(d))) {}
  Value(Function f) : v_(std::make_shared<const Function>(std::move(f))) {}
  static Value FromJson(const nlohmann::ordered_json& j);
  // A str made safe by `|safe` or `|escape` (Jinja's Markup): a str added to it is
  // HTML-escaped first.
  static Value Markup(std::string s) {
    Value v(std::move(s));
    v.markup_ = true;
    return v;
  }
  // What map/select/reject/selectattr/rejectattr give: Jinja's generators, which are
  // always true and have no len(), no index and no JSON form (`|list` makes a list).
  static Value Generator(List l) {
    Value v(std::move(l));
    v.generator_ = true;
    return v;
  }

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float(); }  // booleans are not, for Jinja's tests
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_list() const { return std::holds_alternative<ListPtr>(v_); }
  bool is_dict() const { return std::holds_alternative<DictPtr>(v_); }
  bool is_callable() const { return std::holds_alternative<FunctionPtr>(v_); }
  bool is_markup() const { return markup_ && is_string(); }
  bool is_generator() const { return generator_ && is_list(); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return is_bool() ? as_bool() : std::get<int64_t>(v_); }
  double as_double() const { return is_float() ? std::get<double>(v_) : static_cast<double>(as_int()); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  List& list() const { return *std::get<ListPtr>(v_); }
  Dict& dict() const { return *std::get<DictPtr>(v_); }
  const Function& function() const { return *std::get<FunctionPtr>(v_); }
  const std::string& undefined_name() const { return std::get<Undefined>(v_).name; }

  // Python's truth value (undefined is false).
  bool Truthy() const;
  // Python's str() (undefined: "").
  std::string Str() const;
  // Python's repr().
  std::string Repr() const;
  // json.dumps(self, ensure_ascii=False, indent=indent (< 0: None), sort_keys=sort_keys),
  // separators as Python's defaults for that indent; error for undefined and callables.
  absl::StatusOr<std::string> ToJson(int indent = -1, bool sort_keys = false) const;
  // Python's ==.
  bool Equals(const Value& o) const;
  // The type's name, for errors ("str", "list", ...).
  const char* TypeName() const;

 private:
  template <typename T>
  explicit Value(T alt) : v_(std::move(alt)) {}
  std::variant<Undefined, None, bool, int64_t, double, std::string, ListPtr, DictPtr, FunctionPtr> v_;
  bool markup_ = false, generator_ = false;
};

// Python's repr() of a float ("1.0", "1e-05", "inf").
std::string FloatRepr(double d);

}  // namespace ps::jinja
