#include "kernels/cpu/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "base/status.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/vec.h"

namespace ps {
namespace {

constexpr int64_t kQueryTile = 32;

float* Scratch(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

// Rows [j0, j0 + nb) of a view, inside one block.
struct Chunk {
  int64_t j0 = 0, nb = 0;
};

// Splits row ranges at block boundaries (rows of one chunk are contiguous in memory).
void SplitAtBlocks(const KvRows& kv, std::span<const KvRange> ranges, std::vector<Chunk>* out) {
  out->clear();
  for (const KvRange& r : ranges) {
    for (int64_t j = r.begin; j < r.end;) {
      const int64_t nb = std::min<int64_t>(r.end - j, kv.block_rows - j % kv.block_rows);
      out->push_back({j, nb});
      j += nb;
    }
  }
}

// The leading part of `chunks` whose keys a query at max_q_pos may see (all of
// them unless positions ascend with the row index).
int64_t VisibleChunks(const KvRows& kv, std::span<const Chunk> chunks, int32_t max_q_pos, std::vector<Chunk>* out) {
  out->assign(chunks.begin(), chunks.end());
  if (!kv.positions_ascending) {
    int64_t total = 0;
    for (const Chunk& c : *out) total += c.nb;
    return total;
  }
  int64_t total = 0;
  for (size_t i = 0; i < out->size(); ++i) {
    Chunk& c = (*out)[i];
    const int32_t* p = kv.positions + c.j0;
    const int64_t seen = std::upper_bound(p, p + c.nb, max_q_pos) - p;
    if (seen < c.nb) {
      c.nb = seen;
      out->resize(seen > 0 ? i + 1 : i);
      return total + seen;
    }
    total += c.nb;
  }
  return total;
}

// Scores of rows [j0, j0 + nb) (inside one block) of one key head against q.
void KeyDots(const KvRows& kv, const float* q, int64_t j0, int64_t nb, int64_t col, int hd, float* out) {
  if (kv.dtype == DType::kF32) return DotRows(q, static_cast<const float*>(kv.k(j0, col)), kv.stride, nb, hd, out);
  for (int64_t r = 0; r < nb; ++r) out[r] = DotHalf(kv.dtype, static_cast<const uint16_t*>(kv.k(j0 + r, col)), q, hd);
}

// out += p[r] * value row j0 + r of one head, for the nb rows of one block.
void ValueAxpys(const KvRows& kv, const float* p, int64_t j0, int64_t nb, int64_t col, int hd, float* out) {
  if (kv.dtype == DType::kF32) return AxpyRows(p, static_cast<const float*>(kv.v(j0, col)), kv.stride, nb, hd, out);
  for (int64_t r = 0; r < nb; ++r) {
    if (p[r] != 0.0f) AxpyHalf(kv.dtype, p[r], static_cast<const uint16_t*>(kv.v(j0 + r, col)), out, hd);
  }
}

// One query segment over the chunks of `kv`. For several query rows `kv` must be
// F32 (the gathered copy) so that each chunk is one sgemm operand. row_ids maps a
// view row to the caller's row for the last-query statistics (null: the same).
struct SegmentArgs {
  const KvRows* kv = nullptr;
  std::span<const Chunk> chunks;
  const int32_t* row_ids = nullptr;
  int64_t q_begin = 0, q_end = 0;
  int64_t stats_n = 0;           // length of each head's statistics row (the caller's kv.n)
  float* last_probs = nullptr;   // [n_heads, stats_n] or null
  float* last_logits = nullptr;  // [n_heads, stats_n] or null
};

void RunSegment(const AttentionShape& s, const AttentionArgs& a, const SegmentArgs& seg, ThreadPool& pool) {
  const KvRows& kv = *seg.kv;
  const int group = s.n_heads / s.n_kv_heads;
  const int hd = s.head_dim;
  const int64_t n_q = seg.q_end - seg.q_begin;
  const int64_t n_tiles = (n_q + kQueryTile - 1) / kQueryTile;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const bool last_in_segment = seg.q_end == a.n_q;
  auto stat_row = [&](int64_t j) { return seg.row_ids != nullptr ? seg.row_ids[j] : j; };

  pool.ParallelFor(n_tiles * s.n_heads, 1, [&](int64_t u0, int64_t u1) {
    static thread_local std::vector<float> scores_storage;
    static thread_local std::vector<Chunk> visible;
    for (int64_t u = u0; u < u1; ++u) {
      const int h = static_cast<int>(u % s.n_heads);
      const int64_t q0 = seg.q_begin + (u / s.n_heads) * kQueryTile;
      const int64_t nq = std::min(kQueryTile, seg.q_end - q0);
      const int kvh = h / group;
      int32_t max_pos = std::numeric_limits<int32_t>::min();
      for (int64_t i = 0; i < nq; ++i) max_pos = std::max(max_pos, a.q_pos[q0 + i]);
      const int64_t nk = VisibleChunks(kv, seg.chunks, max_pos, &visible);
      float* sc = Scratch(scores_storage, nq * std::max<int64_t>(nk, 1));  // [nq, nk]
      const float* qh = a.q + q0 * a.q_stride + h * hd;
      float* oh = a.out + q0 * a.out_stride + h * hd;
      if (nk == 0) {
        for (int64_t i = 0; i < nq; ++i) std::memset(oh + i * a.out_stride, 0, hd * sizeof(float));
        continue;
      }
      int64_t col0 = 0;
      for (const Chunk& c : visible) {  // S[:, chunk] = Q K_chunkᵀ
        if (nq == 1) {
          KeyDots(kv, qh, c.j0, c.nb, kvh * hd, hd, sc + col0);
        } else {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(nq), static_cast<int>(c.nb), hd, 1.0f,
                      qh, static_cast<int>(a.q_stride), static_cast<const float*>(kv.k(c.j0, kvh * hd)),
                      static_cast<int>(kv.stride), 0.0f, sc + col0, static_cast<int>(nk));
        }
        col0 += c.nb;
      }
      for (int64_t i = 0; i < nq; ++i) {
        float* row = sc + i * nk;
        const int32_t qp = a.q_pos[q0 + i];
        int64_t col = 0;
        for (const Chunk& c : visible) {
          for (int64_t r = 0; r < c.nb; ++r, ++col) {
            row[col] = kv.positions[c.j0 + r] <= qp ? row[col] * s.scale : neg_inf;
          }
        }
        if (seg.last_logits != nullptr && last_in_segment && q0 + i == a.n_q - 1) {
          float* dst = seg.last_logits + h * seg.stats_n;
          col = 0;
          for (const Chunk& c : visible) {
            for (int64_t r = 0; r < c.nb; ++r) dst[stat_row(c.j0 + r)] = row[col++];
          }
        }
        SoftmaxInPlace(row, nk);
      }
      if (seg.last_probs != nullptr && last_in_segment && q0 + nq == a.n_q) {
        float* dst = seg.last_probs + h * seg.stats_n;
        const float* row = sc + (nq - 1) * nk;
        int64_t col = 0;
        for (const Chunk& c : visible) {
          for (int64_t r = 0; r < c.nb; ++r) dst[stat_row(c.j0 + r)] = row[col++];
        }
      }
      col0 = 0;
      for (const Chunk& c : visible) {  // O += P[:, chunk] V_chunk
        if (nq == 1) {
          if (col0 == 0) std::memset(oh, 0, hd * sizeof(float));
          ValueAxpys(kv, sc + col0, c.j0, c.nb, kvh * hd, hd, oh);
        } else {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(nq), hd, static_cast<int>(c.nb), 1.0f,
                      sc + col0, static_cast<int>(nk), static_cast<const float*>(kv.v(c.j0, kvh * hd)),
                      static_cast<int>(kv.stride), col0 == 0 ? 0.0f : 1.0f, oh, static_cast<int>(a.out_stride));
        }
        col0 += c.nb;
      }
    }
  });
}

// The selected rows of a view as one contiguous F32 block (keys, values, positions
// and the rows they came from), converted from half types as needed.
struct Gathered {
  std::vector<float> k, v;
  std::vector<int32_t> positions, rows;
  const void* k_block = nullptr;
  const void* v_block = nullptr;
  KvRows view;
};

void Gather(const KvRows& kv, std::span<const KvRange> ranges, ThreadPool& pool, Gathered* g) {
  g->rows.clear();
  for (const KvRange& r : ranges) {
    for (int32_t j = r.begin; j < r.end; ++j) g->rows.push_back(j);
  }
  const auto m = static_cast<int64_t>(g->rows.size());
  const int64_t width = kv.stride;
  if (static_cast<int64_t>(g->k.size()) < m * width) {
    g->k.resize(m * width);
    g->v.resize(m * width);
  }
  g->positions.resize(m);
  pool.ParallelFor(m, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t j = g->rows[r];
      g->positions[r] = kv.positions[j];
      if (kv.dtype == DType::kF32) {
        std::memcpy(g->k.data() + r * width, kv.k(j, 0), width * sizeof(float));
        std::memcpy(g->v.data() + r * width, kv.v(j, 0), width * sizeof(float));
      } else {
        HalfToF32(kv.dtype, static_cast<const uint16_t*>(kv.k(j, 0)), g->k.data() + r * width, width);
        HalfToF32(kv.dtype, static_cast<const uint16_t*>(kv.v(j, 0)), g->v.data() + r * width, width);
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

void Attention(const AttentionShape& s, const KvRows& kv, const AttentionArgs& a, ThreadPool& pool) {
  PS_CHECK(s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0) << "bad head counts";
  PS_CHECK(kv.stride == static_cast<int64_t>(s.n_kv_heads) * s.head_dim) << "KV rows hold " << kv.stride << " values";
  // The last query's probabilities / scores per head, reduced after the segments.
  static thread_local std::vector<float> last_probs_storage, last_logits_storage;
  auto per_head = [&](std::vector<float>& storage, const float* wanted, float fill) -> float* {
    if (wanted == nullptr) return nullptr;
    storage.assign(static_cast<size_t>(s.n_heads * kv.n), fill);
    return storage.data();
  };
  float* last_probs = per_head(last_probs_storage, a.last_query_probs, 0.0f);
  float* last_logits = per_head(last_logits_storage, a.last_query_logits, -std::numeric_limits<float>::infinity());

  // Query segments with their rows: the whole query range over every row, or the selection's.
  static thread_local std::vector<KvRange> all_rows(1);
  static thread_local std::vector<Chunk> chunks;
  static thread_local Gathered gathered;
  const bool all = a.selection == nullptr || a.selection->all();
  const size_t n_segments = all ? 1 : a.selection->segments.size();
  for (size_t i = 0; i < n_segments; ++i) {
    SegmentArgs seg{.stats_n = kv.n, .last_probs = last_probs, .last_logits = last_logits};
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
    }
    if (seg.q_end - seg.q_begin >= 2) {
      Gather(kv, ranges, pool, &gathered);
      seg.kv = &gathered.view;
      seg.row_ids = gathered.rows.data();
      chunks.assign(1, Chunk{0, gathered.view.n});
      if (gathered.view.n == 0) chunks.clear();
    } else {
      seg.kv = &kv;
      SplitAtBlocks(kv, ranges, &chunks);
    }
    seg.chunks = chunks;
    RunSegment(s, a, seg, pool);
  }

  if (a.last_query_probs != nullptr) {
    std::fill(a.last_query_probs, a.last_query_probs + kv.n, 0.0f);
    for (int h = 0; h < s.n_heads; ++h) AddInPlace(last_probs + h * kv.n, a.last_query_probs, kv.n);
    Scale(1.0f / s.n_heads, a.last_query_probs, kv.n);
  }
  if (a.last_query_logits != nullptr) {
    std::fill(a.last_query_logits, a.last_query_logits + kv.n, 0.0f);
    for (int h = 0; h < s.n_heads; ++h) AddInPlace(last_logits + h * kv.n, a.last_query_logits, kv.n);
  }
}

}  // namespace ps
