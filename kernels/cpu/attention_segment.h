// The unit of the CPU attention (attention.cc): one query segment over chunks of a
// view's rows, tiled with an online softmax; and the row geometry both files use.
// Internal to kernels/cpu/.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/types.h"

namespace ps::attention_internal {

// A single query row splits its keys among units (flash-decoding) from twice this many
// visible keys on, at least this many a unit; fewer keys run as one unit per KV head.
constexpr int64_t kMinSplitKeys = 256;

// Rows [j0, j0 + nb) of a view, inside one block.
struct Chunk {
  int64_t j0 = 0, nb = 0;
};

// Splits row ranges at block boundaries (rows of one chunk are contiguous in memory).
void SplitAtBlocks(const KvRows& kv, std::span<const KvRange> ranges, std::vector<Chunk>* out);
// The parts of `chunks` whose keys a query at a position in [min_q_pos, max_q_pos]
// may see, and how many keys they hold: when positions ascend with the row index,
// the leading part (causality) and, in a PositionWindow, only the keys proximal or
// distant to some such query: no other key is read (the proximal part's distant keys
// may have been dropped). All of them otherwise.
int64_t VisibleChunks(const KvRows& kv, std::span<const Chunk> chunks, int32_t min_q_pos, int32_t max_q_pos,
                      const PositionWindow& window, std::vector<Chunk>* out);
// n elements of a KV row of type t (F32, F16, BF16 or Q8_0) as F32.
void KvToF32(DType t, const void* src, float* dst, int64_t n);

// One query segment over the chunks of `kv`. For several query rows `kv` must be
// F32 (the gathered copy) so that each tile is one sgemm operand, unless
// PrefillAttentionOnBf16 (kernels/cpu/attention.h). row_ids maps a
// view row to the caller's row for the last-query statistics (null: the same).
struct SegmentArgs {
  const KvRows* kv = nullptr;
  std::span<const Chunk> chunks;
  const int32_t* row_ids = nullptr;
  int64_t q_begin = 0, q_end = 0;
  int kv_head = -1;              // -1: every KV head, else only this one's query heads
  int64_t stats_n = 0;           // length of each head's statistics row (the caller's kv.n)
  float* last_logits = nullptr;  // [n_heads, stats_n] or null: the last query's scaled scores
  float* last_norm = nullptr;    // [n_heads, 2] or null: its final maximum and sum of exponentials
};

// Attends the segment's query rows over its chunks: outputs into a.out, the last
// query's statistics into seg's buffers.
void AttendSegment(const AttentionShape& s, const AttentionArgs& a, const SegmentArgs& seg, ThreadPool& pool);

}  // namespace ps::attention_internal
