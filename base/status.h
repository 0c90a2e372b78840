// Error-handling helpers shared by every component: absl::Status plumbing and
// invariant checks that stay on in release builds.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PS_CONCAT_INNER_(a, b) a##b
#define PS_CONCAT_(a, b) PS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define PS_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status ps_status_ = (expr);      \
    if (!ps_status_.ok()) return ps_status_; \
  } while (0)

// `lhs = value of expr` where expr is an absl::StatusOr<T>; returns its status on error.
#define PS_ASSIGN_OR_RETURN(lhs, expr) PS_ASSIGN_OR_RETURN_IMPL_(PS_CONCAT_(ps_statusor_, __LINE__), lhs, expr)
#define PS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

namespace ps::internal {
// Collects a message and aborts in its destructor; used by PS_CHECK.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond) {
    stream_ << file << ":" << line << ": check failed: " << cond << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::fprintf(stderr, "%s\n", stream_.str().c_str());
    std::fflush(stderr);
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};
struct Voidify {
  void operator&(std::ostream&) {}
};
}  // namespace ps::internal

// Invariant check, active in every build type: PS_CHECK(n > 0) << "n=" << n;
#define PS_CHECK(cond) \
  (cond) ? (void)0 : ::ps::internal::Voidify() & ::ps::internal::CheckFailure(__FILE__, __LINE__, #cond).stream()
