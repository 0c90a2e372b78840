// The forward pass over a ragged batch: each sequence contributes its own rows
// (token ids with position ids); matmuls run over all rows together, attention
// per sequence over that sequence's cached KV. Call from one thread at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "base/thread_pool.h"
#include "engine/model.h"
#include "engine/pruning/strategy.h"
#include "memory/kv_store.h"

namespace ps {

struct SeqInput {
  int64_t seq_id = 0;
  std::span<const int32_t> tokens;     // new rows of this step
  std::span<const int32_t> positions;  // their positions, same length
  bool all_logits = false;             // logits for every row, else for the last row only
  bool no_logits = false;              // e.g. a prefill chunk that does not end the prompt
  PruningStrategy* strategy = nullptr; // null: full attention
};

struct ForwardOutput {
  // [n_logit_rows, n_vocab]; sequence i's rows start at row_offset[i] (row_count[i] rows).
  std::vector<float> logits;
  std::vector<int64_t> row_offset, row_count;
  // Token-layer pairs computed per sequence in this step (for "% of prompt computed").
  std::vector<int64_t> rows_computed;
  std::span<const float> Row(size_t seq, int64_t i, int n_vocab) const {
    return {logits.data() + (row_offset[seq] + i) * n_vocab, static_cast<size_t>(n_vocab)};
  }
};

class Transformer {
 public:
  Transformer(const Model& model, ThreadPool& pool, const MatMulOptions& matmul = {})
      : model_(model), pool_(pool), matmul_(matmul) {}
  absl::Status Forward(std::span<const SeqInput> batch, KvStore& kv, ForwardOutput* out);

 private:
  void EnsureCapacity(int64_t rows);
  const Model& model_;
  ThreadPool& pool_;
  MatMulOptions matmul_;
  // Rows of one sequence inside the compacted activation buffers.
  struct Segment {
    int64_t offset = 0;
    std::vector<int32_t> rows;  // step-local row indices still active, ascending
  };
  // Activations, grown to the largest batch seen ([rows, width] row-major), and
  // per-step bookkeeping reused across steps so the hot path does not allocate.
  std::vector<float> x_, xn_, q_, k_, v_, att_, tmp_, gate_, up_;
  std::vector<int32_t> tokens_, positions_, new_positions_, kept_rows_;
  std::vector<Segment> segments_;
  std::vector<float> probs_;
  int64_t capacity_ = 0;
};

}  // namespace ps
