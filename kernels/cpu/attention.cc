#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/status.h"
#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/attention_segment.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/vec.h"

namespace ps {
namespace {

using attention_internal::AttendSegment;
using attention_internal::Chunk;
using attention_internal::KvToF32;
using attention_internal::SegmentArgs;
using attention_internal::SplitAtBlocks;
using attention_internal::VisibleChunks;

// The selected rows of a view as one contiguous F32 block (keys, values, positions
// and the rows they came from), converted from half or Q8_0 types as needed.
struct Gathered {
  std::vector<float> k, v;
  std::vector<int32_t> positions, rows;
  const void* k_block = nullptr;
  const void* v_block = nullptr;
  KvRows view;
};

// `width`: the values of a row the attention reads (its heads'), from the row's start.
void Gather(const KvRows& kv, std::span<const Chunk> chunks, int64_t width, ThreadPool& pool, Gathered* g) {
  g->rows.clear();
  for (const Chunk& c : chunks) {
    for (int64_t j = c.j0; j < c.j0 + c.nb; ++j) g->rows.push_back(static_cast<int32_t>(j));
  }
  const auto m = static_cast<int64_t>(g->rows.size());
  if (static_cast<int64_t>(g->k.size()) < m * width) {
    g->k.resize(m * width);
    g->v.resize(m * width);
  }
  g->positions.resize(m);
  const int64_t span = kv.head_cols > 0 ? kv.head_cols : width;
  pool.ParallelFor(m, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t j = g->rows[r];
      g->positions[r] = kv.positions[j];
      for (int64_t c = 0; c < width; c += span) {  // a head at a time where heads have blocks of their own
        KvToF32(kv.dtype, kv.k(j, c), g->k.data() + r * width + c, span);
        KvToF32(kv.dtype, kv.v(j, c), g->v.data() + r * width + c, span);
      }
    }
  });
  g->k_block = g->k.data();
  g->v_block = g->v.data();
  g->view = KvRows{.k_blocks = &g->k_block,
                   .v_blocks = &g->v_block,
                   .block_rows = std::max<int64_t>(m, 1),
                   .positions = g->positions.data(),
                   .n = m,
                   .stride = width,
                   .positions_ascending = std::is_sorted(g->positions.begin(), g->positions.end()),
                   .dtype = DType::kF32};
}

}  // namespace

bool PrefillAttentionOnBf16(const AttentionShape& shape, DType kv_dtype) {
  return ActiveCpuIsa() >= CpuIsa::kAvx512Bf16 && kv_dtype == DType::kBF16 &&
         shape.head_dim % avx512_bf16::kHeadAlign == 0;
}

bool PrefillAttentionOnInt8(const AttentionShape& shape, DType kv_dtype) {
  return ActiveCpuIsa() >= CpuIsa::kAvx512Bf16 && kv_dtype == DType::kQ8_0 &&
         shape.head_dim % avx512_bf16::kHeadAlign == 0;
}

namespace {

// A GQA group and head size the AVX-512 decode kernels take.
bool DecodeKernelsTake(const AttentionShape& shape) {
  return shape.n_heads / shape.n_kv_heads <= avx512_bf16::kMaxDecodeHeads &&
         shape.head_dim <= avx512_bf16::kMaxDecodeHeadSize;
}

}  // namespace

bool DecodeAttentionOnBf16(const AttentionShape& shape, DType kv_dtype) {
  return PrefillAttentionOnBf16(shape, kv_dtype) && DecodeKernelsTake(shape);
}

bool DecodeAttentionOnInt8(const AttentionShape& shape, DType kv_dtype) {
  return PrefillAttentionOnInt8(shape, kv_dtype) && DecodeKernelsTake(shape);
}

void Attention(const AttentionShape& s, const KvRows& kv, const AttentionArgs& a, ThreadPool& pool) {
  PS_CHECK(s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0) << "bad head counts";
  // A view may start inside wider rows (one KV head of a cache: its blocks offset to the head).
  const int64_t width = static_cast<int64_t>(s.n_kv_heads) * s.head_dim;
  if (kv.head_cols > 0) {
    PS_CHECK(kv.head_cols == s.head_dim && kv.stride >= s.head_dim)
        << "KV heads of " << kv.head_cols << " values in rows of " << kv.stride << ", the heads " << s.head_dim;
  } else {
    PS_CHECK(kv.stride >= width) << "KV rows hold " << kv.stride << " values, the heads " << width;
  }
  // The last query's scaled scores per head (-inf where unselected or masked) and its
  // final softmax maximum and sum per head: the statistics are reduced from them.
  static thread_local std::vector<float> last_logits_storage, last_norm_storage;
  const bool stats = a.last_query_probs != nullptr || a.last_query_logits != nullptr;
  float* last_logits = nullptr;
  float* last_norm = nullptr;
  if (stats) {
    last_logits_storage.assign(static_cast<size_t>(s.n_heads * kv.n), -std::numeric_limits<float>::infinity());
    last_norm_storage.assign(static_cast<size_t>(2 * s.n_heads), 0.0f);
    last_logits = last_logits_storage.data();
    last_norm = last_norm_storage.data();
  }

  // Query segments with their rows: the whole query range over every row, or the selection's.
  static thread_local std::vector<KvRange> all_rows(1);
  static thread_local std::vector<Chunk> chunks, visible;
  static thread_local Gathered gathered;
  const bool all = a.selection == nullptr || a.selection->all();
  const size_t n_segments = all ? 1 : a.selection->segments.size();
  for (size_t i = 0; i < n_segments; ++i) {
    SegmentArgs seg{.stats_n = kv.n, .last_logits = last_logits, .last_norm = last_norm};
    std::span<const KvRange> ranges;
    if (all) {
      all_rows[0] = {0, static_cast<int32_t>(kv.n)};
      ranges = all_rows;
      seg.q_begin = 0;
      seg.q_end = a.n_q;
    } else {
      const KvSelection::Segment& sel = a.selection->segments[i];
      ranges = sel.ranges;
      seg.q_begin = sel.q_begin;
      seg.q_end = sel.q_end;
      seg.kv_head = sel.kv_head;
      PS_CHECK(sel.kv_head >= -1 && sel.kv_head < s.n_kv_heads) << "selection names KV head " << sel.kv_head;
    }
    SplitAtBlocks(kv, ranges, &chunks);
    if (seg.q_end - seg.q_begin >= 2 && !PrefillAttentionOnBf16(s, kv.dtype) && !PrefillAttentionOnInt8(s, kv.dtype)) {
      // The keys some query row of the segment sees (the window's too: keys dropped
      // from a page are not there to copy).
      const auto [min_pos, max_pos] = std::minmax_element(a.q_pos + seg.q_begin, a.q_pos + seg.q_end);
      VisibleChunks(kv, chunks, *min_pos, *max_pos, a.window, &visible);
      Gather(kv, visible, width, pool, &gathered);
      seg.kv = &gathered.view;
      seg.row_ids = gathered.rows.data();
      chunks.assign(1, Chunk{0, gathered.view.n});
      if (gathered.view.n == 0) chunks.clear();
    } else {
      seg.kv = &kv;
    }
    seg.chunks = chunks;
    AttendSegment(s, a, seg, pool);
  }

  if (a.last_query_probs != nullptr) {  // mean over heads of exp(score - m) / l
    std::fill(a.last_query_probs, a.last_query_probs + kv.n, 0.0f);
    for (int h = 0; h < s.n_heads; ++h) {
      const float m = last_norm[2 * h], l = last_norm[2 * h + 1];
      if (l <= 0) continue;
      const float* logits = last_logits + h * kv.n;
      const float w = 1.0f / (l * s.n_heads);
      for (int64_t j = 0; j < kv.n; ++j) {
        if (logits[j] != -std::numeric_limits<float>::infinity()) a.last_query_probs[j] += std::exp(logits[j] - m) * w;
      }
    }
  }
  if (a.last_query_logits != nullptr) {
    std::fill(a.last_query_logits, a.last_query_logits + kv.n, 0.0f);
    for (int h = 0; h < s.n_heads; ++h) AddInPlace(last_logits + h * kv.n, a.last_query_logits, kv.n);
  }
}

void Attentions(const AttentionShape& shape, std::span<const AttentionCall> calls, ThreadPool& pool) {
  static thread_local std::vector<size_t> short_rows;  // calls of one row, too few keys to split
  short_rows.clear();
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].args.n_q == 1 && calls[i].kv.n < 2 * attention_internal::kMinSplitKeys) {
      short_rows.push_back(i);
    } else {
      Attention(shape, calls[i].kv, calls[i].args, pool);
    }
  }
  if (short_rows.size() < 2) {
    for (size_t i : short_rows) Attention(shape, calls[i].kv, calls[i].args, pool);
    return;
  }
  // The workers' lambda names this thread's list (a thread_local named inside it is the worker's own).
  const std::span<const size_t> rows = short_rows;
  pool.ParallelFor(std::ssize(rows), 1, [&](int64_t c0, int64_t c1) {
    static thread_local ThreadPool alone(1);  // runs its regions on the calling thread
    for (int64_t c = c0; c < c1; ++c) {
      const AttentionCall& call = calls[rows[c]];
      Attention(shape, call.kv, call.args, alone);
    }
  });
}

}  // namespace ps
