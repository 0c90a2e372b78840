// A backend's own copies of host weights (the CUDA backend's device copies), made on
// first use and kept for one model at a time: the copies belong to the model whose id
// the backend was last given, and giving it another drops them. A model freed and
// another loaded at the same host addresses therefore never reads the first one's
// copies. C++17 (the CUDA backend includes it).
#pragma once

#include <cstdint>
#include <map>
#include <tuple>
#include <utility>

#include "kernels/memory_region.h"

namespace ps {

class WeightMirrors {
 public:
  WeightMirrors() = default;
  WeightMirrors(const WeightMirrors&) = delete;
  WeightMirrors& operator=(const WeightMirrors&) = delete;
  ~WeightMirrors() { Clear(); }

  // The weights now come from the model `model_id` (Model::id(); 0 for weights that
  // belong to no model): the copies of any other model are released.
  void UseModel(uint64_t model_id) {
    if (model_id == model_) return;
    Clear();
    model_ = model_id;
  }
  uint64_t model() const { return model_; }

  // The copy of `elements` values at `host` in layout `layout` (a backend's own tag:
  // the same host data may be kept in several types), or null.
  uint8_t* Find(const void* host, int64_t elements, int layout) const {
    const auto it = copies_.find(Key{host, elements, layout});
    return it == copies_.end() ? nullptr : it->second.base;
  }
  // Keeps `region` as that copy (released with the model) and returns its base.
  uint8_t* Add(const void* host, int64_t elements, int layout, MemoryRegion region) {
    return copies_.emplace(Key{host, elements, layout}, std::move(region)).first->second.base;
  }
  size_t size() const { return copies_.size(); }

 private:
  using Key = std::tuple<const void*, int64_t, int>;
  void Clear() {
    for (auto& [key, region] : copies_) {
      if (region.release) region.release(region.base);
    }
    copies_.clear();
  }

  uint64_t model_ = 0;
  std::map<Key, MemoryRegion> copies_;
};

}  // namespace ps
