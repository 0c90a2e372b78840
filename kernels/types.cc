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
  for (size_t i = 0; i < segments.size();) {
    // A group: one segment for every KV head, or one per KV head, heads in order.
    const Segment& first = segments[i];
    if (first.q_begin != q || first.q_end <= first.q_begin) {
      return absl::InvalidArgumentError(absl::StrCat("KV selection segment ", i, " covers query rows [", first.q_begin,
                                                     ", ", first.q_end, ") after ", q, " rows"));
    }
    const size_t heads = first.kv_head == -1 ? 1 : static_cast<size_t>(n_kv_heads);
    for (size_t h = 0; h < heads; ++h, ++i) {
      if (i == segments.size() || (first.kv_head != -1 && segments[i].kv_head != static_cast<int32_t>(h)) ||
          segments[i].q_begin != first.q_begin || segments[i].q_end != first.q_end) {
        return absl::InvalidArgumentError(absl::StrCat("KV selection segment ", i, ": per-KV-head segments must name ",
                                                       "heads 0..", n_kv_heads - 1,
                                                       " in order for the same query rows"));
      }
      int64_t end = 0;
      for (const KvRange& r : segments[i].ranges) {
        if (r.begin < end || r.end <= r.begin || r.end > n_kv) {
          return absl::InvalidArgumentError(absl::StrCat("KV selection segment ", i, ": range [", r.begin, ", ", r.end,
                                                         ") is not ascending inside [0, ", n_kv, ")"));
        }
        end = r.end;
      }
    }
    q = first.q_end;
  }
  if (q != n_q) {
    return absl::InvalidArgumentError(absl::StrCat("KV selection covers ", q, " of ", n_q, " query rows"));
  }
  return absl::OkStatus();
}

}  // namespace ps
