#include "engine/pruning/aux_rows.h"

#include <algorithm>
#include <limits>

#include "base/status.h"

namespace ps {

AuxRows::AuxRows(std::vector<int> layers, int n_layers, int n_embd)
    : layers_(std::move(layers)), n_layers_(n_layers), n_embd_(n_embd), aux_at_(layers_.size(), 0) {
  PS_CHECK(n_layers_ < std::numeric_limits<uint16_t>::max() && std::is_sorted(layers_.begin(), layers_.end()))
      << "bad pruning layers";
}

int AuxRows::PruneIndex(int layer) const {
  auto it = std::lower_bound(layers_.begin(), layers_.end(), layer);
  return it != layers_.end() && *it == layer ? static_cast<int>(it - layers_.begin()) : -1;
}

int AuxRows::DepthAfter(int j) const { return j + 1 < static_cast<int>(layers_.size()) ? layers_[j + 1] : n_layers_; }

void AuxRows::Feed(std::span<const int32_t> positions) {
  int32_t end = context();
  for (int32_t p : positions) end = std::max(end, p + 1);
  depth_.resize(end, 0);
  in_aux_.resize(end, 0);
  for (int32_t p : positions) {
    PS_CHECK(depth_[p] == 0 && !in_aux_[p]) << "position " << p << " fed twice";
    depth_[p] = static_cast<uint16_t>(DepthAfter(-1));
  }
}

void AuxRows::Apply(int j, std::span<const char> go_on, std::span<const int32_t> revive, LayerRows& rows,
                    SeqContext& ctx) {
  const int layer = layers_[j];
  const int after = DepthAfter(j);
  const size_t d = static_cast<size_t>(n_embd_);
  const size_t n = rows.positions.size();
  // The hidden states of the rows that leave (the newest stays), from the first to the last.
  size_t lo = n, hi = 0;
  for (size_t i = 0; i + 1 < n; ++i) {
    if (!go_on[rows.positions[i]]) lo = std::min(lo, i), hi = i + 1;
  }
  const float* hidden = lo < hi ? rows.hidden->Host(static_cast<int64_t>(lo), static_cast<int64_t>(hi - lo)) : nullptr;
  for (size_t i = 0; i < n; ++i) {
    const int32_t p = rows.positions[i];
    PS_CHECK(depth_[p] == layer && !in_aux_[p]) << "row " << p << " reached layer " << layer << " out of turn";
    if (!go_on[p] && i + 1 < n && ctx.AuxPut(p, hidden + (i - lo) * d)) {
      (*rows.keep)[i] = 0;
      in_aux_[p] = 1;
      ++aux_at_[j];
      ++aux_count_;
    } else {
      depth_[p] = static_cast<uint16_t>(after);
    }
  }
  for (int32_t p : revive) {
    PS_CHECK(WaitsAt(p, j)) << "position " << p << " does not wait at layer " << layer;
    rows.add_positions->push_back(p);
    rows.add_hidden->resize(rows.add_hidden->size() + d);
    PS_CHECK(ctx.AuxTake(p, rows.add_hidden->data() + rows.add_hidden->size() - d))
        << "position " << p << " missing from the Aux Cache";
    in_aux_[p] = 0;
    depth_[p] = static_cast<uint16_t>(after);
    --aux_at_[j];
    --aux_count_;
    ++revived_;
  }
}

}  // namespace ps
