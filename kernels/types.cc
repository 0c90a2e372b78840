#include "kernels/types.h"

#include "absl/strings/str_cat.h"

namespace ps {

void KvSelection::SelectRows(int32_t n_q, std::span<const int32_t> rows) {
  segments.assign(1, Segment{.q_begin = 0, .q_end = n_q});
  std::vector<KvRange>& ranges = segments[0].ranges;
  for (int32_t r : rows) {
    if (!ranges.empty() && ranges.back().end == r) {
      ++ranges.back().end;
    } else {
      ranges.push_back({r, r + 1});
    }
  }
}

absl::Status KvSelection::Validate(int64_t n_q, int64_t n_kv) const {
  if (all()) return absl::OkStatus();
  int64_t q = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (s.q_begin != q || s.q_end <= s.q_begin) {
      return absl::InvalidArgumentError(absl::StrCat("KV selection segment ", i, " covers query rows [", s.q_begin,
                                                     ", ", s.q_end, ") after ", q, " rows"));
    }
    q = s.q_end;
    int64_t end = 0;
    for (const KvRange& r : s.ranges) {
      if (r.begin < end || r.end <= r.begin || r.end > n_kv) {
        return absl::InvalidArgumentError(absl::StrCat("KV selection segment ", i, ": range [", r.begin, ", ", r.end,
                                                       ") is not ascending inside [0, ", n_kv, ")"));
      }
      end = r.end;
    }
  }
  if (q != n_q) {
    return absl::InvalidArgumentError(absl::StrCat("KV selection covers ", q, " of ", n_q, " query rows"));
  }
  return absl::OkStatus();
}

}  // namespace ps
