// The forward pass over a ragged batch: each sequence contributes its own rows
// (token ids with position ids); matmuls run over all rows together, attention
// per sequence over the KV its strategy selects. Every operation goes through the
// Backend, and the activations live in its memory: the strategies' hooks read them
// through views that copy only what a hook asks for (rows, or their reductions). A failure belongs to
// one sequence (its rows leave the batch, the others go on), never to the batch.
// Call from one thread at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/pruning/strategy.h"
#include "engine/shared_attention.h"
#include "kernels/activations.h"
#include "kernels/backend.h"
#include "memory/kv_cache.h"
#include "model/model.h"

namespace ps {

struct SeqInput {
  int64_t seq_id = 0;
  std::span<const int32_t> tokens;      // new rows of this step
  std::span<const int32_t> positions;   // their positions, same length
  bool all_logits = false;              // logits for every row, else for the last row only
  bool no_logits = false;               // e.g. a prefill chunk that does not end the prompt
  PruningStrategy* strategy = nullptr;  // null: full attention
  bool report_kept = false;             // fill ForwardOutput::kept_rows for this sequence
};

struct ForwardOutput {
  // Per sequence: OK, or why it failed (ResourceExhausted: its KV reservation was
  // short). A failed sequence's KV is partly written: the caller frees it.
  std::vector<absl::Status> status;
  // [n_logit_rows, n_vocab]; sequence i's rows start at row_offset[i] (row_count[i] rows).
  std::vector<float> logits;
  std::vector<int64_t> row_offset, row_count;
  // Token-layer pairs computed per sequence in this step (for "% of prompt computed"),
  // prefix passes included.
  std::vector<int64_t> rows_computed;
  // Rows entering each layer: [batch.size() * n_layers], sequence-major.
  std::vector<int32_t> layer_rows;
  // Per sequence: the position after its last row (where its next token goes).
  std::vector<int32_t> next_position;
  // Per sequence with report_kept: indices of its input rows that reached the last layer.
  std::vector<std::vector<int32_t>> kept_rows;
  // Per sequence: bytes of activations its strategy's hooks read on the host this step,
  // prefix passes included (on a host-addressable backend: what a device would copy).
  std::vector<int64_t> host_bytes;
  std::span<const float> Row(size_t seq, int64_t i, int n_vocab) const {
    return {logits.data() + (row_offset[seq] + i) * n_vocab, static_cast<size_t>(n_vocab)};
  }
};

class Transformer {
 public:
  Transformer(const Model& model, Backend& backend)
      : model_(model), backend_(backend), hidden_rows_(backend), q_rows_(backend), k_rows_(backend) {
    backend_.UseWeightsOf(model_.id());
  }
  // Runs one step. The returned status is the batch's (a device error); each
  // sequence's own is in out->status.
  absl::Status Forward(std::span<const SeqInput> batch, KvCache& kv, ForwardOutput* out);

 private:
  class Context;
  // Runs layers 0..last_layer (< n_layers: no logits; only the last row's
  // attention at last_layer) over the given rows. Past the model's last layer's attention
  // only the rows that give logits go on.
  absl::Status Run(std::span<const SeqInput> batch, std::span<const StepRows* const> rows,
                   std::span<Context* const> contexts, int last_layer, KvCache& kv, ForwardOutput* out);
  // Sequence i's attention at `layer` over its cached rows (its K/V appended): run at
  // once when its strategy reads the result at this layer, else added to calls_ (run
  // together after every sequence's); its error fails it alone.
  absl::Status Attend(int layer, int stop_layer, size_t i, const SeqInput& in, Context& ctx, KvCache& kv,
                      HostReads& reads);
  // The model's attention shape.
  AttentionShape Shape() const;
  // Applies the strategies' RowsForLayer edits before `layer` and drops the rows of
  // failed sequences, compacting the activations.
  absl::Status EditRows(int layer, std::span<const SeqInput> batch, std::span<Context* const> contexts,
                        std::vector<absl::Status>& status, std::vector<HostReads>& reads);
  // After the last layer's attention: keeps the rows that give logits (each sequence's
  // last, all of them with all_logits, none with no_logits), their attention outputs
  // gathered into q_ and hidden states into x_ when that drops rows; sets logit_rows_.
  // Returns how many.
  int64_t KeepLogitRows(std::span<const SeqInput> batch, const std::vector<absl::Status>& status);
  // Room for `rows` rows in every activation buffer (growing one drops its contents).
  absl::Status EnsureCapacity(int64_t rows);

  const Model& model_;
  Backend& backend_;
  int64_t n_rows_ = 0;  // active rows of the current pass
  // Rows of one sequence inside the compacted activation buffers.
  struct Segment {
    int64_t offset = 0;  // first row in the activation buffers
    int64_t n = 0;       // active rows
  };
  // Activations in the backend's memory, grown to the largest batch seen ([rows,
  // width] row-major; stat_ and logits_ as their hooks need), and per-step
  // bookkeeping reused across steps so the hot path does not allocate.
  Activations x_, xn_, q_, k_, v_, att_, tmp_, gate_, up_, stat_, logits_;
  SharedAttentionScratch shared_;
  // The strategies' hooks' views of the activations, and the host copy of the
  // last-query statistics.
  ActivationRows hidden_rows_, q_rows_, k_rows_;
  std::vector<float> host_stat_;
  std::vector<int32_t> tokens_, positions_, origins_, new_positions_, new_origins_, gather_;
  std::vector<Segment> segments_;
  std::vector<Segment> logit_rows_;  // per sequence: its rows in x_ that give logits, after the last layer
  // Per sequence: the KV its attention reads, and the view's block table; the
  // attentions that run together, and the KV appends of a layer.
  std::vector<KvSelection> selections_;
  std::vector<KvCache::BlockTable> tables_;
  std::vector<AttentionCall> calls_;
  std::vector<KvCache::Rows> appends_;
  std::vector<size_t> appended_;
  std::vector<absl::Status> append_status_;
  std::vector<StepRows> step_rows_;  // per sequence, as BeginStep left them
  struct RowEdit {
    std::vector<char> keep;
    std::vector<int32_t> add_positions;
    std::vector<float> add_hidden;
  };
  std::vector<RowEdit> edits_;  // per sequence, RowsForLayer's answer
};

}  // namespace ps
