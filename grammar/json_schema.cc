#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grammar/regex.h"

namespace ps::grammar {
namespace {

using Json = nlohmann::ordered_json;

// The rules every schema's grammar may use. `ws` follows every value.
constexpr char kCommonRules[] = R"(ws ::= | " " | "\n" [ \t]{0,20}
json-char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
json-string ::= "\"" json-char* "\"" ws
json-number ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? ws
json-integer ::= "-"? ("0" | [1-9] [0-9]{0,15}) ws
json-boolean ::= ("true" | "false") ws
json-null ::= "null" ws
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" ws (json-string ":" ws json-value ("," ws json-string ":" ws json-value)*)? "}" ws
json-array ::= "[" ws (json-value ("," ws json-value)*)? "]" ws
json-date ::= [0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])
json-time ::= ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])
json-uuid ::= [0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12}
)";

constexpr int kMaxCount = 1000;                   // minLength, maxLength, minItems, maxItems
constexpr int64_t kMaxInteger = 999999999999999;  // 15 digits: bounds beyond are refused

const std::set<std::string>& Keywords() {
  static const std::set<std::string> k = {"type", "enum", "const", "properties", "required", "additionalProperties",
                                          "items", "minItems", "maxItems", "minLength", "maxLength", "format",
                                          "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                          "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions",
                                          // annotations
                                          "title", "description", "default", "examples", "$schema", "$id", "$comment"};
  return k;
}

// A GBNF string literal of `text`'s bytes.
std::string Literal(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7F) {
      absl::StrAppend(&out, "\\x", std::string(1, "0123456789ABCDEF"[c >> 4]),
                      std::string(1, "0123456789ABCDEF"[c & 15]));
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// Digit strings lo..hi of equal length (lo <= hi), as a GBNF expression.
std::string DigitRange(const std::string& lo, const std::string& hi) {
  if (lo.empty()) return "";
  if (lo == hi) return Literal(lo);
  const std::string rest_lo = lo.substr(1), rest_hi = hi.substr(1);
  const std::string any_rest = rest_lo.empty() ? "" : absl::StrCat(" [0-9]{", rest_lo.size(), "}");
  auto digits = [](char a, char b) {
    return a == b ? Literal(std::string(1, a)) : absl::StrCat("[", std::string(1, a), "-", std::string(1, b), "]");
  };
  if (lo[0] == hi[0]) return absl::StrCat(Literal(std::string(1, lo[0])), " ", DigitRange(rest_lo, rest_hi));
  if (rest_lo.find_first_not_of('0') == std::string::npos && rest_hi.find_first_not_of('9') == std::string::npos) {
    return absl::StrCat(digits(lo[0], hi[0]), any_rest);
  }
  std::vector<std::string> alts;
  alts.push_back(
      absl::StrCat(Literal(std::string(1, lo[0])), " ", DigitRange(rest_lo, std::string(rest_lo.size(), '9'))));
  if (hi[0] - lo[0] > 1) alts.push_back(absl::StrCat(digits(lo[0] + 1, hi[0] - 1), any_rest));
  alts.push_back(
      absl::StrCat(Literal(std::string(1, hi[0])), " ", DigitRange(std::string(rest_hi.size(), '0'), rest_hi)));
  return absl::StrCat("(", absl::StrJoin(alts, " | "), ")");
}

// Non-negative integers in [lo, hi] (hi empty: unbounded), without leading zeros.
std::string NaturalRange(int64_t lo, std::optional<int64_t> hi) {
  std::vector<std::string> alts;
  const std::string a = std::to_string(lo);
  const size_t max_digits = hi ? std::to_string(*hi).size() : a.size();
  for (size_t d = a.size(); d <= max_digits; ++d) {
    const std::string first = d == 1 ? "0" : "1" + std::string(d - 1, '0');
    std::string from = d == a.size() ? a : first;
    std::string to = hi && d == max_digits ? std::to_string(*hi) : std::string(d, '9');
    alts.push_back(DigitRange(from, to));
  }
  if (!hi) alts.push_back(absl::StrCat("[1-9] [0-9]{", a.size(), ",15}"));  // more digits than lo has
  return alts.size() == 1 ? alts[0] : absl::StrCat("(", absl::StrJoin(alts, " | "), ")");
}

// Integers in [lo, hi], either side open when absent.
std::string IntegerRange(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<std::string> alts;
  // Negative part: -m for m in [max(1, -hi), -lo].
  if (!lo || *lo < 0) {
    const int64_t m_lo = hi && *hi < 0 ? -*hi : 1;
    alts.push_back(absl::StrCat("\"-\" ", NaturalRange(m_lo, lo ? std::optional<int64_t>(-*lo) : std::nullopt)));
  }
  if (!hi || *hi >= 0) alts.push_back(NaturalRange(lo && *lo > 0 ? *lo : 0, hi));
  return alts.size() == 1 ? alts[0] : absl::StrCat("(", absl::StrJoin(alts, " | "), ")");
}

class Compiler {
 public:
  explicit Compiler(const Json& root) : root_(root) {}

  absl::StatusOr<std::string> Run() {
    absl::StatusOr<std::string> root = Visit(root_, "");
    if (!root.ok()) return root.status();
    return absl::StrCat("root ::= ", *root, "\n", kCommonRules, rules_);
  }

 private:
  static absl::Status Error(const std::string& path, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("schema", path.empty() ? "" : " at ", path, ": ", what));
  }
  static std::string At(const std::string& path, const std::string& key) {
    return path.empty() ? key : absl::StrCat(path, ".", key);
  }
  std::string Define(const std::string& body) {
    const std::string name = absl::StrCat("s", ++counter_);
    absl::StrAppend(&rules_, name, " ::= ", body, "\n");
    return name;
  }

  absl::StatusOr<int> Count(const Json& s, const char* key, const std::string& path, int fallback) {
    if (!s.contains(key)) return fallback;
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) return Error(At(path, key), "must be a non-negative integer");
    if (v.get<int64_t>() > kMaxCount)
      return Error(At(path, key), absl::StrCat("above ", kMaxCount, " is not supported"));
    return static_cast<int>(v.get<int64_t>());
  }

  absl::StatusOr<std::string> Visit(const Json& s, const std::string& path) {
    if (++depth_ > 64) return Error(path, "nested too deeply");
    absl::StatusOr<std::string> out = VisitSchema(s, path);
    --depth_;
    return out;
  }

  absl::StatusOr<std::string> VisitSchema(const Json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return std::string("json-value");
      return Error(path, "the schema false accepts nothing");
    }
    if (!s.is_object()) return Error(path, "a schema must be an object or a boolean");
    for (const auto& [key, value] : s.items()) {
      if (!Keywords().contains(key)) return Error(At(path, key), "this keyword is not supported");
    }
    if (s.contains("$ref")) return Ref(s, path);
    if (s.contains("const")) return absl::StrCat(Literal(s["const"].dump()), " ws");
    if (s.contains("enum")) {
      const Json& e = s["enum"];
      if (!e.is_array() || e.empty()) return Error(At(path, "enum"), "must be a non-empty array");
      std::vector<std::string> alts;
      for (const Json& v : e) alts.push_back(Literal(v.dump()));
      return absl::StrCat("(", absl::StrJoin(alts, " | "), ") ws");
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const Json& list = s[key];
      if (!list.is_array() || list.empty()) return Error(At(path, key), "must be a non-empty array");
      std::vector<std::string> alts;
      for (size_t i = 0; i < list.size(); ++i) {
        absl::StatusOr<std::string> alt = Visit(list[i], absl::StrCat(At(path, key), "[", i, "]"));
        if (!alt.ok()) return alt.status();
        alts.push_back(*alt);
      }
      return Define(absl::StrJoin(alts, " | "));
    }
    if (s.contains("allOf")) {
      const Json& list = s["allOf"];
      if (!list.is_array() || list.size() != 1)
        return Error(At(path, "allOf"), "only a list of one schema is supported");
      return Visit(list[0], At(path, "allOf[0]"));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const Json& x : t) {
          if (!x.is_string()) return Error(At(path, "type"), "must be a string or a list of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return Error(At(path, "type"), "must be a string or a list of strings");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else {
      return std::string("json-value");
    }
    std::vector<std::string> alts;
    for (const std::string& t : types) {
      absl::StatusOr<std::string> alt = Type(t, s, path);
      if (!alt.ok()) return alt.status();
      alts.push_back(*alt);
    }
    return alts.size() == 1 ? alts[0] : Define(absl::StrJoin(alts, " | "));
  }

  absl::StatusOr<std::string> Ref(const Json& s, const std::string& path) {
    for (const auto& [key, value] : s.items()) {
      if (key != "$ref" && key != "title" && key != "description" && key != "$comment" && key != "$defs" &&
          key != "definitions") {
        return Error(At(path, key), "is not supported beside $ref");
      }
    }
    const Json& ref = s["$ref"];
    if (!ref.is_string()) return Error(At(path, "$ref"), "must be a string");
    const std::string r = ref.get<std::string>();
    std::string section, name;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      if (r.starts_with(prefix)) {
        section = std::string(prefix).substr(2, std::string(prefix).size() - 3);
        name = r.substr(std::string(prefix).size());
      }
    }
    if (name.empty() || !root_.contains(section) || !root_[section].is_object() || !root_[section].contains(name)) {
      return Error(At(path, "$ref"), absl::StrCat("'", r, "' does not name a schema in #/$defs or #/definitions"));
    }
    auto it = refs_.find(r);
    if (it != refs_.end()) return it->second;
    const std::string rule = absl::StrCat("ref", ++counter_);
    refs_.emplace(r, rule);  // before the visit: a recursive reference finds it
    absl::StatusOr<std::string> body = Visit(root_[section][name], absl::StrCat(section, ".", name));
    if (!body.ok()) return body.status();
    absl::StrAppend(&rules_, rule, " ::= ", *body, "\n");
    return rule;
  }

  absl::StatusOr<std::string> Type(const std::string& type, const Json& s, const std::string& path) {
    if (type == "string") return String(s, path);
    if (type == "integer") return Integer(s, path);
    if (type == "number") {
      for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
        if (s.contains(key)) return Error(At(path, key), "bounds on a number are not supported (an integer's are)");
      }
      return std::string("json-number");
    }
    if (type == "boolean") return std::string("json-boolean");
    if (type == "null") return std::string("json-null");
    if (type == "object") return Object(s, path);
    if (type == "array") return Array(s, path);
    return Error(At(path, "type"), absl::StrCat("'", type, "' is not a JSON Schema type"));
  }

  absl::StatusOr<std::string> String(const Json& s, const std::string& path) {
    if (s.contains("pattern")) {
      for (const char* other : {"format", "minLength", "maxLength"}) {
        if (s.contains(other)) return Error(At(path, other), "next to a pattern is not supported");
      }
      const Json& p = s["pattern"];
      if (!p.is_string()) return Error(At(path, "pattern"), "must be a string");
      absl::StatusOr<std::string> chars = RegexToGbnf(p.get<std::string>(), RegexMode::kJsonString);
      if (!chars.ok()) return Error(At(path, "pattern"), std::string(chars.status().message()));
      return absl::StrCat("\"\\\"\" (", *chars, ") \"\\\"\" ws");
    }
    if (s.contains("format")) {
      const Json& f = s["format"];
      static const std::map<std::string, std::string> kFormats = {{"date", "json-date"},
                                                                  {"time", "json-time"},
                                                                  {"date-time", "json-date \"T\" json-time"},
                                                                  {"uuid", "json-uuid"}};
      auto it = f.is_string() ? kFormats.find(f.get<std::string>()) : kFormats.end();
      if (it == kFormats.end()) return Error(At(path, "format"), "supported formats: date, time, date-time, uuid");
      return absl::StrCat("\"\\\"\" ", it->second, " \"\\\"\" ws");
    }
    absl::StatusOr<int> min = Count(s, "minLength", path, 0);
    if (!min.ok()) return min.status();
    absl::StatusOr<int> max = Count(s, "maxLength", path, -1);
    if (!max.ok()) return max.status();
    if (*min == 0 && *max < 0) return std::string("json-string");
    if (*max >= 0 && *max < *min) return Error(At(path, "maxLength"), "is below minLength");
    return absl::StrCat("\"\\\"\" json-char{", *min, ",", *max < 0 ? "" : std::to_string(*max), "} \"\\\"\" ws");
  }

  absl::StatusOr<std::string> Integer(const Json& s, const std::string& path) {
    std::optional<int64_t> lo, hi;
    for (const char* key : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      if (!s.contains(key)) continue;
      const Json& v = s[key];
      if (!v.is_number()) return Error(At(path, key), "must be a number");
      const double d = v.get<double>();
      if (d < -static_cast<double>(kMaxInteger) || d > static_cast<double>(kMaxInteger)) {
        return Error(At(path, key), "beyond 15 digits is not supported");
      }
      const std::string k = key;
      // The bounds as integers: the smallest integer above a lower bound, the largest below an upper one.
      if (k == "minimum") lo = std::max(lo.value_or(INT64_MIN), static_cast<int64_t>(std::ceil(d)));
      if (k == "exclusiveMinimum") lo = std::max(lo.value_or(INT64_MIN), static_cast<int64_t>(std::floor(d)) + 1);
      if (k == "maximum") hi = std::min(hi.value_or(INT64_MAX), static_cast<int64_t>(std::floor(d)));
      if (k == "exclusiveMaximum") hi = std::min(hi.value_or(INT64_MAX), static_cast<int64_t>(std::ceil(d)) - 1);
    }
    if (!lo && !hi) return std::string("json-integer");
    if (lo && hi && *lo > *hi) return Error(path, "no integer lies between the bounds");
    return Define(absl::StrCat(IntegerRange(lo, hi), " ws"));
  }

  absl::StatusOr<std::string> Object(const Json& s, const std::string& path) {
    const Json properties = s.value("properties", Json::object());
    if (!properties.is_object()) return Error(At(path, "properties"), "must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return Error(At(path, "required"), "must be an array of names");
      for (const Json& r : s["required"]) {
        if (!r.is_string()) return Error(At(path, "required"), "must be an array of names");
        required.insert(r.get<std::string>());
      }
    }
    std::string extra;  // the rule of one more property, when allowed
    const Json additional = s.value("additionalProperties", Json(properties.empty() && required.empty()));
    if (additional.is_object() || (additional.is_boolean() && additional.get<bool>())) {
      absl::StatusOr<std::string> value = Visit(additional, At(path, "additionalProperties"));
      if (!value.ok()) return value.status();
      extra = Define(absl::StrCat("json-string \":\" ws ", *value));
    } else if (!additional.is_boolean()) {
      return Error(At(path, "additionalProperties"), "must be a boolean or a schema");
    }
    // The listed properties in order (a required name without a schema takes any
    // value), each required or optional: rule t[i][c] is properties i.. with c
    // telling whether one came before (a comma then precedes the next).
    std::vector<std::pair<std::string, std::string>> props;  // name, its key-value rule
    std::vector<bool> needed;
    for (const auto& [name, schema] : properties.items()) {
      absl::StatusOr<std::string> value = Visit(schema, At(At(path, "properties"), name));
      if (!value.ok()) return value.status();
      props.emplace_back(name, absl::StrCat(Literal(Json(name).dump()), " ws \":\" ws ", *value));
      needed.push_back(required.contains(name));
    }
    for (const std::string& name : required) {
      if (!properties.contains(name)) {
        props.emplace_back(name, absl::StrCat(Literal(Json(name).dump()), " ws \":\" ws json-value"));
        needed.push_back(true);
      }
    }
    // Built from the end: after the last property, the extra ones (when allowed).
    std::string next[2];
    for (int c = 0; c < 2; ++c) {
      next[c] =
          extra.empty() ? "" : Define(absl::StrCat("| ", c ? "\",\" ws " : "", extra, " (\",\" ws ", extra, ")*"));
    }
    for (size_t i = props.size(); i-- > 0;) {
      std::string here[2];
      for (int c = 0; c < 2; ++c) {
        std::string take = absl::StrCat(c ? "\",\" ws " : "", props[i].second, " ", next[1]);
        here[c] = needed[i] ? Define(take) : Define(absl::StrCat(take, " | ", next[c]));
      }
      next[0] = here[0];
      next[1] = here[1];
    }
    return Define(absl::StrCat("\"{\" ws ", next[0], " \"}\" ws"));
  }

  absl::StatusOr<std::string> Array(const Json& s, const std::string& path) {
    std::string item = "json-value";
    if (s.contains("items")) {
      absl::StatusOr<std::string> v = Visit(s["items"], At(path, "items"));
      if (!v.ok()) return v.status();
      item = *v;
    }
    absl::StatusOr<int> min = Count(s, "minItems", path, 0);
    if (!min.ok()) return min.status();
    absl::StatusOr<int> max = Count(s, "maxItems", path, -1);
    if (!max.ok()) return max.status();
    if (*max >= 0 && *max < *min) return Error(At(path, "maxItems"), "is below minItems");
    if (*max == 0) return Define("\"[\" ws \"]\" ws");
    const std::string more = absl::StrCat("(\",\" ws ", item, ")");
    const std::string tail = *max < 0 ? absl::StrCat(more, "{", std::max(*min - 1, 0), ",}")
                                      : absl::StrCat(more, "{", std::max(*min - 1, 0), ",", *max - 1, "}");
    const std::string items = absl::StrCat(item, " ", tail);
    return Define(absl::StrCat("\"[\" ws ", *min == 0 ? absl::StrCat("(", items, ")?") : items, " \"]\" ws"));
  }

  const Json& root_;
  std::string rules_;
  std::map<std::string, std::string> refs_;
  int counter_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema) { return Compiler(schema).Run(); }

std::string JsonObjectGbnf() { return absl::StrCat("root ::= json-object\n", kCommonRules); }

}  // namespace ps::grammar
