// Runs a shell command for a test: its exit code and what it printed on stdout
// (redirect stderr in the command to capture it too).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace ps::testing {

struct CommandResult {
  int exit_code = -1;  // 128 + signal when killed
  std::string output;
};

inline CommandResult RunCommand(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace ps::testing
