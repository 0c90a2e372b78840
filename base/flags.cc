#include "base/flags.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ps {

void FlagParser::AddString(const std::string& name, std::string* out, const std::string& help) {
  flags_.push_back({name, help, *out, false, [out](const std::string& v) {
                      *out = v;
                      return absl::OkStatus();
                    }});
}

void FlagParser::AddStringList(const std::string& name, std::vector<std::string>* out, const std::string& help) {
  flags_.push_back({name, help + " (repeatable)", "", false, [out](const std::string& v) {
                      out->push_back(v);
                      return absl::OkStatus();
                    }});
}

void FlagParser::AddInt(const std::string& name, int64_t* out, const std::string& help) {
  flags_.push_back({name, help, std::to_string(*out), false, [out, name](const std::string& v) {
                      char* end = nullptr;
                      errno = 0;
                      const long long x = std::strtoll(v.c_str(), &end, 10);
                      if (v.empty() || *end != '\0' || errno != 0) {
                        return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", v, "' is not an integer"));
                      }
                      *out = x;
                      return absl::OkStatus();
                    }});
}

void FlagParser::AddIntList(const std::string& name, std::vector<int64_t>* out, const std::string& help) {
  flags_.push_back({name, help, absl::StrJoin(*out, ","), false, [out, name](const std::string& v) {
                      std::vector<int64_t> list;
                      for (absl::string_view part : absl::StrSplit(v, ',')) {
                        int64_t x = 0;
                        if (!absl::SimpleAtoi(part, &x)) {
                          return absl::InvalidArgumentError(
                              absl::StrCat("--", name, ": '", v, "' is not a comma-separated list of integers"));
                        }
                        list.push_back(x);
                      }
                      *out = std::move(list);
                      return absl::OkStatus();
                    }});
}

void FlagParser::AddFloat(const std::string& name, double* out, const std::string& help) {
  flags_.push_back({name, help, absl::StrFormat("%g", *out), false, [out, name](const std::string& v) {
                      char* end = nullptr;
                      errno = 0;
                      const double x = std::strtod(v.c_str(), &end);
                      if (v.empty() || *end != '\0' || errno != 0) {
                        return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", v, "' is not a number"));
                      }
                      *out = x;
                      return absl::OkStatus();
                    }});
}

void FlagParser::AddBool(const std::string& name, bool* out, const std::string& help) {
  flags_.push_back({name, help, *out ? "true" : "false", true, [out, name](const std::string& v) {
                      if (v == "" || v == "true" || v == "1") {
                        *out = true;
                      } else if (v == "false" || v == "0") {
                        *out = false;
                      } else {
                        return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", v, "' is not a boolean"));
                      }
                      return absl::OkStatus();
                    }});
}

absl::Status FlagParser::Parse(int argc, char** argv, std::vector<std::string>* positional) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      if (positional == nullptr) return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
      positional->push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const Flag* flag = nullptr;
    for (const Flag& f : flags_) {
      if (f.name == name) flag = &f;
    }
    if (flag == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    if (!has_value && !flag->is_bool) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = argv[++i];
    }
    if (absl::Status s = flag->set(value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status FlagParser::Set(const std::string& name, const std::string& value) {
  for (const Flag& f : flags_) {
    if (f.name == name) return f.set(value);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown flag ", name));
}

absl::Status FlagParser::ParseConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open config file ", path));
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    const absl::string_view t = absl::StripAsciiWhitespace(line);
    if (t.empty() || t[0] == '#') continue;
    const size_t sep = t.find_first_of("=:");
    if (sep == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", lineno, ": expected 'name = value'"));
    }
    const std::string name(absl::StripAsciiWhitespace(t.substr(0, sep)));
    const std::string value(absl::StripAsciiWhitespace(t.substr(sep + 1)));
    if (absl::Status s = Set(name, value); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", lineno, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

std::string FlagParser::Help() const {
  std::string out = absl::StrCat("Usage: ", program_, " [flags]\n", summary_, "\n\nFlags:\n");
  for (const Flag& f : flags_) {
    std::string left = absl::StrCat("  --", f.name, f.is_bool ? "" : " VALUE");
    absl::StrAppend(&out, absl::StrFormat("%-28s %s", left, f.help));
    if (!f.default_text.empty() && f.default_text != "false") absl::StrAppend(&out, " [default: ", f.default_text, "]");
    out += "\n";
  }
  absl::StrAppend(&out, absl::StrFormat("%-28s %s\n", "  --help", "show this help"));
  return out;
}

}  // namespace ps
