// The forward pass's view of the KV cache: append rows for a sequence at a layer,
// read them back for attention. Implementations: ContiguousKvStore below (offline
// generation, tests) and PagedKvStore (the scheduler's paged device tier).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/attention.h"

namespace ps {

class KvStore {
 public:
  virtual ~KvStore() = default;
  // Appends n rows of K and V ([n, kv_dim] each) with their token positions.
  // Returns ResourceExhausted when the sequence or the store is full.
  virtual absl::Status Append(int64_t seq_id, int layer, std::span<const int32_t> positions, const float* k,
                              const float* v) = 0;
  // Rows stored for (seq, layer); valid until the next Append, View or Release on
  // this store (implementations may reuse one block-table buffer for every View).
  virtual KvRows View(int64_t seq_id, int layer) = 0;
  // Drops everything held for the sequence.
  virtual void Release(int64_t seq_id) = 0;
};

// Single-tier store: each sequence owns one growing contiguous F32 buffer per layer,
// holding at most `max_tokens` rows.
class ContiguousKvStore final : public KvStore {
 public:
  ContiguousKvStore(int n_layers, int kv_dim, int64_t max_tokens)
      : n_layers_(n_layers), kv_dim_(kv_dim), max_tokens_(max_tokens) {}

  absl::Status Append(int64_t seq_id, int layer, std::span<const int32_t> positions, const float* k,
                      const float* v) override;
  KvRows View(int64_t seq_id, int layer) override;
  void Release(int64_t seq_id) override { seqs_.erase(seq_id); }

 private:
  struct Layer {
    std::vector<float> k, v;         // [size, kv_dim]
    std::vector<int32_t> positions;  // [size]
    bool ascending = true;
    const void* k_block = nullptr;  // the single "block" of View(); refreshed there
    const void* v_block = nullptr;
  };
  int n_layers_;
  int kv_dim_;
  int64_t max_tokens_;
  std::unordered_map<int64_t, std::vector<Layer>> seqs_;
};

}  // namespace ps
