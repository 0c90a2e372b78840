#include "jinja/methods.h"

#include <cctype>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ps::jinja {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace

std::string Strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto strip = [&](char c) {
    return chars != nullptr && chars->is_string() ? chars->as_string().find(c) != std::string::npos : IsSpace(c);
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && strip(s[b])) ++b;
  }
  if (right) {
    while (e > b && strip(s[e - 1])) --e;
  }
  return s.substr(b, e - b);
}

namespace {

std::string Capitalize(const std::string& s, bool every_word) {
  std::string out = absl::AsciiStrToLower(s);
  bool start = true;
  for (char& c : out) {
    if (start && std::isalpha(static_cast<unsigned char>(c))) c = absl::ascii_toupper(c);
    if (every_word) {
      start = !std::isalnum(static_cast<unsigned char>(c));
    } else {
      start = false;
    }
  }
  return out;
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  size_t i = 0;
  int64_t done = 0;
  if (from.empty()) return s;
  while (count < 0 || done < count) {
    const size_t j = s.find(from, i);
    if (j == std::string::npos) break;
    out += s.substr(i, j - i) + to;
    i = j + from.size();
    ++done;
  }
  return out + s.substr(i);
}

}  // namespace

std::optional<Value> DictMethod(const Value& obj, const std::string& name) {
  const Value keep = obj;  // the bound method holds its dict
  if (name == "items") {
    return Value(Function([keep](const Args&) -> absl::StatusOr<Value> {
      List l;
      for (const auto& [k, v] : keep.dict().items) l.emplace_back(List{Value(k), v});
      return Value(std::move(l));
    }));
  }
  if (name == "keys" || name == "values") {
    const bool keys = name == "keys";
    return Value(Function([keep, keys](const Args&) -> absl::StatusOr<Value> {
      List l;
      for (const auto& [k, v] : keep.dict().items) l.push_back(keys ? Value(k) : v);
      return Value(std::move(l));
    }));
  }
  if (name == "get") {
    return Value(Function([keep](const Args& a) -> absl::StatusOr<Value> {
      const Value* key = a.Get("key", 0);
      if (key == nullptr || !key->is_string()) return absl::InvalidArgumentError("get() needs a string key");
      if (const Value* v = keep.dict().Find(key->as_string())) return *v;
      const Value* def = a.Get("default", 1);
      return def != nullptr ? *def : Value::MakeNone();
    }));
  }
  return std::nullopt;
}

std::optional<Value> StringMethod(const std::string& s, const std::string& name) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return Value(Function(
        [s, l, r](const Args& a) -> absl::StatusOr<Value> { return Value(Strip(s, a.Get("chars", 0), l, r)); }));
  }
  if (name == "upper" || name == "lower") {
    const bool up = name == "upper";
    return Value(Function([s, up](const Args&) -> absl::StatusOr<Value> {
      return Value(up ? absl::AsciiStrToUpper(s) : absl::AsciiStrToLower(s));
    }));
  }
  if (name == "title" || name == "capitalize") {
    const bool title = name == "title";
    return Value(Function([s, title](const Args&) -> absl::StatusOr<Value> { return Value(Capitalize(s, title)); }));
  }
  if (name == "startswith" || name == "endswith") {
    const bool starts = name == "startswith";
    return Value(Function([s, starts](const Args& a) -> absl::StatusOr<Value> {
      const Value* p = a.Get("prefix", 0);
      if (p == nullptr) return absl::InvalidArgumentError("startswith/endswith need an argument");
      List options = p->is_list() ? p->list() : List{*p};
      for (const Value& o : options) {
        if (!o.is_string()) return absl::InvalidArgumentError("startswith/endswith need strings");
        if (starts ? s.starts_with(o.as_string()) : s.ends_with(o.as_string())) return Value(true);
      }
      return Value(false);
    }));
  }
  if (name == "split") {
    return Value(Function([s](const Args& a) -> absl::StatusOr<Value> {
      const Value* sep = a.Get("sep", 0);
      const Value* max = a.Get("maxsplit", 1);
      const int64_t limit = max != nullptr && max->is_int() ? max->as_int() : -1;
      List parts;
      if (sep == nullptr || sep->is_none()) {  // runs of whitespace
        size_t i = 0;
        while (true) {
          while (i < s.size() && IsSpace(s[i])) ++i;
          if (i >= s.size()) break;
          if (limit >= 0 && static_cast<int64_t>(parts.size()) == limit) {
            parts.emplace_back(Strip(s.substr(i), nullptr, false, true));
            break;
          }
          size_t j = i;
          while (j < s.size() && !IsSpace(s[j])) ++j;
          parts.emplace_back(s.substr(i, j - i));
          i = j;
        }
        return Value(std::move(parts));
      }
      if (!sep->is_string() || sep->as_string().empty()) return absl::InvalidArgumentError("empty separator");
      size_t i = 0;
      while (true) {
        const size_t j = s.find(sep->as_string(), i);
        if (j == std::string::npos || (limit >= 0 && static_cast<int64_t>(parts.size()) == limit)) {
          parts.emplace_back(s.substr(i));
          break;
        }
        parts.emplace_back(s.substr(i, j - i));
        i = j + sep->as_string().size();
      }
      return Value(std::move(parts));
    }));
  }
  if (name == "replace") {
    return Value(Function([s](const Args& a) -> absl::StatusOr<Value> {
      const Value *from = a.Get("old", 0), *to = a.Get("new", 1), *count = a.Get("count", 2);
      if (from == nullptr || to == nullptr || !from->is_string() || !to->is_string()) {
        return absl::InvalidArgumentError("replace() needs two strings");
      }
      return Value(Replace(s, from->as_string(), to->as_string(), count != nullptr ? count->as_int() : -1));
    }));
  }
  if (name == "find") {
    return Value(Function([s](const Args& a) -> absl::StatusOr<Value> {
      const Value* sub = a.Get("sub", 0);
      if (sub == nullptr || !sub->is_string()) return absl::InvalidArgumentError("find() needs a string");
      const size_t at = s.find(sub->as_string());
      return Value(at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(at));
    }));
  }
  return std::nullopt;
}

}  // namespace ps::jinja
