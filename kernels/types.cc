#include "kernels/types.h"

#include "absl/strings/str_cat.h"

namespace ps {

void AppendRange(std::vector<KvRange>& ranges, int32_t begin, int32_t end) {
  if (!ranges.empty() && ranges.back().end == begin) {
    ranges.back().end = end;
  } else {
    ranges.push_back({begin, end});
  }
}

void KvSelection::SelectRows(int32_t n_q, std::span<const int32_t> rows) {
  segments.assign(1, Segment{.q_begin = 0, .q_end = n_q});
  for (int32_t r : rows) AppendRange(segments[0].ranges, r, r + 1);
}

absl::Status KvSelection::Validate(int64_t n_q, int64_t n_kv, int n_kv_heads) const {
  if (all()) return absl::OkStatus();
  int64_t q = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    const bool head_follows = s.kv_head > 0 && s.kv_head < n_kv_heads && i > 0 &&
                              segments[i - 1].kv_head == s.kv_head - 1 && segments[i - 1].q_begin == s.q_begin &&
                              segments[i - 1].q_end == s.q_end;
    if (s.kv_head > 0 && !head_follows) {
      return absl::InvalidArgumentError(absl::StrCat("KV selection segment ", i, " names KV head ", s.kv_head,
                                                     " without the heads before it for the same query rows"));
    }
    if (!head_follows && (s.q_begin != q || s.q_end <= s.q_begin)) {
      return absl::InvalidArgumentError(absl::StrCat("KV selection segment ", i, " covers query rows [", s.q_begin,
                                                     ", ", s.q_end, ") after ", q, " rows"));
    }
    if (s.kv_head < -1 || s.kv_head >= n_kv_heads ||
        (s.kv_head >= 0 && s.kv_head < n_kv_heads - 1 &&
         (i + 1 == segments.size() || segments[i + 1].kv_head != s.kv_head + 1))) {
      return absl::InvalidArgumentError(absl::StrCat("KV selection segment ", i, ": KV head ", s.kv_head,
                                                     " is not followed by the next of ", n_kv_heads, " heads"));
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
