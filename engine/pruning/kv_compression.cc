#include "engine/pruning/kv_compression.h"

#include <algorithm>

#include "base/status.h"

namespace ps {

KvCompression::KvCompression(int n_layers, int n_kv_heads) : n_layers_(n_layers), n_kv_heads_(n_kv_heads) {}

absl::Status KvCompression::BeginStep(StepRows* rows, SeqContext& ctx) {
  (void)ctx;
  // The first step computes the prompt (WholePrompt: all of it but a prefix taken
  // from the prefix cache), and so does a step from position 0 (again after a
  // preemption dropped the KV, with the tokens generated so far).
  in_prompt_ = !rows->positions.empty() && (rows->positions.front() == 0 || evicted_.empty());
  if (in_prompt_) {
    prompt_ = rows->positions.back() + 1;
    evicted_.assign(n_layers_, 0);
    kept_.assign(n_layers_, std::vector<std::vector<int32_t>>(n_kv_heads_));
  }
  return absl::OkStatus();
}

void KvCompression::SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) {
  if (in_prompt_) {
    ObservePrompt(layer, att, ctx);
    return;  // the prompt attends densely
  }
  if (evicted_.empty()) return;  // no prompt seen (cannot happen with WholePrompt)
  const LayerTable& t = ctx.Kv(layer);
  const int bt = ctx.KvBlockTokens();
  const int32_t full_pages = prompt_ / bt;
  const auto n_kv = static_cast<int32_t>(t.positions.size());
  PS_CHECK(t.ascending && n_kv >= prompt_ && (n_kv == 0 || t.positions[n_kv - 1] == n_kv - 1))
      << "KV compression needs the prompt's rows in position order";
  std::vector<std::vector<int32_t>>& kept = kept_[layer];
  if (!evicted_[layer]) {
    evicted_[layer] = 1;
    KeepPages(layer, full_pages, bt, &kept);
    PS_CHECK(static_cast<int>(kept.size()) == n_kv_heads_) << "kept pages not given per KV head";
    bool evicts = false;
    for (int h = 0; h < n_kv_heads_; ++h) {
      const std::vector<int32_t>& k = kept[h];
      PS_CHECK(std::is_sorted(k.begin(), k.end()) && std::adjacent_find(k.begin(), k.end()) == k.end() &&
               (k.empty() || (k.front() >= 0 && k.back() < full_pages)))
          << "kept pages must be ascending, distinct and whole prompt pages";
      evicts = evicts || static_cast<int32_t>(k.size()) < full_pages;
    }
    if (!evicts) {
      kept.assign(n_kv_heads_, {});  // nothing to evict: dense from here on
      evicted_[layer] = 2;
    }
    for (int h = 0; h < n_kv_heads_ && evicts; ++h) {
      dropped_.clear();
      size_t next = 0;
      for (int32_t p = 0; p < full_pages; ++p) {
        if (next < kept[h].size() && kept[h][next] == p) {
          ++next;
        } else {
          dropped_.push_back(p);
        }
      }
      // A failed drop only keeps the memory: the selection below never reads those rows.
      if (!dropped_.empty()) ctx.DropHeadPages(layer, h, dropped_).IgnoreError();
    }
  }
  if (evicted_[layer] == 2) return;
  const auto n_q = static_cast<int32_t>(att.q_positions.size());
  for (int h = 0; h < n_kv_heads_; ++h) {
    KvSelection::Segment seg{.q_begin = 0, .q_end = n_q, .kv_head = h};
    for (int32_t p : kept[h]) AppendRange(seg.ranges, p * bt, (p + 1) * bt);
    if (full_pages * bt < n_kv) AppendRange(seg.ranges, full_pages * bt, n_kv);
    selection->segments.push_back(std::move(seg));
  }
}

}  // namespace ps
