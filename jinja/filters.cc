// Jinja's filters and tests, and the access to values they share with the renderer
// (obj.name, obj[key], `in`, comparisons), with Python's semantics: jinja/filters.h.
#include "jinja/filters.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "jinja/methods.h"

namespace ps::jinja {
namespace {

// Python's sequence index: negative from the end; nullopt when out of range.
std::optional<size_t> Index(int64_t i, size_t n) {
  if (i < 0) i += static_cast<int64_t>(n);
  if (i < 0 || i >= static_cast<int64_t>(n)) return std::nullopt;
  return static_cast<size_t>(i);
}

// The whole of s (surrounding whitespace allowed) as a number.
template <typename T>
bool ParseNumber(const std::string& s, T* out) {
  const std::string t = Strip(s, nullptr, true, true);
  const auto r = std::from_chars(t.data(), t.data() + t.size(), *out);
  return r.ec == std::errc() && r.ptr == t.data() + t.size() && !t.empty();
}

// Python's < for numbers, strings and lists.
absl::StatusOr<bool> Less(const Value& a, const Value& b, int line) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list()) {
    const List &x = a.list(), &y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (x[i].Equals(y[i])) continue;
      return Less(x[i], y[i], line);
    }
    return x.size() < y.size();
  }
  return Error(line, absl::StrCat("'<' not supported between '", a.TypeName(), "' and '", b.TypeName(), "'"));
}

absl::StatusOr<Value> FilterRest(const std::string& name, const Value& v, const Args& a);
absl::StatusOr<Value> Sequence(const std::string& name, const Value& v, const Args& a);

}  // namespace

// line <= 0: inside a filter or test, whose caller names the line.
absl::Status Error(int line, const std::string& what) {
  if (line <= 0) return absl::InvalidArgumentError(what);
  return absl::InvalidArgumentError(absl::StrCat("template line ", line, ": ", what));
}

// UTF-8 code points of s, each as its bytes (Python indexes strings by code point).
std::vector<std::string> CodePoints(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    const unsigned char c = s[i];
    if (c >= 0xf0) {
      n = 4;
    } else if (c >= 0xe0) {
      n = 3;
    } else if (c >= 0xc0) {
      n = 2;
    }
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// The items a for loop or a filter iterates: a list's, a dict's keys, a string's characters.
absl::StatusOr<List> Iterate(const Value& v, int line) {
  if (v.is_undefined()) return List{};
  if (v.is_list()) return v.list();  // a generator's items too
  if (v.is_dict()) {
    List keys;
    for (const auto& [k, _] : v.dict().items) keys.emplace_back(k);
    return keys;
  }
  if (v.is_string()) {
    List chars;
    for (std::string& c : CodePoints(v.as_string())) chars.emplace_back(std::move(c));
    return chars;
  }
  return Error(line, absl::StrCat("'", v.TypeName(), "' object is not iterable"));
}

// a `op` b for op in <, >, <=, >=.
absl::StatusOr<bool> Compare(std::string_view op, const Value& a, const Value& b, int line) {
  const bool swap = op == ">" || op == "<=";
  PS_ASSIGN_OR_RETURN(const bool less, swap ? Less(b, a, line) : Less(a, b, line));
  return op == "<" || op == ">" ? less : !less;
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item, int line) {
  if (container.is_string()) {
    if (!item.is_string()) return Error(line, "'in <string>' requires a string as left operand");
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_list()) {
    return std::ranges::any_of(container.list(), [&](const Value& v) { return v.Equals(item); });
  }
  if (container.is_dict()) return item.is_string() && container.dict().Find(item.as_string()) != nullptr;
  if (container.is_undefined()) return false;  // it iterates as empty
  return Error(line, absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
}

// obj.name: a method, else the item.
absl::StatusOr<Value> Attr(const Value& obj, const std::string& name, int line) {
  if (obj.is_undefined()) return Error(line, absl::StrCat("'", obj.undefined_name(), "' is undefined"));
  if (obj.is_dict()) {
    if (!obj.dict().is_namespace) {
      if (std::optional<Value> m = DictMethod(obj, name)) return *m;
    }
    if (const Value* v = obj.dict().Find(name)) return *v;
    return Value::MakeUndefined(name);
  }
  if (obj.is_string()) {
    if (std::optional<Value> m = StringMethod(obj.as_string(), name)) return *m;
  }
  if (obj.is_list() && !name.empty() && std::isdigit(static_cast<unsigned char>(name[0]))) {
    int64_t i = 0;
    if (ParseNumber(name, &i)) return Item(obj, Value(i), line);
  }
  return Value::MakeUndefined(name);
}

// obj[key]: the item, else the attribute.
absl::StatusOr<Value> Item(const Value& obj, const Value& key, int line) {
  if (obj.is_undefined()) return Error(line, absl::StrCat("'", obj.undefined_name(), "' is undefined"));
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.dict().Find(key.as_string())) return *v;
    return Value::MakeUndefined(key.as_string());
  }
  if (obj.is_generator()) return Error(line, "'generator' object is not subscriptable");
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    if (obj.is_list()) {
      const std::optional<size_t> i = Index(key.as_int(), obj.list().size());
      return i ? obj.list()[*i] : Value::MakeUndefined(absl::StrCat("[", key.as_int(), "]"));
    }
    const std::vector<std::string> cps = CodePoints(obj.as_string());
    const std::optional<size_t> i = Index(key.as_int(), cps.size());
    return i ? Value(cps[*i]) : Value::MakeUndefined(absl::StrCat("[", key.as_int(), "]"));
  }
  if (key.is_string()) return Attr(obj, key.as_string(), line);
  return Value::MakeUndefined(key.Str());
}

absl::StatusOr<Value> Filter(const std::string& name, const Value& v, const Args& a) {
  if (name == "tojson") {
    const Value* indent = a.Get("indent", 0);
    const Value* sort = a.Get("sort_keys", 99);
    PS_ASSIGN_OR_RETURN(std::string s, v.ToJson(indent != nullptr && indent->is_int() ? indent->as_int() : -1,
                                                sort != nullptr && sort->Truthy()));
    return Value(s);
  }
  if (name == "string") return v.is_string() ? v : Value(v.Str());
  if (name == "safe") return Value::Markup(v.Str());
  if (name == "e" || name == "escape") {
    if (v.is_markup()) return v;
    return Value::Markup(Escape(v.Str()));
  }
  if (name == "forceescape") return Value::Markup(Escape(v.Str()));
  return FilterRest(name, v, a);
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

absl::StatusOr<Value> FilterRest(const std::string& name, const Value& v, const Args& a) {
  if (name == "trim") {  // of str(v), as Jinja's soft_str (undefined: "")
    return Value(Strip(v.Str(), a.Get("chars", 0), true, true));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    return StringMethod(v.Str(), name).value().function()(Args{});
  }
  if (name == "replace") return StringMethod(v.Str(), "replace").value().function()(a);
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value(static_cast<int64_t>(CodePoints(v.as_string()).size()));
    if (v.is_list() && !v.is_generator()) return Value(static_cast<int64_t>(v.list().size()));
    if (v.is_dict()) return Value(static_cast<int64_t>(v.dict().items.size()));
    if (v.is_undefined()) return Value(int64_t{0});
    return absl::InvalidArgumentError(absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
  }
  if (name == "default" || name == "d") {
    const Value* def = a.Get("default_value", 0);
    const Value* boolean = a.Get("boolean", 1);
    const bool use_default = v.is_undefined() || (boolean != nullptr && boolean->Truthy() && !v.Truthy());
    return use_default ? (def != nullptr ? *def : Value("")) : v;
  }
  if (name == "list") {
    PS_ASSIGN_OR_RETURN(List l, Iterate(v, 0));
    return Value(std::move(l));
  }
  if (name == "first" || name == "last") {
    PS_ASSIGN_OR_RETURN(const List l, Iterate(v, 0));
    if (l.empty()) return Value::MakeUndefined(name);
    return name == "first" ? l.front() : l.back();
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<std::string> cps = CodePoints(v.as_string());
      std::ranges::reverse(cps);
      return Value(absl::StrJoin(cps, ""));
    }
    PS_ASSIGN_OR_RETURN(List l, Iterate(v, 0));
    std::ranges::reverse(l);
    return Value(std::move(l));
  }
  if (name == "join") {
    PS_ASSIGN_OR_RETURN(const List l, Iterate(v, 0));
    const Value* sep = a.Get("d", 0);
    const Value* attr = a.Get("attribute", 1);
    std::string out;
    for (size_t i = 0; i < l.size(); ++i) {
      if (i > 0 && sep != nullptr) out += sep->Str();
      if (attr != nullptr) {
        PS_ASSIGN_OR_RETURN(const Value x, Attr(l[i], attr->Str(), 0));
        out += x.Str();
      } else {
        out += l[i].Str();
      }
    }
    return Value(out);
  }
  if (name == "items") {
    if (v.is_undefined()) return Value(List{});
    if (!v.is_dict()) return absl::InvalidArgumentError("items needs a mapping");
    return DictMethod(v, "items").value().function()(Args{});
  }
  if (name == "dictsort") {
    if (!v.is_dict()) return absl::InvalidArgumentError("dictsort needs a mapping");
    std::vector<std::pair<std::string, Value>> items = v.dict().items;
    std::ranges::stable_sort(items, [](const auto& x, const auto& y) {
      return absl::AsciiStrToLower(x.first) < absl::AsciiStrToLower(y.first);
    });
    List l;
    for (auto& [k, x] : items) l.emplace_back(List{Value(k), x});
    return Value(std::move(l));
  }
  if (name == "int") {
    if (v.is_int() || v.is_bool()) return Value(v.as_int());
    if (v.is_float() && std::abs(v.as_double()) < 9.2e18) return Value(static_cast<int64_t>(v.as_double()));
    if (int64_t x = 0; v.is_string() && ParseNumber(v.as_string(), &x)) return Value(x);
    const Value* def = a.Get("default", 0);
    return def != nullptr ? *def : Value(int64_t{0});
  }
  if (name == "float") {
    if (v.is_number() || v.is_bool()) return Value(v.as_double());
    if (double x = 0; v.is_string() && ParseNumber(v.as_string(), &x)) return Value(x);
    const Value* def = a.Get("default", 0);
    return def != nullptr ? *def : Value(0.0);
  }
  if (name == "abs") {
    if (v.is_int() && v.as_int() == INT64_MIN) return absl::InvalidArgumentError("integer overflow");
    if (v.is_int()) return Value(std::abs(v.as_int()));
    if (v.is_float()) return Value(std::abs(v.as_double()));
    return absl::InvalidArgumentError("abs needs a number");
  }
  if (name == "indent") {
    const Value* width = a.Get("width", 0);
    const Value* first = a.Get("first", 1);
    const Value* blank = a.Get("blank", 2);
    const int64_t n = width != nullptr && width->is_int() ? std::clamp<int64_t>(width->as_int(), 0, 4096) : 4;
    const std::string pad = width != nullptr && width->is_string() ? width->as_string() : std::string(n, ' ');
    std::vector<std::string> lines = absl::StrSplit(v.Str(), '\n');
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += '\n';
      const bool indent_it = (i > 0 || (first != nullptr && first->Truthy())) &&
                             (!lines[i].empty() || (blank != nullptr && blank->Truthy()));
      if (indent_it) out += pad;
      out += lines[i];
    }
    return Value(out);
  }
  if (name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    return Sequence(name, v, a);
  }
  if (name == "unique") {
    PS_ASSIGN_OR_RETURN(const List l, Iterate(v, 0));
    List out;
    for (const Value& x : l) {
      if (std::ranges::none_of(out, [&](const Value& y) { return y.Equals(x); })) out.push_back(x);
    }
    return Value(std::move(out));
  }
  if (name == "sum") {
    PS_ASSIGN_OR_RETURN(const List l, Iterate(v, 0));
    Value total = a.Get("start", 1) != nullptr ? *a.Get("start", 1) : Value(int64_t{0});
    for (const Value& x : l) {
      if (!x.is_number() || !total.is_number()) return absl::InvalidArgumentError("sum needs numbers");
      total = total.is_float() || x.is_float() ? Value(total.as_double() + x.as_double())
                                               : Value(total.as_int() + x.as_int());
    }
    return total;
  }
  if (name == "min" || name == "max") {
    PS_ASSIGN_OR_RETURN(const List l, Iterate(v, 0));
    if (l.empty()) return Value::MakeUndefined(name);
    Value best = l[0];
    for (const Value& x : l) {
      PS_ASSIGN_OR_RETURN(const bool less, name == "min" ? Less(x, best, 0) : Less(best, x, 0));
      if (less) best = x;
    }
    return best;
  }
  if (name == "round") {
    const Value* precision = a.Get("precision", 0);
    const double scale = std::pow(10.0, precision != nullptr ? precision->as_int() : 0);
    return Value(std::round(v.as_double() * scale) / scale);
  }
  if (name == "wordcount") {
    return Value(static_cast<int64_t>(
        std::vector<std::string>(absl::StrSplit(v.Str(), absl::ByAnyChar(" \t\n\r"), absl::SkipEmpty())).size()));
  }
  return absl::InvalidArgumentError("unknown filter");
}

// map / select / reject / selectattr / rejectattr.
absl::StatusOr<Value> Sequence(const std::string& name, const Value& v, const Args& a) {
  if (!v.Truthy()) return Value(List{});  // Jinja iterates a false value (none too) as empty here
  PS_ASSIGN_OR_RETURN(const List l, Iterate(v, 0));
  List out;
  if (name == "map") {
    const Value* attr = a.Get("attribute", 99);
    for (const Value& x : l) {
      if (attr != nullptr) {
        PS_ASSIGN_OR_RETURN(Value y, Attr(x, attr->Str(), 0));
        if (y.is_undefined() && a.Get("default", 99) != nullptr) y = *a.Get("default", 99);
        out.push_back(std::move(y));
      } else {
        if (a.positional.empty() || !a.positional[0].is_string()) {
          return absl::InvalidArgumentError("map needs a filter name or attribute=");
        }
        Args rest{.positional = {a.positional.begin() + 1, a.positional.end()}, .keyword = a.keyword};
        PS_ASSIGN_OR_RETURN(Value y, Filter(a.positional[0].as_string(), x, rest));
        out.push_back(std::move(y));
      }
    }
    return Value::Generator(std::move(out));
  }
  const bool by_attr = name.ends_with("attr");
  const bool keep_if = name.starts_with("select");
  const size_t test_at = by_attr ? 1 : 0;
  if (by_attr && (a.positional.empty() || !a.positional[0].is_string())) {
    return absl::InvalidArgumentError(absl::StrCat(name, " needs an attribute name"));
  }
  for (const Value& x : l) {
    Value subject = x;
    if (by_attr) {
      PS_ASSIGN_OR_RETURN(subject, Attr(x, a.positional[0].as_string(), 0));
    }
    bool ok;
    if (a.positional.size() <= test_at) {
      ok = subject.Truthy();
    } else {
      Args rest{.positional = {a.positional.begin() + static_cast<std::ptrdiff_t>(test_at) + 1, a.positional.end()}};
      PS_ASSIGN_OR_RETURN(ok, Test(a.positional[test_at].Str(), subject, rest, 0));
    }
    if (ok == keep_if) out.push_back(x);
  }
  return Value::Generator(std::move(out));
}

}  // namespace

absl::StatusOr<bool> Test(const std::string& name, const Value& v, const Args& a, int line) {
  const Value* arg = a.positional.empty() ? nullptr : &a.positional[0];
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number() || v.is_bool();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "callable") return v.is_callable();
  if (name == "odd" || name == "even") {
    if (!v.is_int()) return Error(line, "odd/even need an integer");
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    if (!v.is_int() || arg == nullptr || !arg->is_int() || arg->as_int() == 0) {
      return Error(line, "divisibleby needs integers");
    }
    return v.as_int() % arg->as_int() == 0;
  }
  if (arg == nullptr) return Error(line, absl::StrCat("test '", name, "' needs an argument or is unknown"));
  if (name == "eq" || name == "equalto" || name == "==") return v.Equals(*arg);
  if (name == "ne" || name == "!=") return !v.Equals(*arg);
  if (name == "sameas") return v.Equals(*arg) && v.TypeName() == arg->TypeName();
  static const std::map<std::string, std::string, std::less<>> kCompare = {
      {"lt", "<"}, {"<", "<"}, {"gt", ">"}, {">", ">"}, {"le", "<="}, {"<=", "<="}, {"ge", ">="}, {">=", ">="}};
  if (auto c = kCompare.find(name); c != kCompare.end()) return Compare(c->second, v, *arg, line);
  if (name == "in") return Contains(*arg, v, line);
  return Error(line, absl::StrCat("unknown test '", name, "'"));
}

}  // namespace ps::jinja
