// Progressive row pruning with revival, shared by LazyLLM and SlimInfer. Pruning
// layers L_0 < L_1 < ... split the model into stages. A row starts at layer 0 and
// runs to L_0; at each pruning layer it either goes on to the next one (or to the
// end) or leaves: its hidden state at that layer waits in the sequence's Aux Cache
// and its KV is not computed from there on. A later step can revive it at that
// layer (it continues with its original position) instead of recomputing the
// layers below. When the Aux Cache has no room for a leaving row, the row stays
// (computed through, as `full` would). Each position is computed at most once per
// layer over the whole generation; at any layer its entry is in the KV cache or
// the Aux Cache, never both.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/pruning/strategy.h"

namespace ps {

class AuxRows {
 public:
  AuxRows(std::vector<int> layers, int n_layers, int n_embd);

  const std::vector<int>& layers() const { return layers_; }
  // The index of `layer` among the pruning layers, or -1.
  int PruneIndex(int layer) const;
  // Where rows going on at pruning layer j stop next: the next pruning layer, or
  // n_layers (j = -1: where new rows stop).
  int DepthAfter(int j) const;

  // New rows (they start at layer 0); positions below their end now exist. A
  // position fed twice is an invariant violation.
  void Feed(std::span<const int32_t> positions);
  // Positions 0..context()-1 exist.
  int32_t context() const { return static_cast<int32_t>(depth_.size()); }

  // At pruning layer layers[j], before it: the rows of `rows` whose position has
  // go_on[pos] == 0 leave to the Aux Cache (the newest, last row always goes on),
  // then the positions `revive` (waiting at this layer) come back, placed before the
  // kept rows.
  void Apply(int j, std::span<const char> go_on, std::span<const int32_t> revive, LayerRows& rows, SeqContext& ctx);

  // A position's KV exists at layers < Depth(pos); when Depth(pos) < n_layers its
  // hidden state at that layer is in the Aux Cache.
  int Depth(int32_t pos) const { return pos < context() ? depth_[pos] : 0; }
  bool InAux(int32_t pos) const { return pos < context() && in_aux_[pos]; }
  // Waiting at pruning layer layers[j] to be revived there.
  bool WaitsAt(int32_t pos, int j) const { return InAux(pos) && depth_[pos] == layers_[j]; }
  int64_t aux_at(int j) const { return aux_at_[j]; }  // Aux Cache entries at pruning layer j
  int64_t aux_entries() const { return aux_count_; }
  int64_t revived() const { return revived_; }

 private:
  std::vector<int> layers_;
  int n_layers_;
  int n_embd_;
  std::vector<uint16_t> depth_;  // per position
  std::vector<char> in_aux_;     // per position
  std::vector<int64_t> aux_at_;  // per pruning layer
  int64_t aux_count_ = 0, revived_ = 0;
};

}  // namespace ps
