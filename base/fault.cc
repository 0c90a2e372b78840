#include "base/fault.h"

#include <array>
#include <atomic>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ps::fault {
namespace {

constexpr std::array<const char*, static_cast<int>(Point::kCount)> kNames = {"swap_copy", "host_tier_full", "kv_append",
                                                                             "strategy"};
std::array<std::atomic<int>, static_cast<int>(Point::kCount)> armed{};

}  // namespace

absl::Status Arm(const std::string& spec) {
  const size_t eq = spec.find('=');
  const std::string name = spec.substr(0, eq);
  int count = 1;
  if (eq != std::string_view::npos && (!absl::SimpleAtoi(spec.substr(eq + 1), &count) || count < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("fault '", spec, "': the count must be an integer >= 1"));
  }
  for (size_t p = 0; p < kNames.size(); ++p) {
    if (kNames[p] == name) {
      armed[p].store(count);
      return absl::OkStatus();
    }
  }
  std::string known;
  for (const char* n : kNames) absl::StrAppend(&known, known.empty() ? "" : ", ", n);
  return absl::InvalidArgumentError(absl::StrCat("unknown fault point '", name, "' (known: ", known, ")"));
}

void Reset() {
  for (std::atomic<int>& a : armed) a.store(0);
}

bool Hit(Point p) {
  std::atomic<int>& a = armed[static_cast<int>(p)];
  if (a.load(std::memory_order_relaxed) <= 0) return false;
  return a.fetch_sub(1) > 0;
}

}  // namespace ps::fault
