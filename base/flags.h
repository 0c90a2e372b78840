// A small command-line parser: --name value, --name=value and boolean --name,
// with generated --help text. Unknown flags and bad values are errors.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace ps {

class FlagParser {
 public:
  FlagParser(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {}

  void AddString(const std::string& name, std::string* out, const std::string& help);
  void AddStringList(const std::string& name, std::vector<std::string>* out, const std::string& help);
  void AddInt(const std::string& name, int64_t* out, const std::string& help);
  // Comma-separated integers ("1,4,16"); a value replaces the default list.
  void AddIntList(const std::string& name, std::vector<int64_t>* out, const std::string& help);
  void AddFloat(const std::string& name, double* out, const std::string& help);
  void AddBool(const std::string& name, bool* out, const std::string& help);

  // Parses argv; positional arguments go to `positional` (error if null and present).
  absl::Status Parse(int argc, char** argv, std::vector<std::string>* positional = nullptr);
  // Applies a config file: one `name = value` (or `name: value`) per line, names as
  // the flags without dashes; blank lines and lines starting with '#' are skipped.
  absl::Status ParseConfigFile(const std::string& path);
  bool help_requested() const { return help_; }
  // Sets one flag by name (as from the command line).
  absl::Status Set(const std::string& name, const std::string& value);
  std::string Help() const;

 private:
  struct Flag {
    std::string name, help, default_text;
    bool is_bool = false;
    std::function<absl::Status(const std::string&)> set;
  };
  std::string program_, summary_;
  std::vector<Flag> flags_;
  bool help_ = false;
};

}  // namespace ps
