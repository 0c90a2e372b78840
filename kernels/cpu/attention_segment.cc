#include "kernels/cpu/attention_segment.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "base/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_avx2.h"
#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/attention_avx512_q8.h"
#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/fetch.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/sgemm.h"
#include "kernels/cpu/vec.h"

namespace ps::attention_internal {
namespace {

constexpr int64_t kQueryTile = 64;  // query rows per unit
static_assert(kQueryTile <= avx512_bf16::kMaxTileRows);
constexpr int64_t kKeyTile = 256;  // keys per score tile

float* Scratch(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

}  // namespace

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

int64_t VisibleChunks(const KvRows& kv, std::span<const Chunk> chunks, int32_t min_q_pos, int32_t max_q_pos,
                      const PositionWindow& window, std::vector<Chunk>* out) {
  out->clear();
  int64_t total = 0;
  if (!kv.positions_ascending) {
    out->assign(chunks.begin(), chunks.end());
    for (const Chunk& c : *out) total += c.nb;
    return total;
  }
  using Part = PositionWindow::Part;
  // Distant to a query at q: sinks <= pos <= q - recent.
  const int64_t distant_to_all = static_cast<int64_t>(min_q_pos) - window.recent;
  const int64_t distant_to_some = static_cast<int64_t>(max_q_pos) - window.recent;
  for (const Chunk& c : chunks) {
    const int32_t* p = kv.positions + c.j0;
    auto first_above = [&](int64_t x) {
      return std::partition_point(p, p + c.nb, [&](int32_t y) { return y <= x; }) - p;
    };
    const int64_t seen = first_above(max_q_pos);
    int64_t keep[2][2] = {{0, seen}, {seen, seen}};  // rows [begin, end) of the chunk, twice
    if (window.part != Part::kAll) {
      const int64_t sinks_end = std::lower_bound(p, p + seen, window.sinks) - p;
      if (window.part == Part::kProximal) {  // the sinks, and the keys after those distant to every query
        keep[0][1] = sinks_end;
        keep[1][0] = std::clamp<int64_t>(first_above(distant_to_all), sinks_end, seen);
      } else {  // the keys distant to some query
        keep[0][0] = sinks_end;
        keep[0][1] = std::clamp<int64_t>(first_above(distant_to_some), sinks_end, seen);
      }
    }
    for (const auto& [begin, end] : keep) {
      if (end > begin) out->push_back({c.j0 + begin, end - begin});
      total += std::max<int64_t>(0, end - begin);
    }
    if (seen < c.nb) break;
  }
  return total;
}

void KvToF32(DType t, const void* src, float* dst, int64_t n) {
  if (t == DType::kF32) return static_cast<void>(std::memcpy(dst, src, n * sizeof(float)));
  DequantizeRow(t, src, dst, n);
}

namespace {

// One head's row of a Q8_0 cache as F32, in a per-thread buffer.
const float* Q8Row(const void* src, int hd) {
  static thread_local std::vector<float> row;
  float* out = Scratch(row, hd);
  DequantizeRow(DType::kQ8_0, src, out, hd);
  return out;
}

// Scores of rows [j0, j0 + nb) (inside one block) of one key head against q.
void KeyDots(const KvRows& kv, const float* q, int64_t j0, int64_t nb, int64_t col, int hd, float* out) {
  if (kv.dtype == DType::kF32) return DotRows(q, static_cast<const float*>(kv.k(j0, col)), kv.stride, nb, hd, out);
  for (int64_t r = 0; r < nb; ++r) {
    const void* k = kv.k(j0 + r, col);
    out[r] = kv.dtype == DType::kQ8_0 ? DotF32(Q8Row(k, hd), q, hd)
                                      : DotHalf(kv.dtype, static_cast<const uint16_t*>(k), q, hd);
  }
}

// out += p[r] * value row j0 + r of one head, for the nb rows of one block.
void ValueAxpys(const KvRows& kv, const float* p, int64_t j0, int64_t nb, int64_t col, int hd, float* out) {
  if (kv.dtype == DType::kF32) return AxpyRows(p, static_cast<const float*>(kv.v(j0, col)), kv.stride, nb, hd, out);
  for (int64_t r = 0; r < nb; ++r) {
    if (p[r] == 0.0f) continue;
    const void* v = kv.v(j0 + r, col);
    if (kv.dtype == DType::kQ8_0) {
      Axpy(p[r], Q8Row(v, hd), out, hd);
    } else {
      AxpyHalf(kv.dtype, p[r], static_cast<const uint16_t*>(v), out, hd);
    }
  }
}

// Asks for rows [j0, j0 + nb) of one head (`first` is row j0's) to be brought into L2:
// a block is a few KB on a page of its own, too short for the hardware prefetchers,
// which stop at page edges. (Into L1, a few blocks ahead evicted what was being read;
// one block ahead came too late.)
void PrefetchRows(const KvRows& kv, const void* first, int64_t nb, int hd) {
  const auto* p = static_cast<const char*>(first);
  const int64_t bytes = kv.bytes((nb - 1) * kv.stride + hd);
  for (int64_t b = 0; b < bytes; b += 64) FetchLineL2(p + b);
}

// x = exp(x - m), masked (-inf) entries exactly 0; returns the sum.
float ExpShifted(float* x, int64_t n, float m) {
  if (avx2::Available()) return avx2::ExpShifted(x, n, m);
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - m));
  return sum;
}
float RowMax(const float* x, int64_t n) { return avx2::Available() ? avx2::MaxOf(x, n) : MaxOf(x, n); }

}  // namespace

namespace {

// Tiled attention with an online softmax (FlashAttention's recurrence, on the CPU).
// A unit attends a tile of up to kQueryTile query rows of the heads of one GQA group
// over a range of the visible keys, walked in tiles of at most kKeyTile rows (inside
// one block): it keeps each row's running maximum m and sum l, rescales the output
// accumulated so far when m grows and adds P·V of the tile. Memory: one
// [rows, kKeyTile] score tile per head; no [rows, keys] matrix.
class SegmentAttention {
 public:
  SegmentAttention(const AttentionShape& s, const AttentionArgs& a, const SegmentArgs& seg)
      : s_(s),
        a_(a),
        seg_(seg),
        kv_(*seg.kv),
        group_(s.n_heads / s.n_kv_heads),
        hd_(s.head_dim),
        kvh0_(seg.kv_head >= 0 ? seg.kv_head : 0),
        n_kvh_(seg.kv_head >= 0 ? 1 : s.n_kv_heads),
        group_simd_(avx2::Available() && s.head_dim % 8 == 0),
        key_major_(PrefillAttentionOnBf16(s, kv_.dtype) || PrefillAttentionOnInt8(s, kv_.dtype)),
        decode_bf16_(DecodeAttentionOnBf16(s, kv_.dtype)),
        decode_q8_(DecodeAttentionOnInt8(s, kv_.dtype)),
        elem_(kv_.dtype == DType::kF32    ? avx2::KvElem::kF32
              : kv_.dtype == DType::kF16  ? avx2::KvElem::kF16
              : kv_.dtype == DType::kQ8_0 ? avx2::KvElem::kQ8_0
                                          : avx2::KvElem::kBF16) {}

  // Query tiles run from the last (the most keys under the causal mask) to the first,
  // so the largest units are claimed first. A single query row (decode) over many keys
  // splits the keys among the threads instead (flash-decoding), every KV head in each
  // unit, merged at the end: kSplitsPerThread units a thread, claimed as threads come free, so
  // that a thread slowed for a while (a VM's core shared with a neighbour) does not hold
  // the other idle: on 2 Zen 4 threads (KVM), Qwen2.5-0.5B's decode at 8,192 keys went
  // 50.3-51.0 -> 53.5-54.4 tok/s (three alternated runs), SmolLM2's at 8,000 stayed within
  // the noise. (On a Zen 5, earlier, 4 units had run 3-5% slower than 2.)
  void Run(ThreadPool& pool) {
    const int64_t n_q = seg_.q_end - seg_.q_begin;
    if (n_q == 1) {
      const int32_t q = a_.q_pos[seg_.q_begin];
      const int64_t keys = VisibleChunks(kv_, seg_.chunks, q, q, a_.window, &visible_);
      const int64_t splits = std::clamp<int64_t>(keys / kMinSplitKeys, 1, kSplitsPerThread * pool.num_threads());
      if (splits > 1) return RunSplit(pool, keys, splits);
    }
    const int64_t n_tiles = (n_q + kQueryTile - 1) / kQueryTile;
    pool.ParallelFor(n_tiles * n_kvh_, 1, [&](int64_t u0, int64_t u1) {
      static thread_local std::vector<float> state_storage;
      static thread_local std::vector<Chunk> visible;
      for (int64_t u = u0; u < u1; ++u) {
        const int kvh = kvh0_ + static_cast<int>(u % n_kvh_);
        const int64_t q0 = seg_.q_begin + (n_tiles - 1 - u / n_kvh_) * kQueryTile;
        const int64_t nq = std::min(kQueryTile, seg_.q_end - q0);
        std::span<const Chunk> keys = visible_;  // a single query row's: found once in Run
        if (n_q > 1) {
          const auto [min_pos, max_pos] = std::minmax_element(a_.q_pos + q0, a_.q_pos + q0 + nq);
          VisibleChunks(kv_, seg_.chunks, *min_pos, *max_pos, a_.window, &visible);
          keys = visible;
        }
        float* m = Scratch(state_storage, 2 * group_ * nq);
        float* l = m + group_ * nq;
        float* out = a_.out + q0 * a_.out_stride + kvh * group_ * hd_;
        Attend(kvh, q0, nq, keys, 0, kv_.n, out, a_.out_stride, m, l);
        Finish(kvh, q0, nq, out, a_.out_stride, m, l);
      }
    });
  }

 private:
  static constexpr int64_t kDecodeKeyTile = 2048;  // keys per score tile for a single query row
  static constexpr int64_t kSplitsPerThread = 4;   // a single query row's key ranges per thread (Run)
  // How far ahead a single query row asks for blocks: 4 blocks of 16 rows, against 1,
  // read the attention bench's decode at 8k at 15.2 / 10.2 GB/s (SmolLM2 / Qwen shapes,
  // best of 5 alternated runs; Zen 4; the bench's rows then off their cache lines) instead of 11.2 / 8.5.
  static constexpr size_t kPrefetchPieces = 4;
  // The same for the AVX-512 BF16 kernels, which count rows: 32, 64, 128 and 256 within the
  // noise of each other on lined-up rows (Zen 4, 2026-11-30), 0 a third slower.
  static constexpr int64_t kPrefetchRows = 64;

  // Unnormalised output, m and l of rows [q0, q0 + nq) of kvh's heads over the visible
  // keys with ordinals [k_lo, k_hi): out rows out_stride apart, heads hd apart. A single
  // row (nq == 1) may take n_kv KV heads from kvh on, each key tile for all of them in
  // turn (a cache row holds every head's key side by side: read together, not a head's
  // at a time), KV head kvh + i's out, m and l at i * kv_step past the first's.
  void Attend(int kvh, int64_t q0, int64_t nq, std::span<const Chunk> visible, int64_t k_lo, int64_t k_hi, float* out,
              int64_t out_stride, float* m, float* l, int n_kv = 1, int64_t kv_step = 0) const {
    static thread_local std::vector<float> scores_storage;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const bool last_tile = seg_.q_end == a_.n_q && seg_.last_logits != nullptr && q0 + nq == a_.n_q;
    const auto q_range = std::minmax_element(a_.q_pos + q0, a_.q_pos + q0 + nq);
    const int32_t min_pos = *q_range.first, max_pos = *q_range.second;
    // Key tiles: pieces of chunks (rows contiguous in one block) of at most key_tile
    // rows in all. Several query rows need one piece per tile (an sgemm operand); a
    // single row takes many blocks per tile, so that the softmax runs on long rows.
    const int64_t key_tile = nq == 1 ? kDecodeKeyTile : kKeyTile;
    const int64_t tile_scores = nq * key_tile;
    const bool tiles = nq > 1 && key_major_;
    std::optional<KeyMajorTiles> key_major;
    PS_CHECK(n_kv == 1 || nq == 1) << "several KV heads at once for a single query row only";
    float* scores = nullptr;  // [group][nq, key_tile]
    if (tiles) {
      key_major.emplace(s_, a_, seg_, kvh, q0, nq);
    } else {
      scores = Scratch(scores_storage, group_ * tile_scores);
      for (int i = 0; i < n_kv; ++i) {
        std::fill(m + i * kv_step, m + i * kv_step + group_ * nq, neg_inf);
        std::fill(l + i * kv_step, l + i * kv_step + group_ * nq, 0.0f);
        for (int h = 0; h < group_; ++h) {
          for (int64_t r = 0; r < nq; ++r) {
            std::memset(out + i * kv_step + h * hd_ + r * out_stride, 0, hd_ * sizeof(float));
          }
        }
      }
    }
    pieces_.clear();
    int64_t ordinal = 0, filled = 0;  // ordinal: of the chunk's first key among the visible ones
    auto flush = [&] {
      if (filled > 0 && tiles) {
        key_major->Attend(pieces_, filled, min_pos, max_pos, last_tile);
      } else if (filled > 0) {
        for (int i = 0; i < n_kv; ++i) {
          AttendTile(kvh + i, q0, nq, min_pos, max_pos, filled, scores, tile_scores, out + i * kv_step, out_stride,
                     m + i * kv_step, l + i * kv_step, last_tile);
        }
      }
      pieces_.clear();
      filled = 0;
    };
    for (const Chunk& c : visible) {
      const int64_t lo = std::max(c.j0, c.j0 + k_lo - ordinal), hi = std::min(c.j0 + c.nb, c.j0 + k_hi - ordinal);
      ordinal += c.nb;
      for (int64_t t0 = lo; t0 < hi;) {
        const int64_t nt = std::min(key_tile - filled, hi - t0);
        pieces_.push_back({t0, nt});
        filled += nt;
        t0 += nt;
        if (filled == key_tile || (nq > 1 && !tiles)) flush();
      }
    }
    flush();
    if (tiles) key_major->End(out, out_stride, m, l);
  }

  // One key tile (pieces_, `nt` rows in all) for rows [q0, q0 + nq) of kvh's heads.
  void AttendTile(int kvh, int64_t q0, int64_t nq, int32_t min_pos, int32_t max_pos, int64_t nt, float* scores,
                  int64_t tile_scores, float* out, int64_t out_stride, float* m, float* l, bool last_tile) const {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const int h0 = kvh * group_;
    const int hd = hd_;
    auto q_of = [&](int h) { return a_.q + q0 * a_.q_stride + (h0 + h) * hd; };
    auto out_of = [&](int h) { return out + h * hd; };
    // A single query row reads the blocks in place (converting half-precision ones in
    // registers) and asks for the next block ahead; its scores come scaled.
    const bool grouped = nq == 1 && group_simd_;
    // The tile's K pieces, then its V pieces, in the order they are read.
    auto prefetch = [&](size_t i) {
      const size_t n = pieces_.size();
      if (i >= 2 * n) return;
      const Chunk& c = pieces_[i % n];
      PrefetchRows(kv_, i < n ? kv_.k(c.j0, kvh * hd) : kv_.v(c.j0, kvh * hd), c.nb, hd);
    };
    // A single query row over a BF16 or Q8_0 cache on AVX-512: the whole tile's rows in one
    // call, every head of the group at once.
    const bool runs = grouped && (decode_bf16_ || decode_q8_);
    if (grouped && !runs) {
      for (size_t i = 0; i < kPrefetchPieces; ++i) prefetch(i);
    }
    if (runs) {
      key_runs_.clear();
      value_runs_.clear();
      key_runs8_.clear();
      value_runs8_.clear();
      for (const Chunk& p : pieces_) {
        const void* k = kv_.k(p.j0, kvh * hd);
        const void* v = kv_.v(p.j0, kvh * hd);
        if (decode_q8_) {
          key_runs8_.push_back({static_cast<const uint8_t*>(k), p.nb});
          value_runs8_.push_back({static_cast<const uint8_t*>(v), p.nb});
        } else {
          key_runs_.push_back({static_cast<const uint16_t*>(k), p.nb});
          value_runs_.push_back({static_cast<const uint16_t*>(v), p.nb});
        }
      }
      if (decode_q8_) {
        avx512_q8::DecodeScores(q_of(0), group_, key_runs8_.data(), std::ssize(key_runs8_), value_runs8_.data(),
                                std::ssize(value_runs8_), kv_.bytes(kv_.stride), hd, s_.scale, scores, tile_scores,
                                kPrefetchRows);
      } else {
        avx512_bf16::DecodeScores(q_of(0), group_, key_runs_.data(), std::ssize(key_runs_), value_runs_.data(),
                                  std::ssize(value_runs_), kv_.stride, hd, s_.scale, scores, tile_scores,
                                  kPrefetchRows);
      }
    }
    int64_t col = 0;
    for (size_t i = 0; i < pieces_.size() && !runs; ++i) {
      const Chunk& p = pieces_[i];
      if (grouped) {
        prefetch(i + kPrefetchPieces);
        avx2::GroupKeyDots(q_of(0), group_, elem_, kv_.k(p.j0, kvh * hd), kv_.stride, p.nb, hd, s_.scale, scores + col,
                           tile_scores);
      } else {
        for (int h = 0; h < group_; ++h) {
          if (nq == 1) {
            float* s = scores + h * tile_scores + col;
            KeyDots(kv_, q_of(h), p.j0, p.nb, kvh * hd, hd, s);
            Scale(s_.scale, s, p.nb);
          } else {
            Sgemm(true, nq, nt, hd, s_.scale, q_of(h), a_.q_stride, static_cast<const float*>(kv_.k(p.j0, kvh * hd)),
                  kv_.stride, 0.0f, scores + h * tile_scores, nt);
          }
        }
      }
      col += p.nb;
    }
    // Mask; P = exp(S - m_new); rescale the rows' sums and outputs.
    int32_t k_lo = std::numeric_limits<int32_t>::max(), k_hi = std::numeric_limits<int32_t>::min();
    if (kv_.positions_ascending) {  // the first piece's first and the last's last (a decode tile: 2,048 keys)
      k_lo = kv_.positions[pieces_.front().j0];
      k_hi = kv_.positions[pieces_.back().j0 + pieces_.back().nb - 1];
    } else {
      for (const Chunk& p : pieces_) {
        const auto [lo, hi] = std::minmax_element(kv_.positions + p.j0, kv_.positions + p.j0 + p.nb);
        k_lo = std::min(k_lo, *lo);
        k_hi = std::max(k_hi, *hi);
      }
    }
    const bool unmasked = a_.window.SeesAll(k_lo, k_hi, min_pos, max_pos);  // every key of the tile to every row
    for (int h = 0; h < group_; ++h) {
      for (int64_t i = 0; i < nq; ++i) {
        float* row = scores + h * tile_scores + i * nt;
        const int32_t qp = a_.q_pos[q0 + i];
        float* dst = last_tile && i == nq - 1 ? seg_.last_logits + (h0 + h) * seg_.stats_n : nullptr;
        col = 0;
        for (const Chunk& p : pieces_) {
          if (unmasked && dst == nullptr) break;  // nothing to mask or record
          const int32_t* pos = kv_.positions + p.j0;
          for (int64_t r = 0; r < p.nb; ++r, ++col) {
            if (!unmasked && !a_.window.Sees(pos[r], qp)) row[col] = neg_inf;
            if (dst != nullptr) dst[StatRow(p.j0 + r)] = row[col];
          }
        }
        float& mi = m[h * nq + i];
        const float m_new = std::max(mi, RowMax(row, nt));
        if (m_new == neg_inf) {  // nothing visible yet: P = 0
          std::fill(row, row + nt, 0.0f);
          continue;
        }
        const float corr = mi == neg_inf ? 0.0f : std::exp(mi - m_new);
        const float sum = runs ? avx512_bf16::ExpShifted(row, nt, m_new) : ExpShifted(row, nt, m_new);
        l[h * nq + i] = l[h * nq + i] * corr + sum;
        if (corr != 1.0f) Scale(corr, out_of(h) + i * out_stride, hd);
        mi = m_new;
      }
    }
    // O += P V for the tile.
    if (runs && decode_q8_) {
      avx512_q8::DecodeValues(scores, tile_scores, group_, value_runs8_.data(), std::ssize(value_runs8_),
                              kv_.bytes(kv_.stride), hd, out_of(0), kPrefetchRows);
    } else if (runs) {
      avx512_bf16::DecodeValues(scores, tile_scores, group_, value_runs_.data(), std::ssize(value_runs_), kv_.stride,
                                hd, out_of(0), kPrefetchRows);
    }
    col = 0;
    for (size_t i = 0; i < pieces_.size() && !runs; ++i) {
      const Chunk& p = pieces_[i];
      if (grouped) {
        prefetch(pieces_.size() + i + kPrefetchPieces);
        avx2::GroupValueAxpys(scores + col, tile_scores, group_, elem_, kv_.v(p.j0, kvh * hd), kv_.stride, p.nb, hd,
                              out_of(0));
      } else {
        for (int h = 0; h < group_; ++h) {
          if (nq == 1) {
            ValueAxpys(kv_, scores + h * tile_scores + col, p.j0, p.nb, kvh * hd, hd, out_of(h));
          } else {
            Sgemm(false, nq, hd, nt, 1.0f, scores + h * tile_scores, nt,
                  static_cast<const float*>(kv_.v(p.j0, kvh * hd)), kv_.stride, 1.0f, out_of(h), out_stride);
          }
        }
      }
      col += p.nb;
    }
  }

  // O /= l (rows that saw no key stay 0); the rows' log-sum-exp; the last query row's
  // m and l for the statistics.
  void Finish(int kvh, int64_t q0, int64_t nq, float* out, int64_t out_stride, const float* m, const float* l) const {
    const bool last_tile = seg_.q_end == a_.n_q && seg_.last_logits != nullptr && q0 + nq == a_.n_q;
    for (int h = 0; h < group_; ++h) {
      for (int64_t i = 0; i < nq; ++i) {
        const float li = l[h * nq + i];
        if (li > 0) Scale(1.0f / li, out + i * out_stride + h * hd_, hd_);
        if (a_.lse != nullptr) {
          a_.lse[(q0 + i) * a_.lse_stride + kvh * group_ + h] =
              li > 0 ? m[h * nq + i] + std::log(li) : -std::numeric_limits<float>::infinity();
        }
      }
      if (last_tile) {
        seg_.last_norm[2 * (kvh * group_ + h)] = m[h * nq + nq - 1];
        seg_.last_norm[2 * (kvh * group_ + h) + 1] = l[h * nq + nq - 1];
      }
    }
  }

  // One query row: units (KV head, key range) write partial outputs, merged here.
  void RunSplit(ThreadPool& pool, int64_t keys, int64_t splits) {
    const int64_t per_head = group_ * (hd_ + 2);  // out, m, l of one unit
    partial_.resize(static_cast<size_t>(n_kvh_ * splits * per_head));
    const int64_t q0 = seg_.q_begin;
    // A unit: one key range for every KV head, each key tile for all heads in turn
    // (partial_: head-major, then the range). With a unit per (head, range), each thread
    // read a head's 128 bytes of every cache row, the rows' other heads later: the
    // attention bench's decode at 8k keys on 2 Zen 5 threads, alternated runs in two
    // sittings, 191-217 -> 169-200 us a layer (SmolLM2's shape), 144-164 -> 133-140 (Qwen's).
    pool.ParallelFor(splits, 1, [&](int64_t u0, int64_t u1) {
      for (int64_t part = u0; part < u1; ++part) {
        float* p = partial_.data() + part * per_head;
        Attend(kvh0_, q0, 1, visible_, keys * part / splits, keys * (part + 1) / splits, p, 0, p + group_ * hd_,
               p + group_ * hd_ + group_, n_kvh_, splits * per_head);
      }
    });
    for (int kvh = kvh0_; kvh < kvh0_ + n_kvh_; ++kvh) {
      const int64_t unit0 = (kvh - kvh0_) * splits;  // the head's first unit
      float* out = a_.out + q0 * a_.out_stride + kvh * group_ * hd_;
      std::vector<float> m(group_, -std::numeric_limits<float>::infinity()), l(group_, 0.0f);
      for (int h = 0; h < group_; ++h) {
        for (int64_t part = 0; part < splits; ++part) {
          m[h] = std::max(m[h], partial_[(unit0 + part) * per_head + group_ * hd_ + h]);
        }
        std::fill(out + h * hd_, out + (h + 1) * hd_, 0.0f);
        if (m[h] == -std::numeric_limits<float>::infinity()) continue;
        for (int64_t part = 0; part < splits; ++part) {
          const float* p = partial_.data() + (unit0 + part) * per_head;
          const float mp = p[group_ * hd_ + h];
          if (mp == -std::numeric_limits<float>::infinity()) continue;
          const float w = std::exp(mp - m[h]);
          l[h] += w * p[group_ * hd_ + group_ + h];
          Axpy(w, p + h * hd_, out + h * hd_, hd_);
        }
      }
      Finish(kvh, q0, 1, out, a_.out_stride, m.data(), l.data());
    }
  }

  int64_t StatRow(int64_t j) const { return seg_.row_ids != nullptr ? seg_.row_ids[j] : j; }

  const AttentionShape& s_;
  const AttentionArgs& a_;
  const SegmentArgs& seg_;
  const KvRows& kv_;
  const int group_, hd_;
  const int kvh0_, n_kvh_;  // the KV heads this segment serves
  const bool group_simd_;
  const bool key_major_;    // several query rows: KeyMajorTiles (else one F32 piece a tile)
  const bool decode_bf16_;  // one query row: the AVX-512 decode kernels, the whole tile at once
  const bool decode_q8_;    // ... their Q8_0 ones
  const avx2::KvElem elem_;
  std::vector<Chunk> visible_;
  std::vector<float> partial_;
  static thread_local std::vector<Chunk> pieces_;  // of the key tile being attended
  // ... and its rows for the decode kernels (decode_bf16_, decode_q8_)
  static thread_local std::vector<avx512_bf16::RowRun> key_runs_, value_runs_;
  static thread_local std::vector<avx512_q8::ByteRun> key_runs8_, value_runs8_;
};

thread_local std::vector<Chunk> SegmentAttention::pieces_;
thread_local std::vector<avx512_bf16::RowRun> SegmentAttention::key_runs_, SegmentAttention::value_runs_;
thread_local std::vector<avx512_q8::ByteRun> SegmentAttention::key_runs8_, SegmentAttention::value_runs8_;

}  // namespace

void AttendSegment(const AttentionShape& s, const AttentionArgs& a, const SegmentArgs& seg, ThreadPool& pool) {
  SegmentAttention(s, a, seg).Run(pool);
}

}  // namespace ps::attention_internal
