#include "jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ps::jinja {

const Value* Dict::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::Set(std::string key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(v));
}

const Value* Args::Get(std::string_view name, size_t index) const {
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return index < positional.size() ? &positional[index] : nullptr;
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return MakeNone();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& e : j) l.push_back(FromJson(e));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, v] : j.items()) d.items.emplace_back(k, FromJson(v));
      return Value(std::move(d));
    }
    default: return MakeUndefined("json");
  }
}

bool Value::Truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int() != 0;
  if (is_float()) return as_double() != 0;
  if (is_string()) return !as_string().empty();
  if (is_list()) return is_generator() || !list().empty();
  if (is_dict()) return !dict().items.empty();
  return true;
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  const std::string s(buf, r.ptr);  // [-]d[.ddd]e[+-]XX
  const size_t e = s.find('e');
  const int exp = std::stoi(s.substr(e + 1));
  std::string sign, digits;
  for (char c : s.substr(0, e)) {
    if (c == '-') {
      sign = "-";
    } else if (c != '.') {
      digits += c;
    }
  }
  if (exp < -4 || exp >= 16) {  // Python's repr switches to exponent notation here
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) absl::StrAppend(&m, ".", digits.substr(1));
    return absl::StrFormat("%s%se%c%02d", sign, m, exp < 0 ? '-' : '+', std::abs(exp));
  }
  std::string out;
  if (exp < 0) {
    out = "0." + std::string(-exp - 1, '0') + digits;
  } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
    out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
  }
  return sign + out;
}

namespace {

std::string StrRepr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c == q) {
          out += '\\';
          out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\x%02x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += q;
  return out;
}

void JsonString(const std::string& s, std::string* out) {
  *out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          *out += absl::StrFormat("\\u%04x", c);
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

absl::Status Json(const Value& v, int indent, bool sort_keys, int depth, std::string* out) {
  auto newline = [&](int d) {
    if (indent >= 0) absl::StrAppend(out, "\n", std::string(static_cast<size_t>(indent) * d, ' '));
  };
  const std::string_view item_sep = indent >= 0 ? "," : ", ";
  if (v.is_generator()) return absl::InvalidArgumentError("Object of type generator is not JSON serializable");
  if (v.is_none()) {
    *out += "null";
  } else if (v.is_bool()) {
    *out += v.as_bool() ? "true" : "false";
  } else if (v.is_int()) {
    absl::StrAppend(out, v.as_int());
  } else if (v.is_float()) {
    const double d = v.as_double();
    *out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : FloatRepr(d);
  } else if (v.is_string()) {
    JsonString(v.as_string(), out);
  } else if (v.is_list()) {
    if (v.list().empty()) {
      *out += "[]";
      return absl::OkStatus();
    }
    *out += '[';
    for (size_t i = 0; i < v.list().size(); ++i) {
      if (i > 0) *out += item_sep;
      newline(depth + 1);
      if (absl::Status st = Json(v.list()[i], indent, sort_keys, depth + 1, out); !st.ok()) return st;
    }
    newline(depth);
    *out += ']';
  } else if (v.is_dict()) {
    if (v.dict().items.empty()) {
      *out += "{}";
      return absl::OkStatus();
    }
    std::vector<const std::pair<std::string, Value>*> items;
    for (const auto& kv : v.dict().items) items.push_back(&kv);
    if (sort_keys) std::ranges::stable_sort(items, {}, [](const auto* kv) { return kv->first; });
    *out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) *out += item_sep;
      newline(depth + 1);
      JsonString(items[i]->first, out);
      *out += ": ";
      if (absl::Status st = Json(items[i]->second, indent, sort_keys, depth + 1, out); !st.ok()) return st;
    }
    newline(depth);
    *out += '}';
  } else {
    return absl::InvalidArgumentError(absl::StrCat("Object of type ", v.TypeName(), " is not JSON serializable"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string Value::Str() const {
  if (is_undefined()) return "";
  if (is_string()) return as_string();
  return Repr();
}

std::string Value::Repr() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "None";
  if (is_bool()) return as_bool() ? "True" : "False";
  if (is_int()) return absl::StrCat(as_int());
  if (is_float()) return FloatRepr(as_double());
  if (is_string()) return StrRepr(as_string());
  if (is_generator()) return "<generator object>";
  if (is_list()) {
    std::string out = "[";
    for (size_t i = 0; i < list().size(); ++i) absl::StrAppend(&out, i > 0 ? ", " : "", list()[i].Repr());
    return out + "]";
  }
  if (is_dict()) {
    if (dict().is_namespace) return "<Namespace>";
    std::string out = "{";
    for (size_t i = 0; i < dict().items.size(); ++i) {
      absl::StrAppend(&out, i > 0 ? ", " : "", StrRepr(dict().items[i].first), ": ", dict().items[i].second.Repr());
    }
    return out + "}";
  }
  return "<function>";
}

absl::StatusOr<std::string> Value::ToJson(int indent, bool sort_keys) const {
  std::string out;
  if (absl::Status st = Json(*this, indent, sort_keys, 0, &out); !st.ok()) return st;
  return out;
}

bool Value::Equals(const Value& o) const {
  if ((is_number() || is_bool()) && (o.is_number() || o.is_bool())) {
    if (is_float() || o.is_float()) return as_double() == o.as_double();
    return as_int() == o.as_int();
  }
  if (v_.index() != o.v_.index()) return false;
  if (is_undefined() || is_none()) return true;
  if (is_string()) return as_string() == o.as_string();
  if (is_list()) {
    return std::ranges::equal(list(), o.list(), [](const Value& a, const Value& b) { return a.Equals(b); });
  }
  if (is_dict()) {
    if (dict().items.size() != o.dict().items.size()) return false;
    for (const auto& [k, v] : dict().items) {
      const Value* w = o.dict().Find(k);
      if (w == nullptr || !v.Equals(*w)) return false;
    }
    return true;
  }
  return std::get<FunctionPtr>(v_) == std::get<FunctionPtr>(o.v_);
}

const char* Value::TypeName() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_list()) return is_generator() ? "generator" : "list";
  if (is_dict()) return dict().is_namespace ? "Namespace" : "dict";
  return "function";
}

}  // namespace ps::jinja
