// Backend-neutral shapes the forward pass hands to a Backend: weight matrices,
// rotary-embedding parameters, and attention over a selection of paged KV rows.
// Plain data: no CPU or CUDA type appears here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kernels/dtype.h"
#include "kernels/shared_math.h"

namespace ps {

// A row-major weight matrix [rows, cols] whose rows are stored in `type` blocks.
// Does not own its data.
struct MatrixView {
  DType type = DType::kF32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  // The same matrix in the CPU's packed layout for int8 products (kernels/cpu/packed.h),
  // made once at start-up (PrepareWeights), or null. `data` stays valid either way.
  const uint8_t* packed = nullptr;
  size_t row_bytes() const { return RowBytes(type, cols); }
  const uint8_t* Row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes(); }
};

// One of several products of the same activations (Backend::MatMuls): y[m, w->rows].
struct MatMulOutput {
  const MatrixView* w = nullptr;
  float* y = nullptr;
};

struct RopeParams {
  int n_dims = 0;  // rotated dimensions per head (<= head_dim)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;          // 1 / linear scaling factor
  bool neox = false;                // pairs (i, i + n_dims/2) instead of (2i, 2i+1)
  std::vector<float> freq_factors;  // per pair divisor (LLaMA-3 scaling); empty = none
};

struct AttentionShape {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;  // usually 1/sqrt(head_dim)
};

// Cached keys and values of one sequence at one layer: n rows of n_kv_heads*head_dim
// elements of `dtype` (F32, F16, BF16, or Q8_0: blocks of 32 int8 values with an fp16
// scale, the heads' widths and `stride` multiples of 32). Rows live in blocks of
// `block_rows` rows (paged KV): row j's key starts `(j % block_rows) * stride` elements into
// k_blocks[j / block_rows], its value likewise in v_blocks. A contiguous cache is
// one block. With head_cols > 0 the heads' columns are in blocks of their own: the
// columns [h * head_cols, (h + 1) * head_cols) of row j start `(j % block_rows) *
// stride` elements into k_blocks[h * head_blocks + j / block_rows] (the KV cache's
// layout, memory/kv_cache.h). positions[j] is row j's token position. A null block
// pointer marks a block that is not in this memory (host tier, or keys dropped): the
// kernel must not read it (a selection or a window leaves it out).
struct KvRows {
  const void* const* k_blocks = nullptr;
  const void* const* v_blocks = nullptr;
  int64_t block_rows = 0;
  const int32_t* positions = nullptr;
  int64_t n = 0;
  int64_t stride = 0;
  bool positions_ascending = false;  // lets the kernel skip keys past the last query
  DType dtype = DType::kF32;
  int64_t head_cols = 0;    // > 0: columns per head, each head in blocks of its own
  int64_t head_blocks = 0;  // then: pointers per head in k_blocks and v_blocks

  // Bytes of n elements (a whole number of Q8_0 blocks for that type).
  int64_t bytes(int64_t n) const {
    switch (dtype) {
      case DType::kF32: return 4 * n;
      case DType::kQ8_0: return n / 32 * 34;
      default: return 2 * n;
    }
  }
  // Element `col` of row j's key / value.
  const void* k(int64_t j, int64_t col) const { return Elem(k_blocks, j, col); }
  const void* v(int64_t j, int64_t col) const { return Elem(v_blocks, j, col); }

 private:
  const void* Elem(const void* const* blocks, int64_t j, int64_t col) const {
    if (head_cols > 0) {
      const int64_t h = col / head_cols;
      blocks += h * head_blocks;
      col -= h * head_cols;
    }
    return static_cast<const uint8_t*>(blocks[j / block_rows]) + bytes((j % block_rows) * stride + col);
  }
};

// [begin, end): rows of a KvRows.
struct KvRange {
  int32_t begin = 0, end = 0;
  bool operator==(const KvRange&) const = default;
};

// Which cached rows the query rows of one sequence attend to at one layer; the
// kernels read exactly these (no mask is built), and causality by position still
// applies inside them. No segments: every row (dense attention, what `full` gives).
// Otherwise the segments cover the query rows in order, each naming ascending,
// disjoint row ranges: one segment for a token subset (a decode over the kept
// tokens), one per query segment for block-sparse prefill. A segment serves every KV
// head, or (kv_head >= 0) only the query heads of one: then the segments of KV heads
// 0..n_kv_heads-1 follow each other for the same query rows (blocks selected per KV
// head).
struct KvSelection {
  struct Segment {
    int32_t q_begin = 0, q_end = 0;  // [q_begin, q_end) of the sequence's query rows
    std::vector<KvRange> ranges;
    int32_t kv_head = -1;  // -1: every KV head
  };
  std::vector<Segment> segments;

  bool all() const { return segments.empty(); }
  // One segment for n_q query rows over the given rows (ascending), adjacent rows merged.
  void SelectRows(int32_t n_q, std::span<const int32_t> rows);
  // Segments in order covering [0, n_q) (per-head ones complete, heads in order);
  // ranges ascending, disjoint, inside [0, n_kv).
  absl::Status Validate(int64_t n_q, int64_t n_kv, int n_kv_heads) const;
};

// Appends row range [begin, end) to ascending `ranges`, merged with the last one
// when they touch.
void AppendRange(std::vector<KvRange>& ranges, int32_t begin, int32_t end);

// Which keys a query row sees by position, beyond causality: all of them, the
// proximal ones (positions below `sinks` or within the `recent` newest up to the
// query's own) or the others (distant).
struct PositionWindow {
  enum class Part { kAll = 0, kProximal = 1, kDistant = 2 };  // WindowSees's numbering
  Part part = Part::kAll;
  int32_t sinks = 0, recent = 0;

  bool Sees(int32_t key_pos, int32_t q_pos) const {
    return WindowSees(static_cast<int>(part), sinks, recent, key_pos, q_pos);
  }
  // Whether every query with a position in [q_lo, q_hi] sees every key with a position
  // in [k_lo, k_hi] (a tile that needs no mask).
  bool SeesAll(int32_t k_lo, int32_t k_hi, int32_t q_lo, int32_t q_hi) const {
    if (k_hi > q_lo) return false;
    const int64_t distant_to_all = int64_t{q_lo} - recent, distant_to_some = int64_t{q_hi} - recent;
    switch (part) {
      case Part::kAll: return true;
      case Part::kProximal:  // none in the gap [sinks, distant_to_some]: distant to the last query
        return k_hi < sinks || k_lo > distant_to_some || sinks > distant_to_some;
      case Part::kDistant: return k_lo >= sinks && k_hi <= distant_to_all;
    }
    return false;
  }
};

struct AttentionArgs {
  const float* q = nullptr;        // [n_q, n_heads*head_dim], rows `q_stride` floats apart
  const int32_t* q_pos = nullptr;  // [n_q]
  int64_t n_q = 0;
  int64_t q_stride = 0;
  float* out = nullptr;  // [n_q, n_heads*head_dim], rows `out_stride` floats apart
  int64_t out_stride = 0;
  const KvSelection* selection = nullptr;  // null: every row
  // Optional [kv.n]: receives the attention probabilities of the last query row,
  // averaged over heads (what progressive token pruning scores tokens by); 0 for rows
  // outside the selection.
  float* last_query_probs = nullptr;
  // Optional [kv.n]: the last query row's scaled pre-softmax scores q·k summed over
  // heads (each query head against its GQA key head), -inf for masked or unselected keys.
  float* last_query_logits = nullptr;
  // Optional [n_q, n_heads], rows lse_stride floats apart: each row's log-sum-exp of
  // its scaled scores over the keys it saw (-inf: none), so that attentions over
  // disjoint key sets merge exactly (o = sum_p exp(lse_p - lse) o_p).
  float* lse = nullptr;
  int64_t lse_stride = 0;
  PositionWindow window;
};

// One sequence's attention among several (Backend::Attentions).
struct AttentionCall {
  KvRows kv;
  AttentionArgs args;
};

}  // namespace ps
